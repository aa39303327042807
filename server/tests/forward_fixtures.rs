//! The default model's greedy continuations and log-probabilities against
//! llama.cpp's (tests/fixtures/smollm2-llamacpp.json).

use serde_json::Value;
use sluice::startup::load_model;
use sluice_engine::sampling::top_probs;
use sluice_kernels::backend::Device;
use sluice_model::session::Session;
use sluice_tests::models::default_model;

/// Where two correct implementations may pick different tokens: the
/// fixture's top two log-probs within this of each other.
const NEAR_TIE: f64 = 0.02;
/// How far each of our top-5 log-probs may be from llama.cpp's. sluice
/// computes what llama.cpp's CPU backend computes, step for step (GGML's
/// dot-product lanes, RMSNorm in f64, stepped RoPE angles, its vector expf
/// in SiLU, its flash-attention roundings), so the hidden states match bit
/// for bit and what is left is the last-digit difference of two softmaxes
/// over the vocabulary (about 3e-4).
const LOGPROB_TOLERANCE: f64 = 0.05;

fn fixture() -> Value {
    let text = std::fs::read_to_string(sluice_tests::fixture("smollm2-llamacpp.json")).expect("fixture present");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn ids(value: &Value) -> Vec<u32> {
    value.as_array().expect("an array").iter().map(|id| id.as_u64().expect("an id") as u32).collect()
}

#[test]
fn greedy_continuations_match_llama_cpp_until_a_near_tie() {
    let model = load_model(&default_model(), Device::Cpu, 2, &[]).expect("default model loads");
    let fixture = fixture();
    let mut compared_steps = 0;
    let mut worst = 0.0f64;
    for completion in fixture["completions"].as_array().expect("completions") {
        let prompt = ids(&completion["prompt_tokens"]);
        let expected = ids(&completion["tokens"]);
        let steps = completion["steps"].as_array().expect("steps");
        let mut session =
            Session::new(std::sync::Arc::clone(&model), prompt.len() + expected.len() + 1).expect("a session");
        let mut logits = session.prefill(&prompt, 64).expect("prefill");
        for (index, step) in steps.iter().enumerate() {
            let top: Vec<(u32, f64)> = step["top"]
                .as_array()
                .expect("top")
                .iter()
                .map(|pair| (pair[0].as_u64().expect("id") as u32, pair[1].as_f64().expect("logprob")))
                .collect();
            let ours = top_probs(&logits, 5);
            for candidate in &ours {
                if let Some((_, theirs)) = top.iter().find(|(token, _)| *token == candidate.token) {
                    let difference = (f64::from(candidate.prob).ln() - theirs).abs();
                    worst = worst.max(difference);
                    assert!(
                        difference <= LOGPROB_TOLERANCE,
                        "prompt {:?} step {index}: token {} log-prob {} vs llama.cpp {theirs}",
                        completion["prompt"],
                        candidate.token,
                        f64::from(candidate.prob).ln()
                    );
                }
            }
            compared_steps += 1;
            if top.len() >= 2 && top[0].1 - top[1].1 < NEAR_TIE {
                break;
            }
            assert_eq!(
                ours[0].token, expected[index],
                "prompt {:?} diverges at step {index} before any near tie",
                completion["prompt"]
            );
            if index + 1 < steps.len() {
                logits = session.decode(expected[index]).expect("decode");
            }
        }
    }
    eprintln!("compared {compared_steps} steps; worst top-5 log-prob difference {worst:.4}");
    // Every prompt runs to its end or to a near tie; with the fixture's 20
    // prompts of 32 steps that is 441 steps.
    assert!(compared_steps >= 400, "too few steps compared: {compared_steps}");
}
