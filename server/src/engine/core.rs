//! The step loop. Each step: build the view, ask the policy, validate its
//! decision, build one batch of prefill chunks and decode tokens, run the
//! model, sample, stream events, stop and free what finished.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use sluice_kernels::pool::ThreadPool;
use tokio::sync::mpsc as events;

use super::handle::{EngineConfig, FallbackPolicy, Health, Shared, SlotInfo};
use super::kv::{BlockManager, SeqBlocks};
use super::metrics::Metrics;
use super::policy::{
    Decision, EndReason, EndedRequest, OccupiedSlot, Phase, RequestInfo, SchedulingPolicy, StepView, WaitingRequest,
};
use super::request::{
    Completion, EngineError, Event, GenerationRequest, IMAGE_ROW, RequestId, StopType, Timings, TokenEvent, TokenProbs,
};
use super::sampling::{Sampler, TokenProb, token_prob, top_probs};
use super::speculative::{CommittedRows, DraftRequest, DraftState, Speculation};
use super::text::{Appended, TextStream};
use super::validate::{has_runnable_work, validate};
use crate::config::OnFault;
use crate::model::batch::{Batch, BatchRow, Layout, RowInput};
use crate::model::kv::KvStore;
use crate::model::tokenizer::Tokenizer;
use crate::model::transformer::{Scratch, Transformer};

pub(super) enum Command {
    Submit {
        id: RequestId,
        request: Box<GenerationRequest>,
        events: events::UnboundedSender<Event>,
    },
    Cancel(RequestId),
    /// Swap the policy; the sender hears once the swap is done.
    ReplacePolicy(Box<dyn SchedulingPolicy>, mpsc::Sender<()>),
}

struct Waiting {
    id: RequestId,
    request: Box<GenerationRequest>,
    events: events::UnboundedSender<Event>,
    arrival_ms: u64,
    /// Numbered once at submission (see `Engine::adapter_group`).
    adapter_group: u32,
}

/// A request in a slot.
struct Active {
    id: RequestId,
    request: Box<GenerationRequest>,
    events: events::UnboundedSender<Event>,
    arrival_ms: u64,
    adapter_group: u32,
    blocks: SeqBlocks,
    phase: Phase,
    /// Prompt then generated tokens whose KV is written, plus at most one
    /// sampled token not yet run.
    tokens: Vec<u32>,
    prompt_done: usize,
    cached: usize,
    /// KV cells written.
    cells: usize,
    generated: usize,
    held_logits: Vec<f32>,
    sampler: Sampler,
    text: TextStream,
    prompt_started: Option<Instant>,
    prompt_ms: f64,
    decode_started: Option<Instant>,
    /// Where its cells sit (image segments move text positions on).
    layout: Layout,
    draft: DraftState,
    /// Tokens drafted for this request and sent to verification.
    draft_n: usize,
    /// Drafted tokens the target's sampler picked.
    draft_accepted: usize,
}

impl Active {
    fn info(&self) -> RequestInfo {
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

    fn send(&self, event: Event) -> bool {
        self.events.send(event).is_ok()
    }
}

/// Every phase change of a slot, at debug level under its own target, so
/// operators and tests can follow what a policy did step by step
/// (`log.level = "info,sluice::phase=debug"`).
fn trace_phase(step: u64, slot: usize, request: RequestId, phase: &'static str) {
    tracing::debug!(target: "sluice::phase", step, slot, request, phase, "phase");
}

fn max_tokens(request: &GenerationRequest) -> u32 {
    request.n_predict.map_or(u32::MAX, |n| n.min(u32::MAX as usize) as u32)
}

/// What a slot does in the batch being built.
enum Work {
    Prefill {
        slot: usize,
        start: usize,
        tokens: usize,
    },
    /// Run the slot's sampled token, then its drafts (if any) for
    /// verification.
    Decode {
        slot: usize,
        drafts: Vec<u32>,
    },
}

impl Work {
    fn slot(&self) -> usize {
        match *self {
            Work::Prefill { slot, .. } | Work::Decode { slot, .. } => slot,
        }
    }

