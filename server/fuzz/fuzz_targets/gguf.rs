//! Any byte string: the GGUF reader returns a model file or an error, and
//! never panics, hangs or allocates beyond the input's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::model::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        for tensor in file.tensors() {
            let _ = file.data(tensor).len();
        }
    }
});
