//! The engine ↔ policy seam: each step the engine builds a [`StepView`],
//! asks the policy for a [`Decision`] and validates it before applying any
//! of it. Validation lives in the engine, never in the policy.

pub use crate::plugins::PluginFault;
pub use crate::plugins::policy_types::{
    Admit, Decision, EndReason, EndedRequest, OccupiedSlot, Phase, Prefill, RequestInfo, StepView, WaitingRequest,
};

/// Decides which work runs in each engine step.
pub trait SchedulingPolicy: Send {
    /// The policy's name for logs, `/props` and metrics.
    fn name(&self) -> &str;

    /// Decide one step. A fault leaves the policy ready for the next call on
    /// a fresh instance.
    fn step(&mut self, view: &StepView) -> Result<Decision, PluginFault>;

    /// Discard any instance state; the next `step` starts from a freshly
    /// configured instance (used after a decision fails validation).
    fn reset(&mut self);
}
