//! Each family's synthetic model (`sluice_tests::models::tiny_family`)
//! against llama.cpp's outputs on the same file
//! (tests/fixtures/<arch>-tiny-llamacpp.json): greedy continuations and
//! top-5 log-probabilities, the chat template it carries, and
//! llama-server's tokenizations.

use std::sync::Arc;

use serde_json::Value;
use sluice_kernels::backend::CpuBackend;
use sluice_model::Model;
use sluice_model::Transformer;
use sluice_model::chat_template::ChatTemplate;
use sluice_model::gguf::GgufFile;
use sluice_model::session::Session;
use sluice_model::tokenizer::Tokenizer;
use sluice_tests::models::tiny_family;

/// Where two correct implementations may pick different tokens: the
/// fixture's top two log-probs within this of each other.
const NEAR_TIE: f64 = 0.02;
/// How far each of our top-5 log-probs may be from llama.cpp's. The f32
/// weights are multiplied in f32 by both in different orders, so the
/// hidden states agree to rounding, not bit for bit.
const TOLERANCE: f64 = 0.01;

fn fixture(arch: &str) -> Value {
    let text =
        std::fs::read_to_string(sluice_tests::fixture(&format!("{arch}-tiny-llamacpp.json"))).expect("fixture present");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn file(arch: &'static str) -> GgufFile {
    GgufFile::from_bytes(tiny_family(arch).expect("a tiny model of the family").build()).expect("valid GGUF")
}

fn ids(value: &Value) -> Vec<u32> {
    value.as_array().expect("an array").iter().map(|id| id.as_u64().expect("an id") as u32).collect()
}

/// The five most likely tokens and their log-probs, most likely first.
fn top5(logits: &[f32]) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits.iter().map(|&logit| (logit as f64 - max).exp()).sum::<f64>().ln() + max;
    let mut ranked: Vec<(u32, f64)> =
        logits.iter().enumerate().map(|(token, &logit)| (token as u32, logit as f64 - log_sum)).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(5);
    ranked
}

/// Every completion of `arch`'s fixture, greedily, until the first near
/// tie: the steps compared.
fn compare(arch: &'static str) -> usize {
    compare_served(arch, "completions", 512)
}

/// [`compare`] for the completions under `key`, served by the model for
/// sequences of `n_ctx_seq` positions, as llama-server served them.
fn compare_served(arch: &'static str, key: &str, n_ctx_seq: usize) -> usize {
    compare_file(file(arch), arch, key, n_ctx_seq)
}

/// [`compare_served`] on `file`, against the fixture `<arch>-tiny-llamacpp.json`.
fn compare_file(file: GgufFile, arch: &str, key: &str, n_ctx_seq: usize) -> usize {
    compare_within(file, arch, key, n_ctx_seq, Some(TOLERANCE))
}

/// [`compare_file`] with log-probs within `tolerance` of llama.cpp's
/// (`None`: greedy tokens only).
fn compare_within(file: GgufFile, arch: &str, key: &str, n_ctx_seq: usize, tolerance: Option<f64>) -> usize {
    let model = Transformer::from_file(file, Arc::new(CpuBackend::new(2))).expect("the tiny model loads");
    let model: Arc<dyn Model> = Arc::new(model.for_context(n_ctx_seq).expect("the rope builds"));
    let mut compared = 0;
    for completion in fixture(arch)[key].as_array().expect("completions") {
        let prompt = ids(&completion["prompt_tokens"]);
        let expected = ids(&completion["tokens"]);
        let mut session = Session::new(Arc::clone(&model), prompt.len() + expected.len() + 1).expect("a session");
        let mut logits = session.prefill(&prompt, 4).expect("prefill");
        for (index, step) in completion["steps"].as_array().expect("steps").iter().enumerate() {
            let theirs: Vec<(u32, f64)> = step["top"]
                .as_array()
                .expect("top")
                .iter()
                .map(|pair| (pair[0].as_u64().expect("id") as u32, pair[1].as_f64().expect("logprob")))
                .collect();
            let ours = top5(&logits);
            for (token, logprob) in &ours {
                let theirs = theirs.iter().find(|(theirs, _)| theirs == token);
                if let (Some(tolerance), Some((_, want))) = (tolerance, theirs) {
                    assert!(
                        (logprob - want).abs() <= tolerance,
                        "{arch} {:?} step {index}: token {token} log-prob {logprob} vs llama.cpp {want}",
                        completion["prompt"]
                    );
                }
            }
            compared += 1;
            if theirs.len() >= 2 && theirs[0].1 - theirs[1].1 < NEAR_TIE {
                break;
            }
            assert_eq!(ours[0].0, expected[index], "{arch} {:?} diverges at step {index}", completion["prompt"]);
            if index + 1 < expected.len() {
                logits = session.decode(expected[index]).expect("decode");
            }
        }
    }
    compared
}

