//! The model files end-to-end tests run on.

use std::path::PathBuf;

/// SmolLM2-135M-Instruct Q4_1, the default model (docs/architecture.md, "Test models").
/// Panics with the command that fetches it when it is not there.
pub fn default_model() -> PathBuf {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(path.is_file(), "{} is missing: run `cargo xtask fetch-model` first", path.display());
    path
}

/// The synthetic model of family `arch` whose llama.cpp outputs are
/// fixtures (`tests/fixtures/<arch>-tiny-llamacpp.json`); `None` for a
/// family without one.
pub fn tiny_family(arch: &str) -> Option<crate::gguf_writer::GgufBuilder> {
    match arch {
        "gemma2" => Some(tiny_gemma("gemma2")),
        "gemma3" => Some(tiny_gemma("gemma3")),
        _ => None,
    }
}

/// The synthetic Gemma models (`arch` `gemma2` or `gemma3`) whose
/// llama.cpp outputs are fixtures (`tests/fixtures/<arch>-tiny-llamacpp.json`):
/// seven layers of the family's default pattern of local and global
/// layers, windows of 5 positions (shorter than the fixture's sequences),
/// a Gemma-style vocabulary and the family's published chat template. A
/// Gemma 3 model's global RoPE base (10⁶) differs from its local layers'
/// (10⁴). The final norm's weights of 4 spread the logits, so that near
/// ties (where greedy choices may differ) are rare.
fn tiny_gemma(arch: &'static str) -> crate::gguf_writer::GgufBuilder {
    use crate::gguf_writer::{Tensor, TinyModel, Value};
    const PIECES: [&str; 16] = [
        "▁", "▁the", "▁cat", "▁sat", "▁on", "▁mat", "▁Hello", "▁world", "▁a", "▁dog", "▁ran", "user", "model", "▁is",
        "▁and", ".",
    ];
    let (template, seed) = match arch {
        "gemma2" => (include_str!("../fixtures/gemma2-chat-template.jinja"), 22),
        _ => (include_str!("../fixtures/gemma3-chat-template.jinja"), 33),
    };
    let shape = TinyModel { n_layer: 7, ..TinyModel::recipe(arch, seed) };
    let (tokens, vocabulary) = crate::vocab::gemma_vocabulary(&PIECES);
    let head_dim = Value::U32((shape.n_embd / shape.n_head) as u32);
    let model = vocabulary(TinyModel { n_vocab: tokens.len(), tokens: Some(tokens), ..shape.clone() }.build())
        .meta(&format!("{arch}.attention.sliding_window"), Value::U32(5))
        .meta(&format!("{arch}.attention.key_length"), head_dim.clone())
        .meta(&format!("{arch}.attention.value_length"), head_dim)
        .meta(&format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .meta("tokenizer.chat_template", Value::Str(template.into()));
    let model = model.tensor(Tensor::f32("output_norm.weight", &[shape.n_embd as u64], &vec![4.0; shape.n_embd]));
    match arch {
        "gemma3" => model.meta("gemma3.rope.freq_base", Value::F32(1e6)),
        _ => model,
    }
}
