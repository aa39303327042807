//! Draft decoding over HTTP on the default model: the output with a draft
//! is the output without one, token for token and probability for
//! probability, streamed or not, on one slot or four.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_model::gguf::GgufFile;
use sluice_tests::gguf_writer::TinyModel;
use sluice_tests::http::Server;
use sluice_tests::models::default_model;

fn requests() -> Vec<Value> {
    let prompts = ["The capital of France is", "List three animals:", "def fibonacci(n):", "Once upon a time"];
    prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| {
            let temperature = if index % 2 == 0 { 0.0 } else { 0.8 };
            json!({ "prompt": prompt, "n_predict": 24, "seed": 7 + index, "temperature": temperature,
                    "ignore_eos": true, "return_tokens": true, "n_probs": 2 })
        })
        .collect()
}

/// (tokens, completion_probabilities, timings) of one request, streamed or not.
fn run(server: &Server, body: &Value, stream: bool) -> (Value, Value, Value) {
    if !stream {
        let (status, answer) = server.post("/completion", body);
        assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
        return (answer["tokens"].clone(), answer["completion_probabilities"].clone(), answer["timings"].clone());
    }
    let mut body = body.clone();
    body["stream"] = json!(true);
    let stream = server.stream("/completion", &body);
    let tokens = stream
        .events
        .iter()
        .filter(|e| e["stop"] == false)
        .flat_map(|e| e["tokens"].as_array().cloned().unwrap_or_default());
    let probs = stream
        .events
        .iter()
        .filter(|e| e["stop"] == false)
        .flat_map(|e| e["completion_probabilities"].as_array().cloned().unwrap_or_default());
    let timings = stream.events.last().map(|e| e["timings"].clone()).unwrap_or_default();
    (Value::Array(tokens.collect()), Value::Array(probs.collect()), timings)
}

/// Every request on `server` (four at once, half streamed) against `solo`;
/// returns (drafted, accepted) of the greedy requests.
fn assert_same_outputs(server: &Server, solo: &[(Value, Value, Value)]) -> (u64, u64) {
    let requests = requests();
    let outputs: BTreeMap<usize, (Value, Value, Value)> = std::thread::scope(|scope| {
        let running: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(index, body)| scope.spawn(move || (index, run(server, body, index / 2 == 1))))
            .collect();
        running.into_iter().map(|handle| handle.join().expect("request thread")).collect()
    });
    let mut greedy = (0, 0);
    for (index, (tokens, probs, timings)) in &outputs {
        assert_eq!(tokens, &solo[*index].0, "request {index}: tokens differ with a draft");
        assert_eq!(probs, &solo[*index].1, "request {index}: probabilities differ with a draft");
        let drafted = timings["draft_n"].as_u64().expect("draft_n");
        let accepted = timings["draft_n_accepted"].as_u64().expect("draft_n_accepted");
        assert!(drafted > 0 && accepted <= drafted, "request {index}: {timings}");
        if requests[*index]["temperature"] == 0.0 {
            greedy = (greedy.0 + drafted, greedy.1 + accepted);
        }
    }
    assert!(server.metric("llamacpp:spec_decode_num_draft_tokens_total") > 0.0);
    assert!(server.metric("llamacpp:spec_decode_num_drafts_total") > 0.0);
    greedy
}

fn solo_outputs() -> Vec<(Value, Value, Value)> {
    solo_outputs_of(&Server::start(&["-np", "1"]))
}

/// Every request's output on `server`, one at a time, without a draft.
fn solo_outputs_of(server: &Server) -> Vec<(Value, Value, Value)> {
    let outputs: Vec<_> = requests().iter().map(|body| run(server, body, false)).collect();
    assert!(outputs.iter().all(|(_, _, timings)| timings["draft_n"] == 0));
    let (_, slots) = server.get("/slots");
    assert_eq!(slots[0]["speculative"], false);
    outputs
}

#[test]
fn drafts_never_change_the_output() {
    let solo = solo_outputs();
    let model = default_model();
    let model = model.to_str().expect("utf-8 path");

    // The model drafting for itself computes exactly the target's logits:
    // every greedy draft is accepted.
    let server = Server::start(&["-np", "4", "-md", model, "--spec-draft-p-min", "0", "--spec-draft-n-max", "5"]);
    let (drafted, accepted) = assert_same_outputs(&server, &solo);
    assert_eq!(accepted, drafted, "self-drafting accepts every greedy draft");
    let accepted_total = server.metric("llamacpp:spec_decode_num_accepted_tokens_total");
    assert!(accepted_total >= accepted as f64, "{accepted_total}");
    let first = server.metric("llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"}");
    assert!(first > 0.0 && first <= accepted_total, "{first}");
    let (_, slots) = server.get("/slots");
    assert!(slots.as_array().is_some_and(|slots| slots.iter().all(|slot| slot["speculative"] == true)), "{slots}");
    drop(server);

    // A random-weight draft with the same vocabulary is mostly wrong.
    let file = GgufFile::open(&default_model()).expect("default model");
    let tokens = file.strs("tokenizer.ggml.tokens").expect("vocabulary").to_vec();
    let draft = TinyModel { n_vocab: tokens.len(), n_layer: 1, tokens: Some(tokens), ..TinyModel::llama(5) };
    let path = std::env::temp_dir().join(format!("sluice-random-draft-{}.gguf", std::process::id()));
    std::fs::write(&path, draft.build().build()).expect("write draft");
    let server = Server::start(&["-np", "4", "-md", path.to_str().expect("utf-8"), "--spec-draft-p-min", "0"]);
    let (drafted, accepted) = assert_same_outputs(&server, &solo);
    assert!(accepted * 4 < drafted, "a random draft should rarely be right: {accepted} of {drafted}");
    drop(server);
    std::fs::remove_file(&path).expect("clean up");
}

/// A mixture of experts (Qwen3-MoE's layout) drafting for itself: the
/// target verifies each draft's rows in one pass, its experts grouped
/// across them, and the output is the output without a draft, every
/// greedy draft accepted.
#[test]
fn drafts_on_a_mixture_of_experts_never_change_the_output() {
    let path = std::env::temp_dir().join(format!("sluice-moe-draft-{}.gguf", std::process::id()));
    let model = sluice_tests::models::tiny_family("qwen3moe").expect("a tiny MoE model");
    std::fs::write(&path, model.build()).expect("write the model");
    let solo = solo_outputs_of(&Server::start_model(&path, &["-np", "1"], &[]));
    let draft = path.to_str().expect("utf-8");
    let args = ["-np", "4", "-md", draft, "--spec-draft-p-min", "0", "--spec-draft-n-max", "5"];
    let server = Server::start_model(&path, &args, &[]);
    let (drafted, accepted) = assert_same_outputs(&server, &solo);
    assert_eq!(accepted, drafted, "self-drafting accepts every greedy draft");
    drop(server);
    std::fs::remove_file(&path).expect("clean up");
}
