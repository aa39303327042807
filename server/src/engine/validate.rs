//! Host validation of a policy's decision (specs/scheduling.md). A decision
//! that breaks any rule is refused whole: nothing of it is applied.

use std::collections::HashSet;

use super::policy::{Decision, Phase, StepView};

/// The rule a decision broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("admits request {0}, which is not waiting")]
    NotWaiting(u64),
    #[error("admits into slot {0}, which is not free")]
    SlotNotFree(u32),
    #[error("admits request {0} twice")]
    RequestTwice(u64),
    #[error("admits two requests into slot {0}")]
    SlotTwice(u32),
    #[error("prefills slot {0}, which is not prefilling")]
    NotPrefilling(u32),
    #[error("prefills slot {slot} with {tokens} tokens; 1..={remaining} remain")]
    PrefillSize { slot: u32, tokens: u32, remaining: u32 },
    #[error("prefills slot {0} twice")]
    PrefillTwice(u32),
    #[error("decodes slot {0}, which is neither ready nor decoding")]
    NotDecodable(u32),
    #[error("decodes slot {0} twice")]
    DecodeTwice(u32),
    #[error("both prefills and decodes slot {0}")]
    PrefillAndDecode(u32),
    #[error("grants {used} tokens, over the budget of {budget}")]
    OverBudget { used: u64, budget: u32 },
}

/// Check `decision` against `view`. `extra_per_decode` is the draft tokens
/// the engine adds to each decode grant.
pub fn validate(view: &StepView, decision: &Decision, extra_per_decode: u32) -> Result<(), Invalid> {
    let mut admitted_requests = HashSet::new();
    let mut admitted_slots = HashSet::new();
    // slot → prompt tokens remaining, for slots that may prefill.
    let mut prefillable: Vec<(u32, u32)> = view
        .occupied
        .iter()
        .filter(|slot| slot.phase == Phase::Prefilling)
        .map(|slot| (slot.slot, slot.request.prompt_remaining()))
        .collect();
    for admit in &decision.admit {
        let waiting = view
            .waiting
            .iter()
            .find(|waiting| waiting.request.id == admit.request_id)
            .ok_or(Invalid::NotWaiting(admit.request_id))?;
        if !view.free_slots.contains(&admit.slot) {
            return Err(Invalid::SlotNotFree(admit.slot));
        }
        if !admitted_requests.insert(admit.request_id) {
            return Err(Invalid::RequestTwice(admit.request_id));
        }
        if !admitted_slots.insert(admit.slot) {
            return Err(Invalid::SlotTwice(admit.slot));
        }
        prefillable.push((admit.slot, waiting.request.prompt_remaining()));
    }
    let mut prefilled = HashSet::new();
    let mut used: u64 = 0;
    for prefill in &decision.prefill {
        let remaining = prefillable
            .iter()
            .find(|(slot, _)| *slot == prefill.slot)
            .map(|(_, remaining)| *remaining)
            .ok_or(Invalid::NotPrefilling(prefill.slot))?;
        if prefill.tokens == 0 || prefill.tokens > remaining {
            return Err(Invalid::PrefillSize { slot: prefill.slot, tokens: prefill.tokens, remaining });
        }
        if !prefilled.insert(prefill.slot) {
            return Err(Invalid::PrefillTwice(prefill.slot));
        }
        used += u64::from(prefill.tokens);
    }
    let mut decoded = HashSet::new();
    for &slot in &decision.decode {
        let decodable = view
            .occupied
            .iter()
            .any(|occupied| occupied.slot == slot && matches!(occupied.phase, Phase::Ready | Phase::Decoding));
        if !decodable {
            return Err(if prefilled.contains(&slot) {
                Invalid::PrefillAndDecode(slot)
            } else {
                Invalid::NotDecodable(slot)
            });
        }
        if !decoded.insert(slot) {
            return Err(Invalid::DecodeTwice(slot));
        }
        used += 1 + u64::from(extra_per_decode);
    }
    if used > u64::from(view.token_budget) {
        return Err(Invalid::OverBudget { used, budget: view.token_budget });
    }
    Ok(())
}

