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
        "smollm3" => Some(tiny_bpe("smollm3")),
        "granite" => Some(tiny_bpe("granite")),
        "olmo2" => Some(tiny_bpe("olmo2")),
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

/// The words the synthetic BPE models' vocabularies build by merges.
const BPE_WORDS: [&str; 24] = [
    " the",
    " cat",
    " sat",
    " on",
    " mat",
    " Hello",
    " world",
    " a",
    " dog",
    " ran",
    " is",
    " and",
    "Hello",
    "the",
    "user",
    "assistant",
    "system",
    "  ",
    "\n\n",
    " caf\u{e9}",
    "\u{65e5}\u{672c}",
    " 12",
    "!",
    "ing",
];

/// The synthetic BPE models (`arch` `smollm3`, `granite` or `olmo2`) whose
/// llama.cpp outputs are fixtures (`tests/fixtures/<arch>-tiny-llamacpp.json`):
/// a byte-level vocabulary of real-looking pieces with the family's
/// `tokenizer.ggml.pre`, special tokens and published chat template, as its
/// converter writes them. SmolLM3 has eight layers (two without RoPE);
/// Granite non-trivial multipliers; OLMo 2 eight layers, six of them local
/// with windows of 5 positions (OLMo 3's layout). The LM head gives pieces
/// of UTF-8 characters and special tokens logits of 0, below any greedy
/// choice: llama-server reports no log-probs for a piece of a character
/// and stops at an end-of-generation token. The final norm's weights of 4
/// spread the logits, so that near ties are rare.
fn tiny_bpe(arch: &'static str) -> crate::gguf_writer::GgufBuilder {
    use crate::gguf_writer::{Rng, Tensor, TinyModel, Value};
    let (specials, pre, template, seed): (&[&str], _, _, _) = match arch {
        "smollm3" => (
            &["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"],
            "smaug-bpe",
            include_str!("../fixtures/smollm3-chat-template.jinja"),
            31,
        ),
        "granite" => (
            &["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"],
            "refact",
            include_str!("../fixtures/granite-chat-template.jinja"),
            32,
        ),
        _ => (&["<|endoftext|>", "<|pad|>"], "dbrx", include_str!("../fixtures/olmo2-chat-template.jinja"), 34),
    };
    let (tokens, types, merges) = crate::vocab::bpe_vocabulary(&BPE_WORDS, specials);
    let id = |text: &str| Value::U32(tokens.iter().position(|token| token == text).expect("a special token") as u32);
    let (n_vocab, n_layer) = (tokens.len(), if arch == "granite" { 4 } else { 8 });
    let shape = TinyModel { n_layer, n_vocab, tokens: Some(tokens.clone()), ..TinyModel::recipe(arch, seed) };
    let e = shape.n_embd;
    let mut rng = Rng::new(seed ^ 0x4ead);
    let byte_of: std::collections::HashMap<char, u8> =
        (0..=255u8).map(|byte| (crate::vocab::byte_char(byte), byte)).collect();
    // A piece cut inside a UTF-8 character (a byte past ASCII, or a prefix
    // of a word like " café") cannot be shown on its own.
    let partial = |token: &str| {
        let bytes: Option<Vec<u8>> = token.chars().map(|c| byte_of.get(&c).copied()).collect();
        bytes.is_some_and(|bytes| std::str::from_utf8(&bytes).is_err())
    };
    let head: Vec<f32> = (0..n_vocab)
        .flat_map(|token| {
            let silent = types[token] != crate::vocab::NORMAL || partial(&tokens[token]);
            let row = rng.vec(e, 1.0 / (e as f32).sqrt());
            if silent { vec![0.0; e] } else { row }
        })
        .collect();
    // Granite's logits are divided by its logit scale: its final norm
    // spreads them as much more.
    let spread = if arch == "granite" { 32.0 } else { 4.0 };
    let model = shape
        .build()
        .meta("tokenizer.ggml.pre", Value::Str(pre.into()))
        .meta("tokenizer.ggml.token_type", Value::I32s(types.clone()))
        .meta("tokenizer.ggml.merges", Value::Strs(merges))
        .meta("tokenizer.chat_template", Value::Str(template.into()))
        .tensor(Tensor::f32("output_norm.weight", &[e as u64], &vec![spread; e]))
        .tensor(Tensor::f32("output.weight", &[e as u64, n_vocab as u64], &head));
    match arch {
        // SmolLM3's files name BOS and EOS but not whether to add BOS.
        "smollm3" => model
            .meta("tokenizer.ggml.bos_token_id", id("<|begin_of_text|>"))
            .meta("tokenizer.ggml.eos_token_id", id("<|im_end|>"))
            .meta("tokenizer.ggml.padding_token_id", id("<|im_end|>")),
        "granite" => model
            .meta("tokenizer.ggml.bos_token_id", id("<|end_of_text|>"))
            .meta("tokenizer.ggml.eos_token_id", id("<|end_of_text|>"))
            .meta("tokenizer.ggml.unknown_token_id", id("<|end_of_text|>"))
            .meta("tokenizer.ggml.padding_token_id", id("<|end_of_text|>"))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(false))
            .meta("granite.embedding_scale", Value::F32(12.0))
            .meta("granite.residual_scale", Value::F32(0.22))
            .meta("granite.attention.scale", Value::F32(0.0625))
            .meta("granite.logit_scale", Value::F32(8.0))
            .meta("granite.rope.freq_base", Value::F32(1e6)),
        _ => model
            .meta("tokenizer.ggml.bos_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.eos_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.padding_token_id", id("<|pad|>"))
            .meta("olmo2.attention.sliding_window", Value::U32(5))
            .meta("olmo2.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
    }
}