/// Local layers (windows of 5 positions, their own RoPE base), post-norms,
/// pre-scaled Q, GeGLU and scaled embeddings; prompts prefilled in chunks
/// of 4, so windows reach back into earlier chunks.
#[test]
fn gemma3_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("gemma3");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// Gemma 3 folds a system message into the first user turn, trims
/// contents and calls the assistant `model`, after `<bos>`.
#[test]
fn gemma3_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("gemma3");
}

fn renders_as_llama_server(arch: &'static str) {
    renders_as_llama_server_but(arch, str::to_owned);
}

/// [`renders_as_llama_server`], both renderings passed through `mask`
/// first.
fn renders_as_llama_server_but(arch: &'static str, mask: fn(&str) -> String) {
    let file = file(arch);
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer builds");
    let template = ChatTemplate::from_gguf(&file, &tokenizer, None).expect("the template compiles");
    let fixture = fixture(arch);
    let cases = fixture["templates"].as_array().expect("templates[]");
    assert!(cases.len() >= 2);
    for case in cases {
        let messages = case["messages"].as_array().expect("messages[]");
        // llama-server's /apply-template renders with add_generation_prompt on.
        let ours = template.render(messages, true).expect("renders");
        assert_eq!(mask(&ours), mask(case["prompt"].as_str().expect("prompt")));
    }
}

/// Soft-capped scores and logits, every other layer local (windows of 5
/// positions).
#[test]
fn gemma2_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("gemma2");
    assert!(compared >= 100, "too few steps compared: {compared}");
}

/// Gemma 2 has no system role.
#[test]
fn gemma2_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("gemma2");
}

/// Every text of `arch`'s fixture tokenizes to llama-server's ids, with
/// special tokens added and parsed as llama-server does for a prompt.
fn tokenizes_as_llama_server(arch: &'static str) {
    let tokenizer = Tokenizer::from_gguf(&file(arch)).expect("tokenizer builds");
    let fixture = fixture(arch);
    let cases = fixture["tokenize"].as_array().expect("tokenize[]");
    assert!(cases.len() >= 8);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let add_special = case["add_special"].as_bool().expect("add_special");
        // llama-server's /tokenize parses special tokens by default.
        assert_eq!(tokenizer.encode(text, add_special, true), ids(&case["tokens"]), "{arch} {text:?}");
    }
}

/// Q/K/V biases, post-norms, gate and up fused, adjacent-pair RoPE over
/// half of each head; the fifth layer (multi-token prediction) is in the
/// file but not run.
#[test]
fn glm4_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("glm4");
    assert!(compared >= 70, "too few steps compared: {compared}");
}

/// GLM-4-0414 opens with `[gMASK]<sop>`, shows only what follows an
/// assistant turn's `</think>`, stripped, and ends a prompt with
/// `<|assistant|>`. (It has no system turn, which llama-server would fold
/// into the first user turn and sluice does not: not compared.)
#[test]
fn glm4_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("glm4");
}

/// Pre-tokenizer `glm4`: Llama 3's splits, whole-word tokens skipping the
/// merges, no BOS.
#[test]
fn glm4_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("glm4");
}