/// Whether a step had runnable work: something waiting with a free slot,
/// or any occupied slot (every phase can always make progress).
pub fn has_runnable_work(view: &StepView) -> bool {
    !view.occupied.is_empty() || (!view.waiting.is_empty() && !view.free_slots.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plugin_api::testing::{ViewBuilder, request};
    use sluice_plugin_api::{Admit, Prefill};

    fn view() -> StepView {
        ViewBuilder::new(4, 100)
            .occupied(0, Phase::Prefilling, request(1, 50).done(10))
            .occupied(1, Phase::Ready, request(2, 5).done(5))
            .occupied(2, Phase::Decoding, request(3, 5).done(5).generated(2))
            .waiting(request(4, 30))
            .waiting(request(5, 30))
            .build()
    }

    fn decision(admit: Vec<Admit>, prefill: Vec<Prefill>, decode: Vec<u32>) -> Decision {
        Decision { admit, prefill, decode }
    }

    #[test]
    fn a_valid_decision_passes() {
        let ok = decision(
            vec![Admit { request_id: 4, slot: 3 }],
            vec![Prefill { slot: 0, tokens: 40 }, Prefill { slot: 3, tokens: 30 }],
            vec![1, 2],
        );
        assert_eq!(validate(&view(), &ok, 0), Ok(()));
        assert_eq!(validate(&view(), &Decision::default(), 0), Ok(()));
    }

    #[test]
    fn every_rule_is_enforced() {
        let view = view();
        let cases = [
            (decision(vec![Admit { request_id: 9, slot: 3 }], vec![], vec![]), Invalid::NotWaiting(9)),
            (decision(vec![Admit { request_id: 4, slot: 0 }], vec![], vec![]), Invalid::SlotNotFree(0)),
            (
                decision(vec![Admit { request_id: 4, slot: 3 }, Admit { request_id: 4, slot: 3 }], vec![], vec![]),
                Invalid::RequestTwice(4),
            ),
            (
                decision(vec![Admit { request_id: 4, slot: 3 }, Admit { request_id: 5, slot: 3 }], vec![], vec![]),
                Invalid::SlotTwice(3),
            ),
            (decision(vec![], vec![Prefill { slot: 1, tokens: 1 }], vec![]), Invalid::NotPrefilling(1)),
            (
                decision(vec![], vec![Prefill { slot: 0, tokens: 41 }], vec![]),
                Invalid::PrefillSize { slot: 0, tokens: 41, remaining: 40 },
            ),
            (
                decision(vec![], vec![Prefill { slot: 0, tokens: 0 }], vec![]),
                Invalid::PrefillSize { slot: 0, tokens: 0, remaining: 40 },
            ),
            (
                decision(vec![], vec![Prefill { slot: 0, tokens: 1 }, Prefill { slot: 0, tokens: 1 }], vec![]),
                Invalid::PrefillTwice(0),
            ),
            (decision(vec![], vec![], vec![3]), Invalid::NotDecodable(3)),
            (decision(vec![], vec![Prefill { slot: 0, tokens: 1 }], vec![0]), Invalid::PrefillAndDecode(0)),
            (decision(vec![], vec![], vec![1, 1]), Invalid::DecodeTwice(1)),
        ];
        for (index, (decision, expected)) in cases.into_iter().enumerate() {
            assert_eq!(validate(&view, &decision, 0), Err(expected), "case {index}");
        }
    }

    #[test]
    fn draft_tokens_count_against_the_budget() {
        let full = decision(
            vec![Admit { request_id: 4, slot: 3 }],
            vec![Prefill { slot: 0, tokens: 40 }, Prefill { slot: 3, tokens: 30 }],
            vec![1, 2],
        );
        // 70 prefill tokens + 2 decodes with 14 draft tokens each = 100.
        assert_eq!(validate(&view(), &full, 14), Ok(()));
        assert_eq!(validate(&view(), &full, 15), Err(Invalid::OverBudget { used: 102, budget: 100 }));
    }

    #[test]
    fn runnable_work_needs_an_occupied_slot_or_a_free_slot_for_a_waiter() {
        assert!(has_runnable_work(&view()));
        assert!(!has_runnable_work(&ViewBuilder::new(2, 10).build()));
        let full =
            ViewBuilder::new(1, 10).occupied(0, Phase::Decoding, request(1, 1).done(1)).waiting(request(2, 1)).build();
        assert!(has_runnable_work(&full));
    }
}
