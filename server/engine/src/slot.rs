//! A request's life inside the engine: waiting for a slot, then in one.

use std::time::Instant;

use super::constraint::Constraint;
use super::delivery::{EventSender, QueueTicket};
use super::kv::SeqBlocks;
use super::policy::{Phase, RequestInfo};
use super::request::{Event, GenerationRequest, RequestId};
use super::sampling::Sampler;
use super::speculative::DraftState;
use super::text::TextStream;
use sluice_model::batch::Layout;

/// A request queued for a slot.
pub(super) struct Waiting {
    pub id: RequestId,
    pub request: Box<GenerationRequest>,
    pub events: EventSender,
    pub arrival_ms: u64,
    /// Numbered once at submission (see `engine::adapters`).
    pub adapter_group: u32,
    /// Its adapter configuration's prefix-cache root.
    pub kv_root: u64,
    /// Its place in the queue; dropped with it when it leaves the queue.
    pub ticket: QueueTicket,
}

impl Waiting {
    /// What the policy sees of it, with `cached` prompt tokens it would
    /// borrow from the prefix cache.
    pub fn info(&self, cached: usize) -> RequestInfo {
        RequestInfo {
            id: self.id,
            prompt_tokens: self.request.prompt.len() as u32,
            prompt_done: cached as u32,
            prompt_cached: cached as u32,
            generated: 0,
            max_tokens: max_tokens(&self.request),
            adapter_group: self.adapter_group,
            priority: self.request.priority,
            arrival_ms: self.arrival_ms,
        }
    }
}

/// A request in a slot.
pub(super) struct Active {
    pub id: RequestId,
    pub request: Box<GenerationRequest>,
    pub events: EventSender,
    pub arrival_ms: u64,
    pub adapter_group: u32,
    pub blocks: SeqBlocks,
    pub phase: Phase,
    /// Prompt then generated tokens whose KV is written, plus at most one
    /// sampled token not yet run.
    pub tokens: Vec<u32>,
    pub prompt_done: usize,
    /// The prompt's length as submitted (a context shift replaces
    /// `request.prompt` with what it keeps).
    pub n_prompt: usize,
    pub cached: usize,
    /// KV cells written.
    pub cells: usize,
    /// Cells before `cells` that the recurrent state (a model with
    /// recurrent layers) does not hold yet: a verification that rejected
    /// drafts put back the state from before it, and the accepted tokens
    /// run again in front of the next decode pass.
    pub replay: usize,
    pub generated: usize,
    pub held_logits: Vec<f32>,
    pub sampler: Sampler,
    pub text: TextStream,
    pub prompt_started: Option<Instant>,
    pub prompt_ms: f64,
    /// When it got its slot (for prompt progress).
    pub admitted: Instant,
    pub decode_started: Option<Instant>,
    /// Where its cells sit (image segments move text positions on).
    pub layout: Layout,
    pub draft: DraftState,
    /// Tokens drafted for this request and sent to verification.
    pub draft_n: usize,
    /// Drafted tokens the target's sampler picked.
    pub draft_accepted: usize,
    /// Its context was shifted: reported as `truncated`.
    pub truncated: bool,
    /// Its grammar's matcher, when the request has one.
    pub constraint: Option<Constraint>,
}

impl Active {
    /// What the policy sees of it.
    pub fn info(&self) -> RequestInfo {
        RequestInfo {
            id: self.id,
            prompt_tokens: self.request.prompt.len() as u32,
            prompt_done: self.prompt_done as u32,
            prompt_cached: self.cached as u32,
            generated: self.generated as u32,
            max_tokens: max_tokens(&self.request),
            adapter_group: self.adapter_group,
            priority: self.request.priority,
            arrival_ms: self.arrival_ms,
        }
    }

    /// Whether the client still listens and keeps up.
    pub fn send(&self, event: Event) -> bool {
        self.events.send(event).is_ok()
    }
}

/// Every phase change of a slot, at debug level under its own target, so
/// operators and tests can follow what a policy did step by step
/// (`log.level = "info,sluice::phase=debug"`).
pub(super) fn trace_phase(step: u64, slot: usize, request: RequestId, phase: &'static str) {
    tracing::debug!(target: "sluice::phase", step, slot, request, phase, "phase");
}

fn max_tokens(request: &GenerationRequest) -> u32 {
    request.n_predict.map_or(u32::MAX, |n| n.min(u32::MAX as usize) as u32)
}
