//! The fault schedule, run beside the clients: the load time is cut into
//! equal windows, and in each the `chaos` policy is loaded (`POST
//! /admin/policy`) with one fault — trap, loop, memory, stall, then an
//! invalid decision, a different rule broken each round — until `/health`
//! shows the mode's answer to it (503 when failed closed, "degraded" on
//! the fallback). It is left so for a moment under load, then the plain
//! policy comes back, by the admin API and by SIGHUP in turn.
//!
//! The loop is loaded over the standing trap, and faults at once: a broken
//! policy replaced by another broken one. Then the queue is empty (a
//! fail-closed emptied it) while the refused clients come back, so that
//! requests are on their way to the engine during the two deadlines it
//! spends before it quarantines again; with the queue full, as it is the
//! rest of the time, few pass to the engine.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::api::{Api, sample};
use super::setup::Mode;
use crate::http::Server;

/// One round: the faults that are not decisions, then an invalid decision.
const FAULTS: [&str; 4] = ["trap", "loop", "memory", "stall"];
/// The invalid decisions, one per round, in turn.
const INVALID: [&str; 4] = ["decode-not-ready", "admit-missing", "prefill-not-prefilling", "over-budget"];
/// The fault loaded over the one before, with no plain policy between.
const STRAIGHT_AFTER: &str = "loop";
/// Load time per round, at least one round.
const ROUND: Duration = Duration::from_secs(20);
/// Steps the chaos policy schedules plainly before its fault. Counted from
/// `sluice_steps_total`, which trails the engine's step number (steps that
/// granted nothing are not in it), so the fault comes at most this late.
const PLAIN_STEPS: u64 = 8;
/// Faults that quarantine a policy: the first is retried on a fresh instance.
const QUARANTINE: u64 = 2;
/// Bound on the wait for a fault to show, and for a reload to take.
const SHOW_WAIT: Duration = Duration::from_secs(10);
/// Longest a fault is left standing before the reload.
const HOLD: Duration = Duration::from_secs(1);

/// How a fault was taken away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// `POST /admin/policy` with `continuous`.
    Admin,
    /// SIGHUP: the config file names `continuous`.
    Signal,
    /// The next fault's policy was loaded over it.
    NextFault,
}

impl Reload {
    pub fn name(self) -> &'static str {
        match self {
            Reload::Admin => "admin API",
            Reload::Signal => "SIGHUP",
            Reload::NextFault => "next fault",
        }
    }
}

/// What became of one injected fault.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: &'static str,
    /// The chaos policy's `after_step`.
    pub after_step: u64,
    pub reload: Reload,
    /// From the load to the mode's answer on `/health`, with the policy
    /// quarantined.
    pub shown_after: Option<Duration>,
    /// From the reload to `/health` saying ok (none for [`Reload::NextFault`]).
    pub recovered_after: Option<Duration>,
    /// The chaos policy's faults by reason, as `/metrics` counted them.
    pub reasons: BTreeMap<String, u64>,
    /// The server's resident memory after the reload, in KiB.
    pub rss_kib: Option<u64>,
    /// What went wrong with the injection itself.
    pub error: Option<String>,
}

impl FaultRecord {
    /// The fault reasons this fault must produce (one of them).
    pub fn expected_reasons(&self) -> &'static [&'static str] {
        match self.fault {
            "trap" => &["trap"],
            "loop" => &["deadline"],
            "memory" => &["memory"],
            "stall" => &["stalled"],
            _ => &["invalid"],
        }
    }
}

