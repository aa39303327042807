//! A stop signal while a stream runs: the listeners close at once (a new
//! connection is refused, not left waiting), the running stream ends with
//! an error event or its last event when the grace runs out, and the
//! server exits.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Report;
use crate::http::Server;
use crate::raw::address;

/// How soon after the signal a new connection must be refused.
const REFUSED_WITHIN: Duration = Duration::from_secs(2);

/// Stop `server` (started with `--api-key key`) with SIGTERM while
/// a long stream runs; `grace` is its `server.timeouts.shutdown_s`.
pub fn shutdown(server: &mut Server, key: &str, grace: Duration, report: &mut Report) {
    let category = "shutdown";
    let body = json!({ "prompt": "Once upon a time", "stream": true, "n_predict": 100_000, "ignore_eos": true });
    let response = match server.client().post(server.url("/completion")).bearer_auth(key).json(&body).send() {
        Ok(response) => response,
        Err(error) => return report.fail(category, format!("the long stream did not start: {error}")),
    };
    report.count(category, &response.status().as_u16().to_string());
    let mut events = crate::http::SseReader::from_response(response);
    if events.next_data().is_none() {
        return report.fail(category, "the long stream sent nothing");
    }
    let target_address = address(server);
    server.signal("TERM");
    let signalled = Instant::now();
    let refused = loop {
        match TcpStream::connect(target_address) {
            Err(_) => break Some(signalled.elapsed()),
            Ok(_) if signalled.elapsed() > REFUSED_WITHIN => break None,
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    report.count(category, if refused.is_some() { "connection refused" } else { "connection accepted" });
    match refused {
        None => report.fail(
            category,
            format!("a new connection was still accepted {} s after SIGTERM", REFUSED_WITHIN.as_secs()),
        ),
        // Refused because the process is gone is not the point.
        Some(_) if !server.is_running() && grace > REFUSED_WITHIN => {
            report.fail(category, "the server exited at once instead of letting the stream run out its grace")
        }
        Some(_) => {}
    }
    let mut last = None;
    while let Some(data) = events.next_data() {
        last = Some(data);
    }
    let last: Value = last.and_then(|data| serde_json::from_str(&data).ok()).unwrap_or(Value::Null);
    let ended = last["error"]["type"] == "unavailable_error" || last["stop"] == true;
    if !ended {
        report.fail(category, format!("the running stream ended without an error event or its last event: {last}"));
    }
    match server.wait_exit(grace + Duration::from_secs(20)) {
        Some(0 | 1) => {}
        code => report.fail(category, format!("the server exited with {code:?}")),
    }
}
