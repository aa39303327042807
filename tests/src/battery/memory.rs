//! Requests built to make the server hold memory: prompts far over the
//! context (several at once), tokenizing megabytes with pieces,
//! probabilities at the cap over a long answer, and streams whose clients
//! never read. The server's resident memory is sampled while they run and
//! held to [`MemoryBounds`]; memory is behaviour, so the bounds are
//! asserted (with margin), never the time anything took.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Expect, Report, Target, send, still_serving};
use crate::http::rss_kib;
use crate::raw::{address, post_head, unread_connection};

/// How far the server's resident memory may rise above its value before
/// the category, in MiB.
#[derive(Debug, Clone, Copy)]
pub struct MemoryBounds {
    /// While oversized prompts, chats and tokenizations run (each kind
    /// several at once).
    pub oversized_peak: u64,
    /// While bodies of the largest size the server takes, all small JSON
    /// values (`[0,0,…]`, tens of bytes a value once parsed), arrive
    /// several at once.
    pub parsing_peak: u64,
    /// While a long non-streamed answer with probabilities at the cap is
    /// built and sent.
    pub probabilities_peak: u64,
    /// While streams nobody reads run until the server ends them.
    pub unread_peak: u64,
    /// After everything, once the server is idle again.
    pub retained: u64,
}

/// Requests of one kind sent at once.
const AT_ONCE: usize = 4;
/// Clients that never read their streams.
const UNREAD_STREAMS: usize = 4;
/// How long the unread streams may run before the server must have ended them.
const UNREAD_WAIT: Duration = Duration::from_secs(90);

/// Samples the server's resident memory every few milliseconds while
/// `work` runs; the peak in KiB.
fn peak_while<T>(pid: u32, work: impl FnOnce() -> T) -> (T, u64) {
    let peak = AtomicU64::new(rss_kib(pid).unwrap_or(0));
    let done = AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                if let Some(rss) = rss_kib(pid) {
                    peak.fetch_max(rss, Ordering::AcqRel);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let result = work();
        done.store(true, Ordering::Release);
        result
    });
    (result, peak.load(Ordering::Acquire))
}

fn within(report: &mut Report, category: &str, what: &str, base_kib: u64, peak_kib: u64, bound_mib: u64) {
    let grew = peak_kib.saturating_sub(base_kib) / 1024;
    if grew > bound_mib {
        report.fail(category, format!("{what}: resident memory rose {grew} MiB, over the bound of {bound_mib} MiB"));
    }
    eprintln!("battery: {what}: resident memory +{grew} MiB (bound {bound_mib} MiB)");
}

/// Every memory category, with the bounds asserted: each against the
/// memory when it starts (what an earlier one left to the allocator is not
/// its own), and what is left at the end against the start of all.
pub fn memory(target: &Target<'_>, bounds: &MemoryBounds, report: &mut Report) {
    let rss = || rss_kib(target.server.pid()).unwrap_or(0);
    let base = rss();
    parsing(target, bounds, report, rss());
    oversized(target, bounds, report, rss());
    probabilities(target, bounds, report, rss());
    unread(target, bounds, report, rss());
    within(report, "memory", "after every memory category", base, rss(), bounds.retained);
    still_serving(target, report, "memory");
}

/// Text just under the body limit, of short words (a token or two each).
fn oversized_text(target: &Target<'_>) -> String {
    let bytes = target.body_limit.saturating_sub(4096).min(10 << 20);
    "tea cup ".repeat(bytes / 8)
}

fn oversized(target: &Target<'_>, bounds: &MemoryBounds, report: &mut Report, base: u64) {
    let category = "oversized prompts";
    let text = oversized_text(target);
    let context = Expect::Kind(400, "exceed_context_size_error");
    let kinds: [(&str, &str, Value, Expect); 3] = [
        ("a prompt", "/completion", json!({ "prompt": text, "n_predict": 1 }), context.clone()),
        (
            "a chat message",
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": text }], "max_tokens": 1 }),
            context.clone(),
        ),
        ("a tokenization with pieces", "/tokenize", json!({ "content": text, "with_pieces": true }), Expect::Any),
    ];
    for (what, path, body, expect) in kinds {
        let what = format!("{AT_ONCE} × {} MB in {what} on {path}", text.len() >> 20);
        let body = body.to_string();
        at_once(target, report, (category, &what), (path, &body), &expect, base, bounds.oversized_peak);
    }
}