    /// Batch rows this work takes.
    fn rows(&self) -> usize {
        match self {
            Work::Prefill { tokens, .. } => *tokens,
            Work::Decode { drafts, .. } => 1 + drafts.len(),
        }
    }
}

/// What emitting a sampled token did.
enum Emitted {
    /// The token was emitted and the request goes on.
    Continue,
    /// The sampler picked another token than the draft offered; nothing was
    /// emitted and the sampler is as it was.
    Rejected,
    /// The request ended (stop condition, disconnect or failure).
    Ended,
}

pub(super) struct Engine {
    model: Arc<Transformer>,
    tokenizer: Arc<Tokenizer>,
    policy: Box<dyn SchedulingPolicy>,
    fallback: FallbackPolicy,
    config: EngineConfig,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    kv: KvStore,
    blocks: BlockManager,
    pool: ThreadPool,
    scratch: Scratch,
    speculation: Option<Speculation>,
    slots: Vec<Option<Active>>,
    waiting: VecDeque<Waiting>,
    ended: Vec<EndedRequest>,
    adapter_groups: Vec<Vec<(u32, f32)>>,
    started: Instant,
    step: u64,
    stalled_steps: u32,
    consecutive_faults: u32,
    failed_closed: bool,
}

/// What the engine runs: the target, its tokenizer and an optional draft.
pub(super) struct Models {
    pub model: Arc<Transformer>,
    pub tokenizer: Arc<Tokenizer>,
    pub speculation: Option<Speculation>,
}

impl Engine {
    pub(super) fn new(
        Models { model, tokenizer, speculation }: Models,
        policy: Box<dyn SchedulingPolicy>,
        fallback: FallbackPolicy,
        config: EngineConfig,
        shared: Arc<Shared>,
        commands: mpsc::Receiver<Command>,
    ) -> Self {
        let (n_blocks, block_tokens) = config.kv_blocks();
        let kv = model.kv_store(n_blocks, block_tokens);
        Engine {
            speculation,
            kv,
            blocks: BlockManager::new(n_blocks, block_tokens),
            pool: ThreadPool::new(config.threads.max(1)),
            scratch: Scratch::default(),
            slots: (0..config.slots).map(|_| None).collect(),
            waiting: VecDeque::new(),
            ended: Vec::new(),
            adapter_groups: vec![Vec::new()],
            started: Instant::now(),
            step: 0,
            stalled_steps: 0,
            consecutive_faults: 0,
            failed_closed: false,
            model,
            tokenizer,
            policy,
            fallback,
            config,
            shared,
            commands,
        }
    }

