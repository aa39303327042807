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
        "glm4" => Some(tiny_glm4()),
        "glm4moe" => Some(tiny_glm4moe()),
        "phi3" => Some(tiny_phi3()),
        "smollm3" => Some(tiny_bpe("smollm3")),
        "granite" => Some(tiny_bpe("granite")),
        "olmo2" => Some(tiny_bpe("olmo2")),
        "qwen3moe" => Some(tiny_bpe("qwen3moe")),
        "qwen2moe" => Some(tiny_bpe("qwen2moe")),
        "mixtral" => Some(tiny_bpe("mixtral")),
        "gpt-oss" => Some(tiny_bpe("gpt-oss")),
        "qwen35" => Some(tiny_bpe("qwen35")),
        "qwen3vlmoe" => Some(tiny_bpe("qwen3vlmoe")),
        "qwen35moe" => Some(tiny_bpe("qwen35moe")),
        "qwen3next" => Some(tiny_bpe("qwen3next")),
        _ => None,
    }
}

/// A legacy DFlash draft (one layer, no rope sections, blocks of 4) for
/// the synthetic model of `arch`, in its vocabulary, tapping its layers 1
/// and 2: on a hybrid target, Gated DeltaNet layers.
pub fn tiny_dflash(arch: &str) -> Option<crate::gguf_writer::GgufBuilder> {
    use crate::gguf_writer::{TinyModel, Value};
    let target = tiny_family(arch)?;
    let tokens = target.metadata.iter().find_map(|(key, value)| match value {
        Value::Strs(tokens) if key == "tokenizer.ggml.tokens" => Some(tokens.clone()),
        _ => None,
    })?;
    let n_embd = target.metadata.iter().find_map(|(key, value)| match value {
        Value::U32(width) if key.ends_with(".embedding_length") => Some(*width as usize),
        _ => None,
    })?;
    let draft = TinyModel { n_layer: 1, n_vocab: tokens.len(), tokens: Some(tokens), ..TinyModel::recipe("qwen3", 9) };
    Some(draft.dflash(&[1, 2], n_embd, 4))
}

/// A draft for the synthetic `qwen35` model: a `qwen3` model (attention
/// only) with its vocabulary, embeddings and head, so that the two often
/// agree on the next token.
pub fn qwen35_draft() -> crate::gguf_writer::GgufBuilder {
    tiny_bpe("qwen35-draft")
}

/// The synthetic gpt-oss model with a context of 2048 positions, for
/// chats: the published template's system prompt alone is ~400 of its
/// byte-level tokens, more than the fixtures' 512 leave room for.
pub fn gpt_oss_for_chat() -> crate::gguf_writer::GgufBuilder {
    tiny_bpe("gpt-oss").meta("gpt-oss.context_length", crate::gguf_writer::Value::U32(2048))
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
    let bytes: Vec<u8> = (0x20..0x7f).chain([0xc3, 0x89, 0xa9]).collect();
    let (tokens, vocabulary) = crate::vocab::bpe_vocabulary(&SPECIALS, &bytes, &WORDS, &[]);
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

/// Words the BPE families' synthetic vocabularies hold, in GPT-2's
/// spelling (`Ġ` a space, `Ċ` a newline).
const BPE_PIECES: [&str; 16] = [
    "Ġthe", "Ġcat", "Ġsat", "Ġon", "Ġmat", "Hello", "Ġworld", "Ġa", "Ġdog", "Ġran", "Ġis", "Ġand", "'s", "123", "ĊĊ",
    "ĠĠ",
];

/// GLM's control tokens; GLM-4.5's vocabulary adds the think tags.
const GLM_CONTROL: [&str; 12] = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
];

