//! What watches the steps without steering them: the shadow policies and
//! the step trace (see [`crate::shadow`], [`crate::trace`]),
//! and the operator commands that change them, including promoting a
//! shadow to active.

use super::Engine;
use crate::metrics::Metrics;
use crate::policy::{Decision, StepView};
use crate::state::{Promoted, ShadowCommand};
use crate::trace::TraceRecorder;

impl Engine {
    /// Whether a step's view and decision are wanted after it is applied.
    pub(super) fn observed(&self) -> bool {
        !self.shadows.is_empty() || self.recorder.is_some()
    }

    /// Show the shadows the step, then record it.
    pub(super) fn observe(&mut self, view: StepView, applied: Decision) {
        self.shadows.observe(&view, &applied, &self.shared.shadows);
        if let Some(recorder) = &mut self.recorder {
            if recorder.step(view, applied) {
                Metrics::set(&self.shared.metrics.trace_steps_dropped_total, recorder.dropped());
            } else {
                self.recorder = None;
            }
        }
    }

    pub(super) fn record(&mut self, recorder: TraceRecorder) {
        // Dropping a recorder waits for its writer: not on this thread.
        if let Some(previous) = self.recorder.replace(recorder) {
            let _ = std::thread::Builder::new().name("trace-end".into()).spawn(move || drop(previous));
        }
    }

    /// The active policy changed: the trace says so from the next step.
    pub(super) fn policy_changed(&mut self) {
        self.shared.set_policy(self.supervisor.policy_name(), self.supervisor.health());
        if let Some(recorder) = &mut self.recorder
            && !recorder.policy(self.step, self.supervisor.policy_name())
        {
            self.recorder = None;
        }
    }

    pub(super) fn shadow_command(&mut self, command: ShadowCommand) {
        let records = &self.shared.shadows;
        match command {
            ShadowCommand::Attach(policy, reply) => {
                let _ = reply.send(self.shadows.attach(policy, records));
            }
            ShadowCommand::Detach(name, reply) => {
                let _ = reply.send(self.shadows.detach(&name, records).map(drop));
            }
            ShadowCommand::Replace(policies, reply) => {
                let _ = reply.send(self.shadows.replace(policies, records));
            }
            ShadowCommand::Promote(name, reply) => {
                let _ = reply.send(self.promote(&name));
            }
        }
    }

    /// Make the shadow `name` the active policy, its instance and history
    /// kept; the policy it replaces keeps running as a shadow in its place
    /// (the fallback when it had taken over), unless it had failed closed.
    /// Like a reload, a promotion reopens a failed-closed server.
    fn promote(&mut self, name: &str) -> Result<Promoted, String> {
        let candidate = self.shadows.take_for_promotion(name, &self.shared.shadows)?;
        let was_closed = self.supervisor.is_closed();
        let previous = self.supervisor.replace(candidate);
        let previous_name = previous.name().to_owned();
        let kept = if was_closed {
            Err("it had failed closed".to_owned())
        } else {
            self.shadows.attach(previous, &self.shared.shadows)
        };
        if let Err(why) = &kept {
            tracing::warn!(policy = previous_name, why, "the replaced policy is not kept as a shadow");
        }
        tracing::info!(policy = name, previous = previous_name, "shadow policy promoted");
        self.policy_changed();
        Ok(Promoted { active: name.to_owned(), previous: previous_name, kept_as_shadow: kept.is_ok() })
    }
}
