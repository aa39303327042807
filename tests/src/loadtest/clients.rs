//! The clients: each a thread sending one request after another until the
//! load ends, every answer classified ([`Class`]). Odd clients stream, even
//! ones do not; a fifth of the streams are dropped after one to three
//! events; the endpoint (`/completion` or `/v1/chat/completions`), the
//! prompt and the token limit are drawn per request from the client's own
//! seeded generator.

use std::io::{BufRead, BufReader, Read};
use std::thread::Scope;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::blocking::Response;
use reqwest::header::RETRY_AFTER;
use serde_json::{Value, json};

use super::api::Api;
use super::report::{Answer, Class, Tally};
use super::setup::{API_KEY, Mode, N_PROBS, QUEUE_LIMIT, SEND_TIMEOUT_S, SLOT_CTX};
use crate::gguf_writer::Rng;
use crate::raw::{post_head, read_until_closed, unread_connection};

/// One client in this many opens streams it never reads.
const UNREAD_EVERY: usize = 32;
/// How long an unread stream's client waits for the status line, and for
/// a refusal's end.
const STATUS_WAIT: Duration = Duration::from_secs(10);
/// How long after the send timeout an unread stream may still be open.
const UNREAD_WAIT: Duration = Duration::from_secs(30);
/// One request in this many asks for token probabilities.
const PROBS_EVERY: usize = 5;

/// Words prompts are made of; ordinary ones, about a token each.
const WORDS: [&str; 40] = [
    "the", "river", "stone", "light", "morning", "city", "bridge", "water", "green", "old", "house", "road", "tree",
    "cold", "wind", "small", "boat", "market", "bread", "window", "quiet", "bird", "hill", "school", "letter",
    "garden", "summer", "night", "train", "story", "friend", "north", "field", "music", "paper", "salt", "winter",
    "door", "rain", "lamp",
];
/// The start some prompts share, so that running requests borrow each
/// other's blocks from the prefix cache and the count of a shared block
/// is exercised.
const PREAMBLE: &str = "You are a helpful assistant who answers in plain words. Keep every answer short, \
    name the places and the people in it, say what happened first and what came after, and do not invent \
    dates or numbers that the question does not give. When a question is unclear, answer the most likely \
    reading of it and say which reading you chose. Here is the question.";

/// The clients of one mode's load.
pub struct Workload<'a> {
    pub api: &'a Api,
    pub mode: Mode,
    pub clients: usize,
    pub seed: u64,
    /// No request starts after this.
    pub load_end: Instant,
}

