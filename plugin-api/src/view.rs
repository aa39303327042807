//! The step view and decision as plain Rust records, shared by plugins (via
//! this SDK) and the host. On the wire (`wit/scheduler.wit`) the view's
//! slots and requests travel packed ([`crate::packed`]).

use crate::scheduler::exports::sluice::plugin::policy as wire;

/// Where a slot stands in the life of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub enum Phase {
    /// Admitted; the prompt is not fully processed yet.
    Prefilling,
    /// Prompt done; the final logits are held and nothing has been sampled.
    Ready,
    /// At least one token has been sampled.
    Decoding,
}

/// What the host knows about one request (see the request row of the WIT's
/// `step-view`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RequestInfo {
    pub id: u64,
    pub prompt_tokens: u32,
    pub prompt_done: u32,
    pub prompt_cached: u32,
    pub generated: u32,
    pub max_tokens: u32,
    pub adapter_group: u32,
    pub priority: i32,
    pub arrival_ms: u64,
}

impl RequestInfo {
    /// Prompt tokens still to process.
    pub fn prompt_remaining(&self) -> u32 {
        self.prompt_tokens.saturating_sub(self.prompt_done)
    }
}

/// A slot that holds a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct OccupiedSlot {
    pub slot: u32,
    pub phase: Phase,
    pub request: RequestInfo,
}

/// A request queued for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct WaitingRequest {
    pub request: RequestInfo,
    /// A free slot whose cached prefix best matches the request (advisory).
    pub slot_hint: Option<u32>,
}

/// Why a request left the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub enum EndReason {
    Completed,
    Cancelled,
    Failed,
}

/// A request that ended since the previous step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EndedRequest {
    pub request_id: u64,
    pub slot: Option<u32>,
    pub reason: EndReason,
}

/// The host's measured model of a step's cost (see `step-costs` in the
/// WIT): `base + prefill tokens × prefill_token + decode rows × decode_row +
/// attended pairs / 1000 × attention_kpair`, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StepCosts {
    /// Steps behind the fit; 0 (and every cost 0) until measured.
    pub measured_steps: u32,
    pub base_ns: u32,
    pub prefill_token_ns: u32,
    pub decode_row_ns: u32,
    pub attention_kpair_ns: u32,
}

/// Everything a policy sees in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StepView {
    pub step: u64,
    pub now_ms: u64,
    pub token_budget: u32,
    /// Measured step costs; traces written before they existed read as
    /// unmeasured.
    #[cfg_attr(feature = "serde", serde(default))]
    pub costs: StepCosts,
    /// Free slot ids, ascending.
    pub free_slots: Vec<u32>,
    /// Occupied slots, by ascending slot id.
    pub occupied: Vec<OccupiedSlot>,
    /// Waiting requests, oldest first.
    pub waiting: Vec<WaitingRequest>,
    pub ended: Vec<EndedRequest>,
}

/// Put a waiting request into a free slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Admit {
    pub request_id: u64,
    pub slot: u32,
}

/// Process `tokens` prompt tokens of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Prefill {
    pub slot: u32,
    pub tokens: u32,
}

/// The work granted for one step; everything not named waits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Decision {
    pub admit: Vec<Admit>,
    pub prefill: Vec<Prefill>,
    pub decode: Vec<u32>,
}

/// The wire's "no slot hint".
pub const NO_SLOT_HINT: u32 = u32::MAX;

/// Building blocks most policies share, so each policy spells out only what
/// it does differently.
impl Decision {
    /// Decode grants for every `ready` or `decoding` slot of `view`, in slot
    /// order, one token each while `budget` lasts.
    pub fn decode_ready(&mut self, view: &StepView, budget: &mut u32) {
        self.decode.reserve(view.occupied.len());
        for slot in view.occupied.iter().filter(|slot| matches!(slot.phase, Phase::Ready | Phase::Decoding)) {
            if *budget == 0 {
                break;
            }
            self.decode.push(slot.slot);
            *budget -= 1;
        }
    }

    /// Admits `requests` in the order given into `free_slots` (in their
    /// order) while both last, appending `(slot, prompt tokens remaining)`
    /// of each admission to `chunks`, ready for
    /// [`Decision::prefill_in_order`].
    pub fn admit_into<'a>(
        &mut self,
        requests: impl IntoIterator<Item = &'a RequestInfo>,
        free_slots: &[u32],
        chunks: &mut Vec<(u32, u32)>,
    ) {
        for (request, &slot) in requests.into_iter().zip(free_slots) {
            self.admit.push(Admit { request_id: request.id, slot });
            chunks.push((slot, request.prompt_remaining()));
        }
    }

    /// Admits waiting requests first-come first-served into free slots,
    /// then grants prefill to every prefilling or just-admitted slot in slot
    /// order while `budget` lasts (the admission and prefill of
    /// `continuous`).
    pub fn admit_fifo_and_prefill(&mut self, view: &StepView, budget: &mut u32) {
        let mut chunks = view.prefilling();
        self.admit_into(view.waiting.iter().map(|waiting| &waiting.request), &view.free_slots, &mut chunks);
        chunks.sort_unstable_by_key(|&(slot, _)| slot);
        self.prefill_in_order(chunks, budget);
    }

    /// Prefill grants for `(slot, prompt tokens remaining)` in the order
    /// given, each as large as `budget` allows; returns the slots whose
    /// prompt these grants complete.
    pub fn prefill_in_order(&mut self, chunks: impl IntoIterator<Item = (u32, u32)>, budget: &mut u32) -> Vec<u32> {
        let chunks = chunks.into_iter();
        self.prefill.reserve(chunks.size_hint().0);
        let mut completed = Vec::with_capacity(chunks.size_hint().0);
        for (slot, remaining) in chunks {
            let tokens = remaining.min(*budget);
            if tokens == 0 {
                continue;
            }
            self.prefill.push(Prefill { slot, tokens });
            *budget -= tokens;
            if tokens == remaining {
                completed.push(slot);
            }
        }
        completed
    }
}

impl StepView {
    /// `(slot, prompt tokens remaining)` of every occupied slot that may
    /// prefill, in slot order.
    pub fn prefilling(&self) -> Vec<(u32, u32)> {
        // Room for the admissions callers add to it.
        let mut chunks = Vec::with_capacity(self.occupied.len() + self.free_slots.len());
        chunks.extend(
            self.occupied
                .iter()
                .filter(|slot| slot.phase == Phase::Prefilling)
                .map(|slot| (slot.slot, slot.request.prompt_remaining())),
        );
        chunks
    }
}

impl From<Decision> for wire::Decision {
    fn from(decision: Decision) -> Self {
        wire::Decision {
            admit: decision
                .admit
                .into_iter()
                .map(|admit| wire::Admit { request_id: admit.request_id, slot: admit.slot })
                .collect(),
            prefill: decision
                .prefill
                .into_iter()
                .map(|prefill| wire::Prefill { slot: prefill.slot, tokens: prefill.tokens })
                .collect(),
            decode: decision.decode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_go_to_the_wire_unchanged() {
        let decision = Decision {
            admit: vec![Admit { request_id: 3, slot: 1 }],
            prefill: vec![Prefill { slot: 1, tokens: 12 }],
            decode: vec![0, 2],
        };
        let wire = wire::Decision::from(decision);
        assert_eq!(wire.admit, vec![wire::Admit { request_id: 3, slot: 1 }]);
        assert_eq!(wire.prefill, vec![wire::Prefill { slot: 1, tokens: 12 }]);
        assert_eq!(wire.decode, vec![0, 2]);
    }
}
