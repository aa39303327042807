//! Shadow policies: candidates that see every step's view after the active
//! policy has decided, under the same validation and fault rules, whose
//! decisions are compared with the applied one and never applied
//! (docs/scheduling.md, "Shadows, traces and replay").
//!
//! Shadows run on the engine thread after the step's work is applied, so a
//! step's own pass never waits for them; the time they take is bounded per
//! step by a budget: once the step's shadows have used it, the rest skip
//! that step (counted), and the next step starts with the next candidate so
//! a slow one cannot starve the others. A candidate that faults is retried
//! on a fresh instance and quarantined on the second fault in a row, as the
//! active policy would be; its faults touch nothing but its own record.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::policy::{Decision, SchedulingPolicy, StepView};
use super::supervisor::{FaultEvent, FaultRules, Health, Observer, OnFault, Supervisor, Verdict};

/// Most candidates attached at once.
pub const MAX_SHADOWS: usize = 4;
/// Divergent steps kept per candidate (the first ones), with their views.
pub const KEPT_DIVERGENCES: usize = 32;

/// Which parts of two decisions agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    pub admit: bool,
    pub prefill: bool,
    pub decode: bool,
}

impl Parts {
    /// Compare part by part; order counts (it is the order work is applied).
    pub fn compare(applied: &Decision, candidate: &Decision) -> Self {
        Parts {
            admit: applied.admit == candidate.admit,
            prefill: applied.prefill == candidate.prefill,
            decode: applied.decode == candidate.decode,
        }
    }

    pub fn all(self) -> bool {
        self.admit && self.prefill && self.decode
    }

    /// The names of the parts that differ.
    pub fn differing(self) -> Vec<&'static str> {
        [("admit", self.admit), ("prefill", self.prefill), ("decode", self.decode)]
            .into_iter()
            .filter(|(_, agree)| !agree)
            .map(|(name, _)| name)
            .collect()
    }
}

/// Steps on which each part agreed, out of the steps compared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Agreement {
    pub admit: u64,
    pub prefill: u64,
    pub decode: u64,
    /// Steps on which the whole decision agreed.
    pub all: u64,
}

impl Agreement {
    pub fn count(&mut self, parts: Parts) {
        self.admit += u64::from(parts.admit);
        self.prefill += u64::from(parts.prefill);
        self.decode += u64::from(parts.decode);
        self.all += u64::from(parts.all());
    }
}

/// One step on which a candidate decided differently.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    pub step: u64,
    /// The parts that differ: `admit`, `prefill`, `decode`.
    pub parts: Vec<&'static str>,
    pub view: StepView,
    /// What the active policy decided (and the engine applied).
    pub active: Decision,
    pub candidate: Decision,
}

/// What shadowing has shown of one candidate, published for
/// `GET /admin/policy/shadow` and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ShadowRecord {
    pub policy: String,
    /// Steps whose decision was compared.
    pub steps: u64,
    pub agreed: Agreement,
    /// Steps skipped because the step's shadow budget was spent.
    pub skipped: u64,
    /// Faults by reason (`trap`, `fuel`, `deadline`, `invalid`, `stalled`, …).
    pub faults: BTreeMap<&'static str, u64>,
    /// Why it was quarantined; a quarantined candidate sees no more steps.
    pub quarantined: Option<String>,
    /// Time spent in its calls, validation included.
    pub seconds: f64,
    /// The first [`KEPT_DIVERGENCES`] steps on which it decided differently.
    pub divergences: Vec<Divergence>,
}

/// A candidate's decision for a step, as [`Supervisor::decide`] gave it:
/// `None` once it is quarantined. A step it granted nothing on (waiting, or
/// a stall handled as a fault) compares as the empty decision. Shared with
/// the lab's replay, so both judge a candidate alike.
pub fn candidate_decision(verdict: Verdict) -> Option<Decision> {
    match verdict {
        Verdict::Run(decision) => Some(decision),
        Verdict::Wait | Verdict::Stalled => Some(Decision::default()),
        Verdict::Closed => None,
    }
}