/// The synthetic GLM-4 model whose llama.cpp outputs are a fixture
/// (`tests/fixtures/glm4-tiny-llamacpp.json`): four layers run, and a
/// fifth with random weights that is its multi-token-prediction layer
/// (`nextn_predict_layers` 1, `blk.4.nextn.*`), never run; Q/K/V biases,
/// post-norms, gate and up fused in `ffn_up`, adjacent-pair RoPE over the
/// first half of each head; GLM-4's chat tokens, pre-tokenizer `glm4` and
/// the published GLM-4-0414 chat template.
fn tiny_glm4() -> crate::gguf_writer::GgufBuilder {
    use crate::gguf_writer::{Tensor, TinyModel, Value};
    let (tokens, vocabulary) = crate::vocab::ascii_bpe_vocabulary("glm4", &BPE_PIECES, &GLM_CONTROL[..10]);
    let id = |text: &str| Value::U32(tokens.iter().position(|token| token == text).unwrap_or(0) as u32);
    let (end, gmask, user) = (id("<|endoftext|>"), id("[gMASK]"), id("<|user|>"));
    let shape =
        TinyModel { n_layer: 5, n_vocab: tokens.len(), tokens: Some(tokens.clone()), ..TinyModel::recipe("glm4", 44) };
    let e = shape.n_embd as u64;
    let mut model = vocabulary(shape.build())
        .meta("glm4.nextn_predict_layers", Value::U32(1))
        .meta("glm4.rope.dimension_count", Value::U32((shape.n_embd / shape.n_head / 2) as u32))
        .meta("glm4.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .meta("tokenizer.ggml.eos_token_id", end.clone())
        .meta("tokenizer.ggml.padding_token_id", end.clone())
        .meta("tokenizer.ggml.unknown_token_id", end)
        .meta("tokenizer.ggml.bos_token_id", gmask)
        .meta("tokenizer.ggml.eot_token_id", user)
        .meta("tokenizer.chat_template", Value::Str(include_str!("../fixtures/glm4-chat-template.jinja").into()))
        .tensor(Tensor::f32("output_norm.weight", &[e], &vec![4.0; shape.n_embd]));
    for layer in 0..shape.n_layer {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        model = fuse(model, &name("ffn_up.weight"), &[name("ffn_gate.weight"), name("ffn_up.weight")]);
    }
    let mut rng = crate::gguf_writer::Rng::new(45);
    model
        .tensor(Tensor::f32("blk.4.nextn.eh_proj.weight", &[2 * e, e], &rng.vec((2 * e * e) as usize, 0.1)))
        .tensor(Tensor::f32("blk.4.nextn.enorm.weight", &[e], &vec![1.0; shape.n_embd]))
        .tensor(Tensor::f32("blk.4.nextn.hnorm.weight", &[e], &vec![1.0; shape.n_embd]))
        .tensor(Tensor::f32("blk.4.nextn.shared_head_norm.weight", &[e], &vec![1.0; shape.n_embd]))
}

/// The synthetic GLM-4.5 model whose llama.cpp outputs are a fixture
/// (`tests/fixtures/glm4moe-tiny-llamacpp.json`): four layers, the first
/// dense, the others 2 of 8 experts chosen by sigmoid scores plus a
/// selection bias from the best 2 of 4 groups, renormalized and scaled by
/// 2.5, and an ungated shared expert; Q/K/V biases, NEOX RoPE over half of
/// each head; GLM-4's chat tokens, pre-tokenizer `glm4` and the published
/// GLM-4.6 chat template.
fn tiny_glm4moe() -> crate::gguf_writer::GgufBuilder {
    use crate::gguf_writer::{Rng, Tensor, TinyExperts, TinyModel, Value};
    let (tokens, vocabulary) = crate::vocab::ascii_bpe_vocabulary("glm4", &BPE_PIECES, &GLM_CONTROL);
    let id = |text: &str| Value::U32(tokens.iter().position(|token| token == text).unwrap_or(0) as u32);
    let experts = TinyExperts { count: 8, used: 2, n_ff: 32, shared: None };
    let shape = TinyModel {
        n_layer: 4,
        n_vocab: tokens.len(),
        tokens: Some(tokens.clone()),
        experts: Some(experts),
        ..TinyModel::recipe("glm4moe", 46)
    };
    let (e, f, count) = (shape.n_embd as u64, experts.n_ff as u64, experts.count as u64);
    let mut rng = Rng::new(47);
    let mut model = vocabulary(shape.build())
        .meta("glm4moe.rope.dimension_count", Value::U32((shape.n_embd / shape.n_head / 2) as u32))
        .meta("glm4moe.leading_dense_block_count", Value::U32(1))
        .meta("glm4moe.expert_shared_count", Value::U32(1))
        .meta("glm4moe.expert_weights_norm", Value::Bool(true))
        .meta("glm4moe.expert_weights_scale", Value::F32(2.5))
        .meta("glm4moe.expert_gating_func", Value::U32(2))
        .meta("glm4moe.expert_group_count", Value::U32(4))
        .meta("glm4moe.expert_group_used_count", Value::U32(2))
        .meta("tokenizer.ggml.eos_token_id", id("<|endoftext|>"))
        .meta("tokenizer.ggml.padding_token_id", id("<|endoftext|>"))
        .meta("tokenizer.ggml.bos_token_id", id("[gMASK]"))
        .meta("tokenizer.ggml.eot_token_id", id("<|user|>"))
        .meta("tokenizer.chat_template", Value::Str(include_str!("../fixtures/glm4moe-chat-template.jinja").into()))
        .tensor(Tensor::f32("output_norm.weight", &[e], &vec![4.0; shape.n_embd]));
    let matrix = |n_in: u64, n_out: u64, rng: &mut Rng| rng.vec((n_in * n_out) as usize, 1.0 / (n_in as f32).sqrt());
    for layer in 0..shape.n_layer {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        model = ffn_norm_as_post_attention(model, layer);
        if layer == 0 {
            let n_ff = shape.n_ff as u64;
            for suffix in ["ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"]
            {
                model = model.without_tensor(&name(suffix));
            }
            model = model
                .tensor(Tensor::f32(&name("ffn_gate.weight"), &[e, n_ff], &matrix(e, n_ff, &mut rng)))
                .tensor(Tensor::f32(&name("ffn_up.weight"), &[e, n_ff], &matrix(e, n_ff, &mut rng)))
                .tensor(Tensor::f32(&name("ffn_down.weight"), &[n_ff, e], &matrix(n_ff, e, &mut rng)));
            continue;
        }
        model = model
            .tensor(Tensor::f32(&name("exp_probs_b.bias"), &[count], &rng.vec(count as usize, 0.2)))
            .tensor(Tensor::f32(&name("ffn_gate_shexp.weight"), &[e, f], &matrix(e, f, &mut rng)))
            .tensor(Tensor::f32(&name("ffn_up_shexp.weight"), &[e, f], &matrix(e, f, &mut rng)))
            .tensor(Tensor::f32(&name("ffn_down_shexp.weight"), &[f, e], &matrix(f, e, &mut rng)));
    }
    model
}

/// The synthetic Phi-3 model whose llama.cpp outputs are a fixture
/// (`tests/fixtures/phi3-tiny-llamacpp.json`): four layers, Q/K/V fused in
/// `attn_qkv` and gate/up in `ffn_up`, NEOX RoPE over 12 of each head's 16
/// elements (Phi-4-mini's partial rotary), LongRoPE factors (long and
/// short, far apart) with an original context of 256 of its 512, a
/// sliding window of 4 that llama.cpp and sluice ignore; Phi-3's chat
/// tokens and the published Phi-3.5-mini chat template.
fn tiny_phi3() -> crate::gguf_writer::GgufBuilder {
    use crate::gguf_writer::{Tensor, TinyModel, Value};
    const PIECES: [&str; 16] = [
        "▁",
        "▁the",
        "▁cat",
        "▁sat",
        "▁on",
        "▁mat",
        "▁Hello",
        "▁world",
        "▁a",
        "▁dog",
        "▁ran",
        "user",
        "▁is",
        "▁and",
        ".",
        "assistant",
    ];
    let (tokens, vocabulary) = crate::vocab::phi3_vocabulary(&PIECES);
    let shape = TinyModel { n_layer: 4, n_vocab: tokens.len(), tokens: Some(tokens), ..TinyModel::recipe("phi3", 55) };
    let n_rot = 12;
    let short: Vec<f32> = (0..n_rot / 2).map(|j| 1.0 + 0.25 * j as f32).collect();
    let long: Vec<f32> = (0..n_rot / 2).map(|j| 3.0 + 4.0 * j as f32).collect();
    let pairs = [n_rot as u64 / 2];
    let mut model = vocabulary(shape.build())
        .meta("phi3.rope.dimension_count", Value::U32(n_rot as u32))
        .meta("phi3.rope.scaling.original_context_length", Value::U32(256))
        .meta("phi3.rope.scaling.attn_factor", Value::F32((1.0 + 2f32.ln() / 256f32.ln()).sqrt()))
        .meta("phi3.attention.sliding_window", Value::U32(4))
        .meta("tokenizer.chat_template", Value::Str(include_str!("../fixtures/phi3-chat-template.jinja").into()))
        .tensor(Tensor::f32("output_norm.weight", &[shape.n_embd as u64], &vec![4.0; shape.n_embd]))
        .tensor(Tensor::f32("rope_factors_short.weight", &pairs, &short))
        .tensor(Tensor::f32("rope_factors_long.weight", &pairs, &long));
    for layer in 0..shape.n_layer {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        model = fuse(
            model,
            &name("attn_qkv.weight"),
            &[name("attn_q.weight"), name("attn_k.weight"), name("attn_v.weight")],
        );
        model = fuse(model, &name("ffn_up.weight"), &[name("ffn_gate.weight"), name("ffn_up.weight")]);
    }
    model
}

/// `builder` with layer `layer`'s FFN pre-norm named as GLM-4.5's and
/// gpt-oss's converters name it, `post_attention_norm`.
fn ffn_norm_as_post_attention(
    builder: crate::gguf_writer::GgufBuilder,
    layer: usize,
) -> crate::gguf_writer::GgufBuilder {
    let name = format!("blk.{layer}.ffn_norm.weight");
    let norm = builder.tensors.iter().find(|t| t.name == name).expect("a pre-norm").clone();
    let renamed = crate::gguf_writer::Tensor { name: format!("blk.{layer}.post_attention_norm.weight"), ..norm };
    builder.without_tensor(&name).tensor(renamed)
}

/// `builder` with the f32 matrices `parts` replaced by one tensor `name`
/// holding their output rows in order, as converters fuse Q|K|V and
/// gate|up.
fn fuse(builder: crate::gguf_writer::GgufBuilder, name: &str, parts: &[String]) -> crate::gguf_writer::GgufBuilder {
    let (mut data, mut n_in, mut n_out) = (Vec::new(), 0, 0);
    for part in parts {
        let tensor = builder.tensors.iter().find(|tensor| &tensor.name == part).expect("the part is in the model");
        data.extend_from_slice(&tensor.data);
        (n_in, n_out) = (tensor.dims[0], n_out + tensor.dims[1]);
    }
    let builder = parts.iter().fold(builder, |builder, part| builder.without_tensor(part));
    builder.tensor(crate::gguf_writer::Tensor { name: name.into(), dims: vec![n_in, n_out], type_id: 0, data })
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

/// The synthetic BPE models (`arch` `smollm3`, `granite`, `olmo2`,
/// `qwen3moe`, `qwen2moe`, `mixtral` (a `llama` file with experts) or
/// `gpt-oss` (see [`gpt_oss`])) whose
/// llama.cpp outputs are fixtures (`tests/fixtures/<arch>-tiny-llamacpp.json`):
/// a byte-level vocabulary of real-looking pieces with the family's
/// `tokenizer.ggml.pre`, special tokens and chat template, as its
/// converter writes them. SmolLM3 has eight layers (two without RoPE);
/// Granite non-trivial multipliers; OLMo 2 eight layers, six of them local
/// with windows of 5 positions (OLMo 3's layout); the mixtures of experts
/// four layers of experts (Qwen3-MoE 2 of 8, Qwen2-MoE 2 of 8 and a
/// shared expert, Mixtral 2 of 4, gpt-oss 4 of 8), ChatML or `[INST]`
/// templates written for these tests (gpt-oss: the published one). The LM head gives pieces
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
        "qwen3moe" | "qwen2moe" | "qwen3vlmoe" | "qwen3next" => (
            &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            "qwen2",
            include_str!("../fixtures/chatml-chat-template.jinja"),
            match arch {
                "qwen3moe" => 35,
                "qwen2moe" => 36,
                "qwen3next" => 42,
                _ => 41,
            },
        ),
        "qwen35" | "qwen35moe" | "qwen35-draft" => (
            &["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
            "qwen35",
            include_str!("../fixtures/qwen35-chat-template.jinja"),
            if arch == "qwen35moe" { 40 } else { 39 },
        ),
        "mixtral" => (&["<s>", "</s>"], "llama-bpe", include_str!("../fixtures/mixtral-chat-template.jinja"), 37),
        "gpt-oss" => (
            &[
                "<|endoftext|>",
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|return|>",
                "<|call|>",
                "<|constrain|>",
            ],
            "gpt-4o",
            include_str!("../fixtures/gpt-oss-chat-template.jinja"),
            38,
        ),
        _ => (&["<|endoftext|>", "<|pad|>"], "dbrx", include_str!("../fixtures/olmo2-chat-template.jinja"), 34),
    };
    let experts = |count, shared| crate::gguf_writer::TinyExperts { count, used: 2, n_ff: 32, shared };
    let (file_arch, experts) = match arch {
        "qwen3moe" | "qwen3vlmoe" => (arch, Some(experts(8, None))),
        "qwen2moe" | "qwen35moe" | "qwen3next" => (arch, Some(experts(8, Some(48)))),
        "qwen35-draft" => ("qwen3", None),
        // Mixtral's experts are `feed_forward_length` (the recipe's 128) wide.
        "mixtral" => ("llama", Some(crate::gguf_writer::TinyExperts { n_ff: 128, ..experts(4, None) })),
        "gpt-oss" => (arch, Some(crate::gguf_writer::TinyExperts { used: 4, ..experts(8, None) })),
        _ => (arch, None),
    };
    // The words in GPT-2's spelling, after all 256 bytes, the specials last.
    let words: Vec<String> = BPE_WORDS.iter().map(|word| word.bytes().map(crate::vocab::byte_char).collect()).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let bytes: Vec<u8> = (0..=255).collect();
    let (tokens, vocabulary) = crate::vocab::bpe_vocabulary(&[], &bytes, &words, specials);
    let id = |text: &str| Value::U32(tokens.iter().position(|token| token == text).expect("a special token") as u32);
    let (n_vocab, n_layer) = (tokens.len(), if arch == "granite" || experts.is_some() { 4 } else { 8 });
    // Qwen3-VL's interleaved M-RoPE over all of each head's 8 pairs.
    let sections = (arch == "qwen3vlmoe").then_some([4, 2, 2, 0]);
    let shape = TinyModel {
        n_layer,
        n_vocab,
        tokens: Some(tokens.clone()),
        experts,
        sections,
        ..TinyModel::recipe(file_arch, seed)
    };
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
            let silent = token >= n_vocab - specials.len() || partial(&tokens[token]);
            let row = rng.vec(e, 1.0 / (e as f32).sqrt());
            if silent { vec![0.0; e] } else { row }
        })
        .collect();
    // Granite's logits are divided by its logit scale: its final norm
    // spreads them as much more.
    let spread = if arch == "granite" { 32.0 } else { 4.0 };
    let model = vocabulary(shape.build())
        .meta("tokenizer.ggml.pre", Value::Str(pre.into()))
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
        "qwen35" | "qwen35moe" | "qwen3next" => crate::hybrid::qwen35(&shape, model)
            .meta("tokenizer.ggml.bos_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.eos_token_id", id("<|im_end|>"))
            .meta("tokenizer.ggml.padding_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        "qwen3moe" | "qwen2moe" | "qwen3vlmoe" | "qwen35-draft" => model
            .meta("tokenizer.ggml.bos_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.eos_token_id", id("<|im_end|>"))
            .meta("tokenizer.ggml.padding_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        "mixtral" => model
            .meta("tokenizer.ggml.bos_token_id", id("<s>"))
            .meta("tokenizer.ggml.eos_token_id", id("</s>"))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(true)),
        "gpt-oss" => gpt_oss(&shape, model)
            .meta("tokenizer.ggml.bos_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.eos_token_id", id("<|return|>"))
            .meta("tokenizer.ggml.padding_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        _ => model
            .meta("tokenizer.ggml.bos_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.eos_token_id", id("<|endoftext|>"))
            .meta("tokenizer.ggml.padding_token_id", id("<|pad|>"))
            .meta("olmo2.attention.sliding_window", Value::U32(5))
            .meta("olmo2.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
    }
}

/// A gpt-oss model from the experts model `model` of `shape`: the FFN
/// pre-norm named `post_attention_norm`, biases on Q/K/V, the output, the
/// router and every expert's projections, a sink per query head, windows
/// of 5 positions on even layers, YaRN (factor 32 over an original context
/// of 64, base 150000, as the published files have it but for the context).
pub fn gpt_oss(
    shape: &crate::gguf_writer::TinyModel,
    model: crate::gguf_writer::GgufBuilder,
) -> crate::gguf_writer::GgufBuilder {
    use crate::gguf_writer::{Rng, Tensor, Value};
    let mut rng = Rng::new(shape.seed ^ 0x0a1);
    let experts = shape.experts.expect("gpt-oss has experts");
    let (e, count, n_ff) = (shape.n_embd as u64, experts.count as u64, experts.n_ff as u64);
    let kv = (shape.n_embd / shape.n_head * shape.n_head_kv) as u64;
    let mut model = model
        .meta("gpt-oss.attention.sliding_window", Value::U32(5))
        .meta("gpt-oss.rope.freq_base", Value::F32(150_000.0))
        .meta("gpt-oss.rope.scaling.type", Value::Str("yarn".into()))
        .meta("gpt-oss.rope.scaling.factor", Value::F32(32.0))
        .meta("gpt-oss.rope.scaling.original_context_length", Value::U32(64));
    for layer in 0..shape.n_layer {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        model = ffn_norm_as_post_attention(model, layer);
        let biases: [(&str, &[u64]); 8] = [
            ("attn_q.bias", &[e]),
            ("attn_k.bias", &[kv]),
            ("attn_v.bias", &[kv]),
            ("attn_output.bias", &[e]),
            ("ffn_gate_inp.bias", &[count]),
            ("ffn_gate_exps.bias", &[n_ff, count]),
            ("ffn_up_exps.bias", &[n_ff, count]),
            ("ffn_down_exps.bias", &[e, count]),
        ];
        for (suffix, dims) in biases {
            let len = dims.iter().product::<u64>() as usize;
            model = model.tensor(Tensor::f32(&name(suffix), dims, &rng.vec(len, 0.1)));
        }
        model =
            model.tensor(Tensor::f32(&name("attn_sinks.weight"), &[shape.n_head as u64], &rng.vec(shape.n_head, 2.0)));
    }
    model
}