    pub(super) fn run(mut self) {
        self.publish();
        loop {
            let idle = self.waiting.is_empty() && self.slots.iter().all(Option::is_none);
            let command = if idle {
                match self.commands.recv() {
                    Ok(command) => Some(command),
                    Err(_) => return,
                }
            } else {
                match self.commands.try_recv() {
                    Ok(command) => Some(command),
                    Err(mpsc::TryRecvError::Empty) => None,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            };
            if let Some(command) = command {
                self.handle(command);
                // Take every queued command before stepping.
                while let Ok(command) = self.commands.try_recv() {
                    self.handle(command);
                }
            }
            self.reap_disconnected();
            self.step();
            self.publish();
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit { id, request, events } => {
                Metrics::add(&self.shared.metrics.requests_total, 1);
                if self.failed_closed {
                    self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
                    let _ = events.send(Event::Failed(EngineError::Unavailable(self.failed_closed_message())));
                    return;
                }
                let arrival_ms = self.now_ms();
                let adapter_group = self.adapter_group(&request.lora);
                self.waiting.push_back(Waiting { id, request, events, arrival_ms, adapter_group });
            }
            Command::Cancel(id) => self.cancel(id),
            Command::ReplacePolicy(policy, applied) => {
                tracing::info!(policy = policy.name(), "scheduling policy replaced");
                if let Ok(mut name) = self.shared.policy_name.lock() {
                    *name = policy.name().to_owned();
                }
                self.policy = policy;
                self.failed_closed = false;
                self.consecutive_faults = 0;
                self.stalled_steps = 0;
                if let Ok(mut health) = self.shared.health.lock() {
                    *health = Health::Ok;
                }
                let _ = applied.send(());
            }
        }
    }

    fn failed_closed_message(&self) -> String {
        match self.shared.health.lock().map(|health| health.clone()) {
            Ok(Health::FailedClosed { policy, fault }) => {
                format!("scheduling policy `{policy}` failed closed ({fault}); reload the policy to resume")
            }
            _ => "the scheduling policy failed closed".into(),
        }
    }

    fn cancel(&mut self, id: RequestId) {
        if let Some(at) = self.waiting.iter().position(|waiting| waiting.id == id) {
            self.waiting.remove(at);
            self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
            self.ended.push(EndedRequest { request_id: id, slot: None, reason: EndReason::Cancelled });
            return;
        }
        if let Some(slot) = self.slots.iter().position(|active| active.as_ref().is_some_and(|active| active.id == id)) {
            self.end_slot(slot, EndReason::Cancelled, None);
        }
    }

    /// Requests whose client went away are cancelled.
    fn reap_disconnected(&mut self) {
        let gone: Vec<RequestId> = self
            .waiting
            .iter()
            .filter(|waiting| waiting.events.is_closed())
            .map(|waiting| waiting.id)
            .chain(self.slots.iter().flatten().filter(|active| active.events.is_closed()).map(|active| active.id))
            .collect();
        for id in gone {
            self.cancel(id);
        }
    }

    fn adapter_group(&mut self, lora: &[(u32, f32)]) -> u32 {
        match self.adapter_groups.iter().position(|group| group.as_slice() == lora) {
            Some(index) => index as u32,
            None => {
                self.adapter_groups.push(lora.to_vec());
                (self.adapter_groups.len() - 1) as u32
            }
        }
    }

    fn view(&mut self) -> StepView {
        let mut occupied = Vec::new();
        let mut free_slots = Vec::new();
        for (slot, active) in self.slots.iter().enumerate() {
            match active {
                Some(active) => {
                    occupied.push(OccupiedSlot { slot: slot as u32, phase: active.phase, request: active.info() })
                }
                None => free_slots.push(slot as u32),
            }
        }
        let waiting = self
            .waiting
            .iter()
            .map(|waiting| {
                let cached = if waiting.request.cache_prompt && self.config.prefix_cache {
                    self.blocks.cached_prefix(&waiting.request.prompt)
                } else {
                    0
                };
                let slot_hint = waiting.request.id_slot.filter(|slot| free_slots.contains(slot));
                WaitingRequest {
                    request: RequestInfo {
                        id: waiting.id,
                        prompt_tokens: waiting.request.prompt.len() as u32,
                        prompt_done: cached as u32,
                        prompt_cached: cached as u32,
                        generated: 0,
                        max_tokens: max_tokens(&waiting.request),
                        adapter_group: waiting.adapter_group,
                        priority: waiting.request.priority,
                        arrival_ms: waiting.arrival_ms,
                    },
                    slot_hint,
                }
            })
            .collect();
        StepView {
            step: self.step,
            now_ms: self.now_ms(),
            token_budget: self.config.batch_tokens as u32,
            free_slots,
            occupied,
            waiting,
            ended: self.ended.clone(),
        }
    }

    fn step(&mut self) {
        if self.failed_closed {
            return;
        }
        let view = self.view();
        if !has_runnable_work(&view) {
            return;
        }
        let Some(decision) = self.decide(&view) else {
            return;
        };
        self.ended.clear();
        self.step += 1;
        if decision.admit.is_empty() && decision.prefill.is_empty() && decision.decode.is_empty() {
            self.stalled_steps += 1;
            if self.stalled_steps >= self.config.stall_steps {
                self.stalled_steps = 0;
                self.fault(
                    "stalled",
                    format!("granted nothing for {} steps with work runnable", self.config.stall_steps),
                );
            } else {
                // Let time pass: a policy waiting on the clock should not spin.
                std::thread::sleep(Duration::from_millis(1));
            }
            return;
        }
        self.stalled_steps = 0;
        self.consecutive_faults = 0;
        self.apply(decision);
    }

    /// The policy's decision for `view`, validated; faults are retried once
    /// on a fresh instance, then quarantined.
    fn decide(&mut self, view: &StepView) -> Option<Decision> {
        loop {
            let started = Instant::now();
            let result = self.policy.step(view);
            self.shared.metrics.observe_policy_call(started.elapsed().as_secs_f64());
            let (reason, detail) = match result {
                Ok(decision) => match validate(view, &decision, 0) {
                    Ok(()) => return Some(decision),
                    Err(invalid) => ("invalid", invalid.to_string()),
                },
                Err(fault) => (fault.reason(), fault.to_string()),
            };
            if !self.fault(reason, detail) {
                return None;
            }
        }
    }

    /// Record a fault; returns whether to retry the step.
    fn fault(&mut self, reason: &'static str, detail: String) -> bool {
        let policy = self.policy.name().to_owned();
        tracing::warn!(step = self.step, policy, reason, detail, "scheduling policy fault");
        self.shared.metrics.count_fault(&policy, reason);
        self.policy.reset();
        self.consecutive_faults += 1;
        if self.consecutive_faults < 2 {
            return true;
        }
        self.consecutive_faults = 0;
        let fault = format!("{reason}: {detail}");
        match self.config.on_fault {
            OnFault::Fallback => match (self.fallback)() {
                Some(fallback) => {
                    tracing::error!(policy, fault, "quarantined; falling back to `{}`", fallback.name());
                    Metrics::add(&self.shared.metrics.policy_fallbacks_total, 1);
                    if let Ok(mut name) = self.shared.policy_name.lock() {
                        *name = fallback.name().to_owned();
                    }
                    self.policy = fallback;
                    if let Ok(mut health) = self.shared.health.lock() {
                        *health = Health::Degraded { policy, fault };
                    }
                    true
                }
                None => {
                    self.fail_closed(policy, fault);
                    false
                }
            },
            OnFault::FailClosed => {
                self.fail_closed(policy, fault);
                false
            }
        }
    }

    fn fail_closed(&mut self, policy: String, fault: String) {
        tracing::error!(policy, fault, "quarantined; failing closed");
        if let Ok(mut health) = self.shared.health.lock() {
            *health = Health::FailedClosed { policy, fault };
        }
        self.failed_closed = true;
        let error = EngineError::Unavailable(self.failed_closed_message());
        for waiting in self.waiting.drain(..) {
            let _ = waiting.events.send(Event::Failed(error.clone()));
        }
        self.shared.waiting.store(0, Ordering::Relaxed);
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                self.end_slot(slot, EndReason::Failed, Some(Event::Failed(error.clone())));
            }
        }
    }

