//! `sluice lab replay`: run a policy against the views a server recorded
//! (`--record-trace`) and compare its decisions with the ones applied.
//!
//! The replay is open-loop: every step shows the recorded view, whatever
//! the policy decided before, so a divergence says "here it would have
//! decided otherwise", exactly as a shadow run would have said it live.
//! The policy runs under the supervisor's rules, as a shadow does
//! ([`candidate_supervisor`], [`candidate_decision`]), so a replay and a
//! shadow run of the same policy on the same steps agree. A policy is a
//! deterministic function of what it is shown, so a replay is
//! deterministic too: the decision hash is the same run to run.

use std::collections::BTreeMap;

use serde::Serialize;

use super::sim::DecisionHash;
use sluice_engine::FaultRules;
use sluice_engine::policy::{Decision, SchedulingPolicy};
use sluice_engine::shadow::{Agreement, Parts, candidate_decision, candidate_supervisor};
use sluice_engine::supervisor::{FaultEvent, Health, Observer};
use sluice_engine::trace::{TraceError, TraceLine};

/// One step on which the replayed policy decided otherwise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayDivergence {
    pub step: u64,
    /// `admit`, `prefill`, `decode`: the parts that differ.
    pub parts: Vec<&'static str>,
    pub applied: Decision,
    pub replayed: Decision,
}

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub policy: String,
    /// Server runs the trace spans (a step number going back starts one).
    pub runs: u64,
    /// Steps replayed.
    pub steps: u64,
    /// Steps missing from the trace (the writer fell behind): the policy
    /// did not see them.
    pub missing_steps: u64,
    pub agreed: Agreement,
    /// Steps on which any part differed.
    pub divergent_steps: u64,
    /// The hash of the replayed decisions, and of the recorded ones.
    pub decision_hash: String,
    pub applied_hash: String,
    /// The first divergences (as many as asked for).
    pub divergences: Vec<ReplayDivergence>,
    /// Faults by reason; after a quarantine the replay stops.
    pub faults: BTreeMap<&'static str, u64>,
    pub quarantined: Option<String>,
}

struct FaultCount<'a>(&'a mut BTreeMap<&'static str, u64>);

impl Observer for FaultCount<'_> {
    fn fault(&mut self, event: &FaultEvent) {
        *self.0.entry(event.reason).or_default() += 1;
    }
}

/// Replay `policy` over the steps of `lines` (one or more trace files'
/// lines, in order), keeping the first `keep` divergences. A step number
/// that goes back starts a new server run: the policy starts afresh, as
/// the server's did.
pub fn replay(
    lines: impl IntoIterator<Item = Result<TraceLine, TraceError>>,
    policy: Box<dyn SchedulingPolicy>,
    rules: FaultRules,
    keep: usize,
) -> Result<ReplayReport, TraceError> {
    let name = policy.name().to_owned();
    let mut supervisor = candidate_supervisor(policy, rules);
    let (mut replayed_hash, mut applied_hash) = (DecisionHash::default(), DecisionHash::default());
    let mut report = ReplayReport {
        policy: name,
        runs: 0,
        steps: 0,
        missing_steps: 0,
        agreed: Agreement::default(),
        divergent_steps: 0,
        decision_hash: String::new(),
        applied_hash: String::new(),
        divergences: Vec::new(),
        faults: BTreeMap::new(),
        quarantined: None,
    };
    let mut next_step: Option<u64> = None;
    for line in lines {
        let TraceLine::Step { view, applied } = line? else { continue };
        match next_step {
            Some(expected) if view.step >= expected => report.missing_steps += view.step - expected,
            Some(_) => {
                supervisor.restart();
                report.runs += 1;
            }
            None => report.runs = 1,
        }
        next_step = Some(view.step.saturating_add(1));
        let verdict = supervisor.decide(&view, &mut FaultCount(&mut report.faults));
        let Some(decision) = candidate_decision(verdict) else {
            if let Health::FailedClosed { fault, .. } = supervisor.health() {
                report.quarantined = Some(format!("at step {}: {fault}", view.step));
            }
            break;
        };
        replayed_hash.add(view.step, &decision);
        applied_hash.add(view.step, &applied);
        let parts = Parts::compare(&applied, &decision);
        report.steps += 1;
        report.agreed.count(parts);
        if !parts.all() {
            report.divergent_steps += 1;
            if report.divergences.len() < keep {
                report.divergences.push(ReplayDivergence {
                    step: view.step,
                    parts: parts.differing(),
                    applied,
                    replayed: decision,
                });
            }
        }
    }
    report.decision_hash = replayed_hash.hex();
    report.applied_hash = applied_hash.hex();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::policy::{Phase, PolicyFault, StepView};
    use sluice_plugin_api::testing::{ViewBuilder, request};

    /// Decodes slot 0 on even steps, slot 1 on odd ones.
    struct Alternating;

    impl SchedulingPolicy for Alternating {
        fn name(&self) -> &str {
            "alternating"
        }
        fn step(&mut self, view: &StepView) -> Result<Decision, PolicyFault> {
            Ok(decode(u32::from(!view.step.is_multiple_of(2))))
        }
        fn reset(&mut self) {}
    }

    fn decode(slot: u32) -> Decision {
        Decision { decode: vec![slot], ..Decision::default() }
    }

    fn step(step: u64, applied: Decision) -> TraceLine {
        let view = ViewBuilder::new(2, 16)
            .occupied(0, Phase::Decoding, request(1, 4).done(4))
            .occupied(1, Phase::Decoding, request(2, 4).done(4))
            .at(step, 0)
            .build();
        TraceLine::Step { view, applied }
    }

    #[test]
    fn divergences_hashes_and_gaps_are_reported() {
        let lines = [step(0, decode(0)), step(1, decode(0)), step(2, decode(0)), step(5, decode(0))];
        let run = || replay(lines.clone().map(Ok), Box::new(Alternating), FaultRules::default(), 1).expect("replays");
        let first = run();
        assert_eq!((first.steps, first.missing_steps, first.divergent_steps), (4, 2, 2));
        assert_eq!(first.agreed, Agreement { admit: 4, prefill: 4, decode: 2, all: 2 });
        assert_eq!(
            first.divergences,
            [ReplayDivergence { step: 1, parts: vec!["decode"], applied: decode(0), replayed: decode(1) }]
        );
        assert_eq!(first.runs, 1);
        let second = run();
        assert_eq!(first.decision_hash, second.decision_hash);
        assert_ne!(first.decision_hash, first.applied_hash);
        // A second server run starts over at step 0.
        let two_runs = [step(0, decode(0)), step(1, decode(1)), step(0, decode(0)), step(1, decode(1))];
        let report = replay(two_runs.map(Ok), Box::new(Alternating), FaultRules::default(), 1).expect("replays");
        assert_eq!((report.runs, report.steps, report.missing_steps, report.divergent_steps), (2, 4, 0, 0));
    }
}