/// Fused Q/K/V and gate/up, pre-scaled Q, NEOX RoPE over 12 of 16
/// elements, the long LongRoPE factors (llama-server's context of 512 per
/// sequence is above the original 256), and the file's sliding window
/// ignored.
#[test]
fn phi3_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("phi3");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// The same model served for sequences of 256 (not above the original
/// context) rotates by the short factors, as llama-server with `-c 256`.
#[test]
fn phi3_with_a_short_context_matches_llama_cpp_with_the_short_factors() {
    let compared = compare_served("phi3", "completions_short", 256);
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// Phi-3.5's template: a turn per message, each ending in `<|end|>`.
#[test]
fn phi3_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("phi3");
}

/// SentencePiece with Phi-3's chat tokens, no BOS.
#[test]
fn phi3_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("phi3");
}

/// YaRN with the file's own correction bounds and magnitude multiplier,
/// and queries scaled by Llama 4's temperature from position 16 on.
#[test]
fn mistral3_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("mistral3");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// Tekken's split: case changes and every digit cut words.
#[test]
fn mistral3_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("mistral3");
}

#[test]
fn mistral3_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("mistral3");
}

/// Llama's layers, the fourth and eighth without RoPE.
#[test]
fn smollm3_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("smollm3");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// The thinking-mode header, with the system message as custom
/// instructions.
#[test]
fn smollm3_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("smollm3");
}

/// Llama 3's split (`smaug-bpe`), no BOS added.
#[test]
fn smollm3_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("smollm3");
}

/// Scaled embeddings, residuals, scores and logits.
#[test]
fn granite_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("granite");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// Roles between `<|start_of_role|>` and `<|end_of_role|>` (conversations
/// with a system message: without one the template writes today's date).
#[test]
fn granite_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("granite");
}

/// StarCoder's split (`refact`): single digits.
#[test]
fn granite_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("granite");
}

/// Post-norms only, whole-vector Q/K norms, six of eight layers local
/// (windows of 5 positions); prompts prefilled in chunks of 4.
#[test]
fn olmo2_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("olmo2");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// `<|user|>` and `<|assistant|>` turns after the BOS text.
#[test]
fn olmo2_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("olmo2");
}

/// GPT-4's split (`dbrx`).
#[test]
fn olmo2_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("olmo2");
}

/// Window layers that free the cells older than their window (blocks of 16
/// cells, windows of 5) give every logit bit for bit what they give keeping
/// every cell, over a sequence many windows long, prefilled in passes that
/// reach back into earlier ones; they hold at most a window and a pass of
/// blocks while the sequence grows to eight.
#[test]
fn freeing_window_cells_changes_no_logit() {
    for arch in ["gemma2", "gemma3"] {
        let model: Arc<dyn Model> =
            Arc::new(Transformer::from_file(file(arch), Arc::new(CpuBackend::new(2))).expect("the tiny model loads"));
        let (prompt, decoded) = (40, 88);
        let capacity = prompt + decoded;
        let mut freeing = Session::new(Arc::clone(&model), capacity).expect("a session");
        let mut keeping = Session::keeping_every_cell(Arc::clone(&model), capacity).expect("a session");
        assert_eq!(keeping.window_blocks_used(), None);
        let tokens: Vec<u32> = (0..prompt as u32).map(|i| (i * 7 + 3) % 20 + 4).collect();
        let mut logits = freeing.prefill(&tokens, 7).expect("prefill");
        assert_eq!(logits, keeping.prefill(&tokens, 7).expect("prefill"), "{arch} prefill");
        // Window 5 before a pass of 7: cells 33..40 in blocks 2 (32..48).
        assert_eq!(freeing.window_blocks_used(), Some(1), "{arch}");
        for step in 0..decoded {
            let next = top5(&logits)[0].0;
            logits = freeing.decode(next).expect("decode");
            assert_eq!(logits, keeping.decode(next).expect("decode"), "{arch} step {step}");
            assert!(freeing.window_blocks_used().is_some_and(|used| used <= 2), "{arch} step {step}");
        }
        assert_eq!(freeing.len(), capacity);
    }
}

