//! `gguf`: byte-level mutations of small synthetic GGUF files. The reader
//! returns a file or an error naming the field, never panics, and allocates
//! in proportion to the bytes it is given, never by a count the file claims.
//! Every tensor's data of a file it accepts is readable, and what start-up
//! reads next from such a file (hyper-parameters, tokenizer, chat template,
//! the weights onto the CPU backend) is a value or an error too.

use std::sync::Arc;

use serde_json::json;
use sluice_kernels::backend::CpuBackend;
use sluice_model::Transformer;
use sluice_model::chat_template::ChatTemplate;
use sluice_model::gguf::GgufFile;
use sluice_model::hparams::HParams;
use sluice_model::tokenizer::Tokenizer;
use sluice_tests::fuzz::{Fuzzer, bytes};
use sluice_tests::gguf_writer::{GgufBuilder, Tensor, TinyExperts, TinyModel, Value};

use crate::alloc::peak_during;

/// What the reader may allocate at once for an input of `len` bytes: what
/// a file's real contents can take in memory (the widest is an array of
/// `u8` read as `i64`s, 8 times its bytes, doubled by a vector's growth and
/// the copy a reallocation makes) plus the few entries reserved ahead.
fn allocation_bound(len: usize) -> u64 {
    32 * len as u64 + (256 << 10)
}

pub fn run() {
    let corpus = vec![every_value_type(), tiny("llama", 1), tiny("qwen2", 2), tiny_dflash(), tiny_experts()];
    let max_len = 2 * corpus.iter().map(Vec::len).max().unwrap_or(0);
    let backend = Arc::new(CpuBackend::new(1));
    Fuzzer::new("gguf", corpus)
        .run(|rng, input, corpus| bytes::mutate(rng, input, corpus, max_len), |input| check(input, &backend));
}

fn check(input: &[u8], backend: &Arc<CpuBackend>) -> Result<(), String> {
    let owned = input.to_vec();
    let (parsed, peak) = peak_during(move || GgufFile::from_bytes(owned));
    if peak > allocation_bound(input.len()) {
        return Err(format!("the reader allocated {peak} bytes for a file of {} bytes", input.len()));
    }
    let Ok(file) = parsed else { return Ok(()) };
    let mut touched = 0u8;
    for tensor in file.tensors() {
        let data = file.data(tensor);
        if data.len() != tensor.len {
            return Err(format!("tensor {:?}: {} bytes of data, {} described", tensor.name, data.len(), tensor.len));
        }
        touched ^= data.first().copied().unwrap_or(0) ^ data.last().copied().unwrap_or(0);
        let _ = file.integers(tensor);
        if file.shared_data(tensor).is_none() {
            return Err(format!("tensor {:?}: its validated range cannot be shared", tensor.name));
        }
    }
    std::hint::black_box(touched);
    file.prefault(|_, _| {});
    for (key, _) in file.metadata() {
        let _ = (file.str(key), file.u32(key), file.f32(key), file.opt_bool(key));
        let _ = (file.strs(key), file.ints(key), file.floats(key));
    }
    let _ = HParams::from_gguf(&file);
    if let Ok(tokenizer) = Tokenizer::from_gguf(&file) {
        let ids = tokenizer.encode("Hello <|im_start|>wörld 🙂\n", true, true);
        let _ = tokenizer.decode(&ids);
        if let Ok(template) = ChatTemplate::from_gguf(&file, &tokenizer, None) {
            let _ = template.render(&[json!({"role": "user", "content": "Hi"})], true);
        }
    }
    let _ = Transformer::from_file(file, Arc::clone(backend));
    Ok(())
}

