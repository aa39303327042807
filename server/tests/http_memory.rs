//! What a request may make the server hold: probabilities per token are
//! capped, a non-streamed answer is bounded and written without a tree of
//! values, an unread stream holds about its window, a prompt far over the
//! context is refused before it is tokenized, and tokenizing a large text
//! costs about its output. Memory is read from the server's resident set
//! (`VmRSS`), sampled while the requests run; the bounds have wide margins,
//! and each states what the code before these bounds reached.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::{Server, config_file};

const MIB: u64 = 1 << 20;

fn start(name: &str, toml: &str, args: &[&str]) -> Server {
    let path = config_file(&format!("memory-{name}"), toml);
    Server::start(&[&["--config", path.to_str().expect("utf-8 path")], args].concat())
}

/// The server's resident memory, in bytes.
fn rss(server: &Server) -> u64 {
    server.rss_kib().expect("VmRSS") * 1024
}

/// Run `work` while sampling the server's memory every 10 ms; what it
/// returned and the most the server held above what it held before. A
/// server that grows past `bound` is killed at once (it is not waited out),
/// which fails the work.
fn peak_growth<T>(server: &Server, bound: u64, work: impl FnOnce() -> T) -> (T, u64) {
    let before = rss(server);
    let peak = AtomicU64::new(before);
    let done = AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                let now = rss(server);
                peak.fetch_max(now, Ordering::AcqRel);
                if now.saturating_sub(before) > bound {
                    eprintln!("the server grew by {} MiB, past the bound of {} MiB", (now - before) / MIB, bound / MIB);
                    server.signal("KILL");
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let result = work();
        done.store(true, Ordering::Release);
        result
    });
    let growth = peak.load(Ordering::Acquire).saturating_sub(before);
    assert!(growth <= bound, "the server grew by {} MiB (bound {} MiB)", growth / MIB, bound / MIB);
    (result, growth)
}

fn message(answer: &Value) -> &str {
    answer["error"]["message"].as_str().unwrap_or_default()
}

/// The start of an answer, for failure messages (an answer with
/// probabilities can be megabytes).
fn short(answer: &Value) -> String {
    answer.to_string().chars().take(400).collect()
}

#[test]
fn probabilities_past_the_cap_are_refused_naming_the_field_the_client_sent() {
    let server = Server::start(&["-np", "1", "-c", "512"]);
    let refusals = [
        ("/completion", json!({ "prompt": "Hi", "n_predict": 1, "n_probs": 1_000_000_000 }), "`n_probs`"),
        ("/v1/completions", json!({ "prompt": "Hi", "max_tokens": 1, "logprobs": 1_000_000_000 }), "`logprobs`"),
        ("/v1/completions", json!({ "prompt": "Hi", "max_tokens": 1, "logprobs": -1 }), "`logprobs`"),
        (
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": "Hi" }], "max_tokens": 1, "logprobs": true,
                    "top_logprobs": 101 }),
            "`top_logprobs`",
        ),
    ];
    for (path, body, field) in refusals {
        let (status, answer) = server.post(path, &body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {}", short(&answer));
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
        let message = message(&answer);
        assert!(message.contains(field), "{path}: {message}");
        if !message.contains("0 or more") {
            assert!(message.contains("100") && message.contains("server.limits.n_probs"), "{path}: {message}");
        }
    }
    // At the cap: served, each token listing exactly that many.
    let (status, answer) = server.post("/completion", &json!({ "prompt": "Hi", "n_predict": 2, "n_probs": 100 }));
    assert_eq!(status, StatusCode::OK, "{}", short(&answer));
    let probs = answer["completion_probabilities"].as_array().expect("probabilities");
    assert!(!probs.is_empty() && probs.iter().all(|entry| entry["top_logprobs"].as_array().map(Vec::len) == Some(100)));
}