    fn apply(&mut self, decision: Decision) {
        for admit in &decision.admit {
            self.admit(admit.request_id, admit.slot as usize);
        }
        let mut work = Vec::new();
        for prefill in &decision.prefill {
            let slot = prefill.slot as usize;
            let Some(active) = self.slots[slot].as_mut() else { continue };
            let start = active.prompt_done;
            let tokens = prefill.tokens as usize;
            if let Err(error) = self.blocks.reserve(&mut active.blocks, start + tokens) {
                self.end_slot(
                    slot,
                    EndReason::Failed,
                    Some(Event::Failed(EngineError::ResourceExhausted(error.to_string()))),
                );
                continue;
            }
            active.prompt_started.get_or_insert_with(Instant::now);
            work.push(Work::Prefill { slot, start, tokens });
        }
        let mut decoding = Vec::new();
        for &slot in &decision.decode {
            if self.sample_and_emit(slot as usize) {
                decoding.push(slot as usize);
            }
        }
        // Drafts count against the step's token budget: they get what the
        // policy's grants left of it.
        let granted = work.iter().map(Work::rows).sum::<usize>() + decoding.len();
        let mut drafts = self.draft(&decoding, self.config.batch_tokens.saturating_sub(granted));
        for slot in decoding {
            work.push(Work::Decode { slot, drafts: drafts.remove(&slot).unwrap_or_default() });
        }
        if work.is_empty() {
            return;
        }
        self.forward(work);
    }

    fn admit(&mut self, request_id: RequestId, slot: usize) {
        let Some(at) = self.waiting.iter().position(|waiting| waiting.id == request_id) else { return };
        let Some(waiting) = self.waiting.remove(at) else { return };
        self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
        let use_cache = waiting.request.cache_prompt && self.config.prefix_cache;
        let admission = match self.blocks.admit(&waiting.request.prompt, use_cache) {
            Ok(admission) => admission,
            Err(error) => {
                let _ = waiting.events.send(Event::Failed(EngineError::ResourceExhausted(error.to_string())));
                self.ended.push(EndedRequest { request_id, slot: None, reason: EndReason::Failed });
                return;
            }
        };
        if let Some((from, to)) = admission.copy {
            self.kv.copy_block(from, to);
            if let Some(speculation) = self.speculation.as_mut() {
                speculation.drafter.copy_block(from, to);
            }
        }
        Metrics::add(&self.shared.metrics.prefix_cache_hit_tokens_total, admission.cached_tokens as u64);
        let mut sampler = Sampler::new(waiting.request.sampling.clone());
        // Image rows are not tokens: penalties never see them.
        for &token in waiting.request.prompt.iter().filter(|&&token| token & IMAGE_ROW == 0) {
            sampler.accept(token);
        }
        let layout = waiting.request.layout().unwrap_or_default();
        let text = TextStream::new(waiting.request.stop.clone());
        let _ = waiting.events.send(Event::Started { id_slot: slot as u32 });
        let cached = admission.cached_tokens;
        trace_phase(self.step, slot, waiting.id, "prefilling");
        self.slots[slot] = Some(Active {
            id: waiting.id,
            tokens: waiting.request.prompt[..cached].to_vec(),
            request: waiting.request,
            events: waiting.events,
            arrival_ms: waiting.arrival_ms,
            adapter_group: waiting.adapter_group,
            blocks: admission.blocks,
            phase: Phase::Prefilling,
            prompt_done: cached,
            cached,
            cells: cached,
            generated: 0,
            held_logits: Vec::new(),
            sampler,
            text,
            prompt_started: None,
            prompt_ms: 0.0,
            decode_started: None,
            layout,
            draft: DraftState::new(cached),
            draft_n: 0,
            draft_accepted: 0,
        });
        Metrics::add(&self.shared.metrics.requests_processing, 1);
    }

