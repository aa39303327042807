//! `cohort`: the PP/TG cohort barrier (docs/scheduling.md, "The cohort
//! barrier").
//!
//! Requests are scheduled in cohorts. A cohort forms from the waiting queue
//! (oldest first, only the adapter group of its first member, up to the free
//! slots and `max_members`); requests of other groups are skipped, not
//! waited for, and lead a later cohort once they are the oldest. Until one
//! member finishes its prompt, compatible arrivals may still join; the step
//! that completes the first prompt seals the cohort. A member whose prompt is
//! done holds its final logits (phase `ready`) and is not decoded until every
//! member is ready or gone; then all members decode together every step, and
//! nothing new is admitted or prefilled until the last of them has finished.
//!
//! Why: members of a cohort start generating in the same step and share every
//! decode step after that, so their token streams advance in lock-step and a
//! prompt is never processed while the cohort generates (prefill does not
//! inflate inter-token latency). The price, to be measured rather than
//! hidden: a short prompt waits for the longest prompt of its cohort (TTFT),
//! and a cohort with a long generation keeps every later request waiting
//! (queueing delay, idle slots while it drains). `max_wait_ms` bounds the
//! first; `max_members` limits how much work one cohort can hold.
//!
//! # State
//!
//! The host may discard an instance after a fault and continue on a fresh
//! one, so the policy derives what it can from each view and keeps only what
//! a view cannot show:
//!
//! * The cohort is the set of occupied slots: only a forming cohort admits,
//!   so every occupied slot belongs to it, and a member that terminates
//!   (completed, cancelled, failed) simply leaves `occupied`. No member list
//!   is kept and `ended` is not needed. An empty `occupied` means there is no
//!   cohort (also when all members terminated before TG: it simply ended).
//! * The cohort's adapter group is that of its members.
//! * Sealed: inferred while a member is `ready` or `decoding` (or has
//!   generated); kept as `sealed_at_ms` because the evidence disappears when
//!   the member that sealed it terminates while the others still prefill.
//!   It is also set when this policy grants the prefill chunk that completes
//!   a prompt, since that member may end before the next view shows it.
//! * Released: inferred while a member is `decoding`; kept because a release
//!   by `max_wait_ms` (or the members that decoded all finishing while a
//!   straggler still prefills) leaves no trace in the view.
//! * The `max_wait_ms` clock starts at `sealed_at_ms`. No view says when a
//!   member became ready, so a fresh instance restarts the clock at the
//!   first view that shows the cohort sealed: after a fault a ready member
//!   may wait up to twice `max_wait_ms`. Holding longer is chosen over
//!   releasing early, which would break the barrier the operator asked for.
//!
//! A fresh instance that lost the kept state still never admits into a
//! cohort whose seal is visible and never decodes before every visible
//! member is ready; it only may let compatible requests join a cohort whose
//! sealing member has already left, or restart the `max_wait_ms` clock.
//!
//! # Budget
//!
//! Before release the whole token budget goes to prefill chunks in slot
//! order. After release every member that is ready or decoding gets a decode
//! grant (slot order, one token each, while the budget lasts) and what is
//! left goes to the prefill of stragglers released by `max_wait_ms`, who
//! join decoding as soon as their prompt is done.
//!
//! # Settings
//!
//! * `max_members` (integer ≥ 1, default: every free slot): the most members
//!   one cohort may have at a time.
//! * `max_wait_ms` (integer ≥ 1, default: off): once the cohort has been
//!   sealed this long, it is released as if the stragglers had finished;
//!   they keep prefilling and decode as soon as they are ready.

use sluice_plugin_api::{Admit, Decision, OccupiedSlot, Phase, Policy, Settings, StepView, export_policy};

const MAX_MEMBERS: &str = "max_members";
const MAX_WAIT_MS: &str = "max_wait_ms";

/// The cohort barrier; see the crate documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cohort {
    /// Most members at a time; `u32::MAX` stands for "all slots".
    max_members: u32,
    max_wait_ms: Option<u64>,
    /// When the current cohort was sealed (or first seen sealed); `None`
    /// while it forms or when there is none.
    sealed_at_ms: Option<u64>,
    /// Whether the current cohort has been released into TG.
    released: bool,
}