/// Qwen3's attention and 2 of 8 experts per row, their weights
/// renormalized; rows grouped by expert in prefill chunks of 4.
#[test]
fn qwen3moe_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("qwen3moe");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

#[test]
fn qwen3moe_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("qwen3moe");
}

/// Qwen's pre-tokenizer, no BOS.
#[test]
fn qwen3moe_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("qwen3moe");
}

/// The same model quantized by llama.cpp's `llama-quantize` (experts in
/// Q4_0, Q5_0 or Q4_1, Q8_0 where it chose): quantized experts through the
/// packed kernels, greedy tokens equal until a near tie.
#[test]
fn quantized_qwen3moe_models_match_llama_cpp_until_a_near_tie() {
    for format in ["q4_0", "q5_0", "q4_1"] {
        let compared = compare_quantized(&format!("qwen3moe-tiny-{format}.gguf"), &format!("qwen3moe-{format}"), None);
        assert!(compared >= 60, "{format}: too few steps compared: {compared}");
    }
}

/// A dense family's synthetic model quantized the same way (SmolLM3's,
/// Q5_0 and Q8_0), within the f32 models' tolerance.
#[test]
fn a_quantized_smollm3_matches_llama_cpp_until_a_near_tie() {
    let compared = compare_quantized("smollm3-tiny-q5_0.gguf", "smollm3-q5_0", Some(TOLERANCE));
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// The fixture file `file` against `<arch>-tiny-llamacpp.json`.
fn compare_quantized(file: &str, arch: &str, tolerance: Option<f64>) -> usize {
    let file = GgufFile::open(&sluice_tests::fixture(file)).expect("the quantized fixture");
    compare_within(file, arch, "completions", 512, tolerance)
}

/// Qwen2's attention, 2 of 8 experts with their probabilities as they are,
/// and a shared expert scaled by the sigmoid of its gate.
#[test]
fn qwen2moe_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("qwen2moe");
    assert!(compared >= 60, "too few steps compared: {compared}");
}

/// A `llama` file with experts (Mixtral): 2 of 4, as wide as
/// `feed_forward_length`.
#[test]
fn mixtral_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("mixtral");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// `[INST]` turns after BOS, which llama-server drops from the rendered
/// prompt (the tokenizer adds it).
#[test]
fn mixtral_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("mixtral");
}

/// A merged `ffn_gate_up_exps` (each expert's gate rows, then its up rows)
/// computes what separate gate and up tensors do, bit for bit.
#[test]
fn merged_gate_up_experts_match_separate_ones() {
    use sluice_tests::gguf_writer::Tensor;
    let separate = tiny_family("qwen3moe").expect("a tiny model");
    let mut merged = separate.clone();
    for layer in 0..4 {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}.weight");
        let part = |suffix: &str| {
            let tensor = separate.tensors.iter().find(|tensor| tensor.name == name(suffix)).expect("in the model");
            (tensor.dims.clone(), tensor.data.clone())
        };
        let ((dims, gate), (_, up)) = (part("ffn_gate_exps"), part("ffn_up_exps"));
        let expert_bytes = gate.len() / dims[2] as usize;
        let data: Vec<u8> = gate
            .chunks_exact(expert_bytes)
            .zip(up.chunks_exact(expert_bytes))
            .flat_map(|(gate, up)| gate.iter().chain(up).copied())
            .collect();
        let fused =
            Tensor { name: name("ffn_gate_up_exps"), dims: vec![dims[0], 2 * dims[1], dims[2]], type_id: 0, data };
        merged = merged.without_tensor(&name("ffn_gate_exps")).without_tensor(&name("ffn_up_exps")).tensor(fused);
    }
    let logits = |builder: sluice_tests::gguf_writer::GgufBuilder| {
        let file = GgufFile::from_bytes(builder.build()).expect("valid GGUF");
        let model: Arc<dyn Model> = Arc::new(
            Transformer::from_file(file, Arc::new(CpuBackend::new(2))).expect("loads").for_context(64).expect("rope"),
        );
        let mut session = Session::new(model, 16).expect("a session");
        let logits = session.prefill(&[258, 261, 264, 266, 258, 269], 4).expect("prefill");
        logits.iter().map(|value| value.to_bits()).collect::<Vec<_>>()
    };
    assert!(logits(merged) == logits(separate));
}