#[test]
fn an_answer_that_is_not_streamed_is_bounded() {
    let server = start("answer", "[server.limits]\nresponse_mib = 1\n", &["-np", "1", "-c", "1024"]);
    let long = json!({ "prompt": "Once upon a time", "n_predict": 600, "ignore_eos": true, "n_probs": 100,
                       "temperature": 0 });
    // Certain to pass 1 MiB (600 tokens × 101 entries of at least 41
    // bytes): refused before it runs.
    let (status, answer) = server.post("/completion", &long);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", short(&answer));
    assert!(message(&answer).contains("server.limits.response_mib"), "{answer}");
    // Not certain (a stop word could end it), so it runs until it passes.
    let mut unsure = long.clone();
    unsure["stop"] = json!(["\u{1}never"]);
    let (status, answer) = server.post("/v1/completions", &unsure);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", short(&answer));
    assert!(message(&answer).contains("passed 1 MiB"), "{answer}");
}

#[test]
fn an_answer_that_is_not_streamed_holds_about_its_text() {
    // 250 tokens of 100 probabilities each (about 2.5 MB of JSON), written
    // from their text. Before: each token's list kept a 590 KB buffer and
    // the answer was built as a tree of values, +184 MiB at its peak.
    let server = Server::start(&["-np", "1", "-c", "1024"]);
    let body = json!({ "prompt": "Once upon a time", "n_predict": 250, "ignore_eos": true, "n_probs": 100 });
    let ((status, answer), growth) = peak_growth(&server, 64 * MIB, || server.post("/completion", &body));
    assert_eq!(status, StatusCode::OK, "{}", short(&answer));
    let probs = answer["completion_probabilities"].as_array().expect("probabilities");
    assert_eq!(probs.len(), 250);
    assert!(probs.iter().all(|entry| entry["top_logprobs"].as_array().map(Vec::len) == Some(100)));
    eprintln!("a 250-token answer with 100 probabilities per token: +{} MiB", growth / MIB);
}