impl Workload<'_> {
    /// Run every client on its own thread of `scope`; their tallies summed.
    pub fn run<'scope>(&'scope self, scope: &'scope Scope<'scope, '_>) -> Tally {
        let handles: Vec<_> = (0..self.clients).map(|index| scope.spawn(move || self.client(index))).collect();
        let mut tally = Tally::default();
        for handle in handles {
            tally.merge(handle.join().expect("a client thread"));
        }
        tally
    }

    fn client(&self, index: usize) -> Tally {
        let mut rng = Rng::new(self.seed.wrapping_mul(1_000_003).wrapping_add(index as u64));
        let streaming = index % 2 == 1;
        let mut tally = Tally::default();
        // Spread the first arrivals over half a second rather than one burst.
        std::thread::sleep(Duration::from_millis(between(&mut rng, 0, 500) as u64));
        if index % UNREAD_EVERY == UNREAD_EVERY / 2 {
            while Instant::now() < self.load_end {
                let answer = self.unread_stream();
                // Back soon after a refusal: the others wait about the
                // second Retry-After says, and these must reach a slot now
                // and then to test anything while the queue stays full.
                let pause = if answer.class == Class::UnreadRefused { between(&mut rng, 50, 150) } else { 0 };
                tally.count(answer, true);
                std::thread::sleep(Duration::from_millis(pause as u64));
            }
            return tally;
        }
        while Instant::now() < self.load_end {
            let plan = Plan::draw(&mut rng, streaming);
            let answer = self.send(&plan);
            // After a refusal (or any failure) Retry-After says 1 s: about
            // that, jittered, so that the refused clients do not all come
            // back at once, and a broken server is not hammered.
            let pause = match answer.class {
                Class::Completed | Class::Disconnected | Class::StreamFailedClosed => between(&mut rng, 0, 20),
                _ => between(&mut rng, 500, 1500),
            };
            tally.count(answer, plan.stream);
            std::thread::sleep(Duration::from_millis(pause as u64));
        }
        tally
    }

    fn send(&self, plan: &Plan) -> Answer {
        let response = match self.api.client.post(self.api.url(plan.endpoint.path())).json(&plan.body).send() {
            Ok(response) => response,
            Err(error) => return Answer::new(Class::Transport, format!("{}: {error}", plan.endpoint.path())),
        };
        if response.status() != StatusCode::OK {
            return self.refusal(response);
        }
        if plan.stream { self.read_stream(response, plan) } else { read_answer(response, plan) }
    }

    /// A stream with the most probabilities a token, on a connection
    /// with a small receive buffer whose client reads its status line and
    /// then nothing: the server must cut it by its send timeout (or its
    /// stream window) rather than hold its tokens. After a while the client
    /// reads what arrived, which must end in the connection being closed.
    /// A refusal (the queue is full) is read like any other.
    fn unread_stream(&self) -> Answer {
        let body = json!({ "prompt": "Once upon a time", "stream": true, "n_predict": SLOT_CTX,
                           "ignore_eos": true, "n_probs": N_PROBS })
        .to_string();
        let request = format!("{}{body}", post_head("/completion", body.len() as u64, Some(API_KEY)));
        let mut stream = match unread_connection(self.api.address(), request.as_bytes(), 4096) {
            Ok(stream) => stream,
            Err(error) => return Answer::new(Class::Transport, format!("an unread stream: {error}")),
        };
        let mut status = [0u8; 12];
        let read = stream.set_read_timeout(Some(STATUS_WAIT)).and_then(|()| stream.read_exact(&mut status));
        if let Err(error) = read {
            return Answer::new(Class::Transport, format!("an unread stream's status line: {error}"));
        }
        match &status {
            b"HTTP/1.1 200" => {}
            b"HTTP/1.1 503" => {
                let rest = read_until_closed(&mut stream, STATUS_WAIT).unwrap_or_default();
                return Answer::new(Class::UnreadRefused, rest);
            }
            other => return Answer::new(Class::OtherStatus, String::from_utf8_lossy(other).into_owned()),
        }
        std::thread::sleep(Duration::from_secs(SEND_TIMEOUT_S + 2));
        // Whatever the server sent before it stopped, then the end: a
        // connection still open is a stream the server still holds (after
        // it waited its turn in the queue, which takes a few seconds).
        match read_until_closed(&mut stream, UNREAD_WAIT) {
            Some(_) => Answer::new(Class::Unread, String::new()),
            None => Answer::new(
                Class::UnreadHeld,
                format!("open {} s after it was sent", SEND_TIMEOUT_S + 2 + UNREAD_WAIT.as_secs()),
            ),
        }
    }

    /// A non-200 answer: a full queue (503 with Retry-After) or a refusal
    /// while failed closed are expected; anything else is a failure.
    fn refusal(&self, response: Response) -> Answer {
        let status = response.status();
        let retry_after = response.headers().contains_key(RETRY_AFTER);
        let text = response.text().unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|body| body["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let detail = format!("{status}: {}", clip(&text));
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return Answer::new(Class::OtherStatus, detail);
        }
        if message.contains("failed closed") {
            let class = if self.mode == Mode::Fallback { Class::ClosedInFallback } else { Class::RefusedClosed };
            return Answer::new(class, detail);
        }
        let Some(waiting) = queue_count(&message) else { return Answer::new(Class::OtherStatus, detail) };
        // More than there are clients cannot be waiting: the count wrapped.
        let class = if waiting > QUEUE_LIMIT + self.clients {
            Class::WrappedQueue
        } else if waiting > QUEUE_LIMIT {
            Class::QueueOverLimit
        } else if !retry_after {
            Class::NoRetryAfter
        } else {
            Class::QueueFull
        };
        Answer { class, detail, waiting: Some(waiting) }
    }

    /// Read a stream to its end, or drop it where the plan says. It must
    /// end with its final event (and `[DONE]` on the OpenAI endpoint) or
    /// with one error event; an error event may only say that the policy
    /// failed closed, and only in that mode.
    fn read_stream(&self, response: Response, plan: &Plan) -> Answer {
        let mut lines = BufReader::new(response).lines();
        let (mut events, mut finished, mut done) = (0, false, false);
        loop {
            let line = match lines.next() {
                None => break,
                Some(Err(error)) => return Answer::new(Class::Transport, format!("after {events} events: {error}")),
                Some(Ok(line)) => line,
            };
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let Some(data) = line.strip_prefix("data: ") else {
                return Answer::new(Class::Malformed, format!("not an SSE data line: {}", clip(&line)));
            };
            if !matches!(lines.next(), Some(Ok(blank)) if blank.is_empty()) {
                return Answer::new(Class::Malformed, format!("an event not ended by a blank line: {}", clip(data)));
            }
            if done {
                return Answer::new(Class::Malformed, format!("an event after [DONE]: {}", clip(data)));
            }
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(event) = serde_json::from_str::<Value>(data) else {
                return Answer::new(Class::Malformed, format!("not JSON: {}", clip(data)));
            };
            if let Some(error) = event.get("error") {
                return self.stream_error(lines, error, events);
            }
            finished |= plan.endpoint.is_final(&event);
            events += 1;
            if !finished && plan.disconnect_after == Some(events) {
                return Answer::new(Class::Disconnected, String::new());
            }
        }
        if finished && (done || plan.endpoint == Endpoint::Completion) {
            Answer::new(Class::Completed, String::new())
        } else {
            Answer::new(Class::Truncated, format!("ended after {events} events, final: {finished}, [DONE]: {done}"))
        }
    }

    /// An error event: the stream must end right after it.
    fn stream_error(
        &self,
        mut lines: impl Iterator<Item = std::io::Result<String>>,
        error: &Value,
        events: usize,
    ) -> Answer {
        let detail = format!("after {events} events: {}", clip(&error.to_string()));
        if lines.any(|line| line.map_or(true, |line| !line.is_empty())) {
            return Answer::new(Class::Malformed, format!("more after an error event {detail}"));
        }
        let failed_closed = error["message"].as_str().is_some_and(|message| message.contains("failed closed"));
        let class = match (failed_closed, self.mode) {
            (true, Mode::FailClosed) => Class::StreamFailedClosed,
            (true, Mode::Fallback) => Class::ClosedInFallback,
            (false, _) => Class::ErrorEvent,
        };
        Answer::new(class, detail)
    }
}