    /// Sample the slot's next token from its held logits and emit it.
    /// Returns whether the token must run through the model (the request
    /// goes on).
    fn sample_and_emit(&mut self, slot: usize) -> bool {
        matches!(self.emit(slot, None), Emitted::Continue)
    }

    /// Sample from the held logits and emit the token; with `draft`, only
    /// if the sampler picks that token (otherwise the sampler is restored,
    /// so the next step samples the same logits with the same random state,
    /// exactly as plain decoding would).
    fn emit(&mut self, slot: usize, draft: Option<u32>) -> Emitted {
        let ctx = self.config.ctx;
        let tokenizer = Arc::clone(&self.tokenizer);
        let Some(active) = self.slots[slot].as_mut() else { return Emitted::Ended };
        if active.request.n_predict == Some(0) {
            // n_predict 0 evaluates the prompt only.
            self.finish(slot, StopType::Limit, String::new(), false);
            return Emitted::Ended;
        }
        active.decode_started.get_or_insert_with(Instant::now);
        let n_probs = active.request.n_probs;
        let mut post = Vec::new();
        let pre = (n_probs > 0 && !active.request.post_sampling_probs).then(|| top_probs(&active.held_logits, n_probs));
        let post_request = (n_probs > 0 && active.request.post_sampling_probs).then_some((n_probs, &mut post));
        let before = draft.map(|_| active.sampler.checkpoint());
        let sampled = active.sampler.sample(&active.held_logits, post_request);
        let token = sampled.token;
        if let Some(before) = before {
            if draft != Some(token) {
                active.sampler.restore(before);
                return Emitted::Rejected;
            }
            active.draft_accepted += 1;
        }
        active.sampler.accept(token);
        active.generated += 1;
        if active.phase != Phase::Decoding {
            trace_phase(self.step, slot, active.id, "decoding");
            active.phase = Phase::Decoding;
        }
        Metrics::add(&self.shared.metrics.tokens_predicted_total, 1);
        let probs = if let Some(top) = pre {
            Some(TokenProbs {
                chosen: TokenProb { token, prob: token_prob(&active.held_logits, token) },
                top,
                post_sampling: false,
            })
        } else if n_probs > 0 {
            Some(TokenProbs { chosen: sampled, top: post, post_sampling: true })
        } else {
            None
        };

        let end_of_generation = !active.request.ignore_eos && tokenizer.is_end_of_generation(token);
        if end_of_generation {
            self.finish(slot, StopType::Eos, String::new(), false);
            return Emitted::Ended;
        }
        let (text, stop_word) = match active.text.push(tokenizer.render_bytes(token, false)) {
            Appended::Text(text) => (text, None),
            Appended::Stop { text, word } => (text, Some(word)),
        };
        if !active.send(Event::Token(TokenEvent { token, text, probs })) {
            self.end_slot(slot, EndReason::Cancelled, None);
            return Emitted::Ended;
        }
        if let Some(word) = stop_word {
            self.finish(slot, StopType::Word, word, false);
            return Emitted::Ended;
        }
        if active.request.n_predict.is_some_and(|limit| active.generated >= limit) {
            self.finish(slot, StopType::Limit, String::new(), false);
            return Emitted::Ended;
        }
        if active.cells + 1 > ctx {
            self.finish(slot, StopType::Limit, String::new(), true);
            return Emitted::Ended;
        }
        active.tokens.push(token);
        if let Err(error) = self.blocks.reserve(&mut active.blocks, active.cells + 1) {
            self.end_slot(
                slot,
                EndReason::Failed,
                Some(Event::Failed(EngineError::ResourceExhausted(error.to_string()))),
            );
            return Emitted::Ended;
        }
        Emitted::Continue
    }

