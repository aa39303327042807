//! What a run found: every request's class counted, the faults and what
//! became of them, the idle checks; printed as counts, and judged by
//! [`Report::problems`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::faults::{FaultRecord, Reload};
use super::idle::Idle;
use super::setup::{Mode, QUEUE_LIMIT, RSS_BOUND_MIB, SLOT_CTX, SLOTS};

/// One request's class, what to show of it, and the waiting count a full
/// queue named.
pub struct Answer {
    pub class: Class,
    pub detail: String,
    pub waiting: Option<usize>,
}

impl Answer {
    pub fn new(class: Class, detail: String) -> Self {
        Answer { class, detail, waiting: None }
    }
}

/// How a request was answered. The first five are what the rules allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Completed,
    QueueFull,
    RefusedClosed,
    StreamFailedClosed,
    Disconnected,
    Unread,
    UnreadRefused,
    WrappedQueue,
    QueueOverLimit,
    NoRetryAfter,
    ClosedInFallback,
    OtherStatus,
    ErrorEvent,
    Truncated,
    Malformed,
    Transport,
    UnreadHeld,
}

impl Class {
    pub const ALL: [Class; 17] = [
        Class::Completed,
        Class::QueueFull,
        Class::RefusedClosed,
        Class::StreamFailedClosed,
        Class::Disconnected,
        Class::Unread,
        Class::UnreadRefused,
        Class::WrappedQueue,
        Class::QueueOverLimit,
        Class::NoRetryAfter,
        Class::ClosedInFallback,
        Class::OtherStatus,
        Class::ErrorEvent,
        Class::Truncated,
        Class::Malformed,
        Class::Transport,
        Class::UnreadHeld,
    ];

    pub fn is_failure(self) -> bool {
        self >= Class::WrappedQueue
    }

    pub fn label(self) -> &'static str {
        match self {
            Class::Completed => "200, answered in full",
            Class::QueueFull => "503 queue full, with Retry-After",
            Class::RefusedClosed => "503 while failed closed",
            Class::StreamFailedClosed => "stream ended by a failed-closed error event",
            Class::Disconnected => "stream dropped by its client part way",
            Class::Unread => "stream never read, cut by the server (send timeout or stream window)",
            Class::UnreadRefused => "stream never read, refused (503) and closed",
            Class::WrappedQueue => "FAILURE: 503 queue full naming more waiting requests than there are clients",
            Class::QueueOverLimit => "FAILURE: 503 queue full naming more waiting requests than queue_limit",
            Class::NoRetryAfter => "FAILURE: 503 queue full without Retry-After",
            Class::ClosedInFallback => "FAILURE: a failed-closed error in fallback mode",
            Class::OtherStatus => "FAILURE: another status (another 5xx or a 4xx)",
            Class::ErrorEvent => "FAILURE: a stream error event not from a fail-closed",
            Class::Truncated => "FAILURE: a stream ended without its final event",
            Class::Malformed => "FAILURE: a malformed answer or SSE framing",
            Class::Transport => "FAILURE: a connection error or a hang past the timeout",
            Class::UnreadHeld => "FAILURE: a stream never read was still open well past the send timeout",
        }
    }
}

/// Samples kept of each failure class.
const SAMPLES: usize = 3;

/// The classes of a mode's requests.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub counts: BTreeMap<Class, u64>,
    pub streamed: u64,
    pub plain: u64,
    /// The most waiting requests a full queue's 503 named, within bounds.
    pub most_waiting: usize,
    pub samples: BTreeMap<Class, Vec<String>>,
}

impl Tally {
    pub fn count(&mut self, answer: Answer, streamed: bool) {
        *self.counts.entry(answer.class).or_default() += 1;
        *if streamed { &mut self.streamed } else { &mut self.plain } += 1;
        if matches!(answer.class, Class::QueueFull | Class::QueueOverLimit) {
            self.most_waiting = self.most_waiting.max(answer.waiting.unwrap_or(0));
        }
        if answer.class.is_failure() {
            let samples = self.samples.entry(answer.class).or_default();
            if samples.len() < SAMPLES {
                samples.push(answer.detail);
            }
        }
    }

    pub fn merge(&mut self, other: Tally) {
        for (class, count) in other.counts {
            *self.counts.entry(class).or_default() += count;
        }
        self.streamed += other.streamed;
        self.plain += other.plain;
        self.most_waiting = self.most_waiting.max(other.most_waiting);
        for (class, samples) in other.samples {
            let kept = self.samples.entry(class).or_default();
            kept.extend(samples.into_iter().take(SAMPLES.saturating_sub(kept.len())));
        }
    }

