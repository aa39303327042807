//! The host's rules for a decision (docs/scheduling.md, "Host validation"):
//! the one definition the host applies to every decision and plugin authors
//! can run in their native tests. A decision that breaks any rule is refused
//! whole: nothing of it is applied.

use std::collections::HashSet;
use std::fmt;

use crate::{Decision, Phase, StepView};

/// The rule a decision broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// Admits a request that is not waiting.
    NotWaiting(u64),
    /// Admits into a slot that is not free.
    SlotNotFree(u32),
    /// Admits one request twice.
    RequestTwice(u64),
    /// Admits two requests into one slot.
    SlotTwice(u32),
    /// Prefills a slot that is not prefilling (nor admitted in this decision).
    NotPrefilling(u32),
    /// Prefills zero tokens, or more than the prompt has left.
    PrefillSize { slot: u32, tokens: u32, remaining: u32 },
    /// Prefills one slot twice.
    PrefillTwice(u32),
    /// Decodes a slot that is neither ready nor decoding.
    NotDecodable(u32),
    /// Decodes one slot twice.
    DecodeTwice(u32),
    /// Prefills and decodes the same slot.
    PrefillAndDecode(u32),
    /// Grants more tokens than the step's budget.
    OverBudget { used: u64, budget: u32 },
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::NotWaiting(id) => write!(f, "admits request {id}, which is not waiting"),
            Invalid::SlotNotFree(slot) => write!(f, "admits into slot {slot}, which is not free"),
            Invalid::RequestTwice(id) => write!(f, "admits request {id} twice"),
            Invalid::SlotTwice(slot) => write!(f, "admits two requests into slot {slot}"),
            Invalid::NotPrefilling(slot) => write!(f, "prefills slot {slot}, which is not prefilling"),
            Invalid::PrefillSize { slot, tokens, remaining } => {
                write!(f, "prefills slot {slot} with {tokens} tokens; 1..={remaining} remain")
            }
            Invalid::PrefillTwice(slot) => write!(f, "prefills slot {slot} twice"),
            Invalid::NotDecodable(slot) => write!(f, "decodes slot {slot}, which is neither ready nor decoding"),
            Invalid::DecodeTwice(slot) => write!(f, "decodes slot {slot} twice"),
            Invalid::PrefillAndDecode(slot) => write!(f, "both prefills and decodes slot {slot}"),
            Invalid::OverBudget { used, budget } => write!(f, "grants {used} tokens, over the budget of {budget}"),
        }
    }
}

impl std::error::Error for Invalid {}

/// Check `decision` against `view`. `extra_per_decode` counts tokens a host
/// would add to every decode grant; sluice passes 0, since its drafts only
/// take what the grants leave of the budget.
///
/// Runs every step, so it costs O(n) in the view's slots: each grant finds
/// its slot in one table indexed by slot id instead of scanning the view.
pub fn validate(view: &StepView, decision: &Decision, extra_per_decode: u32) -> Result<(), Invalid> {
    let mut slots = SlotTable::new(view);
    let mut admitted_requests = HashSet::new();
    for admit in &decision.admit {
        let waiting = view
            .waiting
            .iter()
            .find(|waiting| waiting.request.id == admit.request_id)
            .ok_or(Invalid::NotWaiting(admit.request_id))?;
        let entry =
            slots.get(admit.slot).filter(|entry| entry.kind == Kind::Free).ok_or(Invalid::SlotNotFree(admit.slot))?;
        if !admitted_requests.insert(admit.request_id) {
            return Err(Invalid::RequestTwice(admit.request_id));
        }
        if entry.admitted {
            return Err(Invalid::SlotTwice(admit.slot));
        }
        entry.admitted = true;
        entry.remaining = waiting.request.prompt_remaining();
    }
    let mut used: u64 = 0;
    for prefill in &decision.prefill {
        let entry = slots
            .get(prefill.slot)
            .filter(|entry| entry.kind == Kind::Prefilling || entry.admitted)
            .ok_or(Invalid::NotPrefilling(prefill.slot))?;
        let remaining = entry.remaining;
        if prefill.tokens == 0 || prefill.tokens > remaining {
            return Err(Invalid::PrefillSize { slot: prefill.slot, tokens: prefill.tokens, remaining });
        }
        if entry.granted {
            return Err(Invalid::PrefillTwice(prefill.slot));
        }
        entry.granted = true;
        used += u64::from(prefill.tokens);
    }
    for &slot in &decision.decode {
        let Some(entry) = slots.get(slot).filter(|entry| entry.kind == Kind::Decodable) else {
            let prefilled = slots.get(slot).is_some_and(|entry| entry.granted);
            return Err(if prefilled { Invalid::PrefillAndDecode(slot) } else { Invalid::NotDecodable(slot) });
        };
        if entry.granted {
            return Err(Invalid::DecodeTwice(slot));
        }
        entry.granted = true;
        used += 1 + u64::from(extra_per_decode);
    }
    if used > u64::from(view.token_budget) {
        return Err(Invalid::OverBudget { used, budget: view.token_budget });
    }
    Ok(())
}

