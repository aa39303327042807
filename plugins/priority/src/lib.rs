//! `priority`: admission and prefill by priority, then arrival, with aging
//! so that low priorities are delayed but never starved.
//!
//! Every step: decode every ready or decoding slot (slot order, while the
//! budget lasts, as `continuous` does), admit waiting requests into free
//! slots in order of effective priority (highest first, then oldest), then
//! spend what is left of the budget on prefill chunks in the same order.
//!
//! A request's effective priority is its `priority` plus one for every full
//! `aging_ms` it has waited (`now_ms - arrival_ms`); among equal effective
//! priorities the older request goes first. Without aging a steady stream of
//! high-priority requests would keep a low-priority one waiting forever;
//! with it, a request of priority `p` is never overtaken by one of priority
//! `q` that arrived `(q - p) * aging_ms` or more after it, so it waits at
//! most behind the finitely many requests that arrived before it or within
//! that window.
//!
//! Trade-offs, to be measured rather than hidden: priority acts only where
//! the policy has a choice, i.e. admission and prefill order. There is no
//! preemption (the interface has none), so a high-priority request still
//! waits for a slot to free up, and running requests of any priority keep
//! decoding. Decoding first keeps inter-token latency low at the cost of
//! TTFT when slots decode a lot, like `continuous`.
//!
//! # Settings
//!
//! * `aging_ms` (integer ≥ 1, default 5000): the wait that raises a
//!   request's effective priority by one. Smaller means fairer (closer to
//!   FIFO), larger means priorities hold longer.

use std::cmp::Reverse;

use sluice_plugin_api::{Admit, Decision, Phase, Policy, RequestInfo, Settings, StepView, export_policy};

const AGING_MS: &str = "aging_ms";
const DEFAULT_AGING_MS: i64 = 5000;

/// Priority then arrival, with aging; see the crate documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityPolicy {
    aging_ms: u64,
}

impl Policy for PriorityPolicy {
    fn configure(settings: &Settings) -> Result<Self, String> {
        settings.expect_only(&[AGING_MS])?;
        let aging_ms = settings.integer(AGING_MS, DEFAULT_AGING_MS, 1..=i64::MAX)?;
        let aging_ms = u64::try_from(aging_ms).map_err(|_| format!("setting `{AGING_MS}` must be positive"))?;
        Ok(PriorityPolicy { aging_ms })
    }

    fn step(&mut self, view: &StepView) -> Decision {
        let mut budget = view.token_budget;
        let mut decision = Decision::default();

        decision.decode_ready(view, &mut budget);

        let mut waiting: Vec<(Rank, &RequestInfo)> = view
            .waiting
            .iter()
            .enumerate()
            .map(|(position, waiting)| (self.rank(&waiting.request, view.now_ms, position), &waiting.request))
            .collect();
        waiting.sort_unstable_by_key(|&(rank, _)| rank);

        // (rank, slot, prompt tokens remaining) of every slot that may prefill.
        let mut prefilling: Vec<(Rank, u32, u32)> = view
            .occupied
            .iter()
            .filter(|slot| slot.phase == Phase::Prefilling)
            .map(|slot| (self.rank(&slot.request, view.now_ms, 0), slot.slot, slot.request.prompt_remaining()))
            .collect();
        for (&(rank, request), &slot) in waiting.iter().zip(&view.free_slots) {
            decision.admit.push(Admit { request_id: request.id, slot });
            prefilling.push((rank, slot, request.prompt_remaining()));
        }
        // Among equal ranks, slot order (the tie-break of `continuous`).
        prefilling.sort_unstable_by_key(|&(rank, slot, _)| (rank.priority, rank.arrival_ms, slot));

        decision.prefill_in_order(prefilling.into_iter().map(|(_, slot, remaining)| (slot, remaining)), &mut budget);
        decision
    }
}

/// Sort key: higher effective priority first, then older, then queue order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    priority: Reverse<i64>,
    arrival_ms: u64,
    position: usize,
}

impl PriorityPolicy {
    /// The request's priority plus one per full `aging_ms` since it arrived.
    fn effective_priority(&self, request: &RequestInfo, now_ms: u64) -> i64 {
        let aged = now_ms.saturating_sub(request.arrival_ms) / self.aging_ms.max(1);
        i64::from(request.priority).saturating_add(i64::try_from(aged).unwrap_or(i64::MAX))
    }

    fn rank(&self, request: &RequestInfo, now_ms: u64, position: usize) -> Rank {
        Rank { priority: Reverse(self.effective_priority(request, now_ms)), arrival_ms: request.arrival_ms, position }
    }
}

