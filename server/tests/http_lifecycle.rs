//! Slots, metrics and the informational endpoints over real HTTP: a client
//! that goes away frees its slot and KV blocks; `/metrics` moves as
//! llama-server's does; `/props`, `/v1/models`, `/slots`, `/tokenize`,
//! `/detokenize`, `/apply-template`, `/lora-adapters`.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::{Server, config_file};

#[test]
fn a_disconnect_mid_stream_frees_the_slot() {
    let server = Server::start(&["-np", "1"]);
    let body =
        json!({ "prompt": "Count to one thousand: 1, 2, 3,", "n_predict": 4000, "ignore_eos": true, "stream": true });
    let mut stream = server.open_stream("/completion", &body);
    for _ in 0..3 {
        let chunk = stream.next_data().expect("a chunk");
        assert!(chunk.contains("\"stop\":false"), "{chunk}");
    }
    let (_, slots) = server.get("/slots");
    assert_eq!(slots[0]["is_processing"], true, "{slots}");
    assert_eq!(slots[0]["phase"], "decoding", "{slots}");
    assert_eq!(slots[0]["policy"], "chunked", "{slots}");
    assert!(server.metric("sluice_kv_blocks_used") > 0.0);
    drop(stream);

    server.wait_idle();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("sluice_kv_blocks_used") != 0.0 {
        assert!(Instant::now() < deadline, "KV blocks still used after the client left\n{}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.metric("llamacpp:requests_processing"), 0.0);
    let (status, answer) = server.post("/completion", &json!({ "prompt": "Hello", "n_predict": 2 }));
    assert_eq!(status, StatusCode::OK, "the slot serves again: {answer}");

    // A client that gives up on a non-streamed answer cancels it too.
    let mut long = body.clone();
    long["stream"] = json!(false);
    let gave_up =
        server.client().post(server.url("/completion")).json(&long).timeout(Duration::from_millis(1500)).send();
    assert!(gave_up.is_err_and(|error| error.is_timeout()));
    server.wait_idle();
    assert_eq!(server.metric("sluice_kv_blocks_used"), 0.0);
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let dir = scratch("queue");
    let config = dir.join("queue.toml");
    std::fs::write(&config, "[engine]\nslots = 1\nqueue_limit = 1\n").expect("config");
    let server = Server::start(&["--config", config.to_str().expect("utf-8 path")]);
    let body = json!({ "prompt": "Count to one thousand:", "n_predict": 4000, "ignore_eos": true, "stream": true });
    let mut running = server.open_stream("/completion", &body);
    running.next_data().expect("the first request runs");
    std::thread::scope(|scope| {
        // The second waits for the slot (its answer starts only with its
        // first token, so it waits on its own thread).
        let waiting = scope.spawn(|| server.client().post(server.url("/completion")).json(&body).send());
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.metric("llamacpp:requests_deferred") < 1.0 {
            assert!(Instant::now() < deadline, "the second request never queued\n{}", server.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        let refused = server.client().post(server.url("/completion")).json(&body).send().expect("answered");
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(refused.headers().contains_key("retry-after"), "{:?}", refused.headers());
        let error: Value = refused.json().expect("JSON error");
        assert_eq!(error["error"]["type"], "unavailable_error", "{error}");
        drop(running);
        let mut second = waiting.join().expect("second request thread").expect("second request answered");
        assert_eq!(second.status(), StatusCode::OK);
        let mut first_chunk = [0u8; 16];
        std::io::Read::read(&mut second, &mut first_chunk).expect("the second request streams");
    });
    server.wait_idle();
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn metrics_move_as_llama_server_s_do() {
    let server = Server::start(&[]);
    let text = server.client().get(server.url("/metrics")).send().expect("metrics");
    assert!(text.headers()["content-type"].to_str().expect("type").starts_with("text/plain; version=0.0.4"));
    let text = text.text().expect("body");
    for (name, kind) in [
        ("llamacpp:prompt_tokens_total", "counter"),
        ("llamacpp:prompt_tokens_cached_total", "counter"),
        ("llamacpp:prompt_seconds_total", "counter"),
        ("llamacpp:tokens_predicted_total", "counter"),
        ("llamacpp:tokens_predicted_seconds_total", "counter"),
        ("llamacpp:n_decode_total", "counter"),
        ("llamacpp:n_tokens_max", "counter"),
        ("llamacpp:prompt_tokens_seconds", "gauge"),
        ("llamacpp:predicted_tokens_seconds", "gauge"),
        ("llamacpp:requests_processing", "gauge"),
        ("llamacpp:requests_deferred", "gauge"),
        ("llamacpp:n_busy_slots_per_decode", "gauge"),
        ("sluice_policy_call_seconds", "histogram"),
        ("sluice_policy_faults_total", "counter"),
        ("sluice_kv_blocks_used", "gauge"),
        ("sluice_kv_blocks_free", "gauge"),
        ("sluice_kv_window_blocks_used", "gauge"),
        ("sluice_kv_window_blocks_free", "gauge"),
        ("sluice_prefix_cache_hit_tokens_total", "counter"),
        ("sluice_step_tokens_total", "counter"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name} {kind} missing:\n{text}");
        assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP");
    }

    let before = |name: &str| server.metric(name);
    let prompt_tokens = before("llamacpp:prompt_tokens_total");
    let predicted = before("llamacpp:tokens_predicted_total");
    let decodes = before("llamacpp:n_decode_total");
    let calls = before("sluice_policy_call_seconds_count");
    let prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. Again:";
    let body = json!({ "prompt": prompt, "n_predict": 8, "ignore_eos": true, "temperature": 0 });
    let (status, answer) = server.post("/completion", &body);
    assert_eq!(status, StatusCode::OK, "{answer}");
    let timings = &answer["timings"];
    let count = |value: &Value| value.as_f64().expect("a number");
    assert_eq!(server.metric("llamacpp:prompt_tokens_total") - prompt_tokens, count(&timings["prompt_n"]));
    assert_eq!(server.metric("llamacpp:tokens_predicted_total") - predicted, count(&timings["predicted_n"]));
    assert!(server.metric("llamacpp:n_decode_total") - decodes >= 8.0);
    assert!(server.metric("llamacpp:prompt_seconds_total") > 0.0);
    assert!(server.metric("llamacpp:tokens_predicted_seconds_total") > 0.0);
    assert!(server.metric("llamacpp:n_tokens_max") >= count(&answer["tokens_evaluated"]));
    assert!(server.metric("sluice_policy_call_seconds_count") > calls);
    assert_eq!(server.metric("llamacpp:requests_processing"), 0.0);
    assert_eq!(server.metric("llamacpp:requests_deferred"), 0.0);
    // Throughput gauges cover the window since the previous scrape.
    assert!(server.metric("llamacpp:prompt_tokens_seconds") >= 0.0);

    let cached_before = server.metric("llamacpp:prompt_tokens_cached_total");
    let (_, again) = server.post("/completion", &body);
    let cache_n = count(&again["timings"]["cache_n"]);
    assert!(cache_n > 0.0, "{again}");
    assert_eq!(server.metric("llamacpp:prompt_tokens_cached_total") - cached_before, cache_n);
    assert_eq!(again["content"], answer["content"]);
}

#[test]
fn informational_endpoints_answer_like_llama_server() {
    // llama-server's -c: the whole context, split between the -np slots.
    let server = Server::start(&["-np", "2", "-c", "512", "--alias", "smol"]);
    let (status, props) = server.get("/props");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(props["total_slots"], 2, "{props}");
    assert_eq!(props["model_alias"], "smol");
    assert_eq!(props["default_generation_settings"]["n_ctx"], 256);
    let params = &props["default_generation_settings"]["params"];
    assert_eq!((params["top_k"].clone(), params["n_predict"].clone()), (json!(40), json!(-1)), "{params}");
    assert!((params["temperature"].as_f64().expect("temperature") - 0.8).abs() < 1e-6);
    assert!((params["min_p"].as_f64().expect("min_p") - 0.05).abs() < 1e-6);
    assert_eq!(params["repeat_penalty"], 1.0);
    assert_eq!((props["ui"].clone(), props["endpoint_metrics"].clone()), (json!(false), json!(true)), "{props}");
    assert_eq!(props["policy"]["name"], "chunked");
    assert_eq!(props["policy"]["health"], "ok");
    assert!(props["chat_template"].as_str().is_some_and(|template| template.contains("im_start")));
    let (status, refused) = server.post("/props", &json!({}));
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{refused}");
    assert_eq!(refused["error"]["type"], "not_supported_error");

    for path in ["/v1/models", "/models"] {
        let (status, models) = server.get(path);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(models["object"], "list");
        assert_eq!(models["data"][0]["id"], "smol");
        assert_eq!(models["data"][0]["meta"]["n_ctx"], 256);
        assert!(models["data"][0]["meta"]["n_params"].as_u64().is_some_and(|n| n > 100_000_000));
    }

    let (status, slots) = server.get("/slots?fail_on_no_slot=1");
    assert_eq!(status, StatusCode::OK, "{slots}");
    let slots = slots.as_array().expect("an array");
    assert_eq!(slots.len(), 2);
    for (id, slot) in slots.iter().enumerate() {
        assert_eq!(
            (slot["id"].clone(), slot["n_ctx"].clone(), slot["is_processing"].clone()),
            (json!(id), json!(256), json!(false))
        );
    }

    let (_, tokens) = server.post("/tokenize", &json!({ "content": "Hello world" }));
    let ids = tokens["tokens"].as_array().expect("tokens").clone();
    assert!(!ids.is_empty());
    let (_, text) = server.post("/detokenize", &json!({ "tokens": ids }));
    assert_eq!(text["content"], "Hello world");
    let (_, pieces) = server.post("/tokenize", &json!({ "content": "Hello world", "with_pieces": true }));
    let pieces = pieces["tokens"].as_array().expect("pieces");
    let joined: String = pieces.iter().map(|piece| piece["piece"].as_str().expect("piece")).collect();
    assert_eq!(joined, "Hello world");
    assert!(pieces.iter().zip(&ids).all(|(piece, id)| &piece["id"] == id));
    let (_, special) = server.post("/tokenize", &json!({ "content": "<|im_start|>", "parse_special": true }));
    assert_eq!(special["tokens"].as_array().map(Vec::len), Some(1), "{special}");
    let (_, plain) = server.post("/tokenize", &json!({ "content": "<|im_start|>", "parse_special": false }));
    assert!(plain["tokens"].as_array().is_some_and(|tokens| tokens.len() > 1), "{plain}");

    let messages = json!([{"role": "user", "content": "Hi there"}]);
    let (status, template) = server.post("/apply-template", &json!({ "messages": messages }));
    assert_eq!(status, StatusCode::OK, "{template}");
    let prompt = template["prompt"].as_str().expect("prompt");
    assert!(
        prompt.contains("<|im_start|>user\nHi there<|im_end|>") && prompt.ends_with("<|im_start|>assistant\n"),
        "{prompt}"
    );

    let (status, adapters) = server.get("/lora-adapters");
    assert_eq!((status, adapters), (StatusCode::OK, json!([])));
    let (status, _) = server.post("/lora-adapters", &json!([]));
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn aliases_tags_and_the_metrics_switch_follow_llama_server() {
    let server = Server::start_plain(&["--alias", " b-name,a-name,,b-name", "--tags", "chat,small"]);
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, StatusCode::OK);
    let model = &models["data"][0];
    assert_eq!(model["id"], "a-name", "the first alias in sorted order: {model}");
    assert_eq!(
        (model["aliases"].clone(), model["tags"].clone()),
        (json!(["a-name", "b-name"]), json!(["chat", "small"]))
    );
    assert_eq!(server.get("/props").1["model_alias"], "a-name");
    let (status, refused) = server.get("/metrics");
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "off until --metrics: {refused}");
}

/// A policy whose first decision is invalid (it decodes a slot that does
/// not exist), on every fresh instance too: it faults twice and is
/// quarantined on the first request.
fn faulty_policy(dir: &std::path::Path) -> std::path::PathBuf {
    use sluice_tests::plugin_fixtures::{BENIGN, OK, SCHEDULER_WIT, componentize, policy_module, version};
    let path = dir.join("faulty.wasm");
    std::fs::write(&path, componentize(&policy_module(version(), BENIGN, OK, ""), SCHEDULER_WIT, "scheduler"))
        .expect("write plugin");
    path
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-http-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn a_failed_closed_policy_refuses_with_503_until_an_admin_reload() {
    let dir = scratch("fail-closed");
    let policy = faulty_policy(&dir);
    let policy = policy.to_str().expect("utf-8 path");
    let server = Server::start(&["--policy", policy, "--api-key", "k"]);
    let client = server.client();
    let completion = json!({ "prompt": "Hello", "n_predict": 2 });
    let post = |path: &str, body: &Value| server.send(client.post(server.url(path)).bearer_auth("k").json(body));

    let (status, refused) = post("/completion", &completion);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(refused["error"]["type"], "unavailable_error");
    assert!(refused["error"]["message"].as_str().is_some_and(|message| message.contains(policy)), "{refused}");
    let (status, health) = server.get("/health");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{health}");
    assert_eq!(health["error"]["type"], "unavailable_error");
    assert_eq!(health["error"]["policy"], policy);
    assert!(health["error"]["fault"].as_str().is_some_and(|fault| !fault.is_empty()), "{health}");
    let mut streamed = completion.clone();
    streamed["stream"] = json!(true);
    let (status, _) = post("/completion", &streamed);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "before the first token a stream fails as plain HTTP");
    let metrics = client.get(server.url("/metrics")).bearer_auth("k").send().and_then(|r| r.text()).expect("metrics");
    let faults = format!("sluice_policy_faults_total{{policy=\"{policy}\",reason=\"invalid\"}} 2\n");
    assert!(metrics.contains(&faults), "{faults} missing:\n{metrics}");
    assert!(metrics.contains("sluice_policy_failed_closed 1\n"), "{metrics}");

    let (status, answer) = post("/admin/policy", &json!({ "policy": "continuous" }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, health) = server.get("/health");
    assert_eq!((status, health), (StatusCode::OK, json!({"status": "ok"})));
    let (status, answer) = post("/completion", &completion);
    assert_eq!(status, StatusCode::OK, "service resumes: {answer}");

    // Another policy comes with its own settings; bad ones are refused and
    // the running policy stays.
    let (status, answer) = post("/admin/policy", &json!({ "policy": "cohort", "settings": { "max_members": 2 } }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    let props =
        client.get(server.url("/props")).bearer_auth("k").send().and_then(|r| r.json::<Value>()).expect("props");
    assert_eq!(props["policy"]["name"], "cohort");
    assert_eq!(props["policy"]["settings"], json!({ "max_members": 2 }));
    let (status, refused) = post("/admin/policy", &json!({ "policy": "cohort", "settings": { "max_members": 0 } }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("max_members")), "{refused}");
    let (status, refused) = post("/admin/policy", &json!({ "policy": "cohort", "settings": [1] }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, answer) = post("/completion", &completion);
    assert_eq!(status, StatusCode::OK, "the cohort policy serves: {answer}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_fallback_policy_reports_degraded_and_serves() {
    let dir = scratch("fallback");
    let policy = faulty_policy(&dir);
    let config = dir.join("fallback.toml");
    std::fs::write(
        &config,
        format!("[policy]\nplugin = {:?}\non_fault = \"fallback\"\n", policy.display().to_string()),
    )
    .expect("config");
    let server = Server::start(&["--config", config.to_str().expect("utf-8 path")]);
    let (status, answer) = server.post("/completion", &json!({ "prompt": "Hello", "n_predict": 2 }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, health) = server.get("/health");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["status"], "degraded", "{health}");
    let label = format!("sluice_policy_faults_total{{policy=\"{}\",reason=\"invalid\"}}", policy.display());
    assert_eq!(server.metric(&label), 2.0);
    assert_eq!(server.metric("sluice_policy_degraded"), 1.0);
    assert_eq!(server.metric("sluice_policy_fallbacks_total"), 1.0);
    let (_, props) = server.get("/props");
    assert_eq!(props["policy"]["name"], "continuous");
    assert_eq!(props["policy"]["health"], "degraded");
    // The fault journal: a retry on a fresh instance, then the fallback.
    let faults = props["policy"]["faults"].as_array().expect("faults[]");
    let actions: Vec<&str> = faults.iter().filter_map(|fault| fault["action"].as_str()).collect();
    assert_eq!(actions, ["retry", "fallback"], "{props}");
    assert!(faults.iter().all(|fault| fault["reason"] == "invalid" && fault["step"] == 0), "{props}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn sighup_reloads_the_policy_and_sigterm_stops_the_server() {
    let dir = scratch("signals");
    let config = dir.join("sluice.toml");
    std::fs::write(&config, "[policy]\nplugin = \"continuous\"\n").expect("config");
    let mut server = Server::start(&["--config", config.to_str().expect("utf-8 path")]);
    server.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.log().contains("SIGHUP: policy reloaded") {
        assert!(Instant::now() < deadline, "no reload logged:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // A config made invalid is refused and the running policy stays.
    std::fs::write(&config, "[policy]\nplugin = \"fastest\"\n").expect("config");
    server.signal("HUP");
    while !server.log().contains("policy not reloaded") {
        assert!(Instant::now() < deadline, "no refusal logged:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = server.post("/completion", &json!({ "prompt": "Hello", "n_predict": 2 }));
    assert_eq!(status, StatusCode::OK);
    server.signal("TERM");
    assert_eq!(server.wait_exit(Duration::from_secs(30)), Some(0), "{}", server.log());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A stream held in the queue behind a long request gets its headers and a
/// `: waiting` comment before its first token (`server.hold_notice_ms`),
/// then its tokens once a slot frees.
#[test]
fn a_held_stream_gets_its_headers_and_a_waiting_comment_before_its_first_token() {
    use std::io::{BufRead, BufReader};
    let config = config_file("hold-notice", "[server]\nhold_notice_ms = 0\n");
    let server = Server::start(&["--config", config.to_str().expect("utf-8 path"), "-np", "1"]);
    let first_line = |body: &Value| {
        let response = server.client().post(server.url("/completion")).json(body).send().expect("stream");
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        let mut lines = BufReader::new(response).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        (first, lines)
    };
    let stream = json!({ "prompt": "Hello", "n_predict": 4, "stream": true, "cache_prompt": false });
    let long = json!({ "prompt": "Once upon a time", "n_predict": 400, "ignore_eos": true });
    std::thread::scope(|scope| {
        let running = scope.spawn(|| server.post("/completion", &long).0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.get("/slots").1[0]["is_processing"] != true {
            assert!(Instant::now() < deadline, "the long request never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (first, lines) = first_line(&stream);
        assert_eq!(first, ": waiting", "the held stream's first line");
        assert_eq!(server.get("/slots").1[0]["is_processing"], true, "still held behind the long request");
        let data: Vec<String> = lines.map_while(Result::ok).filter(|line| line.starts_with("data: ")).collect();
        assert!(data.len() >= 2 && data.last().is_some_and(|last| last.contains("\"stop\":true")), "{data:?}");
        assert_eq!(running.join().expect("long request"), StatusCode::OK);
    });
    std::fs::remove_dir_all(config.parent().expect("its folder")).expect("clean up");
}