/// Q/K/V and output biases, a sink per query head, windows of 5 positions
/// on even layers, YaRN, 4 of 8 biased experts chosen by their raw scores
/// and weighed by a softmax over the chosen, clamped SwiGLU.
#[test]
fn gpt_oss_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("gpt-oss");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// The published Harmony template: a system message with the date and
/// reasoning effort, the user's system prompt as the developer's
/// instructions, earlier answers on the `final` channel. The date is
/// today's, so it is masked.
#[test]
fn gpt_oss_template_renders_as_llama_server_renders_it() {
    fn undated(prompt: &str) -> String {
        const DATE: &str = "Current date: ";
        match prompt.find(DATE) {
            Some(at) => {
                format!("{}{DATE}YYYY-MM-DD{}", &prompt[..at], prompt.get(at + DATE.len() + 10..).unwrap_or(""))
            }
            None => prompt.to_owned(),
        }
    }
    renders_as_llama_server_but("gpt-oss", undated);
}

/// The same model quantized by llama.cpp's `llama-quantize` as gpt-oss
/// files are (`MXFP4_MOE`: experts in MXFP4, the other matrices Q8_0).
#[test]
fn an_mxfp4_gpt_oss_matches_llama_cpp_until_a_near_tie() {
    let compared = compare_quantized("gpt-oss-tiny-mxfp4.gguf", "gpt-oss-mxfp4", Some(TOLERANCE));
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// The o200k split (`gpt-4o`), and Harmony's structural tokens matched in
/// text.
#[test]
fn gpt_oss_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("gpt-oss");
}

/// The first layer dense, the others experts chosen by sigmoid scores plus
/// a selection bias from the best 2 of 4 groups, renormalized, scaled by
/// 2.5, with an ungated shared expert; NEOX RoPE over half of each head.
#[test]
fn glm4moe_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("glm4moe");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// The published GLM-4.6 template: `[gMASK]<sop>`, an earlier answer with
/// an empty think block.
#[test]
fn glm4moe_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("glm4moe");
}

/// Gated DeltaNet layers (2 key and 4 value heads, a convolution over 4
/// positions) with a gated full-attention layer every fourth; prompts
/// prefilled in chunks of 4, so every recurrent state goes on from one
/// pass to the next.
#[test]
fn qwen35_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("qwen35");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// [`qwen35_matches_llama_cpp_until_a_near_tie`] with experts (2 of 8,
/// renormalized) and a gated shared expert.
#[test]
fn qwen35moe_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("qwen35moe");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

/// Qwen3-Next: the same layers with NEOX rotary, value heads reading their
/// key heads in groups, β and α fused (`ssm_ba`), and the first layer's
/// projections fused as older files have them (`ssm_in`).
#[test]
fn qwen3next_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("qwen3next");
    assert!(compared >= 80, "too few steps compared: {compared}");
}

#[test]
fn qwen3next_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("qwen3next");
}

#[test]
fn qwen3next_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("qwen3next");
}

#[test]
fn qwen35_template_renders_as_llama_server_renders_it() {
    renders_as_llama_server("qwen35");
}

#[test]
fn qwen35_tokenizes_as_llama_server() {
    tokenizes_as_llama_server("qwen35");
}

/// Qwen3-VL-MoE's text path: Qwen3-MoE's layers with interleaved M-RoPE
/// sections over each head.
#[test]
fn qwen3vlmoe_matches_llama_cpp_until_a_near_tie() {
    let compared = compare("qwen3vlmoe");
    assert!(compared >= 80, "too few steps compared: {compared}");
}
