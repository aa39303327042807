//! The policy supervisor: one set of fault rules for the engine and the
//! policy lab's simulator (docs/scheduling.md, "Faults").
//!
//! Each step it asks the policy for a decision, validates it with the host's
//! rules ([`sluice_plugin_api::rules`]), retries a fault once on a fresh
//! instance, quarantines the policy on the second fault in a row, then fails
//! closed or falls back to the built-in `continuous`. A policy that grants
//! nothing for `stall_steps` steps in a row while work is runnable faults
//! too. The supervisor owns the health `/health` reports; it never touches
//! requests, which is what lets the engine and the simulator share it: each
//! applies a verdict to its own slots.

use std::time::Instant;

use sluice_plugin_api::rules;

use super::policy::{Decision, SchedulingPolicy, StepView};

/// Faults in a row that quarantine a policy; the ones before are retried
/// on a fresh instance.
pub const QUARANTINE_AFTER: u32 = 2;

/// What happens when a policy is quarantined: `[policy] on_fault` (and the
/// lab's `--on-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFault {
    /// End every request with an error and refuse new ones until reloaded.
    FailClosed,
    /// Switch to the embedded `continuous` policy and report "degraded".
    Fallback,
}

impl OnFault {
    pub const ALL: [OnFault; 2] = [OnFault::FailClosed, OnFault::Fallback];

    /// The value by its name in the config (`fail-closed`, `fallback`).
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|value| value.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnFault::FailClosed => "fail-closed",
            OnFault::Fallback => "fallback",
        }
    }
}

/// The supervisor's rules (`[policy] on_fault`, `stall_steps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRules {
    pub on_fault: OnFault,
    /// Steps in a row without any grant, while work is runnable, that count
    /// as a stall fault.
    pub stall_steps: u32,
}

impl Default for FaultRules {
    fn default() -> Self {
        FaultRules { on_fault: OnFault::FailClosed, stall_steps: 64 }
    }
}

/// Builds the policy to fall back to after a quarantine; `None` when it
/// cannot be built (then the supervisor fails closed).
pub type FallbackPolicy = Box<dyn Fn() -> Option<Box<dyn SchedulingPolicy>> + Send>;

/// The serving health, as `/health` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// Running on the fallback policy after the configured one was quarantined.
    Degraded {
        policy: String,
        fault: String,
    },
    /// The policy failed closed; requests are refused until a reload.
    FailedClosed {
        policy: String,
        fault: String,
    },
    /// The engine itself stopped (its thread panicked or its state is
    /// unreadable); only a restart serves again. The supervisor never
    /// reports this; the engine's handle does.
    Stopped {
        reason: String,
    },
}

impl Health {
    /// Why requests are refused, when they are.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Health::FailedClosed { policy, fault } => {
                Some(format!("scheduling policy `{policy}` failed closed ({fault}); reload the policy to resume"))
            }
            Health::Stopped { reason } => Some(reason.clone()),
            Health::Ok | Health::Degraded { .. } => None,
        }
    }
}

/// What the supervisor did about one fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// The next call runs on a fresh instance.
    Retry,
    /// Quarantined; the fallback policy (named) took over.
    Fallback(String),
    /// Quarantined; serving is closed until a reload.
    FailClosed,
}

impl FaultAction {
    pub fn name(&self) -> &'static str {
        match self {
            FaultAction::Retry => "retry",
            FaultAction::Fallback(_) => "fallback",
            FaultAction::FailClosed => "fail-closed",
        }
    }
}

/// One fault and what was done about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultEvent {
    /// The step whose decision faulted.
    pub step: u64,
    pub policy: String,
    /// `trap`, `fuel`, `deadline`, `memory`, `malformed`, `invalid` or `stalled`.
    pub reason: &'static str,
    pub detail: String,
    pub action: FaultAction,
}

/// Hears about every policy call and fault (the engine's metrics and log;
/// the simulator records only faults).
pub trait Observer {
    /// A policy call took `seconds`.
    fn call(&mut self, _seconds: f64) {}
    /// A fault was handled.
    fn fault(&mut self, _event: &FaultEvent) {}
}

/// An observer that ignores everything.
impl Observer for () {}

/// The outcome of one step's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Apply this decision: it passed validation and grants something.
    Run(Decision),
    /// The policy granted nothing; let a moment pass before the next step
    /// (a policy waiting on the clock must not spin).
    Wait,
    /// The policy granted nothing for `stall_steps` steps and the stall was
    /// handled as a fault (retried or quarantined with a fallback); nothing
    /// runs this step.
    Stalled,
    /// The policy was quarantined and serving is now closed.
    Closed,
}