export_policy!(PriorityPolicy);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plugin_api::Prefill;
    use sluice_plugin_api::SettingValue;
    use sluice_plugin_api::testing::{ViewBuilder, request, tokens_used};

    fn policy() -> PriorityPolicy {
        PriorityPolicy::configure(&Settings::default()).expect("defaults are valid")
    }

    fn policy_aging(aging_ms: i64) -> PriorityPolicy {
        PriorityPolicy::configure(&Settings::from_pairs([(AGING_MS, SettingValue::Integer(aging_ms))])).expect("valid")
    }

    #[test]
    fn admits_by_priority_then_arrival() {
        let view = ViewBuilder::new(3, 512)
            .at(5, 1000)
            .occupied(1, Phase::Decoding, request(1, 4).done(4).generated(1))
            .waiting(request(2, 10).arrived(100))
            .waiting(request(3, 10).arrived(200).priority(5))
            .waiting(request(4, 10).arrived(300))
            .waiting(request(5, 10).arrived(50))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 3, slot: 0 }, Admit { request_id: 5, slot: 2 }]);
    }

    #[test]
    fn negative_priorities_go_last() {
        let view = ViewBuilder::new(1, 512)
            .waiting(request(1, 10).priority(-1))
            .waiting(request(2, 10).arrived(10))
            .at(0, 10)
            .build();
        assert_eq!(policy().step(&view).admit, vec![Admit { request_id: 2, slot: 0 }]);
    }

    #[test]
    fn aging_lets_an_old_low_priority_request_overtake_later_arrivals() {
        // Request 1 (priority 0) arrived at 0; a priority-2 request arrives
        // at `now` and competes with it for the one free slot.
        let admitted = |now_ms| {
            let view = ViewBuilder::new(1, 512)
                .at(1, now_ms)
                .waiting(request(1, 10).arrived(0))
                .waiting(request(2, 10).arrived(now_ms).priority(2))
                .build();
            policy_aging(1000).step(&view).admit[0].request_id
        };
        assert_eq!(admitted(1000), 2, "0 + 1 < 2");
        assert_eq!(admitted(1999), 2, "0 + 1 < 2");
        assert_eq!(admitted(2000), 1, "0 + 2 = 2: the older goes first");
        assert_eq!(admitted(7000), 1, "0 + 7 > 2");
    }

    #[test]
    fn a_stream_of_high_priority_arrivals_does_not_starve_a_low_one() {
        // Every 100 ms a new priority-3 request arrives and one slot frees up.
        let mut policy = policy_aging(500);
        let mut queue = vec![request(1, 10).arrived(0)];
        let mut admitted_at = None;
        for tick in 1..100u64 {
            let now = tick * 100;
            queue.push(request(tick + 1, 10).arrived(now).priority(3));
            let mut builder = ViewBuilder::new(1, 512).at(tick, now);
            for waiting in &queue {
                builder = builder.waiting(*waiting);
            }
            let id = policy.step(&builder.build()).admit[0].request_id;
            queue.retain(|waiting| waiting.id != id);
            if id == 1 {
                admitted_at = Some(now);
                break;
            }
        }
        // Priority-3 requests arriving (3 - 0) * 500 ms or more after it no
        // longer outrank it.
        assert_eq!(admitted_at, Some(1500));
    }

    #[test]
    fn decodes_first_then_prefills_by_effective_priority() {
        let view = ViewBuilder::new(4, 50)
            .at(3, 100)
            .occupied(0, Phase::Prefilling, request(1, 100).arrived(0))
            .occupied(1, Phase::Decoding, request(2, 4).done(4).generated(3))
            .occupied(2, Phase::Prefilling, request(3, 100).arrived(50).priority(1))
            .occupied(3, Phase::Ready, request(4, 4).done(4))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.decode, vec![1, 3]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 2, tokens: 48 }], "the higher priority prefills first");
        assert_eq!(tokens_used(&decision), 50);
    }

    #[test]
    fn admitted_requests_prefill_in_rank_order_with_running_ones() {
        let view = ViewBuilder::new(3, 60)
            .at(1, 0)
            .occupied(0, Phase::Prefilling, request(1, 40).done(10))
            .waiting(request(2, 40).priority(1))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 2, slot: 1 }]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 40 }, Prefill { slot: 0, tokens: 20 }]);
    }

    #[test]
    fn with_equal_priorities_it_schedules_like_continuous() {
        let view = ViewBuilder::new(4, 100)
            .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
            .occupied(2, Phase::Prefilling, request(2, 100).done(40))
            .waiting(request(3, 80).arrived(0))
            .waiting(request(4, 80).arrived(0))
            .build();
        let mut continuous = continuous::Continuous::configure(&Settings::default()).expect("valid");
        assert_eq!(policy().step(&view), continuous.step(&view));
    }

    #[test]
    fn decode_never_exceeds_a_tiny_budget() {
        let view = ViewBuilder::new(3, 2)
            .occupied(0, Phase::Decoding, request(1, 1).done(1))
            .occupied(1, Phase::Decoding, request(2, 1).done(1))
            .occupied(2, Phase::Decoding, request(3, 1).done(1))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.decode, vec![0, 1]);
        assert!(decision.prefill.is_empty());
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let view = ViewBuilder::new(2, 8)
            .at(u64::MAX, u64::MAX)
            .waiting(request(1, 4).priority(i32::MAX).arrived(0))
            .waiting(request(2, 4).priority(i32::MIN).arrived(u64::MAX))
            .build();
        let decision = policy_aging(1).step(&view);
        assert_eq!(decision.admit.len(), 2);
        assert_eq!(tokens_used(&decision), 8);
        // An arrival stamped after `now` has simply not aged.
        let view = ViewBuilder::new(1, 8).at(0, 10).waiting(request(1, 4).arrived(1_000)).build();
        assert_eq!(policy().step(&view).admit.len(), 1);
    }

    #[test]
    fn idle_engine_gets_an_empty_decision() {
        assert_eq!(policy().step(&ViewBuilder::new(2, 512).build()), Decision::default());
    }

    #[test]
    fn settings_are_validated_by_name() {
        assert_eq!(policy().aging_ms, 5000);
        assert_eq!(policy_aging(250).aging_ms, 250);
        let refuse = |key: &str, value: SettingValue| {
            PriorityPolicy::configure(&Settings::from_pairs([(key, value)])).expect_err("refused")
        };
        let error = refuse(AGING_MS, SettingValue::Integer(0));
        assert!(error.contains("`aging_ms` = 0 is out of range"), "{error}");
        let error = refuse(AGING_MS, SettingValue::Text("5s".into()));
        assert!(error.contains("`aging_ms` must be an integer"), "{error}");
        let error = refuse("max_members", SettingValue::Integer(2));
        assert!(error.starts_with("unknown setting `max_members` (expected one of: aging_ms)"), "{error}");
    }
}
