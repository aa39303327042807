//! One slot or four, alone or under concurrent load: every request gets
//! exactly the output it gets alone (batch invariance, seen over HTTP).

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::Server;

fn requests() -> Vec<Value> {
    let prompts = [
        "The capital of France is",
        "List three animals:",
        "Write a haiku about the sea.",
        "def fibonacci(n):",
        "Once upon a time",
        "The best way to learn is",
    ];
    prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| {
            // Greedy and seeded sampling both.
            let temperature = if index % 2 == 0 { 0.0 } else { 0.8 };
            json!({ "prompt": prompt, "n_predict": 10, "seed": 100 + index, "temperature": temperature,
                    "ignore_eos": true, "return_tokens": true })
        })
        .collect()
}

fn tokens(server: &Server, body: &Value) -> Value {
    let (status, answer) = server.post("/completion", body);
    assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
    answer["tokens"].clone()
}

#[test]
fn one_slot_and_four_slots_give_solo_outputs() {
    let requests = requests();
    let solo: Vec<Value> = {
        let server = Server::start(&["-np", "1"]);
        requests.iter().map(|body| tokens(&server, body)).collect()
    };
    assert!(solo.iter().all(|tokens| tokens.as_array().is_some_and(|tokens| tokens.len() == 10)));

    let server = Server::start(&["-np", "4"]);
    let concurrent: BTreeMap<usize, Value> = std::thread::scope(|scope| {
        let running: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(index, body)| {
                let server = &server;
                scope.spawn(move || {
                    // Half of them streamed, so decode steps mix both kinds.
                    if index % 2 == 1 {
                        let mut body = body.clone();
                        body["stream"] = json!(true);
                        let stream = server.stream("/completion", &body);
                        let tokens: Vec<Value> = stream
                            .events
                            .iter()
                            .filter(|e| e["stop"] == false)
                            .map(|e| e["tokens"][0].clone())
                            .collect();
                        (index, Value::Array(tokens))
                    } else {
                        (index, tokens(server, body))
                    }
                })
            })
            .collect();
        running.into_iter().map(|handle| handle.join().expect("request thread")).collect()
    });
    for (index, expected) in solo.iter().enumerate() {
        assert_eq!(&concurrent[&index], expected, "request {index} differs under load");
    }
    let metrics_busy = server.metric("llamacpp:n_busy_slots_per_decode");
    assert!(metrics_busy > 1.0, "requests should have shared steps: {metrics_busy}");
}
