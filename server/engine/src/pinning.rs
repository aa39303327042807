//! Requests that name their slot (`id_slot`) run in that slot only, as in
//! llama-server, where a client pins a conversation to the slot holding
//! its cache (or a slot file it restored). Policies see the slot as a hint
//! and may admit such a request anywhere; the engine then moves the admit,
//! with the prefill grant that came with it, into the named slot; a
//! request the policy put in the named slot moves to the slot that was
//! freed. While the named slot is busy the request is not in the view at
//! all (`Engine::view`); two requests naming one free slot take turns. No step admits more
//! requests than the policy chose, nor into a slot that was not free.

use std::collections::HashMap;

use super::policy::{Admit, Decision, Prefill};
use super::request::RequestId;

/// Rewrite `decision`'s admits (and their prefill grants) so that every
/// request `pin_of` names a slot for is admitted into that slot or not at
/// all. `free` says which slots were free when the policy decided.
pub(super) fn pin_slots(
    decision: &mut Decision,
    free: impl Fn(u32) -> bool,
    pin_of: impl Fn(RequestId) -> Option<u32>,
) {
    let pins: Vec<Option<u32>> = decision.admit.iter().map(|admit| pin_of(admit.request_id)).collect();
    if pins.iter().all(Option::is_none) {
        return;
    }
    let mut taken: Vec<u32> = Vec::new();
    // Where each admit goes: pinned ones first, to their own slot.
    let mut placed: Vec<Option<u32>> = pins
        .iter()
        .map(|pin| {
            let slot = pin.filter(|&slot| free(slot) && !taken.contains(&slot))?;
            taken.push(slot);
            Some(slot)
        })
        .collect();
    // Slots the policy chose that no pinned request took, for the
    // unpinned requests displaced from theirs.
    let mut spare: Vec<u32> =
        decision.admit.iter().rev().map(|admit| admit.slot).filter(|slot| !taken.contains(slot)).collect();
    for (at, admit) in decision.admit.iter().enumerate() {
        if pins[at].is_some() {
            continue;
        }
        placed[at] = if taken.contains(&admit.slot) {
            std::iter::from_fn(|| spare.pop()).find(|slot| !taken.contains(slot))
        } else {
            Some(admit.slot)
        };
        if let Some(slot) = placed[at] {
            taken.push(slot);
        }
    }
    let moves: HashMap<u32, Option<u32>> =
        decision.admit.iter().zip(&placed).map(|(admit, &slot)| (admit.slot, slot)).collect();
    decision.admit =
        decision.admit.iter().zip(&placed).filter_map(|(admit, &slot)| Some(Admit { slot: slot?, ..*admit })).collect();
    decision.prefill = decision
        .prefill
        .iter()
        .filter_map(|grant| match moves.get(&grant.slot) {
            Some(&moved) => Some(Prefill { slot: moved?, ..*grant }),
            None => Some(*grant),
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(admits: &[(RequestId, u32)]) -> Decision {
        Decision {
            admit: admits.iter().map(|&(request_id, slot)| Admit { request_id, slot }).collect(),
            // Each admit's grant is as many tokens as its request id, to
            // see that grants follow their request; slot 9 is occupied.
            prefill: admits
                .iter()
                .map(|&(id, slot)| Prefill { slot, tokens: id as u32 })
                .chain([Prefill { slot: 9, tokens: 99 }])
                .collect(),
            decode: vec![9],
        }
    }

    fn placed(decision: &Decision) -> Vec<(RequestId, u32, u32)> {
        let mut placed: Vec<_> = decision
            .admit
            .iter()
            .map(|admit| {
                let grant = decision.prefill.iter().find(|grant| grant.slot == admit.slot).expect("a grant");
                (admit.request_id, admit.slot, grant.tokens)
            })
            .collect();
        placed.sort_unstable();
        placed
    }

    #[test]
    fn a_pinned_request_moves_into_its_slot_and_the_one_there_takes_the_freed_slot() {
        let mut moved = decision(&[(1, 0), (2, 3)]);
        pin_slots(&mut moved, |slot| slot < 4, |id| (id == 1).then_some(3));
        assert_eq!(placed(&moved), vec![(1, 3, 1), (2, 0, 2)]);
        assert!(moved.prefill.contains(&Prefill { slot: 9, tokens: 99 }), "other grants stay");
        assert_eq!(moved.decode, vec![9]);
    }

    #[test]
    fn a_pinned_request_waits_while_its_slot_is_busy() {
        let mut held = decision(&[(1, 0), (2, 1)]);
        pin_slots(&mut held, |slot| slot != 2, |id| (id == 1).then_some(2));
        assert_eq!(placed(&held), vec![(2, 1, 2)]);
        assert!(!held.prefill.iter().any(|grant| grant.tokens == 1), "its grant is dropped with it");
    }

    #[test]
    fn two_requests_pinned_to_one_slot_take_turns_and_unpinned_steps_are_untouched() {
        let mut both = decision(&[(1, 0), (2, 1)]);
        pin_slots(&mut both, |_| true, |_| Some(1));
        assert_eq!(placed(&both), vec![(1, 1, 1)]);

        let mut free = decision(&[(1, 0), (2, 1)]);
        let before = free.clone();
        pin_slots(&mut free, |_| true, |_| None);
        assert_eq!(free, before);
    }

    #[test]
    fn a_pinned_request_may_take_a_free_slot_the_policy_left_empty() {
        let mut moved = decision(&[(1, 0)]);
        pin_slots(&mut moved, |_| true, |_| Some(2));
        assert_eq!(placed(&moved), vec![(1, 2, 1)]);
    }
}
