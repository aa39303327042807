//! Bad input gets llama-server's documented errors, and the server goes on
//! serving; the API key guards every endpoint but `/health`.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::Server;

fn assert_error(answer: (StatusCode, Value), status: StatusCode, kind: &str, mentions: &str) {
    let (got, body) = answer;
    assert_eq!(got, status, "{body}");
    let error = &body["error"];
    assert_eq!(error["type"], kind, "{body}");
    assert_eq!(error["code"], status.as_u16(), "{body}");
    let message = error["message"].as_str().expect("message");
    assert!(message.contains(mentions), "{message:?} should mention {mentions:?}");
}

fn serves(server: &Server) {
    let (status, answer) = server.post("/completion", &json!({ "prompt": "Hello", "n_predict": 2 }));
    assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
    assert_eq!(answer["tokens_predicted"], 2, "{answer}");
}

#[test]
fn bad_input_gives_documented_errors_and_the_server_goes_on() {
    let dir = std::env::temp_dir().join(format!("sluice-http-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("small.toml");
    std::fs::write(&config, "[server.limits]\nbody_bytes = 4096\n[engine]\nctx = 64\n").expect("config");
    let server = Server::start(&["--config", config.to_str().expect("utf-8 path"), "-np", "1"]);
    let bad = StatusCode::BAD_REQUEST;
    let invalid = "invalid_request_error";

    let post = |body: Value| server.post("/completion", &body);
    assert_error(post(json!({ "prompt": "Hi", "temperature": "hot" })), bad, invalid, "temperature");
    assert_error(post(json!({ "prompt": "Hi", "top_k": [1] })), bad, invalid, "top_k");
    assert_error(post(json!({ "prompt": "Hi", "stream": "yes" })), bad, invalid, "stream");
    assert_error(post(json!({ "prompt": "Hi", "n_predict": -2 })), bad, invalid, "n_predict");
    assert_error(post(json!({ "prompt": "Hi", "n_predict": 1.5 })), bad, invalid, "n_predict");
    assert_error(post(json!({ "prompt": "Hi", "n_predict": 1e30 })), bad, invalid, "n_predict");
    assert_error(post(json!({ "prompt": "Hi", "max_tokens": -7 })), bad, invalid, "max_tokens");
    assert_error(post(json!({ "prompt": "Hi", "seed": -5 })), bad, invalid, "seed");
    assert_error(post(json!({ "prompt": "Hi", "n_probs": -1 })), bad, invalid, "n_probs");
    assert_error(post(json!({ "prompt": "Hi", "n": 2 })), bad, invalid, "n");
    assert_error(post(json!({ "prompt": "Hi", "lora": [{"id": 0, "scale": 1.0}] })), bad, invalid, "lora");
    assert_error(post(json!({ "n_predict": 2 })), bad, invalid, "prompt");
    assert_error(post(json!({ "prompt": {"text": "Hi"} })), bad, invalid, "prompt");
    assert_error(post(json!({ "prompt": [1, 2, 99_999_999] })), bad, invalid, "99999999");
    assert_error(post(json!(["not", "an", "object"])), bad, invalid, "object");
    serves(&server);

    let raw = |bytes: Vec<u8>| {
        server.send(
            server.client().post(server.url("/completion")).header("content-type", "application/json").body(bytes),
        )
    };
    assert_error(raw(b"{\"prompt\": \"\xff\xfe\", \"n_predict\": 2}".to_vec()), bad, invalid, "JSON");
    assert_error(raw(b"{\"prompt\": ".to_vec()), bad, invalid, "JSON");
    let large = format!("{{\"prompt\": \"{}\"}}", "a".repeat(8192));
    assert_error(raw(large.into_bytes()), StatusCode::PAYLOAD_TOO_LARGE, invalid, "limit");
    serves(&server);

    // Unknown fields are ignored.
    let (status, answer) = post(json!({ "prompt": "Hi", "n_predict": 2, "frobnicate": {"x": 1}, "mirostat": 0 }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    // An empty token list answers at once with empty content.
    let (status, answer) = post(json!({ "prompt": [], "n_predict": 4 }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!((answer["content"].clone(), answer["tokens_predicted"].clone()), (json!(""), json!(0)));

    // A prompt the context cannot hold, streaming or not: a plain 400.
    let long = "one two three four five six seven eight nine ten ".repeat(10);
    for stream in [false, true] {
        let answer = post(json!({ "prompt": long, "n_predict": 2, "stream": stream }));
        let error = answer.1["error"].clone();
        assert_error(answer, bad, "exceed_context_size_error", "context");
        assert!(error["n_prompt_tokens"].as_u64().is_some_and(|n| n > 64), "{error}");
        assert_eq!(error["n_ctx"], 64);
    }
    let chat = json!({ "messages": [{"role": "user", "content": long}], "stream": true });
    assert_error(server.post("/v1/chat/completions", &chat), bad, "exceed_context_size_error", "context");
    assert_error(server.post("/v1/chat/completions", &json!({ "messages": "hi" })), bad, invalid, "messages");
    assert_error(server.post("/v1/chat/completions", &json!({ "max_tokens": 2 })), bad, invalid, "messages");

    assert_error(server.get("/no/such/endpoint"), StatusCode::NOT_FOUND, "not_found_error", "Not Found");
    assert_error(server.get("/completion"), StatusCode::NOT_FOUND, "not_found_error", "Not Found");
    assert_error(server.post("/tokenize", &json!({ "content": 5 })), bad, invalid, "content");
    assert_error(server.post("/detokenize", &json!({ "tokens": [-1] })), bad, invalid, "tokens");
    assert_error(server.post("/lora-adapters", &json!([{"id": 3, "scale": 0.5}])), bad, invalid, "3");
    serves(&server);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn the_api_key_guards_everything_but_health() {
    let server = Server::start(&["--api-key", "s3cret"]);
    let (status, health) = server.get("/health");
    assert_eq!((status, health), (StatusCode::OK, json!({"status": "ok"})));
    let unauthorized = StatusCode::UNAUTHORIZED;
    let body = json!({ "prompt": "Hi", "n_predict": 1 });
    let client = server.client();
    let completion = || client.post(server.url("/completion")).json(&body);
    assert_error(server.send(completion()), unauthorized, "authentication_error", "API Key");
    assert_error(server.send(completion().bearer_auth("wrong")), unauthorized, "authentication_error", "API Key");
    assert_error(server.send(completion().header("x-api-key", "s3cre")), unauthorized, "authentication_error", "");
    assert_error(server.get("/metrics"), unauthorized, "authentication_error", "");
    assert_error(server.get("/no/such/endpoint"), unauthorized, "authentication_error", "");
    assert_eq!(server.send(completion().bearer_auth("s3cret")).0, StatusCode::OK);
    assert_eq!(server.send(completion().header("x-api-key", "s3cret")).0, StatusCode::OK);

    // CORS as llama-server: a preflight needs no key; every answer echoes the origin.
    let origin = "http://app.example";
    let preflight = client
        .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
        .header("origin", origin)
        .send()
        .expect("preflight");
    assert_eq!(preflight.status(), StatusCode::OK);
    let header = |response: &reqwest::blocking::Response, name: &str| {
        response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
    };
    assert_eq!(header(&preflight, "access-control-allow-origin").as_deref(), Some(origin));
    assert_eq!(header(&preflight, "access-control-allow-credentials").as_deref(), Some("true"));
    assert!(header(&preflight, "access-control-allow-methods").is_some_and(|methods| methods.contains("POST")));
    let refused = completion().header("origin", origin).send().expect("request");
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&refused, "access-control-allow-origin").as_deref(), Some(origin));

    // The policy can be replaced behind the key; a bad plugin is refused
    // with its path and the old policy keeps serving.
    let admin = |body: Value| server.send(client.post(server.url("/admin/policy")).bearer_auth("s3cret").json(&body));
    assert_error(
        server.post("/admin/policy", &json!({ "policy": "continuous" })),
        unauthorized,
        "authentication_error",
        "",
    );
    let (status, answer) = admin(json!({ "policy": "continuous" }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["policy"], "continuous");
    assert_error(
        admin(json!({ "policy": "/no/such/policy.wasm" })),
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "/no/such/policy.wasm",
    );
    assert_error(admin(json!({ "policy": "fastest" })), StatusCode::BAD_REQUEST, "invalid_request_error", "fastest");
    let (status, answer) = admin(json!({}));
    assert_eq!(status, StatusCode::OK, "reload from the config: {answer}");
    assert_eq!(server.send(completion().bearer_auth("s3cret")).0, StatusCode::OK);
}

#[test]
fn health_says_loading_then_ok() {
    let server = Server::spawn(&[]);
    // Loading is quick; whatever is seen before it ends must be the
    // documented 503 on every path.
    let loading = json!({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        assert!(std::time::Instant::now() < deadline, "never became healthy:\n{}", server.log());
        let (status, body) = server.get("/health");
        if status == StatusCode::OK {
            assert_eq!(body, json!({"status": "ok"}));
            break;
        }
        assert_eq!((status, &body), (StatusCode::SERVICE_UNAVAILABLE, &loading));
        let (status, body) = server.post("/completion", &json!({ "prompt": "Hi", "n_predict": 1 }));
        assert!(
            status == StatusCode::SERVICE_UNAVAILABLE && body == loading || status == StatusCode::OK,
            "{status} {body}"
        );
    }
    let (status, _) = server.get("/v1/health");
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn starts_that_cannot_serve_are_refused_with_the_reason() {
    let refused = |args: &[&str], mentions: &str| {
        let output = std::process::Command::new(sluice_tests::binary::sluice_binary())
            .args(["serve", "--port", "0", "-m"])
            .arg(sluice_tests::models::default_model())
            .args(args)
            .output()
            .expect("sluice runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(mentions) && !stderr.contains("panicked"), "{stderr}");
    };
    refused(&["--lora", "/no/such/adapter.gguf"], "LoRA adapter /no/such/adapter.gguf: ");
    refused(&["--lora-scaled", "/no/such/scaled.gguf:0.5"], "LoRA adapter /no/such/scaled.gguf: ");
    let output = std::process::Command::new(sluice_tests::binary::sluice_binary())
        .args(["serve", "--port", "0", "-m", "/no/such/model.gguf"])
        .output()
        .expect("sluice runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/no/such/model.gguf: cannot load the model"), "{stderr}");
    let output = std::process::Command::new(sluice_tests::binary::sluice_binary())
        .args(["serve", "--port", "0", "-m"])
        .arg(sluice_tests::models::default_model())
        .args(["-md", "/no/such/draft.gguf"])
        .output()
        .expect("sluice runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/no/such/draft.gguf: cannot use the draft model"), "{stderr}");
    assert!(!stderr.contains("draft context created"), "{stderr}");

    // A DFlash draft built for a 64-wide target: refused before any of its
    // context exists, and the server does not start.
    let draft = std::env::temp_dir().join(format!("sluice-narrow-dflash-{}.gguf", std::process::id()));
    let narrow = sluice_tests::gguf_writer::TinyModel::recipe("qwen3", 3).dflash(&[1, 2], 64, 4);
    std::fs::write(&draft, narrow.build()).expect("write draft");
    let output = std::process::Command::new(sluice_tests::binary::sluice_binary())
        .args(["serve", "--port", "0", "-m"])
        .arg(sluice_tests::models::default_model())
        .arg("-md")
        .arg(&draft)
        .output()
        .expect("sluice runs");
    std::fs::remove_file(&draft).expect("clean up");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("dflash.embedding_length = 64 differs from the target's hidden size 576"), "{stderr}");
    assert!(!stderr.contains("draft context created"), "{stderr}");
}