impl Policy for Cohort {
    fn configure(settings: &Settings) -> Result<Self, String> {
        settings.expect_only(&[MAX_MEMBERS, MAX_WAIT_MS])?;
        let max_members = settings.integer(MAX_MEMBERS, i64::from(u32::MAX), 1..=i64::from(u32::MAX))?;
        let max_wait_ms = settings.optional_integer(MAX_WAIT_MS, 1..=i64::MAX)?;
        Ok(Cohort {
            max_members: u32::try_from(max_members).map_err(|_| format!("setting `{MAX_MEMBERS}` is too large"))?,
            max_wait_ms: max_wait_ms
                .map(u64::try_from)
                .transpose()
                .map_err(|_| format!("setting `{MAX_WAIT_MS}` must be positive"))?,
            sealed_at_ms: None,
            released: false,
        })
    }

    fn step(&mut self, view: &StepView) -> Decision {
        self.observe(view);
        let mut decision = Decision::default();
        let mut budget = view.token_budget;

        // (slot, prompt tokens remaining) of every member that may prefill.
        let mut prefilling = view.prefilling();

        if self.sealed_at_ms.is_none() {
            self.admit(view, &mut decision, &mut prefilling);
        } else if !self.released {
            let clock_ran_out = match (self.max_wait_ms, self.sealed_at_ms) {
                (Some(max_wait), Some(sealed_at)) => view.now_ms.saturating_sub(sealed_at) >= max_wait,
                _ => false,
            };
            if prefilling.is_empty() || clock_ran_out {
                self.released = true;
            }
        }

        if self.released {
            decision.decode_ready(view, &mut budget);
        }

        prefilling.sort_unstable_by_key(|&(slot, _)| slot);
        let completed = decision.prefill_in_order(prefilling, &mut budget);
        if !completed.is_empty() && self.sealed_at_ms.is_none() {
            // A chunk completes a prompt: the cohort is sealed from this step
            // on, even if that member ends before the next view.
            self.sealed_at_ms = Some(view.now_ms);
        }
        decision
    }
}

impl Cohort {
    /// Bring the kept state in line with what the view shows.
    fn observe(&mut self, view: &StepView) {
        if view.occupied.is_empty() {
            // No cohort: whatever was kept belonged to one that has ended.
            self.sealed_at_ms = None;
            self.released = false;
            return;
        }
        if view.occupied.iter().any(decodable) && self.sealed_at_ms.is_none() {
            self.sealed_at_ms = Some(view.now_ms);
        }
        if view.occupied.iter().any(|slot| slot.phase == Phase::Decoding || slot.request.generated > 0) {
            self.released = true;
        }
    }

    /// Form the cohort, or let compatible requests join it while it is not
    /// sealed, FIFO into the free slots (lowest first).
    fn admit(&self, view: &StepView, decision: &mut Decision, prefilling: &mut Vec<(u32, u32)>) {
        // The cohort's first member is its oldest; with no cohort, the oldest
        // waiting request starts one.
        let first = view
            .occupied
            .iter()
            .map(|slot| &slot.request)
            .min_by_key(|request| (request.arrival_ms, request.id))
            .or_else(|| view.waiting.first().map(|waiting| &waiting.request));
        let Some(group) = first.map(|request| request.adapter_group) else { return };
        let members = u32::try_from(view.occupied.len()).unwrap_or(u32::MAX);
        let room = usize::try_from(self.max_members.saturating_sub(members)).unwrap_or(usize::MAX);
        let joining = view.waiting.iter().filter(|waiting| waiting.request.adapter_group == group).take(room);
        for (waiting, &slot) in joining.zip(&view.free_slots) {
            decision.admit.push(Admit { request_id: waiting.request.id, slot });
            prefilling.push((slot, waiting.request.prompt_remaining()));
        }
    }
}

fn decodable(slot: &OccupiedSlot) -> bool {
    matches!(slot.phase, Phase::Ready | Phase::Decoding)
}

export_policy!(Cohort);

#[cfg(test)]
mod tests;
