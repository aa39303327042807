//! The hostile-client battery: what a careless or hostile client sends to a
//! running server, with what every answer must be. Each category is a
//! function over a [`Target`] (a running server and what it serves), so
//! that whatever adds endpoints, model families, caches or backends runs
//! the same battery on them (`server/tests/battery.rs` runs it on the
//! default model):
//!
//! - [`bad_inputs`]: malformed bodies on every route, every known field of
//!   each endpoint set to values of every wrong type and edge, and named
//!   hostile requests (deep grammars, huge `n_probs`, wrong shapes) with
//!   the status and the field their answer must name;
//! - [`protocol`]: what arrives before routing (declared lengths never
//!   sent, oversized bodies, targets and heads, not-HTTP) and the API key;
//! - [`memory`]: requests built to make the server hold gigabytes
//!   (oversized prompts at once, probabilities of the whole vocabulary,
//!   streams nobody reads), with the resident memory sampled against a
//!   bound;
//! - [`shutdown`]: a stop signal with requests running and queued.
//!
//! Every answer of every category is held to the same rules (`check`):
//! no 5xx but 501 and 503, every error a JSON object whose message leaks
//! no panic, backtrace, source location or parser dump, every stream
//! well framed, and the server still up afterwards.

mod inputs;
mod memory;
mod protocol;
mod shutdown;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use reqwest::blocking::{Client, RequestBuilder};
use serde_json::Value;

use crate::http::Server;

pub use inputs::bad_inputs;
pub use memory::{MemoryBounds, memory};
pub use protocol::protocol;
pub use shutdown::shutdown;

/// The server under test and what it serves.
pub struct Target<'a> {
    pub server: &'a Server,
    /// The API key the server was started with (`--api-key`).
    pub key: &'a str,
    /// Context of one slot, in tokens.
    pub slot_ctx: usize,
    /// The largest `n_probs` the server takes (`server.limits.n_probs`).
    pub n_probs_cap: usize,
    /// The body limit (`server.limits.body_bytes`).
    pub body_limit: usize,
    /// Routes the target serves beyond the default set (a new endpoint
    /// adds its path and a valid body; [`bad_inputs`] mutates it too).
    pub extra_routes: Vec<(String, Value)>,
    /// A folder of the server's `policy.plugin_dir` with nothing in it that
    /// should load, or `None` when the server has none.
    pub plugin_dir: Option<std::path::PathBuf>,
}

/// Bound on one request of the battery: past it the request counts as hung.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

impl Target<'_> {
    /// A client that sends the API key, a fresh connection per request (a
    /// server may close a connection whose body it refused unread).
    fn client(&self) -> Client {
        let mut headers = reqwest::header::HeaderMap::new();
        let bearer = format!("Bearer {}", self.key);
        headers.insert(reqwest::header::AUTHORIZATION, bearer.parse().expect("an ASCII key"));
        Client::builder()
            .default_headers(headers)
            .timeout(REQUEST_TIMEOUT)
            .pool_max_idle_per_host(0)
            .build()
            .expect("an HTTP client")
    }
}

/// How many requests of a category got which status, and what broke the rules.
#[derive(Debug, Default)]
pub struct Report {
    categories: BTreeMap<String, Tally>,
    failures: Vec<String>,
}

#[derive(Debug, Default, Clone)]
struct Tally {
    sent: usize,
    /// By answer: a status, or what happened instead.
    answers: BTreeMap<String, usize>,
}

impl Report {
    /// Record the answer of one request of `category`: its status, or
    /// what happened instead.
    fn count(&mut self, category: &str, answer: &str) {
        let tally = self.categories.entry(category.to_owned()).or_default();
        tally.sent += 1;
        *tally.answers.entry(answer.to_owned()).or_default() += 1;
    }

    /// Take in what another report (of a client thread) counted.
    fn merge(&mut self, other: Report) {
        for (name, tally) in other.categories {
            let mine = self.categories.entry(name).or_default();
            mine.sent += tally.sent;
            for (answer, count) in tally.answers {
                *mine.answers.entry(answer).or_default() += count;
            }
        }
        for failure in other.failures {
            if self.failures.len() < 64 {
                self.failures.push(failure);
            }
        }
    }