/// Runs a policy under the fault rules.
pub struct Supervisor {
    policy: Box<dyn SchedulingPolicy>,
    fallback: FallbackPolicy,
    rules: FaultRules,
    consecutive_faults: u32,
    stalled_steps: u32,
    health: Health,
}

impl Supervisor {
    pub fn new(policy: Box<dyn SchedulingPolicy>, fallback: FallbackPolicy, rules: FaultRules) -> Self {
        Supervisor { policy, fallback, rules, consecutive_faults: 0, stalled_steps: 0, health: Health::Ok }
    }

    /// The name of the policy deciding now (the fallback once it took over).
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Whether serving is closed until a reload.
    pub fn is_closed(&self) -> bool {
        matches!(self.health, Health::FailedClosed { .. })
    }

    /// An operator's reload: the new policy decides from the next step, with
    /// a clean record; the one it replaces (to keep running as a shadow).
    pub fn replace(&mut self, policy: Box<dyn SchedulingPolicy>) -> Box<dyn SchedulingPolicy> {
        self.consecutive_faults = 0;
        self.stalled_steps = 0;
        self.health = Health::Ok;
        std::mem::replace(&mut self.policy, policy)
    }

    /// Start the policy afresh (a new instance next call), with a clean
    /// record: a replay crossing into another server run.
    pub fn restart(&mut self) {
        self.policy.reset();
        self.consecutive_faults = 0;
        self.stalled_steps = 0;
        self.health = Health::Ok;
    }

    /// The policy, its instance and history kept (a shadow being promoted).
    pub fn into_policy(self) -> Box<dyn SchedulingPolicy> {
        self.policy
    }

    /// Decide the step `view` describes. Call it only when the view has
    /// runnable work ([`rules::has_runnable_work`]) and serving is open.
    pub fn decide(&mut self, view: &StepView, observer: &mut dyn Observer) -> Verdict {
        let decision = loop {
            let started = Instant::now();
            let result = self.policy.step(view);
            observer.call(started.elapsed().as_secs_f64());
            let (reason, detail) = match result {
                Ok(decision) => match rules::validate(view, &decision, 0) {
                    Ok(()) => break decision,
                    Err(invalid) => ("invalid", invalid.to_string()),
                },
                Err(fault) => (fault.reason, fault.detail),
            };
            if self.fault(view.step, reason, detail, observer) == FaultAction::FailClosed {
                return Verdict::Closed;
            }
        };
        if decision.admit.is_empty() && decision.prefill.is_empty() && decision.decode.is_empty() {
            self.stalled_steps += 1;
            if self.stalled_steps < self.rules.stall_steps {
                return Verdict::Wait;
            }
            self.stalled_steps = 0;
            let detail = format!("granted nothing for {} steps with work runnable", self.rules.stall_steps);
            return match self.fault(view.step, "stalled", detail, observer) {
                FaultAction::FailClosed => Verdict::Closed,
                _ => Verdict::Stalled,
            };
        }
        self.stalled_steps = 0;
        self.consecutive_faults = 0;
        Verdict::Run(decision)
    }

    /// Record a fault, discard the instance and apply the rules.
    fn fault(&mut self, step: u64, reason: &'static str, detail: String, observer: &mut dyn Observer) -> FaultAction {
        let policy = self.policy.name().to_owned();
        self.policy.reset();
        self.consecutive_faults += 1;
        let action = if self.consecutive_faults < QUARANTINE_AFTER {
            FaultAction::Retry
        } else {
            self.consecutive_faults = 0;
            let fault = format!("{reason}: {detail}");
            let fallback = match self.rules.on_fault {
                OnFault::Fallback => (self.fallback)(),
                OnFault::FailClosed => None,
            };
            match fallback {
                Some(fallback) => {
                    let name = fallback.name().to_owned();
                    self.policy = fallback;
                    self.health = Health::Degraded { policy: policy.clone(), fault };
                    FaultAction::Fallback(name)
                }
                None => {
                    self.health = Health::FailedClosed { policy: policy.clone(), fault };
                    FaultAction::FailClosed
                }
            }
        };
        observer.fault(&FaultEvent { step, policy, reason, detail, action: action.clone() });
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Phase, PolicyFault};
    use sluice_plugin_api::testing::{ViewBuilder, request};

    /// Answers from a script, one entry per call, then grants nothing.
    struct Scripted {
        name: &'static str,
        answers: Vec<Result<Decision, PolicyFault>>,
    }

    impl SchedulingPolicy for Scripted {
        fn name(&self) -> &str {
            self.name
        }
        fn step(&mut self, _view: &StepView) -> Result<Decision, PolicyFault> {
            if self.answers.is_empty() { Ok(Decision::default()) } else { self.answers.remove(0) }
        }
        fn reset(&mut self) {}
    }

