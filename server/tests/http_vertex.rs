//! Vertex AI's prediction protocol (`AIP_MODE=PREDICTION`) over real HTTP:
//! `AIP_HTTP_PORT` replaces `--port`, `AIP_HEALTH_ROUTE` answers as
//! `/health`, and `/predict` answers each instance with the route its
//! `@requestFormat` names, behind the API key and the body limit.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::binary::sluice_binary;
use sluice_tests::http::Server;
use sluice_tests::models::default_model;

const KEY: &str = "vertex-key";

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("local address").port()
}

fn assert_invalid(error: &Value, mentions: &str) {
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    assert_eq!(error["error"]["code"], 400, "{error}");
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.contains(mentions), "{message:?} should mention {mentions:?}");
}

#[test]
fn predictions_are_answered_by_the_routes_instances_name() {
    let dir = std::env::temp_dir().join(format!("sluice-http-vertex-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("limits.toml");
    std::fs::write(&config, "[server.limits]\nbody_bytes = 4096\n").expect("config");
    let port = free_port();
    let port_text = port.to_string();
    let env = [("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", port_text.as_str()), ("AIP_HEALTH_ROUTE", "ping")];
    let server = Server::start_with_env(&["--api-key", KEY, "--config", config.to_str().expect("utf-8 path")], &env);
    assert_eq!(server.url(""), format!("http://127.0.0.1:{port}"), "AIP_HTTP_PORT replaces --port");
    assert!(server.log().contains("AIP_HTTP_PORT"), "the override is logged:\n{}", server.log());

    let client = server.client();
    let predict = |body: &Value| server.send(client.post(server.url("/predict")).bearer_auth(KEY).json(body));
    let predictions = |instances: Value| {
        let (status, answer) = predict(&json!({ "instances": instances }));
        assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
        answer["predictions"].as_array().cloned().unwrap_or_else(|| panic!("no predictions: {answer}"))
    };

    // The health route, behind the key as every path but /health.
    let (status, health) = server.send(client.get(server.url("/ping")).bearer_auth(KEY));
    assert_eq!((status, health), (StatusCode::OK, json!({ "status": "ok" })));
    assert_eq!(server.get("/ping").0, StatusCode::UNAUTHORIZED);
    let (status, refused) = server.post("/predict", &json!({ "instances": [] }));
    assert_eq!((status, refused["error"]["type"].clone()), (StatusCode::UNAUTHORIZED, json!("authentication_error")));

    let chat = json!({
        "@requestFormat": "chatCompletions",
        "messages": [{ "role": "user", "content": "Say hello." }],
        "max_tokens": 8,
    });
    let answers = predictions(json!([chat]));
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["object"], "chat.completion", "{}", answers[0]);
    let content = answers[0]["choices"][0]["message"]["content"].as_str().expect("content");
    assert!(!content.is_empty(), "{}", answers[0]);

    // Two instances, in order; a literal path; `stream` is turned off.
    let completion = json!({ "@requestFormat": "/completion", "prompt": "Hello", "n_predict": 3, "stream": true });
    let answers = predictions(json!([completion, chat]));
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0]["tokens_predicted"], 3, "{}", answers[0]);
    assert!(answers[0]["content"].is_string(), "{}", answers[0]);
    assert_eq!(answers[1]["object"], "chat.completion", "{}", answers[1]);

    // Bad instances get error predictions; the others are still answered.
    let answers = predictions(json!([
        { "@requestFormat": "frobnicate" },
        { "@requestFormat": "tokenize", "content": "Hello" },
        { "prompt": "no format" },
        { "@requestFormat": 7 },
        "not an object",
        { "@requestFormat": "completion" },
    ]));
    assert_invalid(&answers[0], "no handler registered for @requestFormat: frobnicate");
    assert!(answers[1]["tokens"].as_array().is_some_and(|tokens| !tokens.is_empty()), "{}", answers[1]);
    assert_invalid(&answers[2], "each instance must include a string @requestFormat");
    assert_invalid(&answers[3], "each instance must include a string @requestFormat");
    assert_invalid(&answers[4], "each instance must be a JSON object");
    // The route's own error body is the prediction.
    assert_invalid(&answers[5], "prompt");
    assert_eq!(predictions(json!([])), Vec::<Value>::new());

    // Bodies the route refuses.
    let raw = |bytes: &str| {
        server.send(
            client
                .post(server.url("/predict"))
                .bearer_auth(KEY)
                .header("content-type", "application/json")
                .body(bytes.to_owned()),
        )
    };
    let bad = |(status, error): (StatusCode, Value), mentions: &str| {
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert_invalid(&error, mentions);
    };
    bad(raw("{\"instances\": "), "JSON");
    bad(predict(&json!([1])), "request body must be a JSON object");
    bad(predict(&json!({})), "request body must include an array field named instances");
    bad(predict(&json!({ "instances": {} })), "request body must include an array field named instances");
    let many: Vec<Value> = (0..129).map(|_| json!({})).collect();
    bad(predict(&json!({ "instances": many })), "instances array exceeds maximum size of 128");
    let (status, error) = raw(&format!("{{\"instances\": [], \"pad\": \"{}\"}}", "a".repeat(8192)));
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
}

#[test]
fn a_predict_route_on_an_existing_path_refuses_the_start() {
    let output = Command::new(sluice_binary())
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "-m"])
        .arg(default_model())
        .env("AIP_MODE", "PREDICTION")
        .env("AIP_HTTP_PORT", "0")
        .env("AIP_PREDICT_ROUTE", "v1/chat/completions")
        .output()
        .expect("sluice runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("AIP_PREDICT_ROUTE=/v1/chat/completions conflicts with an existing route"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