    /// Drafts for the decoding `slots`, at most `budget` tokens in all.
    fn draft(&mut self, slots: &[usize], mut budget: usize) -> std::collections::HashMap<usize, Vec<u32>> {
        let mut drafts = std::collections::HashMap::new();
        let Some(speculation) = self.speculation.as_mut() else { return drafts };
        let settings = speculation.settings;
        let ctx = self.config.ctx;
        let mut requests = Vec::new();
        let mut requested = Vec::new();
        for (slot, active) in self.slots.iter_mut().enumerate() {
            let Some(active) = active.as_mut().filter(|_| slots.contains(&slot)) else { continue };
            // Room for the drafts: the context, what is left to generate
            // (the sampled token is already counted) and the budget.
            let to_generate =
                active.request.n_predict.map_or(usize::MAX, |limit| limit.saturating_sub(active.generated));
            let mut n_max = settings.n_max.min(budget).min(to_generate).min(ctx.saturating_sub(active.cells + 1));
            if n_max < settings.n_min.max(1)
                || self.blocks.reserve(&mut active.blocks, active.cells + 1 + n_max).is_err()
            {
                n_max = 0;
            }
            budget -= n_max;
            requested.push(slot);
            let Active { draft, blocks, tokens, layout, .. } = active;
            requests.push(DraftRequest {
                state: draft,
                table: &blocks.table,
                layout,
                tokens,
                n_max,
                drafts: Vec::new(),
            });
        }
        if let Err(error) = speculation.drafter.draft(&mut requests, &settings, &self.pool) {
            tracing::warn!(%error, drafter = speculation.drafter.kind(), "drafting failed; decoding without drafts");
            return drafts;
        }
        for (slot, request) in requested.into_iter().zip(requests) {
            if request.drafts.len() >= settings.n_min.max(1) {
                drafts.insert(slot, request.drafts);
            }
        }
        drafts
    }