    pub fn get(&self, class: Class) -> u64 {
        self.counts.get(&class).copied().unwrap_or(0)
    }
}

/// What one mode's load produced: the clients' answers, the faults, and
/// the most resident memory sampled meanwhile.
pub struct Load {
    pub tally: Tally,
    pub faults: Vec<FaultRecord>,
    pub rss_peak_kib: Option<u64>,
}

/// One `on_fault` mode's run.
#[derive(Debug, Clone)]
pub struct ModeReport {
    pub mode: Mode,
    pub tally: Tally,
    pub faults: Vec<FaultRecord>,
    pub idle: Idle,
    /// The most resident memory sampled during the load, in KiB.
    pub rss_peak_kib: Option<u64>,
    pub elapsed: Duration,
    /// The server's warnings and errors (the first few), and how many.
    pub log_excerpt: Vec<String>,
    pub log_problems: usize,
}

/// Log lines kept for the report.
const LOG_LINES: usize = 12;

impl ModeReport {
    pub fn new(mode: Mode, load: Load, idle: Idle, log: &str, elapsed: Duration) -> Self {
        let noted: Vec<&str> = log.lines().filter(|line| line.contains(" WARN ") || line.contains(" ERROR ")).collect();
        let log_excerpt = noted.iter().take(LOG_LINES).map(|line| (*line).to_owned()).collect();
        let Load { tally, faults, rss_peak_kib } = load;
        ModeReport { mode, tally, faults, idle, rss_peak_kib, elapsed, log_excerpt, log_problems: noted.len() }
    }

    /// Every broken rule, one line each; none when the mode passed.
    pub fn problems(&self) -> Vec<String> {
        let mode = self.mode.name();
        let mut problems = Vec::new();
        for class in Class::ALL.into_iter().filter(|class| class.is_failure()) {
            let count = self.tally.get(class);
            if count > 0 {
                let samples = self.tally.samples.get(&class).cloned().unwrap_or_default();
                problems.push(format!("{mode}: {count} × {}; e.g. {samples:?}", class.label()));
            }
        }
        // What the run is for: if these did not happen it tested nothing.
        if self.tally.get(Class::QueueFull) == 0 {
            problems.push(format!("{mode}: the queue never filled"));
        }
        if self.tally.get(Class::Unread) == 0 {
            problems.push(format!("{mode}: no stream that was never read ran to be cut"));
        }
        // Failing closed every few seconds may end every request on a slow
        // machine; on the fallback they all go on. (That a fail-closed
        // server serves again is the idle probe's to check.)
        if self.mode == Mode::Fallback && self.tally.get(Class::Completed) == 0 {
            problems.push(format!("{mode}: no request completed"));
        }
        if self.mode == Mode::FailClosed
            && self.tally.get(Class::RefusedClosed) + self.tally.get(Class::StreamFailedClosed) == 0
        {
            problems.push(format!("{mode}: no request was refused or ended by a fail-closed"));
        }
        for record in &self.faults {
            if let Some(error) = &record.error {
                problems.push(format!("{mode}: fault {}: {error}", record.fault));
            }
            if !record.expected_reasons().iter().any(|reason| record.reasons.contains_key(*reason)) {
                problems.push(format!(
                    "{mode}: fault {} was counted as {:?}, not as {:?}",
                    record.fault,
                    record.reasons,
                    record.expected_reasons()
                ));
            }
        }
        problems.extend(self.idle_problems());
        problems
    }

    fn idle_problems(&self) -> Vec<String> {
        let (mode, idle) = (self.mode.name(), &self.idle);
        let mut problems = Vec::new();
        if idle.settled_after.is_none() {
            problems.push(format!("{mode}: the server was not idle within 20 s of the last answer"));
        }
        for (name, value, expected) in &idle.gauges {
            if value != expected {
                problems.push(format!("{mode}: {name} is {value} once idle, not {expected}"));
            }
        }
        if idle.busy_slots != 0 {
            problems.push(format!("{mode}: {} slots busy once idle", idle.busy_slots));
        }
        if idle.kv_blocks.0 != idle.kv_blocks.1 {
            problems.push(format!(
                "{mode}: {} KV blocks used, cached or free once idle, of {}: some were lost",
                idle.kv_blocks.0, idle.kv_blocks.1
            ));
        }
        if idle.health != r#"200 {"status":"ok"}"# {
            problems.push(format!("{mode}: /health once idle: {}", idle.health));
        }
        if !idle.probe_failures.is_empty() {
            problems.push(format!(
                "{mode}: after the load, {} of {QUEUE_LIMIT} requests at once were refused: {:?}",
                idle.probe_failures.len(),
                idle.probe_failures.iter().take(SAMPLES).collect::<Vec<_>>()
            ));
        }
        match (idle.rss_kib, self.rss_peak_kib) {
            ((Some(warm), Some(end)), Some(peak)) => {
                for (when, kib) in [("at its peak during the load", peak), ("at the end", end)] {
                    if kib > warm + RSS_BOUND_MIB * 1024 {
                        problems.push(format!(
                            "{mode}: resident memory grew from {} to {} {when} (bound +{RSS_BOUND_MIB} MiB)",
                            mib(warm),
                            mib(kib)
                        ));
                    }
                }
            }
            _ => problems.push(format!("{mode}: the server's VmRSS could not be read")),
        }
        problems
    }
}