/// A whole non-streamed answer must carry the generated text, and the
/// probabilities when it asked for them.
fn read_answer(response: Response, plan: &Plan) -> Answer {
    let text = match response.text() {
        Ok(text) => text,
        Err(error) => return Answer::new(Class::Transport, format!("reading the body: {error}")),
    };
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let (answered, probs) = match plan.endpoint {
        Endpoint::Completion => {
            (body["content"].is_string() && body["stop"] == true, &body["completion_probabilities"])
        }
        Endpoint::Chat => {
            (body["choices"][0]["message"]["content"].is_string(), &body["choices"][0]["logprobs"]["content"])
        }
    };
    let answered = answered && (!plan.probs || probs.as_array().is_some_and(|probs| !probs.is_empty()));
    if answered {
        Answer::new(Class::Completed, String::new())
    } else {
        Answer::new(Class::Malformed, format!("200 without an answer: {}", clip(&text)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Completion,
    Chat,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Completion => "/completion",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    /// The event that says the generation is over.
    fn is_final(self, event: &Value) -> bool {
        match self {
            Endpoint::Completion => event["stop"] == true,
            Endpoint::Chat => event["choices"][0]["finish_reason"].is_string(),
        }
    }
}

/// One request to send.
struct Plan {
    endpoint: Endpoint,
    stream: bool,
    /// Drop the stream after this many events.
    disconnect_after: Option<usize>,
    /// Whether it asks for token probabilities.
    probs: bool,
    body: Value,
}

impl Plan {
    fn draw(rng: &mut Rng, stream: bool) -> Plan {
        let endpoint = if between(rng, 0, 1) == 0 { Endpoint::Completion } else { Endpoint::Chat };
        let n_predict = between(rng, 8, 48);
        let ignore_eos = between(rng, 0, 1) == 0;
        let disconnect_after = (stream && between(rng, 1, 5) == 1).then(|| between(rng, 1, 3));
        let probs = (between(rng, 1, PROBS_EVERY) == 1).then(|| between(rng, 1, N_PROBS));
        let prompt = prompt(rng);
        let mut body = match endpoint {
            Endpoint::Completion => json!({
                "prompt": prompt, "n_predict": n_predict, "ignore_eos": ignore_eos, "stream": stream,
            }),
            Endpoint::Chat => json!({
                "messages": [{ "role": "user", "content": prompt }], "max_tokens": n_predict,
                "ignore_eos": ignore_eos, "stream": stream,
            }),
        };
        match (probs, endpoint) {
            (Some(n), Endpoint::Completion) => body["n_probs"] = json!(n),
            // OpenAI's bound on chat's `top_logprobs`.
            (Some(n), Endpoint::Chat) => {
                body["logprobs"] = json!(true);
                body["top_logprobs"] = json!(n.min(20));
            }
            (None, _) => {}
        }
        Plan { endpoint, stream, disconnect_after, probs: probs.is_some(), body }
    }
}

/// Mostly short prompts, some of up to 80 words, a few of up to 200
/// (about 270 tokens with the preamble: prefill is most of the cost on two
/// cores); three in ten start with the shared preamble.
fn prompt(rng: &mut Rng) -> String {
    let words = match between(rng, 1, 10) {
        1..=6 => between(rng, 4, 24),
        7..=9 => between(rng, 30, 80),
        _ => between(rng, 120, 200),
    };
    let mut prompt = if between(rng, 1, 10) <= 3 { format!("{PREAMBLE} ") } else { String::new() };
    for index in 0..words {
        if index > 0 {
            prompt.push(' ');
        }
        prompt.push_str(WORDS[between(rng, 0, WORDS.len() - 1)]);
    }
    prompt
}

/// Uniform in `low..=high`.
fn between(rng: &mut Rng, low: usize, high: usize) -> usize {
    low + (rng.next_u64() % (high - low + 1) as u64) as usize
}

/// The count of "the request queue is full (N waiting)".
fn queue_count(message: &str) -> Option<usize> {
    let (_, rest) = message.split_once("queue is full (")?;
    rest.split(' ').next()?.parse().ok()
}

/// Enough of a body to recognize it.
fn clip(text: &str) -> String {
    text.chars().take(240).collect()
}