    fn forward(&mut self, work: Vec<Work>) {
        let mut batch = Batch::default();
        if let Some(speculation) = &self.speculation {
            batch.taps = speculation.drafter.taps().to_vec();
        }
        let mut prefill_tokens = 0;
        let mut decode_tokens = 0;
        let n_embd = self.model.hparams().n_embd;
        for item in &work {
            let Some(active) = self.slots[item.slot()].as_ref() else { continue };
            let (start, inputs, logits_from): (usize, Vec<u32>, usize) = match item {
                Work::Prefill { start, tokens, .. } => {
                    prefill_tokens += tokens;
                    let done = start + tokens == active.request.prompt.len();
                    (
                        *start,
                        active.request.prompt[*start..start + tokens].to_vec(),
                        if done { tokens - 1 } else { *tokens },
                    )
                }
                Work::Decode { drafts, .. } => {
                    decode_tokens += 1 + drafts.len();
                    let mut inputs = vec![active.tokens[active.cells]];
                    inputs.extend_from_slice(drafts);
                    // Verification needs the logits after every row.
                    (active.cells, inputs, 0)
                }
            };
            batch.block_tables.push(active.blocks.table.clone());
            for (offset, token) in inputs.into_iter().enumerate() {
                let cell = start + offset;
                let image_row = (token & IMAGE_ROW != 0).then(|| active.request.image_row(cell, n_embd)).flatten();
                let input = match image_row {
                    Some(row) => {
                        batch.embeddings.extend_from_slice(row);
                        RowInput::Embedding(batch.embeddings.len() / n_embd - 1)
                    }
                    None => RowInput::Token(token),
                };
                batch.rows.push(BatchRow {
                    input,
                    seq: batch.block_tables.len() - 1,
                    cell: cell as u32,
                    pos: active.layout.position(cell),
                    logits: offset >= logits_from,
                });
            }
        }
        let started = Instant::now();
        let output = match self.model.forward(&batch, &mut self.kv, &self.pool, &mut self.scratch) {
            Ok(output) => output,
            Err(error) => {
                tracing::error!(%error, "forward pass refused");
                for item in &work {
                    self.end_slot(
                        item.slot(),
                        EndReason::Failed,
                        Some(Event::Failed(EngineError::Internal(error.to_string()))),
                    );
                }
                return;
            }
        };
        let elapsed = started.elapsed();
        let metrics = &self.shared.metrics;
        Metrics::add(&metrics.steps_total, 1);
        Metrics::add(&metrics.n_decode_total, 1);
        Metrics::add(&metrics.n_busy_slots_total, self.slots.iter().flatten().count() as u64);
        Metrics::add(&metrics.step_prefill_tokens_total, prefill_tokens as u64);
        Metrics::add(&metrics.step_decode_tokens_total, decode_tokens as u64);
        Metrics::add(&metrics.prompt_tokens_total, prefill_tokens as u64);
        let total = (prefill_tokens + decode_tokens).max(1) as f64;
        let micros = elapsed.as_micros() as f64;
        Metrics::add(&metrics.prompt_micros_total, (micros * prefill_tokens as f64 / total) as u64);
        Metrics::add(&metrics.predicted_micros_total, (micros * decode_tokens as f64 / total) as u64);

        let n_vocab = self.model.hparams().n_vocab;
        // Logits rows come in batch-row order, so each work item's are
        // consecutive: count them off as the items go by.
        let mut next_logits = 0;
        let mut first_row = 0;
        let mut committed = Vec::new();
        for item in work {
            let slot = item.slot();
            let rows = first_row..first_row + item.rows();
            first_row = rows.end;
            let n_logits = output.logit_rows[next_logits..].iter().take_while(|row| rows.contains(row)).count();
            let logits = &output.logits[next_logits * n_vocab..(next_logits + n_logits) * n_vocab];
            next_logits += n_logits;
            let Some(active) = self.slots[slot].as_mut() else { continue };
            let first_cell = active.cells;
            match item {
                Work::Prefill { tokens, start, .. } => {
                    active.tokens.extend_from_slice(&active.request.prompt[start..start + tokens]);
                    active.prompt_done += tokens;
                    active.cells += tokens;
                    if n_logits > 0 {
                        active.held_logits = logits.to_vec();
                        active.phase = Phase::Ready;
                        trace_phase(self.step, slot, active.id, "ready");
                        active.prompt_ms =
                            active.prompt_started.map_or(0.0, |started| started.elapsed().as_secs_f64() * 1e3);
                    }
                }
                Work::Decode { drafts, .. } => {
                    active.cells += 1;
                    active.held_logits = logits[..n_vocab].to_vec();
                    if !self.verify(slot, &drafts, logits) {
                        continue;
                    }
                }
            }
            let Some(active) = self.slots[slot].as_mut() else { continue };
            let written = active.cells;
            active.draft.trim(written);
            self.blocks.commit(&mut active.blocks, &active.tokens[..written]);
            committed.push((slot, first_cell, rows.start..rows.start + (written - first_cell)));
            Metrics::set(
                &self.shared.metrics.n_tokens_max,
                Metrics::get(&self.shared.metrics.n_tokens_max).max(written as u64),
            );
        }
        self.commit_to_drafter(&committed, &output.taps);
    }

    /// Emit the drafts the target's sampler agrees with, from `logits`
    /// (after the sampled token, then after each draft). Leaves the held
    /// logits after the last accepted token. Returns whether the request
    /// goes on.
    fn verify(&mut self, slot: usize, drafts: &[u32], logits: &[f32]) -> bool {
        if drafts.is_empty() {
            return true;
        }
        let n_vocab = self.model.hparams().n_vocab;
        let metrics = &self.shared.metrics;
        Metrics::add(&metrics.drafts_total, 1);
        Metrics::add(&metrics.draft_tokens_total, drafts.len() as u64);
        if let Some(active) = self.slots[slot].as_mut() {
            active.draft_n += drafts.len();
        }
        for (index, &draft) in drafts.iter().enumerate() {
            match self.emit(slot, Some(draft)) {
                Emitted::Continue => {
                    self.shared.metrics.count_accepted_at(index);
                    let Some(active) = self.slots[slot].as_mut() else { return false };
                    active.cells += 1;
                    active.held_logits.copy_from_slice(&logits[(index + 1) * n_vocab..(index + 2) * n_vocab]);
                }
                Emitted::Rejected => break,
                Emitted::Ended => {
                    self.shared.metrics.count_accepted_at(index);
                    return false;
                }
            }
        }
        true
    }

