//! Native test helpers: build step views without an engine or wasm.
//!
//! ```
//! use sluice_plugin_api::testing::{request, ViewBuilder};
//! use sluice_plugin_api::Phase;
//!
//! let view = ViewBuilder::new(4, 512)
//!     .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(3))
//!     .waiting(request(2, 100))
//!     .build();
//! assert_eq!(view.free_slots, vec![1, 2, 3]);
//! ```

use crate::{Decision, EndReason, EndedRequest, OccupiedSlot, Phase, RequestInfo, StepCosts, StepView, WaitingRequest};

/// A request with `prompt_tokens` prompt tokens, nothing done, 128 max tokens,
/// adapter group 0, priority 0, arrival 0.
pub fn request(id: u64, prompt_tokens: u32) -> RequestInfo {
    RequestInfo {
        id,
        prompt_tokens,
        prompt_done: 0,
        prompt_cached: 0,
        generated: 0,
        max_tokens: 128,
        adapter_group: 0,
        priority: 0,
        arrival_ms: 0,
    }
}

impl RequestInfo {
    /// Set the processed prompt tokens.
    pub fn done(mut self, prompt_done: u32) -> Self {
        self.prompt_done = prompt_done;
        self
    }
    /// Set the generated token count.
    pub fn generated(mut self, generated: u32) -> Self {
        self.generated = generated;
        self
    }
    /// Set the adapter group.
    pub fn group(mut self, adapter_group: u32) -> Self {
        self.adapter_group = adapter_group;
        self
    }
    /// Set the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
    /// Set the arrival time.
    pub fn arrived(mut self, arrival_ms: u64) -> Self {
        self.arrival_ms = arrival_ms;
        self
    }
    /// Set the token limit.
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }
}

/// Builds a [`StepView`]; free slots are whatever is not occupied.
#[derive(Debug, Clone)]
pub struct ViewBuilder {
    slots: u32,
    view: StepView,
}

impl ViewBuilder {
    /// A view of an engine with `slots` slots and a token budget, at step 0.
    pub fn new(slots: u32, token_budget: u32) -> Self {
        ViewBuilder {
            slots,
            view: StepView {
                step: 0,
                now_ms: 0,
                token_budget,
                costs: StepCosts::default(),
                free_slots: Vec::new(),
                occupied: Vec::new(),
                waiting: Vec::new(),
                ended: Vec::new(),
            },
        }
    }

    /// Set the step number and clock.
    pub fn at(mut self, step: u64, now_ms: u64) -> Self {
        self.view.step = step;
        self.view.now_ms = now_ms;
        self
    }

    /// Set the measured step costs.
    pub fn costs(mut self, costs: StepCosts) -> Self {
        self.view.costs = costs;
        self
    }

    /// Put `request` in `slot` with `phase`.
    pub fn occupied(mut self, slot: u32, phase: Phase, request: RequestInfo) -> Self {
        self.view.occupied.push(OccupiedSlot { slot, phase, request });
        self
    }

    /// Queue `request` (after those queued before it).
    pub fn waiting(mut self, request: RequestInfo) -> Self {
        self.view.waiting.push(WaitingRequest { request, slot_hint: None });
        self
    }

    /// Report that a request ended since the previous step.
    pub fn ended(mut self, request_id: u64, slot: Option<u32>, reason: EndReason) -> Self {
        self.view.ended.push(EndedRequest { request_id, slot, reason });
        self
    }

    /// The view, with occupied slots sorted and free slots filled in.
    pub fn build(mut self) -> StepView {
        self.view.occupied.sort_by_key(|slot| slot.slot);
        let occupied: Vec<u32> = self.view.occupied.iter().map(|slot| slot.slot).collect();
        self.view.free_slots = (0..self.slots).filter(|slot| !occupied.contains(slot)).collect();
        self.view
    }
}

/// Tokens a decision spends: prefill tokens plus one per decode slot
/// (saturating: a hostile decision may name more than a `u32` holds).
pub fn tokens_used(decision: &Decision) -> u32 {
    let prefill = decision.prefill.iter().fold(0u32, |sum, chunk| sum.saturating_add(chunk.tokens));
    prefill.saturating_add(u32::try_from(decision.decode.len()).unwrap_or(u32::MAX))
}
