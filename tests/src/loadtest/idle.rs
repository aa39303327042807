//! Before the load, a warm-up and the values to come back to; after it,
//! the checks that nothing was left held: the gauges at their idle values,
//! every KV block free or in the prefix cache, every slot idle, and a full
//! queue's worth of requests served (the engine's count of queued requests
//! is not exported; a count left high or wrapped refuses them).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::api::{Api, sample};
use super::setup::{QUEUE_LIMIT, SLOTS};
use crate::http::Server;

/// Gauges and the value each must read once the server is idle.
const IDLE_GAUGES: [(&str, f64); 6] = [
    ("llamacpp:requests_processing", 0.0),
    ("llamacpp:requests_deferred", 0.0),
    ("sluice_kv_blocks_used", 0.0),
    ("sluice_policy_degraded", 0.0),
    ("sluice_policy_failed_closed", 0.0),
    ("sluice_engine_stopped", 0.0),
];
/// Counters shown with the report: what the engine did.
const COUNTERS: [&str; 5] = [
    "sluice_requests_total",
    "sluice_steps_total",
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total",
    "llamacpp:tokens_predicted_total",
];
/// Bound on the wait for idle once every client has its answer.
const SETTLE_WAIT: Duration = Duration::from_secs(20);

/// What the load must come back to, read after the warm-up.
pub struct Baseline {
    /// KV blocks in all: used + cached + free.
    pub kv_blocks: u64,
    pub rss_kib: Option<u64>,
}

/// The server after the load.
#[derive(Debug, Clone)]
pub struct Idle {
    /// How long after the last answer the server was idle.
    pub settled_after: Option<Duration>,
    /// Every idle gauge: (name, value read, idle value).
    pub gauges: Vec<(&'static str, f64, f64)>,
    /// What the engine did, by its counters.
    pub counters: Vec<(&'static str, f64)>,
    pub busy_slots: usize,
    /// KV blocks counted (used, cached or free) once idle, and after the
    /// warm-up: a block lost to all three lists makes the first smaller.
    pub kv_blocks: (u64, u64),
    /// `/health` once idle.
    pub health: String,
    /// Of the full queue's worth of requests sent after the load: how many
    /// got 200, and what the others got.
    pub probe_ok: usize,
    pub probe_failures: Vec<String>,
    /// Resident memory after the warm-up and at the end, in KiB.
    pub rss_kib: (Option<u64>, Option<u64>),
}

/// A request per slot at once, so that the slots, the kernels' buffers and
/// the HTTP side have all been used before the memory is read.
pub fn warm_up(api: &Api, server: &Server) -> Baseline {
    let outcomes = concurrently(api, SLOTS, 16);
    let refused: Vec<&String> = outcomes.iter().filter_map(|outcome| outcome.as_ref().err()).collect();
    assert!(refused.is_empty(), "the warm-up failed: {refused:?}\n{}", server.log());
    let (_, metrics) = settle(api);
    let metrics = metrics.unwrap_or_else(|error| panic!("{error}\n{}", server.log()));
    Baseline { kv_blocks: kv_blocks(&metrics), rss_kib: api.rss_kib() }
}

pub fn check(api: &Api, baseline: &Baseline) -> Idle {
    let (settled_after, metrics) = settle(api);
    let metrics = metrics.unwrap_or_default();
    let gauges = IDLE_GAUGES.iter().map(|&(name, idle)| (name, sample(&metrics, name), idle)).collect();
    let counters = COUNTERS.iter().map(|&name| (name, sample(&metrics, name))).collect();
    let busy_slots = busy_slots(api).unwrap_or(usize::MAX);
    let health = match api.get("/health") {
        Ok((status, body)) => format!("{status} {body}"),
        Err(error) => error,
    };
    let outcomes = concurrently(api, QUEUE_LIMIT, 4);
    let probe_ok = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    let probe_failures = outcomes.into_iter().filter_map(Result::err).collect();
    // So that the memory is read at rest.
    let _ = settle(api);
    Idle {
        settled_after,
        gauges,
        counters,
        busy_slots,
        kv_blocks: (kv_blocks(&metrics), baseline.kv_blocks),
        health,
        probe_ok,
        probe_failures,
        rss_kib: (baseline.rss_kib, api.rss_kib()),
    }
}

/// `count` plain completions at once, of `n_predict` tokens each.
fn concurrently(api: &Api, count: usize, n_predict: usize) -> Vec<Result<(), String>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|index| {
                scope.spawn(move || {
                    let body = json!({
                        "prompt": format!("Request {index}: name three rivers and the seas they reach."),
                        "n_predict": n_predict, "ignore_eos": true,
                    });
                    match api.client.post(api.url("/completion")).json(&body).send() {
                        Ok(response) if response.status() == 200 => Ok(()),
                        Ok(response) => Err(format!("{}: {}", response.status(), response.text().unwrap_or_default())),
                        Err(error) => Err(error.to_string()),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
    })
}

/// Wait (bounded) until nothing runs or waits and every slot is idle; how
/// long it took, and the metrics then (the last read when it never was).
fn settle(api: &Api) -> (Option<Duration>, Result<BTreeMap<String, f64>, String>) {
    let start = Instant::now();
    loop {
        let metrics = api.metrics();
        let quiet = metrics.as_ref().is_ok_and(|metrics| {
            ["llamacpp:requests_processing", "llamacpp:requests_deferred", "sluice_kv_blocks_used"]
                .iter()
                .all(|name| sample(metrics, name) == 0.0)
        });
        if quiet && busy_slots(api) == Some(0) {
            return (Some(start.elapsed()), metrics);
        }
        if start.elapsed() > SETTLE_WAIT {
            return (None, metrics);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn busy_slots(api: &Api) -> Option<usize> {
    let (_, slots) = api.get("/slots").ok()?;
    Some(slots.as_array()?.iter().filter(|slot| slot["is_processing"] != Value::Bool(false)).count())
}

fn kv_blocks(metrics: &BTreeMap<String, f64>) -> u64 {
    ["sluice_kv_blocks_used", "sluice_kv_blocks_cached", "sluice_kv_blocks_free"]
        .iter()
        .map(|name| sample(metrics, name) as u64)
        .sum()
}