    /// Tell the drafter which target rows each sequence kept.
    fn commit_to_drafter(&mut self, committed: &[(usize, usize, std::ops::Range<usize>)], taps: &[Vec<f32>]) {
        let Some(speculation) = self.speculation.as_mut() else { return };
        if speculation.drafter.taps().is_empty() {
            return;
        }
        let mut rows = Vec::new();
        for (slot, active) in self.slots.iter_mut().enumerate() {
            let Some(active) = active.as_mut() else { continue };
            let Some((_, first_cell, batch_rows)) = committed.iter().find(|(committed, ..)| *committed == slot) else {
                continue;
            };
            rows.push(CommittedRows {
                state: &mut active.draft,
                table: &active.blocks.table,
                layout: &active.layout,
                first_cell: *first_cell,
                batch_rows: batch_rows.clone(),
            });
        }
        if let Err(error) = speculation.drafter.commit(&mut rows, taps, &self.pool) {
            tracing::warn!(%error, drafter = speculation.drafter.kind(), "draft context update failed");
        }
    }

    fn finish(&mut self, slot: usize, stop_type: StopType, stopping_word: String, truncated: bool) {
        let Some(active) = self.slots[slot].as_mut() else { return };
        let text = active.text.finish();
        let predicted_ms = active.decode_started.map_or(0.0, |started| started.elapsed().as_secs_f64() * 1e3);
        let completion = Completion {
            stop_type,
            stopping_word,
            text,
            truncated,
            tokens_predicted: active.generated,
            tokens_evaluated: active.request.prompt.len(),
            tokens_cached: active.cached,
            id_slot: slot as u32,
            timings: Timings {
                cache_n: active.cached,
                prompt_n: active.request.prompt.len() - active.cached,
                prompt_ms: active.prompt_ms,
                predicted_n: active.generated,
                predicted_ms,
                draft_n: active.draft_n,
                draft_n_accepted: active.draft_accepted,
            },
        };
        self.end_slot(slot, EndReason::Completed, Some(Event::Done(completion)));
    }

    /// Free a slot: release its blocks, tell the client (if `event`), and
    /// report the end to the policy.
    fn end_slot(&mut self, slot: usize, reason: EndReason, event: Option<Event>) {
        let Some(active) = self.slots[slot].take() else { return };
        trace_phase(
            self.step,
            slot,
            active.id,
            match reason {
                EndReason::Completed => "completed",
                EndReason::Cancelled => "cancelled",
                EndReason::Failed => "failed",
            },
        );
        // Bookkeeping first: a client that reads /metrics or /slots right
        // after its response must see the request gone.
        self.blocks.release(active.blocks);
        self.ended.push(EndedRequest { request_id: active.id, slot: Some(slot as u32), reason });
        self.shared.metrics.requests_processing.fetch_sub(1, Ordering::Relaxed);
        self.publish();
        if let Some(event) = event {
            let _ = active.events.send(event);
        }
    }

    /// Publish slots, queue and KV usage for the HTTP layer.
    fn publish(&mut self) {
        let stats = self.blocks.stats();
        let metrics = &self.shared.metrics;
        Metrics::set(&metrics.kv_blocks_used, stats.used as u64);
        Metrics::set(&metrics.kv_blocks_cached, stats.cached as u64);
        Metrics::set(&metrics.kv_blocks_free, stats.free as u64);
        Metrics::set(&metrics.requests_deferred, self.waiting.len() as u64);
        let infos = self
            .slots
            .iter()
            .enumerate()
            .map(|(slot, active)| SlotInfo {
                id: slot as u32,
                n_ctx: self.config.ctx,
                phase: active.as_ref().map(|active| active.phase),
                request_id: active.as_ref().map(|active| active.id),
                prompt_tokens: active.as_ref().map_or(0, |active| active.request.prompt.len()),
                prompt_done: active.as_ref().map_or(0, |active| active.prompt_done),
                prompt_cached: active.as_ref().map_or(0, |active| active.cached),
                generated: active.as_ref().map_or(0, |active| active.generated),
                max_tokens: active.as_ref().and_then(|active| active.request.n_predict),
                priority: active.as_ref().map_or(0, |active| active.request.priority),
                adapter_group: active.as_ref().map_or(0, |active| active.adapter_group),
            })
            .collect();
        if let Ok(mut slots) = self.shared.slots.lock() {
            *slots = infos;
        }
    }
}