/// Headers that claim as many tensors or metadata entries as the rest of a
/// 1 MiB file could hold, and then hold none: the reader fails at the first
/// entry having allocated about the same whatever the claim.
pub fn claimed_counts() {
    const LEN: usize = 1 << 20;
    for (field, entry_bytes) in [("tensor_count", 24), ("metadata_kv_count", 12)] {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        let claim = (LEN as u64 - 24) / entry_bytes;
        let (tensors, entries) = if field == "tensor_count" { (claim, 0) } else { (0, claim) };
        bytes.extend_from_slice(&tensors.to_le_bytes());
        bytes.extend_from_slice(&entries.to_le_bytes());
        bytes.resize(LEN, 0);
        let (parsed, peak) = peak_during(move || GgufFile::from_bytes(bytes));
        assert!(parsed.is_err(), "{field} = {claim} over zeros parsed");
        assert!(peak < 256 << 10, "{field} = {claim}: the reader allocated {peak} bytes before the first entry failed");
    }
}

/// Metadata of every type the writer has, the keys start-up reads, and a
/// tensor of each block layout (f32, f16, Q8_0, Q4_0, I32).
fn every_value_type() -> Vec<u8> {
    GgufBuilder::new()
        .meta("general.architecture", Value::Str("llama".into()))
        .meta("general.alignment", Value::U32(32))
        .meta("general.file_type", Value::U32(1))
        .meta("answer", Value::I32(-42))
        .meta("scale", Value::F32(0.5))
        .meta("flag", Value::Bool(true))
        .meta("ids", Value::U32s(vec![0, 1, u32::MAX]))
        .meta("deltas", Value::I32s(vec![-1, 0, 1]))
        .meta("weights", Value::F32s(vec![1.0, -0.0, f32::INFINITY]))
        .meta("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .meta("tokenizer.ggml.tokens", Value::Strs(["a", "b", "ab", "<|im_start|>"].map(String::from).to_vec()))
        .meta("tokenizer.ggml.merges", Value::Strs(vec!["a b".into()]))
        .meta("tokenizer.ggml.token_type", Value::I32s(vec![1, 1, 1, 3]))
        .meta("tokenizer.chat_template", Value::Str("{% for m in messages %}{{ m.content }}{% endfor %}".into()))
        .tensor(Tensor::f32("a", &[4, 2], &[1.0; 8]))
        .tensor(Tensor { name: "half".into(), dims: vec![8], type_id: 1, data: vec![0x3c; 16] })
        .tensor(Tensor { name: "q8".into(), dims: vec![32], type_id: 8, data: vec![1; 34] })
        .tensor(Tensor { name: "q4".into(), dims: vec![32, 2], type_id: 2, data: vec![2; 36] })
        .tensor(Tensor {
            name: "index".into(),
            dims: vec![3],
            type_id: 26,
            data: vec![0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0],
        })
        .build()
}

/// A whole model of `arch`, as small as the loader allows, with a chat
/// template: everything start-up reads.
fn tiny(arch: &'static str, seed: u64) -> Vec<u8> {
    tiny_with(arch, seed, None)
}

/// [`tiny`] of a mixture of experts with a shared expert (Qwen2-MoE): 3-D
/// expert tensors, their counts and widths, a router of one row per expert.
fn tiny_experts() -> Vec<u8> {
    tiny_with("qwen2moe", 4, Some(TinyExperts { count: 3, used: 2, n_ff: 4, shared: Some(4) }))
}

fn tiny_with(arch: &'static str, seed: u64, experts: Option<TinyExperts>) -> Vec<u8> {
    let shape = TinyModel {
        arch,
        n_vocab: 8,
        n_embd: 8,
        n_layer: 1,
        n_head: 2,
        n_head_kv: 1,
        n_ff: 8,
        experts,
        ..TinyModel::llama(seed)
    };
    shape.build().meta("tokenizer.chat_template", Value::Str("{{ messages[0].content }}".into())).build()
}

/// A DFlash draft (no embeddings of its own; target layers, block size).
fn tiny_dflash() -> Vec<u8> {
    let shape =
        TinyModel { n_vocab: 8, n_embd: 8, n_layer: 1, n_head: 2, n_head_kv: 1, n_ff: 8, ..TinyModel::llama(3) };
    shape.dflash(&[0], 8, 4).build()
}
