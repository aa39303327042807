//! Corrupt GGUF files: each gives an error naming the field, never a panic.

use sluice_model::gguf::GgufFile;
use sluice_tests::gguf_writer::{GgufBuilder, Rng, Tensor, TinyModel, Value};

fn error_of(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(file) => panic!("expected an error, parsed {file:?}"),
        Err(error) => error.to_string(),
    }
}

fn valid() -> GgufBuilder {
    GgufBuilder::new()
        .meta("general.architecture", Value::Str("llama".into()))
        .meta("answer", Value::U32(42))
        .tensor(Tensor::f32("a", &[4, 2], &[1.0; 8]))
        .tensor(Tensor::f32("b", &[8], &[2.0; 8]))
}

#[test]
fn a_valid_file_round_trips() {
    let file = GgufFile::from_bytes(valid().build()).expect("valid");
    assert_eq!(file.str("general.architecture").expect("present"), "llama");
    assert_eq!(file.u32("answer").expect("present"), 42);
    let a = file.tensor("a").expect("tensor a");
    assert_eq!(a.dims, vec![4, 2]);
    assert_eq!(file.data(a), &[1.0f32; 8].map(f32::to_le_bytes).concat()[..]);
    assert_eq!(file.tensors().len(), 2);
    // Pre-reading the weights reports every byte, ending at the total.
    let mut reports = Vec::new();
    file.prefault(|done, total| reports.push((done, total)));
    assert_eq!(reports, vec![(32, 64), (64, 64)]);
}

#[test]
fn bad_magic_and_version() {
    let mut bytes = valid().build();
    bytes[0] = b'X';
    assert!(error_of(bytes).contains("not a GGUF file"));
    let mut bytes = valid().build();
    bytes[4] = 9;
    assert_eq!(error_of(bytes), "GGUF version 9 is not supported (2 and 3 are)");
}

#[test]
fn truncation_anywhere_is_an_error_naming_the_field() {
    let bytes = valid().build();
    for len in [0, 3, 7, 20, 30, 60, bytes.len() / 2, bytes.len() - 1] {
        let error = error_of(bytes[..len].to_vec());
        assert!(
            error.contains("truncated")
                || error.contains("is absurd")
                || error.contains("not a GGUF")
                || error.contains("runs past the end"),
            "len {len}: {error}"
        );
    }
    let error = error_of(bytes[..30].to_vec());
    assert_eq!(error, "tensor_count = 2 is absurd for a file of 30 bytes");
    let error = error_of(bytes[..90].to_vec());
    assert!(error.starts_with("truncated: "), "{error}");
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let mut bytes = valid().build();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(error_of(bytes).starts_with("tensor_count = 18446744073709551615 is absurd"));
    let mut bytes = valid().build();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(error_of(bytes).starts_with("metadata_kv_count = 1099511627776 is absurd"));
    let huge_array = GgufBuilder::new().meta("list", Value::U32s(vec![1, 2])).build();
    let mut bytes = huge_array;
    // key "list" (8 + 4 bytes), value type, element type, then the length.
    let length_at = 24 + 8 + 4 + 4 + 4;
    bytes[length_at..length_at + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
    assert!(error_of(bytes).contains("list (array length) = 1125899906842624 is absurd"));
}

#[test]
fn offsets_past_the_end_overlaps_alignment_and_types() {
    let mut past_end = valid();
    past_end.tensors[1].data.truncate(16);
    let error = error_of(past_end.build());
    assert!(error.contains("tensor \"b\"") && error.contains("runs past the end"), "{error}");

    let overlapping = valid().build();
    // Point tensor "b" at tensor "a"'s offset (0): rewrite b's offset field.
    let b_offset_at = find_tensor_offset_field(&overlapping, "b");
    let mut bytes = overlapping.clone();
    bytes[b_offset_at..b_offset_at + 8].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(error_of(bytes), "tensors \"a\" and \"b\" overlap in the data section");

    let mut bytes = overlapping.clone();
    bytes[b_offset_at..b_offset_at + 8].copy_from_slice(&33u64.to_le_bytes());
    assert!(error_of(bytes).contains("offset 33 is not aligned to 32"));

    let mut unknown = valid();
    unknown.tensors[0].type_id = 99;
    assert_eq!(error_of(unknown.build()), "tensor \"a\": unknown tensor type 99");
    // A type ggml has and sluice does not read is named as ggml names it.
    let mut unsupported = valid();
    unsupported.tensors[0].type_id = 40;
    assert_eq!(error_of(unsupported.build()), "tensor \"a\": weight type NVFP4 (type 40) is not supported");

    let mut bad_block = valid();
    bad_block.tensors[0] = Tensor { name: "q".into(), dims: vec![33], type_id: 8, data: vec![0; 68] };
    assert!(error_of(bad_block.build()).contains("first dimension 33 is not a multiple of the Q8_0 block size"));

    let mut zero_dim = valid();
    zero_dim.tensors[0].dims = vec![0, 2];
    assert!(error_of(zero_dim.build()).contains("contain a zero"));

    let mut too_many_dims = valid();
    too_many_dims.tensors[0].dims = vec![1, 1, 1, 1, 8];
    assert!(error_of(too_many_dims.build()).contains("n_dims = 5"));

    let bad_alignment = valid().meta("general.alignment", Value::U32(24)).build();
    assert!(error_of(bad_alignment).contains("general.alignment = 24"));
}

#[test]
fn duplicate_keys_and_bad_utf8() {
    let duplicate = valid().duplicate_meta("answer", Value::U32(7)).build();
    assert_eq!(error_of(duplicate), "metadata key \"answer\" appears twice");
    let mut bytes = GgufBuilder::new().meta("k", Value::Str("ok".into())).build();
    let value_at = bytes.windows(2).rposition(|window| window == b"ok").expect("the value is in the file");
    bytes[value_at] = 0xff;
    assert_eq!(error_of(bytes), "k: invalid UTF-8");
}

#[test]
fn typed_getters_name_the_key() {
    let file = GgufFile::from_bytes(valid().build()).expect("valid");
    assert_eq!(file.u32("missing").unwrap_err().to_string(), "missing metadata key \"missing\"");
    assert_eq!(
        file.u32("general.architecture").unwrap_err().to_string(),
        "metadata \"general.architecture\": expected an integer 0..2^32, found string"
    );
}

/// Seeded mutations of a real synthetic model never panic the reader.
#[test]
fn random_corruption_never_panics() {
    let bytes = TinyModel::llama(1).build().build();
    let mut rng = Rng::new(7);
    for _ in 0..2000 {
        let mut mutated = bytes.clone();
        match rng.next_u64() % 3 {
            0 => mutated.truncate((rng.next_u64() as usize) % bytes.len()),
            _ => {
                for _ in 0..1 + rng.next_u64() % 8 {
                    let at = (rng.next_u64() as usize) % mutated.len().min(4096);
                    mutated[at] = rng.next_u64() as u8;
                }
            }
        }
        let _ = GgufFile::from_bytes(mutated);
    }
}

/// Byte offset of a tensor's `offset` field in a file built by the writer.
fn find_tensor_offset_field(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = bytes.windows(needle.len()).position(|window| window == needle.as_slice()).expect("tensor name present");
    let n_dims_at = at + needle.len();
    let n_dims = u32::from_le_bytes(bytes[n_dims_at..n_dims_at + 4].try_into().expect("4 bytes")) as usize;
    n_dims_at + 4 + 8 * n_dims + 4
}