fn parsing(target: &Target<'_>, bounds: &MemoryBounds, report: &mut Report, base: u64) {
    let values = target.body_limit.saturating_sub(1024) / 2;
    let body = format!("{{\"prompt\": \"hi\", \"n_predict\": 1, \"x\": [{}0]}}", "0,".repeat(values));
    let what = format!("{AT_ONCE} × {} MB of [0,0,…] on /completion", body.len() >> 20);
    let expect = Expect::Status(200, &[]);
    let category = ("bodies of small values", what.as_str());
    at_once(target, report, category, ("/completion", &body), &expect, base, bounds.parsing_peak);
}

/// Send the JSON text `body` to `path` from [`AT_ONCE`] clients at once,
/// the server's resident memory sampled meanwhile against `bound`.
fn at_once(
    target: &Target<'_>,
    report: &mut Report,
    (category, what): (&str, &str),
    (path, body): (&str, &str),
    expect: &Expect,
    base: u64,
    bound: u64,
) {
    let (reports, peak) = peak_while(target.server.pid(), || {
        std::thread::scope(|scope| {
            let sent: Vec<_> = (0..AT_ONCE)
                .map(|_| {
                    scope.spawn(|| {
                        let mut report = Report::default();
                        let request = target
                            .client()
                            .post(target.server.url(path))
                            .header("content-type", "application/json")
                            .body(body.to_owned());
                        send(&mut report, category, what, request, expect);
                        report
                    })
                })
                .collect();
            sent.into_iter().map(|handle| handle.join().expect("a client thread")).collect::<Vec<_>>()
        })
    });
    for one in reports {
        report.merge(one);
    }
    within(report, category, what, base, peak, bound);
}

fn probabilities(target: &Target<'_>, bounds: &MemoryBounds, report: &mut Report, base: u64) {
    let category = "probabilities at the cap";
    let tokens = (target.slot_ctx / 2).min(512);
    let body = json!({ "prompt": "Write a story.", "n_predict": tokens, "n_probs": target.n_probs_cap,
                       "ignore_eos": true, "verbose": true });
    let what = format!("{tokens} tokens with {} probabilities each, not streamed", target.n_probs_cap);
    let ((), peak) = peak_while(target.server.pid(), || {
        let request = target.client().post(target.server.url("/completion")).json(&body);
        send(report, category, &what, request, &Expect::Status(200, &[]));
        let chat = json!({ "messages": [{ "role": "user", "content": "Write a story." }], "max_tokens": tokens,
                           "logprobs": true, "top_logprobs": target.n_probs_cap.min(20), "ignore_eos": true });
        let request = target.client().post(target.server.url("/v1/chat/completions")).json(&chat);
        send(report, category, &format!("{what}, chat"), request, &Expect::Status(200, &[]));
    });
    within(report, category, &what, base, peak, bounds.probabilities_peak);
}

fn unread(target: &Target<'_>, bounds: &MemoryBounds, report: &mut Report, base: u64) {
    let category = "unread streams";
    let body = json!({ "prompt": "Once upon a time", "stream": true, "n_predict": target.slot_ctx,
                       "ignore_eos": true, "n_probs": target.n_probs_cap })
    .to_string();
    let request = format!("{}{body}", post_head("/completion", body.len() as u64, Some(target.key)));
    let what = format!("{UNREAD_STREAMS} streams never read, {} probabilities a token", target.n_probs_cap);
    let client = target.client();
    let processing = || {
        client.get(target.server.url("/metrics")).send().and_then(reqwest::blocking::Response::text).ok().and_then(
            |text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("llamacpp:requests_processing "))
                    .and_then(|value| value.trim().parse::<f64>().ok())
            },
        )
    };
    let (ended, peak) = peak_while(target.server.pid(), || {
        let streams: Vec<_> = (0..UNREAD_STREAMS)
            .filter_map(|_| unread_connection(address(target.server), request.as_bytes(), 4096).ok())
            .collect();
        // They start, then run until the server ends them: by the send
        // timeout or the stream window, whichever comes first.
        let deadline = Instant::now() + UNREAD_WAIT;
        std::thread::sleep(Duration::from_secs(1));
        let ended = loop {
            if processing().is_some_and(|running| running == 0.0) {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        drop(streams);
        ended
    });
    report.count(category, if ended { "ended by the server" } else { "still running" });
    if !ended {
        report.fail(category, format!("{what}: still running after {} s", UNREAD_WAIT.as_secs()));
    }
    within(report, category, &what, base, peak, bounds.unread_peak);
}
