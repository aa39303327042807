//! The step view and decision as plain Rust records, shared by plugins (via
//! this SDK) and the host. On the wire (`wit/scheduler.wit`) the view's
//! requests travel as columns; [`StepView::from_wire`] rebuilds the records.

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

/// What the host knows about one request (see the WIT `request-table`).
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

/// Everything a policy sees in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StepView {
    pub step: u64,
    pub now_ms: u64,
    pub token_budget: u32,
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
        let mut completed = Vec::new();
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
        self.occupied
            .iter()
            .filter(|slot| slot.phase == Phase::Prefilling)
            .map(|slot| (slot.slot, slot.request.prompt_remaining()))
            .collect()
    }
}

impl StepView {
    /// Rebuild the records from the wire's columns. Columns shorter than
    /// their table's `id` column read as zero (the host never sends them).
    pub fn from_wire(view: wire::StepView) -> Self {
        let occupied = rows(&view.occupied)
            .zip(&view.occupied_slots)
            .zip(&view.occupied_phases)
            .map(|((request, &slot), phase)| OccupiedSlot { slot, phase: Phase::from(*phase), request })
            .collect();
        let waiting = rows(&view.waiting)
            .enumerate()
            .map(|(row, request)| {
                let hint = view.waiting_slot_hints.get(row).copied().unwrap_or(NO_SLOT_HINT);
                WaitingRequest { request, slot_hint: (hint != NO_SLOT_HINT).then_some(hint) }
            })
            .collect();
        let ended = view
            .ended
            .iter()
            .map(|ended| EndedRequest {
                request_id: ended.request_id,
                slot: ended.slot,
                reason: match ended.reason {
                    wire::EndReason::Completed => EndReason::Completed,
                    wire::EndReason::Cancelled => EndReason::Cancelled,
                    wire::EndReason::Failed => EndReason::Failed,
                },
            })
            .collect();
        StepView {
            step: view.step,
            now_ms: view.now_ms,
            token_budget: view.token_budget,
            free_slots: view.free_slots,
            occupied,
            waiting,
            ended,
        }
    }
}

fn rows(table: &wire::RequestTable) -> impl Iterator<Item = RequestInfo> + '_ {
    let at = |column: &[u32], row: usize| column.get(row).copied().unwrap_or(0);
    (0..table.id.len()).map(move |row| RequestInfo {
        id: table.id[row],
        prompt_tokens: at(&table.prompt_tokens, row),
        prompt_done: at(&table.prompt_done, row),
        prompt_cached: at(&table.prompt_cached, row),
        generated: at(&table.generated, row),
        max_tokens: at(&table.max_tokens, row),
        adapter_group: at(&table.adapter_group, row),
        priority: table.priority.get(row).copied().unwrap_or(0),
        arrival_ms: table.arrival_ms.get(row).copied().unwrap_or(0),
    })
}

impl From<wire::Phase> for Phase {
    fn from(phase: wire::Phase) -> Self {
        match phase {
            wire::Phase::Prefilling => Phase::Prefilling,
            wire::Phase::Ready => Phase::Ready,
            wire::Phase::Decoding => Phase::Decoding,
        }
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
    fn columns_become_records() {
        let table = |ids: Vec<u64>| wire::RequestTable {
            prompt_tokens: ids.iter().map(|id| *id as u32 * 10).collect(),
            prompt_done: ids.iter().map(|id| *id as u32).collect(),
            prompt_cached: vec![0; ids.len()],
            generated: vec![2; ids.len()],
            max_tokens: vec![64; ids.len()],
            adapter_group: vec![1; ids.len()],
            priority: vec![-3; ids.len()],
            arrival_ms: ids.iter().map(|id| id * 100).collect(),
            id: ids,
        };
        let view = StepView::from_wire(wire::StepView {
            step: 9,
            now_ms: 77,
            token_budget: 256,
            free_slots: vec![1],
            occupied_slots: vec![0, 2],
            occupied_phases: vec![wire::Phase::Ready, wire::Phase::Prefilling],
            occupied: table(vec![5, 6]),
            waiting: table(vec![7, 8]),
            waiting_slot_hints: vec![NO_SLOT_HINT, 1],
            ended: vec![wire::EndedRequest { request_id: 4, slot: Some(1), reason: wire::EndReason::Cancelled }],
        });
        let request = |id: u64| RequestInfo {
            id,
            prompt_tokens: id as u32 * 10,
            prompt_done: id as u32,
            prompt_cached: 0,
            generated: 2,
            max_tokens: 64,
            adapter_group: 1,
            priority: -3,
            arrival_ms: id * 100,
        };
        assert_eq!(
            view,
            StepView {
                step: 9,
                now_ms: 77,
                token_budget: 256,
                free_slots: vec![1],
                occupied: vec![
                    OccupiedSlot { slot: 0, phase: Phase::Ready, request: request(5) },
                    OccupiedSlot { slot: 2, phase: Phase::Prefilling, request: request(6) },
                ],
                waiting: vec![
                    WaitingRequest { request: request(7), slot_hint: None },
                    WaitingRequest { request: request(8), slot_hint: Some(1) },
                ],
                ended: vec![EndedRequest { request_id: 4, slot: Some(1), reason: EndReason::Cancelled }],
            }
        );
    }

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