#[test]
fn an_unread_stream_holds_about_its_window_and_is_ended_by_it() {
    // No send timeout: only the window ends the request.
    let toml = "[server.limits]\nstream_window_kib = 256\n[server.timeouts]\nsend_s = 0\n";
    let server = start("unread", toml, &["-np", "1", "-c", "4096"]);
    let address = server.url("").trim_start_matches("http://").to_owned();
    let body = json!({ "prompt": "Once upon a time", "stream": true, "n_predict": 4000, "ignore_eos": true,
                       "n_probs": 100 })
    .to_string();
    let head = format!(
        "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut unread = TcpStream::connect(&address).expect("connects");
    unread.write_all(format!("{head}{body}").as_bytes()).expect("writes");
    // Before: every unread token held a 590 KB buffer but counted 800
    // bytes, so the window let about 300 tokens hold 160 MiB.
    let (_, growth) = peak_growth(&server, 64 * MIB, || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while server.metric("llamacpp:requests_processing") > 0.0
            || server.metric("llamacpp:tokens_predicted_total") == 0.0
        {
            assert!(Instant::now() < deadline, "the unread stream still runs:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    eprintln!("an unread stream with a 256 KiB window: +{} MiB", growth / MIB);
    // Read on, it ends with the error that says why.
    unread.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut stream = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while !String::from_utf8_lossy(&stream[stream.len().saturating_sub(4096)..]).contains("unread") {
        let n = unread.read(&mut buf).expect("the stream goes on");
        assert!(n > 0, "the stream closed without saying why");
        stream.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&stream).contains("more than 256 KiB of its stream unread"));
}

/// A text of about `bytes`, of words and spaces as prose has.
fn prose(bytes: usize) -> String {
    "Write a story about the sea, and the ships that sail on it. ".repeat(bytes / 60 + 1)
}

#[test]
fn prompts_far_over_the_context_are_refused_before_they_are_tokenized() {
    let server = Server::start(&["-np", "4", "-c", "4096"]);
    let text = prose(10 << 20);
    let bodies = [
        ("/completion", json!({ "prompt": text, "n_predict": 1 })),
        ("/v1/completions", json!({ "prompt": [text], "max_tokens": 1 })),
        ("/v1/chat/completions", json!({ "messages": [{ "role": "user", "content": text }], "max_tokens": 1 })),
        ("/v1/messages", json!({ "messages": [{ "role": "user", "content": text }], "max_tokens": 1 })),
    ];
    // Four at once. Before: each was tokenized whole first, +3.9 GiB at the
    // peak for four.
    let server = &server;
    let (answers, growth) = peak_growth(server, 400 * MIB, || {
        std::thread::scope(|scope| {
            let running: Vec<_> =
                bodies.iter().map(|(path, body)| scope.spawn(move || (path, server.post(path, body)))).collect();
            running.into_iter().map(|running| running.join().expect("a client")).collect::<Vec<_>>()
        })
    });
    for (path, (status, answer)) in answers {
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
        assert_eq!(answer["error"]["type"], "exceed_context_size_error", "{path}: {answer}");
        assert_eq!(answer["error"]["n_ctx"], 1024, "{path}: {answer}");
        assert!(answer["error"]["n_prompt_tokens"].as_u64().is_some_and(|n| n >= 1024), "{path}: {answer}");
    }
    eprintln!("four 10 MB prompts: +{} MiB", growth / MIB);
    // A prompt that fits is still served.
    let (status, answer) = server.post("/completion", &json!({ "prompt": prose(2000), "n_predict": 1 }));
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[test]
fn tokenizing_a_large_text_costs_about_its_answer() {
    let server = Server::start(&["-np", "1", "-c", "512"]);
    let text = prose(4 << 20);
    let body = json!({ "content": text, "with_pieces": true });
    // Before: +1.9 GiB for two (each text tokenized at once, each token a
    // map of values).
    let (answers, growth) = peak_growth(&server, 400 * MIB, || {
        std::thread::scope(|scope| {
            let running: Vec<_> = (0..2).map(|_| scope.spawn(|| server.post("/tokenize", &body))).collect();
            running.into_iter().map(|running| running.join().expect("a client")).collect::<Vec<_>>()
        })
    });
    eprintln!("two 4 MB texts tokenized with pieces: +{} MiB", growth / MIB);
    let (_, plain) = server.post("/tokenize", &json!({ "content": text }));
    let ids = plain["tokens"].as_array().expect("ids");
    for (status, answer) in answers {
        assert_eq!(status, StatusCode::OK, "{}", short(&answer));
        let pieces = answer["tokens"].as_array().expect("pieces");
        assert_eq!(pieces.len(), ids.len());
        let joined: String = pieces.iter().map(|piece| piece["piece"].as_str().unwrap_or_default()).collect();
        assert_eq!(joined, text);
        assert!(pieces.iter().zip(ids).all(|(piece, id)| piece["id"] == *id));
    }
}

#[test]
fn tokenizer_answers_past_the_answer_limit_are_refused() {
    let server = start("tokenizer-answers", "[server.limits]\nresponse_mib = 1\n", &["-np", "1", "-c", "512"]);
    // 200,000 single characters of punctuation: about a token each.
    let text = "!?".repeat(100_000);
    let (status, answer) = server.post("/tokenize", &json!({ "content": text, "with_pieces": true }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", short(&answer));
    assert!(message(&answer).contains("server.limits.response_mib"), "{}", short(&answer));
    // Without pieces, a few bytes a token: within the megabyte.
    let (status, answer) = server.post("/tokenize", &json!({ "content": text }));
    assert_eq!(status, StatusCode::OK, "{}", short(&answer));
    let ids = answer["tokens"].as_array().expect("ids").clone();
    // Their text, ten times over: 2 MB.
    let many: Vec<Value> = ids.iter().cycle().take(ids.len() * 10).cloned().collect();
    let (status, answer) = server.post("/detokenize", &json!({ "tokens": many }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", short(&answer));
    assert!(message(&answer).contains("server.limits.response_mib"), "{}", short(&answer));
    let (status, answer) = server.post("/detokenize", &json!({ "tokens": ids }));
    assert_eq!(status, StatusCode::OK, "{}", short(&answer));
    assert_eq!(answer["content"], text);
}
