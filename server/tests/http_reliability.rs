//! What a careless or hostile client cannot do to the server: hold
//! connections open with half a request or an unread stream, get a bare
//! answer without a JSON error, or make a client error look like a server
//! error; and what every client gets when the server stops.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::{Server, config_file};
use sluice_tests::raw::{address, answer_json, post_head, raw, read_until_closed};

fn start(name: &str, toml: &str, args: &[&str]) -> Server {
    let path = config_file(&format!("reliability-{name}"), toml);
    Server::start(&[&["--config", path.to_str().expect("utf-8 path")], args].concat())
}

const TIMEOUTS: &str = "[server.timeouts]\nheader_s = 1\nidle_s = 2\nsend_s = 2\n";

#[test]
fn slow_and_silent_clients_are_closed_by_the_timeouts_without_holding_up_others() {
    let server = start("slow", TIMEOUTS, &["-np", "2", "-c", "8192"]);
    let address = address(&server);
    // Half a request line on each (slowloris), and connections that send nothing.
    let mut slow: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut stream = TcpStream::connect(address).expect("connects");
            stream.write_all(b"POST /completion HTT").expect("writes");
            stream
        })
        .collect();
    let mut silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(address).expect("connects")).collect();
    // A streamer that never reads, with large events.
    let mut unread = TcpStream::connect(address).expect("connects");
    // Left alone it would run for minutes.
    let body = json!({ "prompt": "Once upon a time", "stream": true, "n_predict": 8000, "ignore_eos": true,
                       "n_probs": 4000 })
    .to_string();
    let head = format!(
        "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    unread.write_all(format!("{head}{body}").as_bytes()).expect("writes");

    // Meanwhile a normal request is served.
    let (status, answer) = server.post("/completion", &json!({ "prompt": "Hello", "n_predict": 4 }));
    assert_eq!(status, StatusCode::OK, "{answer}");

    for stream in slow.iter_mut().chain(silent.iter_mut()) {
        let closed = read_until_closed(stream, Duration::from_secs(20));
        assert_eq!(closed.as_deref(), Some(""), "closed by the header or idle timeout, with nothing sent");
    }
    // The unread stream's request is cancelled and its slot freed: by the
    // send timeout, or by the stream window if that fills first.
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.metric("llamacpp:requests_processing") > 0.0 {
        assert!(Instant::now() < deadline, "the unread stream still runs:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    server.wait_idle();
    drop(unread);

    // A kept-alive connection is closed once idle, after its answer.
    let mut kept = TcpStream::connect(address).expect("connects");
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").expect("writes");
    let answer = read_until_closed(&mut kept, Duration::from_secs(20)).expect("closed when idle");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn answers_hyper_gives_before_routing_carry_json_errors() {
    let server = Server::start(&["-np", "1", "-c", "512"]);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    // (A head over hyper's buffer gets 431 the same way, but hyper closes
    // with the rest of it unread, and the reset that sends may discard the
    // answer before the client reads it: not a stable test.)
    for (request, status) in [(long_uri.as_bytes(), 414), (&b"GARBAGE\r\n\r\n"[..], 400)] {
        let (code, body) = answer_json(&raw(&server, request));
        assert_eq!(code, status);
        assert_eq!(body["error"]["code"], status, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
    // The server goes on serving.
    assert_eq!(server.get("/health").0, StatusCode::OK);
}

#[test]
fn a_declared_length_over_the_limit_is_refused_at_once() {
    let server = start("declared", "[server.limits]\nbody_bytes = 4096\n", &["-np", "1", "-c", "512"]);
    for length in [1_000_000_000_000u64, 4097] {
        let mut stream = TcpStream::connect(address(&server)).expect("connects");
        // A few bytes of the body; the rest never comes.
        stream
            .write_all(format!("{}{{\"prompt\":\"a\"}}", post_head("/completion", length, None)).as_bytes())
            .expect("writes");
        // Well within the body timeout (60 s), which is what a refusal
        // that waits for the body would take.
        let answer = read_until_closed(&mut stream, Duration::from_secs(5)).expect("answered and closed at once");
        let (status, body) = answer_json(&answer);
        assert_eq!(status, 413, "{answer}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("4096 bytes")), "{body}");
    }
    // A length within the limit is read as before.
    let body = json!({ "prompt": "Hi", "n_predict": 1 }).to_string();
    let (status, _) =
        answer_json(&raw(&server, format!("{}{body}", post_head("/completion", body.len() as u64, None)).as_bytes()));
    assert_eq!(status, 200);
}

#[test]
fn client_mistakes_are_400s_naming_the_field_and_id_slot_pins_the_slot() {
    let server = start("client", "[engine]\nqueue_limit = 2\n", &["-np", "2", "-c", "512"]);
    let chat = |messages: Value| server.post("/v1/chat/completions", &json!({ "messages": messages, "max_tokens": 2 }));
    let (status, answer) = chat(json!([{ "role": "user" }]));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("messages[0].content")), "{answer}");
    let (status, answer) =
        chat(json!([{ "role": "system", "content": "Be brief." }, { "role": "user", "content": null }]));
    assert_eq!(status, StatusCode::OK, "null content is no text, as in llama.cpp: {answer}");
    let (status, answer) = server.post("/apply-template", &json!({ "messages": [{ "role": "user" }] }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

    let (status, answer) = chat(json!([{ "role": "user", "content": [[[[1]]]] }]));
    assert_eq!(status, StatusCode::BAD_REQUEST, "a malformed part is a mistake, not a missing feature: {answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("messages[0].content[0]")), "{answer}");

    for logprobs in [json!("x"), json!(-1)] {
        let body = json!({ "prompt": "Hi", "logprobs": logprobs, "max_tokens": 1 });
        let (status, answer) = server.post("/v1/completions", &body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("`logprobs`")), "{answer}");
    }
    for bias in [json!([[1, "x"]]), json!({ "1": { "x": 1 } }), json!([[1, true]])] {
        let (status, answer) =
            server.post("/completion", &json!({ "prompt": "Hi", "logit_bias": bias, "n_predict": 1 }));
        assert_eq!(status, StatusCode::BAD_REQUEST, "a bias that would do nothing is refused: {answer}");
        assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("logit_bias")), "{answer}");
    }

    // Three prompts never fit a queue of two: retrying would not help.
    let (status, answer) = server.post("/completion", &json!({ "prompt": ["a", "b", "c"], "n_predict": 1 }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("queue_limit")), "{answer}");

    let (status, answer) = server.post("/completion", &json!({ "prompt": "Hi", "id_slot": 2, "n_predict": 1 }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    // An idle server would put every request in slot 0; one naming slot 1 runs there.
    for _ in 0..3 {
        let (status, answer) = server.post("/completion", &json!({ "prompt": "Hi", "id_slot": 1, "n_predict": 2 }));
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["id_slot"], 1, "{answer}");
    }
}

#[test]
fn a_stop_signal_ends_what_the_grace_could_not_finish_and_exits_non_zero() {
    let toml = "[server.timeouts]\nshutdown_s = 1\n";
    let mut server = start("shutdown", toml, &["-np", "1", "-c", "4096"]);
    let long = json!({ "prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": true });
    let mut running = server.open_stream("/completion", &streaming(&long));
    assert!(running.next_data().is_some(), "the first token");
    let queued = std::thread::scope(|scope| {
        let plain = scope.spawn(|| server.post("/completion", &long));
        let streamed = scope.spawn(|| server.stream("/completion", &streaming(&long)));
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.metric("llamacpp:requests_deferred") < 2.0 {
            assert!(Instant::now() < deadline, "the two did not queue:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        server.signal("TERM");
        // New connections are refused once the signal is taken.
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(address(&server)).is_ok() {
            assert!(Instant::now() < deadline, "still accepting after SIGTERM:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        (plain.join().expect("plain client"), streamed.join().expect("streaming client"))
    });
    // The running stream ends with an error event, not a cut.
    let mut last = None;
    while let Some(data) = running.next_data() {
        last = Some(data);
    }
    let last: Value = serde_json::from_str(&last.expect("events")).expect("JSON");
    assert_eq!(last["error"]["type"], "unavailable_error", "{last}");
    // The queued ones get 503s; the queued stream, held past the hold
    // notice (its headers are out), gets the same error as its one event.
    let ((status, plain), streamed) = queued;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{plain}");
    assert_eq!(plain["error"]["type"], "unavailable_error", "{plain}");
    assert_eq!(streamed.status, StatusCode::OK, "{:?}", streamed);
    assert_eq!(streamed.events.len(), 1, "{:?}", streamed);
    assert_eq!(streamed.events[0]["error"]["type"], "unavailable_error", "{:?}", streamed);
    assert_eq!(server.wait_exit(Duration::from_secs(30)), Some(1), "{}", server.log());
    assert!(server.log().contains("were ended with an error"), "{}", server.log());
}

/// `body` as a streaming request.
fn streaming(body: &Value) -> Value {
    let mut body = body.clone();
    body["stream"] = json!(true);
    body
}