/// Both modes' runs.
#[derive(Debug, Clone)]
pub struct Report {
    pub clients: usize,
    pub seconds: u64,
    pub modes: Vec<ModeReport>,
}

impl Report {
    pub fn problems(&self) -> Vec<String> {
        self.modes.iter().flat_map(ModeReport::problems).collect()
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn seconds(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "never".to_owned(), |duration| format!("{:.2} s", duration.as_secs_f64()))
}

impl fmt::Display for ModeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tally = &self.tally;
        writeln!(
            f,
            "== {}: {} requests ({} streamed, {} not) in {:.1} s",
            self.mode.name(),
            tally.streamed + tally.plain,
            tally.streamed,
            tally.plain,
            self.elapsed.as_secs_f64()
        )?;
        for class in Class::ALL {
            let count = tally.get(class);
            if count > 0 || !class.is_failure() {
                let extra = if class == Class::QueueFull {
                    format!(" (most waiting named: {})", tally.most_waiting)
                } else {
                    String::new()
                };
                writeln!(f, "  {count:>7}  {}{extra}", class.label())?;
            }
        }
        writeln!(f, "  faults:")?;
        for record in &self.faults {
            let reasons: Vec<String> = record.reasons.iter().map(|(reason, n)| format!("{reason}×{n}")).collect();
            let rss = record.rss_kib.map_or_else(|| "?".to_owned(), mib);
            let recovered = match record.reload {
                Reload::NextFault => "—".to_owned(),
                _ => seconds(record.recovered_after),
            };
            writeln!(
                f,
                "    {:<22} after step {:<5} shown after {:>7}, counted as {:<18} {:<10} reload ok after {:>7}, RSS {rss}{}",
                record.fault,
                record.after_step,
                seconds(record.shown_after),
                reasons.join(" "),
                record.reload.name(),
                recovered,
                record.error.as_ref().map_or_else(String::new, |error| format!(" — {error}"))
            )?;
        }
        let idle = &self.idle;
        let gauges: Vec<String> = idle.gauges.iter().map(|(name, value, _)| format!("{name} {value}")).collect();
        writeln!(f, "  idle after {}: {}", seconds(idle.settled_after), gauges.join(", "))?;
        let counters: Vec<String> = idle.counters.iter().map(|(name, value)| format!("{name} {value}")).collect();
        writeln!(f, "  engine: {}", counters.join(", "))?;
        writeln!(
            f,
            "  slots busy {}, KV blocks {}/{}, /health {}, then {}/{QUEUE_LIMIT} requests at once answered 200",
            idle.busy_slots, idle.kv_blocks.0, idle.kv_blocks.1, idle.health, idle.probe_ok
        )?;
        let most =
            self.faults.iter().filter_map(|record| record.rss_kib).chain(idle.rss_kib.1).chain(self.rss_peak_kib).max();
        let show = |kib: Option<u64>| kib.map_or_else(|| "?".to_owned(), mib);
        writeln!(
            f,
            "  RSS {} after the warm-up, {} at the end, {} at most (bound +{RSS_BOUND_MIB} MiB)",
            show(idle.rss_kib.0),
            show(idle.rss_kib.1),
            show(most)
        )?;
        writeln!(f, "  server log: {} warnings and errors", self.log_problems)?;
        for line in &self.log_excerpt {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "load and fault test: {} clients, {} s, {SLOTS} slots of {SLOT_CTX} tokens, queue_limit {QUEUE_LIMIT}",
            self.clients, self.seconds
        )?;
        for mode in &self.modes {
            write!(f, "{mode}")?;
        }
        let problems = self.problems();
        if problems.is_empty() {
            writeln!(f, "no problems")
        } else {
            writeln!(f, "{} problems:", problems.len())?;
            problems.iter().try_for_each(|problem| writeln!(f, "  - {problem}"))
        }
    }
}