/// The supervisor a candidate runs under: the active policy's stall rule,
/// and a second fault in a row quarantines it (no fallback).
pub fn candidate_supervisor(policy: Box<dyn SchedulingPolicy>, rules: FaultRules) -> Supervisor {
    let rules = FaultRules { on_fault: OnFault::FailClosed, ..rules };
    Supervisor::new(policy, Box::new(|| None), rules)
}

/// Counts a candidate's faults into its record and the log.
struct FaultCount<'a>(&'a mut BTreeMap<&'static str, u64>);

impl Observer for FaultCount<'_> {
    fn fault(&mut self, event: &FaultEvent) {
        let FaultEvent { step, policy, reason, detail, action } = event;
        tracing::warn!(step, policy, reason, detail, action = action.name(), "shadow policy fault");
        *self.0.entry(reason).or_default() += 1;
    }
}

/// The attached candidates, in attachment order.
pub struct Shadows {
    candidates: Vec<Supervisor>,
    budget: Duration,
    rules: FaultRules,
    /// Which candidate goes first at the next step that runs any.
    turn: usize,
    /// Time the shadows took beyond their budget, paid back by skipping
    /// whole steps (one budget each).
    debt: Duration,
}

/// The records, even after a panic elsewhere poisoned their lock (they
/// are counters: nothing in them can be half-written).
fn lock(records: &Mutex<Vec<ShadowRecord>>) -> MutexGuard<'_, Vec<ShadowRecord>> {
    records.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What one candidate did in a step, merged into its record afterwards so
/// the records' lock is never held while a candidate runs.
enum Outcome {
    Skipped,
    Ran { seconds: f64, faults: BTreeMap<&'static str, u64>, decision: Result<Decision, Option<String>> },
}

impl Shadows {
    pub fn new(budget: Duration, rules: FaultRules) -> Self {
        Shadows { candidates: Vec::new(), budget, rules, turn: 0, debt: Duration::ZERO }
    }

    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.candidates.iter().position(|candidate| candidate.policy_name() == name)
    }

    /// Attach a candidate; refused past [`MAX_SHADOWS`] or when one of that
    /// name is attached.
    pub fn attach(
        &mut self,
        policy: Box<dyn SchedulingPolicy>,
        records: &Mutex<Vec<ShadowRecord>>,
    ) -> Result<(), String> {
        let name = policy.name().to_owned();
        if self.position(&name).is_some() {
            return Err(format!("a shadow policy `{name}` is already attached"));
        }
        if self.candidates.len() == MAX_SHADOWS {
            return Err(format!("{MAX_SHADOWS} shadow policies are attached already; detach one first"));
        }
        self.candidates.push(candidate_supervisor(policy, self.rules));
        lock(records).push(ShadowRecord { policy: name, ..ShadowRecord::default() });
        Ok(())
    }

