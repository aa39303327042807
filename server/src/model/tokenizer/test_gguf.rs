//! A minimal GGUF writer (metadata only) for the tokenizer's unit tests.

use crate::model::gguf::GgufFile;

pub(super) enum Meta {
    Str(&'static str),
    U32(u32),
    Bool(bool),
    Strs(Vec<String>),
    I32s(Vec<i32>),
    F32s(Vec<f32>),
}

fn string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn array_header(out: &mut Vec<u8>, element_type: u32, len: usize) {
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&element_type.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

/// A GGUF v3 file with no tensors and the given metadata.
pub(super) fn gguf(entries: Vec<(&str, Meta)>) -> GgufFile {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (key, value) in entries {
        string(&mut out, key);
        match value {
            Meta::Str(text) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                string(&mut out, text);
            }
            Meta::U32(value) => {
                out.extend_from_slice(&4u32.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            Meta::Bool(value) => {
                out.extend_from_slice(&7u32.to_le_bytes());
                out.push(u8::from(value));
            }
            Meta::Strs(values) => {
                array_header(&mut out, 8, values.len());
                values.iter().for_each(|text| string(&mut out, text));
            }
            Meta::I32s(values) => {
                array_header(&mut out, 5, values.len());
                values.iter().for_each(|value| out.extend_from_slice(&value.to_le_bytes()));
            }
            Meta::F32s(values) => {
                array_header(&mut out, 6, values.len());
                values.iter().for_each(|value| out.extend_from_slice(&value.to_le_bytes()));
            }
        }
    }
    // The (empty) data section starts at the next 32-byte boundary.
    out.resize(out.len().next_multiple_of(32), 0);
    GgufFile::from_bytes(out).expect("the test writer produces valid GGUF")
}
