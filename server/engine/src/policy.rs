//! The engine ↔ policy seam: each step the engine builds a [`StepView`],
//! asks the policy for a [`Decision`] and validates it before applying any
//! of it (see [`super::supervisor`]). Validation lives in the engine, never
//! in the policy; the view and decision are the plugin SDK's records, which
//! plugins see too.

pub use sluice_plugin_api::{
    Admit, Decision, EndReason, EndedRequest, OccupiedSlot, Phase, Prefill, RequestInfo, StepCosts, StepView,
    WaitingRequest,
};

/// Why a policy produced no decision. The supervisor counts faults by
/// `reason` and reports `detail`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct PolicyFault {
    /// A short label for logs and metrics (`trap`, `fuel`, …).
    pub reason: &'static str,
    pub detail: String,
}

/// Decides which work runs in each engine step.
pub trait SchedulingPolicy: Send {
    /// The policy's name for logs, `/props` and metrics.
    fn name(&self) -> &str;

    /// Decide one step. A fault leaves the policy ready for the next call on
    /// a fresh instance.
    fn step(&mut self, view: &StepView) -> Result<Decision, PolicyFault>;

    /// Discard any instance state; the next `step` starts from a freshly
    /// configured instance (used after a decision fails validation).
    fn reset(&mut self);
}