    fn fail(&mut self, category: &str, what: impl Into<String>) {
        let what = what.into();
        // A run that goes wrong everywhere would print megabytes.
        if self.failures.len() < 64 {
            self.failures.push(format!("[{category}] {what}"));
        }
    }

    /// Requests sent, over all categories.
    pub fn sent(&self) -> usize {
        self.categories.values().map(|tally| tally.sent).sum()
    }

    /// The requests of `category` answered with `status`.
    pub fn answered(&self, category: &str, status: u16) -> usize {
        self.categories.get(category).and_then(|tally| tally.answers.get(&status.to_string())).copied().unwrap_or(0)
    }

    pub fn failures(&self) -> &[String] {
        &self.failures
    }

    /// A Markdown table: per category the requests sent and their statuses.
    pub fn table(&self) -> String {
        let mut table = String::from("| category | sent | answers |\n|---|---:|---|\n");
        for (name, tally) in &self.categories {
            let answers: Vec<String> =
                tally.answers.iter().map(|(answer, count)| format!("{count} × {answer}")).collect();
            let _ = writeln!(table, "| {name} | {} | {} |", tally.sent, answers.join(", "));
        }
        let _ = writeln!(table, "| all | {} | {} failures |", self.sent(), self.failures.len());
        table
    }

    /// Panic listing every broken rule, if any.
    pub fn assert_clean(&self, server: &Server) {
        assert!(
            self.failures.is_empty(),
            "the battery found {} problems:\n{}\n{}\nserver log:\n{}",
            self.failures.len(),
            self.failures.join("\n"),
            self.table(),
            tail(&server.log(), 8000)
        );
    }
}

