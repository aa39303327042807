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
        "mistral3" => Some(tiny_mistral3()),
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

/// A Mistral 3 text model: Llama's layers under YaRN with the file's own
/// correction bounds and magnitude multiplier, queries scaled by Llama 4's
/// temperature past an original context of 16 positions (so most of the
/// fixture's rows are scaled, by up to three buckets); correction bounds
/// that, unlike the defaults, blend pairs 1 to 7 at RoPE base 100, a Tekken vocabulary
/// (words that its split cuts where GPT-2's would not: `HelloWorld`,
/// `12`) and a v7-style template with Mistral's control tokens.
fn tiny_mistral3() -> crate::gguf_writer::GgufBuilder {
    use crate::gguf_writer::{Tensor, TinyModel, Value};
    const SPECIALS: [&str; 7] = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"];
    const WORDS: [&str; 18] = [
        "Hello",
        "\u{120}Hello",
        "\u{120}world",
        "\u{120}the",
        "\u{120}cat",
        "\u{120}sat",
        "\u{120}on",
        "\u{120}mat",
        "\u{120}a",
        "\u{120}dog",
        "\u{120}is",
        "\u{120}and",
        "World",
        "HelloWorld",
        "12",
        "\u{120}12",
        "\u{c3}\u{89}t\u{c3}\u{a9}",
        "..",
    ];
    let shape = TinyModel { n_layer: 4, ..TinyModel::recipe("mistral3", 44) };
    // Printable ASCII, and the two lead bytes and two continuations of é and É.
    let bytes = (0x20..0x7f).chain([0xc3, 0x89, 0xa9]);
    let (tokens, vocabulary) = crate::vocab::bpe_vocabulary(&SPECIALS, bytes, &WORDS);
    let model = vocabulary(TinyModel { n_vocab: tokens.len(), tokens: Some(tokens), ..shape.clone() }.build())
        .meta("tokenizer.ggml.pre", Value::Str("tekken".into()))
        .meta("tokenizer.ggml.bos_token_id", Value::U32(1))
        .meta("tokenizer.ggml.eos_token_id", Value::U32(2))
        .meta("tokenizer.ggml.unknown_token_id", Value::U32(0))
        .meta("tokenizer.chat_template", Value::Str(include_str!("../fixtures/mistral3-chat-template.jinja").into()))
        .meta("mistral3.rope.scaling.type", Value::Str("yarn".into()))
        .meta("mistral3.rope.scaling.factor", Value::F32(16.0))
        .meta("mistral3.rope.freq_base", Value::F32(100.0))
        .meta("mistral3.rope.scaling.original_context_length", Value::U32(16))
        .meta("mistral3.rope.scaling.yarn_beta_fast", Value::F32(1.0))
        .meta("mistral3.rope.scaling.yarn_beta_slow", Value::F32(0.05))
        .meta("mistral3.rope.scaling.yarn_log_multiplier", Value::F32(0.5))
        .meta("mistral3.attention.temperature_scale", Value::F32(0.3));
    model.tensor(Tensor::f32("output_norm.weight", &[shape.n_embd as u64], &vec![4.0; shape.n_embd]))
}
