//! `-ctk q8_0 -ctv q8_0`: a Q8_0 KV cache serves completions, each request
//! getting the tokens it gets alone when others share its steps; llama.cpp's
//! other cache types stop the start, naming the flag.

use std::collections::BTreeMap;
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::binary::sluice_binary;
use sluice_tests::http::Server;

const PROMPTS: [&str; 4] = ["The capital of France is", "List three animals:", "def fibonacci(n):", "Once upon a time"];

/// Greedy, fixed length, and without the prefix cache, so that every run
/// prefills its prompt in whatever batch it lands in.
fn body(prompt: &str) -> Value {
    json!({ "prompt": prompt, "n_predict": 16, "temperature": 0.0, "ignore_eos": true, "cache_prompt": false,
            "return_tokens": true })
}

fn tokens(server: &Server, body: &Value) -> Value {
    let (status, answer) = server.post("/completion", body);
    assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
    answer["tokens"].clone()
}

#[test]
fn a_q8_0_kv_cache_serves_the_same_tokens_alone_and_batched() {
    let server = Server::start(&["-np", "4", "-c", "2048", "-ctk", "q8_0", "-ctv", "q8_0"]);
    let log = server.log();
    assert!(log.contains("K (q8_0)") && log.contains("V (q8_0)"), "the KV cache's size and types are logged:\n{log}");
    let alone: Vec<Value> = PROMPTS.iter().map(|prompt| tokens(&server, &body(prompt))).collect();
    assert!(alone.iter().all(|tokens| tokens.as_array().is_some_and(|tokens| tokens.len() == 16)), "{alone:?}");
    let together: BTreeMap<usize, Value> = std::thread::scope(|scope| {
        let running: Vec<_> = PROMPTS
            .iter()
            .enumerate()
            .map(|(index, prompt)| {
                let server = &server;
                scope.spawn(move || (index, tokens(server, &body(prompt))))
            })
            .collect();
        running.into_iter().map(|handle| handle.join().expect("request thread")).collect()
    });
    for (index, expected) in alone.iter().enumerate() {
        assert_eq!(&together[&index], expected, "request {index} differs when batched");
    }
    let busy = server.metric("llamacpp:n_busy_slots_per_decode");
    assert!(busy > 1.0, "the requests should have shared steps: {busy}");
}

#[test]
fn other_llama_cpp_cache_types_are_refused_naming_the_flag() {
    for (args, flag) in [
        (["-ctk", "q4_0"], "--cache-type-k"),
        (["-ctv", "bf16"], "--cache-type-v"),
        (["--cache-type-k", "f32"], "--cache-type-k"),
        (["--cache-type-v", "iq4_nl"], "--cache-type-v"),
    ] {
        let output = Command::new(sluice_binary()).arg("serve").args(args).output().expect("sluice runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        let refusal = format!("for '{flag} <TYPE>': the KV cache holds f16 or q8_0, not \"{}\"", args[1]);
        assert!(stderr.contains(&refusal), "{args:?}: {stderr}");
    }
}