/// The last `bytes` of `text` (on a character boundary).
fn tail(text: &str, bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// What a request's answer must be beyond the rules every answer keeps.
#[derive(Debug, Clone)]
pub enum Expect {
    /// Any answer that keeps the rules.
    Any,
    /// A client error (4xx) or 501.
    Refused,
    /// This status, with a message that contains each of the words.
    Status(u16, &'static [&'static str]),
    /// This status, with an error of this `type`.
    Kind(u16, &'static str),
}

/// Words an error message must not carry: Rust panics and backtraces,
/// source locations, llguidance's parser-state dumps.
const LEAKS: [&str; 9] = [
    "panic",
    "backtrace",
    "RUST_BACKTRACE",
    ".rs:",
    "thread '",
    "stack overflow",
    "Earley",
    "lexer_stack",
    "row_infos",
];
/// An error message longer than this is a dump, not a message.
const MESSAGE_BYTES: usize = 4096;

/// Hold one answer to the rules; record it.
fn check(report: &mut Report, category: &str, what: &str, answer: &Answer, expect: &Expect) {
    let Answer { status, body, stream } = answer;
    let (status, body) = (*status, body.as_str());
    report.count(category, &if status == 0 { "no answer".to_owned() } else { status.to_string() });
    let mut fail = |why: String| report.fail(category, format!("{what}: {why}"));
    if status == 0 {
        return fail(format!("no answer ({body})"));
    }
    if status >= 500 && status != 501 && status != 503 {
        fail(format!("status {status}: {}", clip(body)));
    }
    match expect {
        Expect::Any => {}
        Expect::Refused if (400..500).contains(&status) || status == 501 => {}
        Expect::Refused => fail(format!("expected a refusal, got {status}: {}", clip(body))),
        Expect::Status(expected, _) | Expect::Kind(expected, _) if *expected != status => {
            fail(format!("expected {expected}, got {status}: {}", clip(body)));
        }
        Expect::Status(..) | Expect::Kind(..) => {}
    }
    if status >= 400 {
        let error = serde_json::from_str::<Value>(body).map(|json| json["error"].clone()).unwrap_or_default();
        let message = error["message"].as_str().map(str::to_owned);
        let Some(message) = message else {
            return fail(format!("status {status} without a JSON error message: {}", clip(body)));
        };
        if let Some(leak) = LEAKS.iter().find(|leak| message.to_lowercase().contains(&leak.to_lowercase())) {
            fail(format!("the message leaks {leak:?}: {}", clip(&message)));
        }
        if message.len() > MESSAGE_BYTES {
            fail(format!("a {} byte message: {}", message.len(), clip(&message)));
        }
        if let Expect::Status(_, words) = expect
            && let Some(word) = words.iter().find(|word| !message.contains(**word))
        {
            fail(format!("the message does not name {word:?}: {}", clip(&message)));
        }
        if let Expect::Kind(_, kind) = expect
            && error["type"] != *kind
        {
            fail(format!("expected an error of type {kind}: {}", clip(body)));
        }
    } else if *stream {
        check_stream(&mut fail, body);
    }
}

/// A 200 stream: whole events of JSON (or `[DONE]`), none a server error.
fn check_stream(fail: &mut impl FnMut(String), body: &str) {
    if !body.ends_with("\n\n") {
        return fail(format!("a stream cut short: {}", clip(tail(body, 300))));
    }
    for line in body.lines().filter(|line| line.starts_with("data: ")) {
        let data = &line["data: ".len()..];
        if data == "[DONE]" {
            continue;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(event) if event["error"]["type"] == "server_error" => fail(format!("a server error event: {data}")),
            Ok(_) => {}
            Err(_) => fail(format!("an event that is not JSON: {}", clip(data))),
        }
    }
}

fn clip(text: &str) -> String {
    if text.len() <= 400 {
        return text.to_owned();
    }
    let mut end = 400;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// An answer as the rules see it.
struct Answer {
    /// 0 when none came.
    status: u16,
    body: String,
    /// Whether it is an event stream.
    stream: bool,
}

impl Answer {
    fn read(request: RequestBuilder) -> Answer {
        match request.send() {
            Ok(response) => {
                let status = response.status().as_u16();
                let content_type = response.headers().get(reqwest::header::CONTENT_TYPE);
                let stream = content_type.is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
                let body = response.text().unwrap_or_else(|error| format!("<the body broke off: {error}>"));
                Answer { status, body, stream }
            }
            Err(error) => Answer { status: 0, body: error.to_string(), stream: false },
        }
    }
}

/// A caller's own named requests (`(what, path, body, expect)`), held to
/// the battery's rules like the built-in ones: what a model family, a
/// cache or a backend brings that the general categories do not reach.
pub fn requests(target: &Target<'_>, report: &mut Report, category: &str, cases: Vec<(String, &str, Value, Expect)>) {
    let client = target.client();
    for (what, path, body, expect) in cases {
        send(report, category, &format!("{path} {what}"), client.post(target.server.url(path)).json(&body), &expect);
    }
    still_serving(target, report, category);
}

/// Send one request and hold its answer to the rules.
fn send(report: &mut Report, category: &str, what: &str, request: RequestBuilder, expect: &Expect) {
    check(report, category, what, &Answer::read(request), expect);
}

/// The server answers `/health` and a short completion: after each
/// category, so that a request that broke something is found near it.
fn still_serving(target: &Target<'_>, report: &mut Report, category: &str) {
    if crate::http::rss_kib(target.server.pid()).is_none() {
        report.fail(category, "the server process is gone");
        return;
    }
    let client = target.client();
    let health = client.get(target.server.url("/health")).send().map(|response| response.status().as_u16());
    if health.as_ref().ok() != Some(&200) {
        report.fail(category, format!("/health after the category: {health:?}"));
        return;
    }
    let body = serde_json::json!({ "prompt": "Hello", "n_predict": 2 });
    let answer = client.post(target.server.url("/completion")).json(&body).send();
    if answer.as_ref().map(|response| response.status().as_u16()).ok() != Some(200) {
        report.fail(category, format!("a plain completion after the category: {answer:?}"));
    }
}