/// What a slot of the view may be granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Not in the view.
    Absent,
    Free,
    Prefilling,
    /// Ready or decoding.
    Decodable,
}

/// A slot of the view and what the decision has granted it so far.
#[derive(Debug, Clone, Copy)]
struct Entry {
    slot: u32,
    kind: Kind,
    /// Prompt tokens left: a prefilling slot's, or the request admitted into
    /// a free one.
    remaining: u32,
    admitted: bool,
    /// Prefilled (a prefilling or admitted slot) or decoded (a decodable one).
    granted: bool,
}

/// The view's slots, found by id.
enum SlotTable {
    /// Indexed by slot id: an engine's slots are numbered from 0, so the
    /// table is about as long as the view has slots.
    Dense(Vec<Entry>),
    /// Sorted by slot id, for views (read from a trace) whose ids are
    /// sparse enough that a dense table would waste memory.
    Sparse(Vec<Entry>),
}

impl SlotTable {
    fn new(view: &StepView) -> Self {
        let entry = |slot, kind, remaining| Entry { slot, kind, remaining, admitted: false, granted: false };
        let entries = view.free_slots.iter().map(|&slot| entry(slot, Kind::Free, 0)).chain(view.occupied.iter().map(
            |occupied| match occupied.phase {
                Phase::Prefilling => entry(occupied.slot, Kind::Prefilling, occupied.request.prompt_remaining()),
                Phase::Ready | Phase::Decoding => entry(occupied.slot, Kind::Decodable, 0),
            },
        ));
        let count = (view.free_slots.len() + view.occupied.len()) as u64;
        let bound = entries.clone().map(|entry| u64::from(entry.slot) + 1).max().unwrap_or(0);
        if bound <= 2 * count + 64 {
            let mut table = vec![entry(0, Kind::Absent, 0); bound as usize];
            for entry in entries {
                table[entry.slot as usize] = entry;
            }
            SlotTable::Dense(table)
        } else {
            let mut table: Vec<Entry> = entries.collect();
            table.sort_by_key(|entry| entry.slot);
            SlotTable::Sparse(table)
        }
    }

    fn get(&mut self, slot: u32) -> Option<&mut Entry> {
        match self {
            SlotTable::Dense(table) => table.get_mut(slot as usize).filter(|entry| entry.kind != Kind::Absent),
            SlotTable::Sparse(table) => {
                let index = table.binary_search_by_key(&slot, |entry| entry.slot).ok()?;
                table.get_mut(index)
            }
        }
    }
}

/// Whether a step has runnable work: something waiting with a free slot, or
/// any occupied slot (every phase can always make progress). The host asks
/// the policy only then.
pub fn has_runnable_work(view: &StepView) -> bool {
    !view.occupied.is_empty() || (!view.waiting.is_empty() && !view.free_slots.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ViewBuilder, request};
    use crate::{Admit, Prefill};

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
    fn slots_are_found_in_any_order_and_at_any_id() {
        // A view read from a trace need not be sorted, and slot ids need not
        // be dense.
        let mut view = ViewBuilder::new(0, 100)
            .occupied(u32::MAX, Phase::Decoding, request(1, 5).done(5))
            .occupied(7, Phase::Prefilling, request(2, 50).done(10))
            .waiting(request(4, 30))
            .build();
        view.occupied.reverse();
        view.free_slots = vec![1_000_000, 3];
        let ok = decision(
            vec![Admit { request_id: 4, slot: 3 }],
            vec![Prefill { slot: 7, tokens: 40 }, Prefill { slot: 3, tokens: 30 }],
            vec![u32::MAX],
        );
        assert_eq!(validate(&view, &ok, 0), Ok(()));
        let over = decision(vec![], vec![Prefill { slot: 3, tokens: 1 }], vec![]);
        assert_eq!(validate(&view, &over, 0), Err(Invalid::NotPrefilling(3)));
        let absent = decision(vec![], vec![], vec![8]);
        assert_eq!(validate(&view, &absent, 0), Err(Invalid::NotDecodable(8)));
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
        assert_eq!(
            Invalid::OverBudget { used: 102, budget: 100 }.to_string(),
            "grants 102 tokens, over the budget of 100"
        );
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