    /// Detach every candidate and attach `policies` instead; nothing
    /// changes when they cannot all be attached.
    pub fn replace(
        &mut self,
        policies: Vec<Box<dyn SchedulingPolicy>>,
        records: &Mutex<Vec<ShadowRecord>>,
    ) -> Result<(), String> {
        if policies.len() > MAX_SHADOWS {
            return Err(format!("{} shadow policies given; at most {MAX_SHADOWS} run", policies.len()));
        }
        let mut names: Vec<&str> = policies.iter().map(|policy| policy.name()).collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(format!("the shadow policy `{}` is given twice", pair[0]));
        }
        self.candidates.clear();
        lock(records).clear();
        policies.into_iter().try_for_each(|policy| self.attach(policy, records))
    }

    /// Detach the candidate `name`.
    pub fn detach(&mut self, name: &str, records: &Mutex<Vec<ShadowRecord>>) -> Result<Supervisor, String> {
        let at = self.position(name).ok_or_else(|| format!("no shadow policy `{name}` is attached"))?;
        let mut records = lock(records);
        if at < records.len() {
            records.remove(at);
        }
        Ok(self.candidates.remove(at))
    }

    /// Detach the candidate `name` to make it the active policy; refused
    /// while it is quarantined.
    pub fn take_for_promotion(
        &mut self,
        name: &str,
        records: &Mutex<Vec<ShadowRecord>>,
    ) -> Result<Box<dyn SchedulingPolicy>, String> {
        let at = self.position(name).ok_or_else(|| format!("no shadow policy `{name}` is attached"))?;
        if let Health::FailedClosed { fault, .. } = self.candidates[at].health() {
            return Err(format!("shadow policy `{name}` is quarantined ({fault}); it cannot be promoted"));
        }
        self.detach(name, records).map(Supervisor::into_policy)
    }

    /// Show every candidate the step `view` the active policy decided as
    /// `applied`, within the budget, and record how each compares.
    ///
    /// The budget holds on average: candidates run in turn while the step's
    /// shadows are within it, and what the last one took beyond it is a
    /// debt that whole steps pay back by skipping (a slow or looping
    /// candidate makes its successors skip, never the served steps wait
    /// longer than one call's worth).
    pub fn observe(&mut self, view: &StepView, applied: &Decision, records: &Mutex<Vec<ShadowRecord>>) {
        let n = self.candidates.len();
        if n == 0 {
            return;
        }
        let mut outcomes: Vec<(usize, Outcome)> = Vec::with_capacity(n);
        if self.debt >= self.budget {
            self.debt -= self.budget;
            outcomes.extend((0..n).map(|at| (at, Outcome::Skipped)));
        } else {
            let allowance = self.budget - std::mem::take(&mut self.debt);
            let started = Instant::now();
            let first = self.turn % n;
            self.turn = self.turn.wrapping_add(1);
            for at in (first..n).chain(0..first) {
                let candidate = &mut self.candidates[at];
                if candidate.is_closed() {
                    continue;
                }
                if started.elapsed() >= allowance {
                    outcomes.push((at, Outcome::Skipped));
                    continue;
                }
                let mut faults = BTreeMap::new();
                let call = Instant::now();
                let verdict = candidate.decide(view, &mut FaultCount(&mut faults));
                let seconds = call.elapsed().as_secs_f64();
                let decision = candidate_decision(verdict).ok_or_else(|| match candidate.health() {
                    Health::FailedClosed { fault, .. } => Some(fault.clone()),
                    _ => None,
                });
                outcomes.push((at, Outcome::Ran { seconds, faults, decision }));
            }
            self.debt = started.elapsed().saturating_sub(allowance);
        }
        let mut records = lock(records);
        for (at, outcome) in outcomes {
            let Some(record) = records.get_mut(at) else { continue };
            let (seconds, faults, decision) = match outcome {
                Outcome::Skipped => {
                    record.skipped += 1;
                    continue;
                }
                Outcome::Ran { seconds, faults, decision } => (seconds, faults, decision),
            };
            record.seconds += seconds;
            for (reason, count) in faults {
                *record.faults.entry(reason).or_default() += count;
            }
            let decision = match decision {
                Ok(decision) => decision,
                Err(fault) => {
                    tracing::error!(policy = record.policy, fault, "shadow policy quarantined");
                    record.quarantined = fault.or_else(|| Some("quarantined".to_owned()));
                    continue;
                }
            };
            let parts = Parts::compare(applied, &decision);
            record.steps += 1;
            record.agreed.count(parts);
            if !parts.all() && record.divergences.len() < KEPT_DIVERGENCES {
                record.divergences.push(Divergence {
                    step: view.step,
                    parts: parts.differing(),
                    view: view.clone(),
                    active: applied.clone(),
                    candidate: decision,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Phase, PolicyFault};
    use sluice_plugin_api::testing::{ViewBuilder, request};

    /// Decodes `slot`; faults from step `fault_from` on.
    struct Fixed {
        name: &'static str,
        slot: u32,
        fault_from: u64,
        spin: Duration,
    }

    impl SchedulingPolicy for Fixed {
        fn name(&self) -> &str {
            self.name
        }
        fn step(&mut self, view: &StepView) -> Result<Decision, PolicyFault> {
            std::thread::sleep(self.spin);
            if view.step >= self.fault_from {
                return Err(PolicyFault { reason: "trap", detail: "trap: unreachable".into() });
            }
            Ok(Decision { decode: vec![self.slot], ..Decision::default() })
        }
        fn reset(&mut self) {}
    }

    fn fixed(name: &'static str) -> Box<Fixed> {
        Box::new(Fixed { name, slot: 0, fault_from: u64::MAX, spin: Duration::ZERO })
    }

    fn view(step: u64) -> StepView {
        ViewBuilder::new(2, 16)
            .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1))
            .occupied(1, Phase::Decoding, request(2, 4).done(4).generated(1))
            .at(step, 0)
            .build()
    }

    fn decode() -> Decision {
        Decision { decode: vec![0], ..Decision::default() }
    }

    fn shadows() -> (Shadows, Mutex<Vec<ShadowRecord>>) {
        (Shadows::new(Duration::from_secs(1), FaultRules::default()), Mutex::new(Vec::new()))
    }

    #[test]
    fn agreeing_and_diverging_candidates_are_counted_part_by_part() {
        let (mut shadows, records) = shadows();
        shadows.attach(fixed("same"), &records).expect("attach");
        shadows.attach(Box::new(Fixed { slot: 1, ..*fixed("other") }), &records).expect("attach");
        for step in 0..3 {
            shadows.observe(&view(step), &decode(), &records);
        }
        let records = records.into_inner().expect("records");
        assert_eq!(records[0].steps, 3);
        assert_eq!(records[0].agreed, Agreement { admit: 3, prefill: 3, decode: 3, all: 3 });
        assert!(records[0].divergences.is_empty());
        assert_eq!(records[1].agreed, Agreement { admit: 3, prefill: 3, decode: 0, all: 0 });
        let first = &records[1].divergences[0];
        assert_eq!((first.step, first.parts.clone()), (0, vec!["decode"]));
        assert_eq!((first.view.clone(), first.active.clone()), (view(0), decode()));
        assert_eq!(first.candidate.decode, [1]);
    }

    #[test]
    fn a_faulting_candidate_is_quarantined_and_names_are_unique() {
        let (mut shadows, records) = shadows();
        shadows.attach(Box::new(Fixed { fault_from: 1, ..*fixed("bad") }), &records).expect("attach");
        assert_eq!(shadows.attach(fixed("bad"), &records).unwrap_err(), "a shadow policy `bad` is already attached");
        for step in 0..4 {
            shadows.observe(&view(step), &decode(), &records);
        }
        let record = records.lock().expect("records")[0].clone();
        assert_eq!(record.steps, 1);
        assert_eq!(record.faults.get("trap"), Some(&2));
        assert_eq!(record.quarantined.as_deref(), Some("trap: trap: unreachable"));
        for name in ["b", "c", "d"] {
            shadows.attach(fixed(name), &records).expect("attach");
        }
        assert!(shadows.attach(fixed("e"), &records).unwrap_err().starts_with("4 shadow policies"));
        let again: Vec<Box<dyn SchedulingPolicy>> = vec![fixed("x"), fixed("x")];
        assert_eq!(shadows.replace(again, &records).unwrap_err(), "the shadow policy `x` is given twice");
        assert_eq!(records.lock().expect("records").len(), 4, "a refused replacement changes nothing");
        assert!(shadows.detach("bad", &records).is_ok());
        assert_eq!(records.lock().expect("records").len(), 3);
        assert_eq!(shadows.detach("bad", &records).err().as_deref(), Some("no shadow policy `bad` is attached"));
    }

    #[test]
    fn over_budget_candidates_skip_and_take_turns() {
        let (mut shadows, records) = shadows();
        shadows.budget = Duration::from_millis(5);
        for name in ["slow", "slower"] {
            shadows
                .attach(Box::new(Fixed { spin: Duration::from_millis(10), ..*fixed(name) }), &records)
                .expect("attach");
        }
        for step in 0..4 {
            shadows.observe(&view(step), &decode(), &records);
        }
        let records = records.into_inner().expect("records");
        // A step runs the one whose turn it is (10 ms, 5 over budget) and
        // the other skips; the next step pays the debt back by skipping both.
        assert_eq!([records[0].steps, records[0].skipped], [1, 3]);
        assert_eq!([records[1].steps, records[1].skipped], [1, 3]);
    }
}