/// Inject faults until `load_end`, each in its own window.
pub fn schedule(api: &Api, server: &Server, mode: Mode, load_end: Instant) -> Vec<FaultRecord> {
    let start = Instant::now();
    let span = load_end.saturating_duration_since(start);
    let rounds = (span.as_secs() / ROUND.as_secs()).max(1) as u32;
    let per_round = FAULTS.len() as u32 + 1;
    let window = span / (rounds * per_round);
    let hold = HOLD.min(window / 5);
    let mut records = Vec::new();
    for index in 0..rounds * per_round {
        let (round, place) = (index / per_round, (index % per_round) as usize);
        let fault = FAULTS.get(place).copied().unwrap_or(INVALID[round as usize % INVALID.len()]);
        let next = FAULTS.get(place + 1).copied();
        let reload = if next == Some(STRAIGHT_AFTER) {
            Reload::NextFault
        } else if index % 2 == 0 {
            Reload::Admin
        } else {
            Reload::Signal
        };
        // Some plain service first in each window, so that the queue is
        // full again and streams are running when the fault comes.
        if fault != STRAIGHT_AFTER {
            sleep_until(start + window * index + window * 3 / 10);
        }
        let mut record = FaultRecord {
            fault,
            after_step: 0,
            reload,
            shown_after: None,
            recovered_after: None,
            reasons: BTreeMap::new(),
            rss_kib: None,
            error: None,
        };
        if let Err(error) = inject(api, server, mode, &mut record, hold) {
            record.error = Some(error);
        }
        record.rss_kib = api.rss_kib();
        records.push(record);
    }
    records
}

fn inject(api: &Api, server: &Server, mode: Mode, record: &mut FaultRecord, hold: Duration) -> Result<(), String> {
    let before = api.metrics()?;
    // Loaded over a standing fault, the policy faults at its first step.
    if record.fault != STRAIGHT_AFTER {
        record.after_step = sample(&before, "sluice_steps_total") as u64 + PLAIN_STEPS;
    }
    let settings = json!({ "fault": record.fault, "after_step": record.after_step });
    let (status, answer) = api.post("/admin/policy", &json!({ "policy": chaos_wasm(), "settings": settings }))?;
    if status != 200 {
        return Err(format!("loading chaos: {status} {answer}"));
    }
    record.shown_after = wait_for(|| {
        let quarantined =
            api.metrics().is_ok_and(|after| fault_counts(&after, &before).values().sum::<u64>() >= QUARANTINE);
        quarantined && shows(api, mode)
    });
    std::thread::sleep(hold);
    match record.reload {
        Reload::NextFault => {}
        Reload::Signal => server.signal("HUP"),
        Reload::Admin => {
            let (status, answer) = api.post("/admin/policy", &json!({ "policy": "continuous" }))?;
            if status != 200 {
                return Err(format!("reloading continuous: {status} {answer}"));
            }
        }
    }
    if record.reload != Reload::NextFault {
        record.recovered_after =
            wait_for(|| matches!(api.get("/health"), Ok((200, health)) if health["status"] == "ok"));
    }
    record.reasons = fault_counts(&api.metrics()?, &before);
    if record.shown_after.is_none() {
        return Err(format!("the policy was not quarantined, or /health did not say so, within {SHOW_WAIT:?}"));
    }
    if record.reload != Reload::NextFault && record.recovered_after.is_none() {
        return Err(format!("/health was not ok within {SHOW_WAIT:?} of the reload"));
    }
    Ok(())
}

/// Whether `/health` gives the mode's answer to a quarantined policy.
fn shows(api: &Api, mode: Mode) -> bool {
    match (mode, api.get("/health")) {
        (Mode::FailClosed, Ok((503, health))) => health["error"]["fault"].is_string(),
        (Mode::Fallback, Ok((200, health))) => health["status"] == "degraded",
        _ => false,
    }
}

/// How long until `done` holds, polled; `None` past [`SHOW_WAIT`].
fn wait_for(mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < SHOW_WAIT {
        if done() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// The chaos policy's faults since `before`, by reason.
fn fault_counts(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (name, value) in after {
        if !name.starts_with("sluice_policy_faults_total{") || !name.contains("chaos.wasm") {
            continue;
        }
        let added = (value - sample(before, name)) as u64;
        let reason = name.split("reason=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or("?");
        if added > 0 {
            *counts.entry(reason.to_owned()).or_default() += added;
        }
    }
    counts
}

/// The folder of the built plugins: the server's `policy.plugin_dir`, so
/// that the admin API may load the chaos policy from it.
pub fn plugin_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/dist").to_owned()
}

fn chaos_wasm() -> String {
    format!("{}/chaos.wasm", plugin_dir())
}

fn sleep_until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}