    #[derive(Default)]
    struct Journal(Vec<FaultEvent>);

    impl Observer for Journal {
        fn fault(&mut self, event: &FaultEvent) {
            self.0.push(event.clone());
        }
    }

    fn view() -> StepView {
        ViewBuilder::new(2, 16).occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1)).at(7, 0).build()
    }

    fn decode() -> Decision {
        Decision { decode: vec![0], ..Decision::default() }
    }

    fn trap() -> PolicyFault {
        PolicyFault { reason: "trap", detail: "trap: unreachable".into() }
    }

    fn supervisor(
        answers: Vec<Result<Decision, PolicyFault>>,
        rules: FaultRules,
        fallback: FallbackPolicy,
    ) -> Supervisor {
        Supervisor::new(Box::new(Scripted { name: "scripted", answers }), fallback, rules)
    }

    fn no_fallback() -> FallbackPolicy {
        Box::new(|| None)
    }

    #[test]
    fn a_fault_is_retried_once_then_the_policy_fails_closed() {
        let mut journal = Journal::default();
        let mut once = supervisor(vec![Err(trap()), Ok(decode())], FaultRules::default(), no_fallback());
        assert_eq!(once.decide(&view(), &mut journal), Verdict::Run(decode()));
        assert_eq!(once.health(), &Health::Ok);
        let mut twice = supervisor(vec![Err(trap()), Err(trap())], FaultRules::default(), no_fallback());
        assert_eq!(twice.decide(&view(), &mut journal), Verdict::Closed);
        assert!(twice.is_closed());
        let actions: Vec<_> = journal.0.iter().map(|event| (event.step, event.reason, event.action.clone())).collect();
        assert_eq!(
            actions,
            [(7, "trap", FaultAction::Retry), (7, "trap", FaultAction::Retry), (7, "trap", FaultAction::FailClosed)]
        );
        assert_eq!(
            twice.health().refusal().as_deref(),
            Some("scheduling policy `scripted` failed closed (trap: trap: unreachable); reload the policy to resume")
        );
        twice.replace(Box::new(Scripted { name: "new", answers: vec![] }));
        assert_eq!(twice.health(), &Health::Ok);
    }

    #[test]
    fn invalid_decisions_are_faults_and_a_fallback_takes_over() {
        let bad = Decision { decode: vec![5], ..Decision::default() };
        let fallback: FallbackPolicy = Box::new(|| {
            Some(Box::new(Scripted { name: "continuous", answers: vec![Ok(decode())] }) as Box<dyn SchedulingPolicy>)
        });
        let rules = FaultRules { on_fault: OnFault::Fallback, stall_steps: 4 };
        let mut supervisor = supervisor(vec![Ok(bad.clone()), Ok(bad)], rules, fallback);
        let mut journal = Journal::default();
        assert_eq!(supervisor.decide(&view(), &mut journal), Verdict::Run(decode()));
        assert_eq!(supervisor.policy_name(), "continuous");
        assert!(matches!(supervisor.health(), Health::Degraded { policy, .. } if policy == "scripted"));
        assert_eq!(journal.0[0].detail, "decodes slot 5, which is neither ready nor decoding");
        assert_eq!(journal.0[1].action, FaultAction::Fallback("continuous".into()));
    }

    #[test]
    fn a_stall_is_a_fault_after_stall_steps_empty_decisions() {
        let rules = FaultRules { on_fault: OnFault::FailClosed, stall_steps: 3 };
        let mut supervisor = supervisor(Vec::new(), rules, no_fallback());
        let mut journal = Journal::default();
        let verdicts: Vec<Verdict> = (0..6).map(|_| supervisor.decide(&view(), &mut journal)).collect();
        use Verdict::{Closed, Stalled, Wait};
        assert_eq!(verdicts, [Wait, Wait, Stalled, Wait, Wait, Closed]);
        assert_eq!(journal.0.iter().map(|event| event.reason).collect::<Vec<_>>(), ["stalled", "stalled"]);
    }

    #[test]
    fn a_good_step_clears_the_fault_count() {
        let answers = vec![Err(trap()), Ok(decode()), Err(trap()), Ok(decode())];
        let mut supervisor = supervisor(answers, FaultRules::default(), no_fallback());
        assert_eq!(supervisor.decide(&view(), &mut ()), Verdict::Run(decode()));
        assert_eq!(supervisor.decide(&view(), &mut ()), Verdict::Run(decode()));
        assert_eq!(supervisor.health(), &Health::Ok);
    }
}
