//! The step loop. Each step: build the view, let the supervisor get a
//! valid decision from the policy, build one batch of prefill chunks and
//! decode tokens, run the model, sample, stream events, stop and free what
//! finished.

mod observe;
mod slot_actions;
mod states;

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use sluice_kernels::backend::BackendError;
use sluice_plugin_api::rules::has_runnable_work;

use super::adapters::{AdapterGroups, cache_root};
use super::batch::{Assembled, Work, assemble};
use super::constraint::Grammar;
use super::drafting::{self, Committed};
use super::emit::{self, Emitted, Emitter, Ending};
use super::kv::BlockManager;
use super::metrics::Metrics;
use super::pinning;
use super::policy::{Decision, EndReason, EndedRequest, OccupiedSlot, Phase, StepView, WaitingRequest};
use super::request::{EngineError, Event, IMAGE_ROW, Progress, RequestId};
use super::sampling::Sampler;
use super::shadow::Shadows;
use super::shift;
use super::slot::{Active, Waiting, trace_phase};
use super::slot_store::SlotAction;
use super::speculative::{DraftState, Speculation};
use super::state::{Command, EngineConfig, Shared, SlotInfo};
use super::state_cache::{self, StateCache};
use super::step_cost::{CostFit, StepWork};
use super::supervisor::{FaultAction, FaultEvent, Observer, Supervisor, Verdict};
use super::text::TextStream;
use super::trace::TraceRecorder;
use sluice_model::batch::forward_with_stops;
use sluice_model::tokenizer::Tokenizer;
use sluice_model::window::WindowPool;
use sluice_model::{Context, Model};

/// What the engine runs: the target, its tokenizer and an optional draft.
pub(super) struct Models {
    pub model: Arc<dyn Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub speculation: Option<Speculation>,
}

pub(super) struct Engine {
    model: Arc<dyn Model>,
    tokenizer: Arc<Tokenizer>,
    supervisor: Supervisor,
    config: EngineConfig,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    context: Box<dyn Context>,
    blocks: BlockManager,
    speculation: Option<Speculation>,
    slots: Vec<Option<Active>>,
    waiting: VecDeque<Waiting>,
    ended: Vec<EndedRequest>,
    adapter_groups: AdapterGroups,
    /// Per adapter id, its fingerprint (prefix-cache roots).
    adapter_prints: Vec<[u8; 32]>,
    started: Instant,
    step: u64,
    /// Per slot: the tokens of the last sequence that named it (`id_slot`)
    /// or ran in it naming none, whose KV the prefix cache may still hold
    /// (what saving the slot saves).
    slot_tokens: Vec<(u64, Vec<u32>)>,
    /// Actions waiting for their (busy) slots.
    deferred_slot_actions: Vec<(usize, SlotAction)>,
    shadows: Shadows,
    recorder: Option<TraceRecorder>,
    /// The step-cost model fitted to the steps run, which every view carries.
    costs: CostFit,
    /// Recurrent-state snapshots for the prefix cache, in a model with
    /// recurrent layers and the prefix cache on.
    states: Option<StateCache>,
}

/// The [`Emitter`] over an engine's fields, borrowed one by one so that a
/// slot can be borrowed beside it.
macro_rules! emitter {
    ($engine:ident) => {
        Emitter {
            tokenizer: &$engine.tokenizer,
            metrics: &$engine.shared.metrics,
            blocks: &mut $engine.blocks,
            ctx: $engine.config.ctx,
            context_shift: $engine.config.context_shift,
            step: $engine.step,
        }
    };
}

/// The engine's ear on the supervisor: latency histogram, fault counters,
/// the log and the fault journal.
struct Watch<'a> {
    shared: &'a Shared,
    faulted: bool,
}

impl Observer for Watch<'_> {
    fn call(&mut self, seconds: f64) {
        self.shared.metrics.observe_policy_call(seconds);
    }

    fn fault(&mut self, event: &FaultEvent) {
        self.faulted = true;
        let FaultEvent { step, policy, reason, detail, action } = event;
        tracing::warn!(step, policy, reason, detail, "scheduling policy fault");
        self.shared.metrics.count_fault(policy, reason);
        let fault = format!("{reason}: {detail}");
        match action {
            FaultAction::Retry => {}
            FaultAction::Fallback(fallback) => {
                tracing::error!(policy, fault, "quarantined; falling back to `{fallback}`");
                Metrics::add(&self.shared.metrics.policy_fallbacks_total, 1);
            }
            FaultAction::FailClosed => tracing::error!(policy, fault, "quarantined; failing closed"),
        }
        self.shared.record_fault(event);
    }
}

/// `--cache-ram` in bytes, which bounds the state snapshots as it does the
/// cached KV.
fn snapshot_limit(config: &EngineConfig) -> Option<usize> {
    config.cache_mib.map(|mib| usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX))
}

impl Engine {
    /// An engine on `models`; fails when the model's KV store cannot be
    /// allocated on its device.
    pub(super) fn new(
        Models { model, tokenizer, speculation }: Models,
        supervisor: Supervisor,
        config: EngineConfig,
        shared: Arc<Shared>,
        commands: mpsc::Receiver<Command>,
    ) -> Result<Self, BackendError> {
        let (n_blocks, block_tokens) = config.kv_blocks();
        let (context, mut blocks) = match config.window_blocks(model.kv_window()) {
            Some((window, window_blocks)) => (
                Arc::clone(&model).windowed_context(n_blocks, window_blocks, block_tokens, config.kv_types)?,
                BlockManager::new(n_blocks, block_tokens).with_window(WindowPool::new(
                    window_blocks,
                    block_tokens,
                    window,
                )),
            ),
            None => (
                Arc::clone(&model).context(n_blocks, block_tokens, config.kv_types)?,
                BlockManager::new(n_blocks, block_tokens),
            ),
        };
        let states = model.recurrent_state_bytes().map(|bytes| {
            let states = StateCache::new(block_tokens, config.state_snapshot_tokens, snapshot_limit(&config));
            let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
            tracing::info!(
                "recurrent state: {:.2} MiB per slot, {:.2} MiB for {} slots; prefix-cache snapshots of {:.2} MiB \
                 every {} prompt tokens, {} before a prompt's end and where a request ends",
                mib(bytes),
                mib(bytes * config.slots),
                config.slots,
                mib(bytes),
                states.every(),
                state_cache::END_MARGIN,
            );
            states
        });
        // `--cache-ram` in blocks of this store.
        if let Some(bytes) = snapshot_limit(&config) {
            blocks.limit_cache(bytes / context.block_format().bytes.max(1));
        }
        Ok(Engine {
            context,
            speculation,
            blocks,
            slots: (0..config.slots).map(|_| None).collect(),
            waiting: VecDeque::new(),
            ended: Vec::new(),
            adapter_groups: AdapterGroups::default(),
            adapter_prints: model.adapters().iter().map(|adapter| adapter.fingerprint).collect(),
            started: Instant::now(),
            step: 0,
            slot_tokens: vec![(0, Vec::new()); config.slots],
            deferred_slot_actions: Vec::new(),
            shadows: Shadows::new(config.shadow_budget, config.faults),
            recorder: None,
            costs: CostFit::online(),
            states: states.filter(|_| config.prefix_cache),
            model,
            tokenizer,
            supervisor,
            config,
            shared,
            commands,
        })
    }

    pub(super) fn run(mut self) {
        self.publish();
        loop {
            let idle =
                self.waiting.is_empty() && self.slots.iter().all(Option::is_none) && !self.has_deferred_slot_actions();
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
            // Before the policy can admit into a slot that just freed up.
            self.run_deferred_slot_actions();
            self.step();
            self.publish();
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit { id, request, events, ticket } => {
                Metrics::add(&self.shared.metrics.requests_total, 1);
                if let Some(refusal) = self.supervisor.health().refusal() {
                    let _ = events.send(Event::Failed(EngineError::Unavailable(refusal)));
                    return;
                }
                let arrival_ms = self.now_ms();
                let live = self.waiting.iter().map(|waiting| waiting.adapter_group);
                let running = self.slots.iter().flatten().map(|active| active.adapter_group);
                let adapter_group = self.adapter_groups.group(&request.lora, live.chain(running));
                let kv_root = cache_root(&request.lora, &self.adapter_prints);
                self.waiting.push_back(Waiting { id, request, events, arrival_ms, adapter_group, kv_root, ticket });
            }
            Command::Cancel(id) => self.cancel(id),
            Command::Slot { slot, action } => self.slot_action(slot, action),
            Command::EndAll(error, ended) => {
                let _ = ended.send(self.end_all(&error));
            }
            Command::ReplacePolicy(policy, applied) => {
                tracing::info!(policy = policy.name(), "scheduling policy replaced");
                self.supervisor.replace(policy);
                self.policy_changed();
                let _ = applied.send(());
            }
            Command::Shadow(command) => self.shadow_command(command),
            Command::Record(recorder) => self.record(recorder),
        }
    }

    fn cancel(&mut self, id: RequestId) {
        if let Some(at) = self.waiting.iter().position(|waiting| waiting.id == id) {
            self.waiting.remove(at);
            self.ended.push(EndedRequest { request_id: id, slot: None, reason: EndReason::Cancelled });
            return;
        }
        if let Some(slot) = self.slots.iter().position(|active| active.as_ref().is_some_and(|active| active.id == id)) {
            self.end_slot(slot, Ending { reason: EndReason::Cancelled, event: None });
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

    fn view(&self) -> StepView {
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
        // A request pinned to a busy slot cannot run this step; showing it
        // would let a policy spend a free slot's admission on it while the
        // requests behind it wait (see `pinning`).
        let waiting = self
            .waiting
            .iter()
            .filter(|waiting| waiting.request.id_slot.is_none_or(|slot| free_slots.contains(&slot)))
            .map(|waiting| {
                let cached = if waiting.request.cache_prompt && self.config.prefix_cache {
                    self.cached_prefix(waiting.kv_root, &waiting.request.prompt)
                } else {
                    0
                };
                let slot_hint = waiting.request.id_slot.filter(|slot| free_slots.contains(slot));
                WaitingRequest { request: waiting.info(cached), slot_hint }
            })
            .collect();
        StepView {
            step: self.step,
            now_ms: self.now_ms(),
            token_budget: self.config.batch_tokens as u32,
            costs: self.costs.costs(),
            free_slots,
            occupied,
            waiting,
            ended: self.ended.clone(),
        }
    }

    fn step(&mut self) {
        if self.supervisor.is_closed() {
            return;
        }
        let view = self.view();
        if !has_runnable_work(&view) {
            return;
        }
        let mut watch = Watch { shared: &self.shared, faulted: false };
        let verdict = self.supervisor.decide(&view, &mut watch);
        if watch.faulted {
            // A fallback that took over is a policy change the trace records.
            self.policy_changed();
        }
        if verdict == Verdict::Closed {
            self.fail_closed();
            return;
        }
        self.ended.clear();
        self.step += 1;
        let observed = self.observed().then(|| match &verdict {
            Verdict::Run(decision) => decision.clone(),
            Verdict::Wait | Verdict::Stalled | Verdict::Closed => Decision::default(),
        });
        match verdict {
            Verdict::Run(decision) => self.apply(decision),
            // Let time pass: a policy waiting on the clock should not spin.
            Verdict::Wait => std::thread::sleep(Duration::from_millis(1)),
            // A stall handled as a fault runs nothing; `Closed` was handled above.
            Verdict::Stalled | Verdict::Closed => {}
        }
        if let Some(applied) = observed {
            self.observe(view, applied);
        }
    }

    /// End every request with the supervisor's refusal.
    fn fail_closed(&mut self) {
        let message =
            self.supervisor.health().refusal().unwrap_or_else(|| "the scheduling policy failed closed".into());
        self.end_all(&EngineError::Unavailable(message));
    }

    /// End every waiting and running request with `error`; how many.
    fn end_all(&mut self, error: &EngineError) -> usize {
        let mut ended = 0;
        for waiting in self.waiting.drain(..) {
            let _ = waiting.events.send(Event::Failed(error.clone()));
            ended += 1;
        }
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                self.end_slot(slot, Ending { reason: EndReason::Failed, event: Some(Event::Failed(error.clone())) });
                ended += 1;
            }
        }
        ended
    }

    fn apply(&mut self, mut decision: Decision) {
        let started = Instant::now();
        pinning::pin_slots(
            &mut decision,
            |slot| self.slots.get(slot as usize).is_some_and(Option::is_none),
            |id| self.waiting.iter().find(|waiting| waiting.id == id).and_then(|waiting| waiting.request.id_slot),
        );
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
                self.fail_slot(slot, EngineError::ResourceExhausted(error.to_string()));
                continue;
            }
            active.prompt_started.get_or_insert_with(Instant::now);
            work.push(Work::Prefill { slot, start, tokens });
        }
        let mut decoding = Vec::new();
        for &slot in &decision.decode {
            if self.sample(slot as usize) {
                decoding.push(slot as usize);
            }
        }
        // Drafts count against the step's token budget: they get what the
        // policy's grants (and the tokens replayed in front of them) left.
        let replayed: usize =
            decoding.iter().filter_map(|&slot| self.slots[slot].as_ref()).map(|active| active.replay).sum();
        let granted = work.iter().map(Work::rows).sum::<usize>() + decoding.len() + replayed;
        let budget = self.config.batch_tokens.saturating_sub(granted);
        let mut drafts = match self.speculation.as_mut() {
            Some(speculation) => {
                drafting::draft(speculation, &mut self.slots, &mut self.blocks, &decoding, budget, self.config.ctx)
            }
            None => Default::default(),
        };
        for slot in decoding {
            let replay = self.slots[slot].as_ref().map_or(0, |active| active.replay);
            work.push(Work::Decode { slot, drafts: drafts.remove(&slot).unwrap_or_default(), replay });
        }
        if !work.is_empty() {
            let measured = self.step_work(&work);
            self.forward(work);
            self.costs.add(&measured, started.elapsed().as_secs_f64() * 1e3);
        }
    }

    /// What `work` computes, as the step-cost model sees it.
    fn step_work(&self, work: &[Work]) -> StepWork {
        let mut measured = StepWork::default();
        for item in work {
            let Some(active) = self.slots[item.slot()].as_ref() else { continue };
            let decode = matches!(item, Work::Decode { .. });
            measured.add_rows(active.cells as u64, item.rows() as u32, decode);
        }
        measured
    }

    fn admit(&mut self, request_id: RequestId, slot: usize) {
        let Some(at) = self.waiting.iter().position(|waiting| waiting.id == request_id) else { return };
        let Some(waiting) = self.waiting.remove(at) else { return };
        drop(waiting.ticket);
        let use_cache = waiting.request.cache_prompt && self.config.prefix_cache;
        let admission = match self.admit_blocks(waiting.kv_root, &waiting.request.prompt, use_cache, slot) {
            Ok(admission) => admission,
            Err(error) => {
                let _ = waiting.events.send(Event::Failed(EngineError::ResourceExhausted(error.to_string())));
                self.ended.push(EndedRequest { request_id, slot: None, reason: EndReason::Failed });
                return;
            }
        };
        Metrics::add(&self.shared.metrics.prefix_cache_hit_tokens_total, admission.cached_tokens as u64);
        let mut sampler = Sampler::new(waiting.request.sampling.clone());
        // Image rows are not tokens: penalties never see them.
        for &token in waiting.request.prompt.iter().filter(|&&token| token & IMAGE_ROW == 0) {
            sampler.accept(token);
        }
        let layout = waiting.request.layout().unwrap_or_default();
        let constraint = waiting.request.grammar.as_ref().map(Grammar::start);
        let text = TextStream::new(waiting.request.stop.clone());
        let _ = waiting.events.send(Event::Started { id_slot: slot as u32 });
        let cached = admission.cached_tokens;
        if waiting.request.return_progress {
            let total = waiting.request.prompt.len();
            let _ =
                waiting.events.send(Event::Progress(Progress { total, cache: cached, processed: cached, time_ms: 0 }));
        }
        trace_phase(self.step, slot, waiting.id, "prefilling");
        self.slots[slot] = Some(Active {
            id: waiting.id,
            tokens: waiting.request.prompt[..cached].to_vec(),
            events: waiting.events,
            arrival_ms: waiting.arrival_ms,
            adapter_group: waiting.adapter_group,
            blocks: admission.blocks,
            phase: Phase::Prefilling,
            prompt_done: cached,
            n_prompt: waiting.request.prompt.len(),
            request: waiting.request,
            cached,
            cells: cached,
            replay: 0,
            generated: 0,
            held_logits: Vec::new(),
            sampler,
            text,
            prompt_started: None,
            prompt_ms: 0.0,
            admitted: Instant::now(),
            decode_started: None,
            layout,
            draft: DraftState::new(cached),
            draft_n: 0,
            draft_accepted: 0,
            truncated: false,
            constraint,
        });
        Metrics::add(&self.shared.metrics.requests_processing, 1);
    }

    /// Sample the slot's next token from its held logits and emit it (see
    /// [`Emitter::emit`]); a request that ends is ended here. Whether the
    /// token goes on to the model.
    fn sample(&mut self, slot: usize) -> bool {
        let Some(active) = self.slots[slot].as_mut() else { return false };
        let mut emitter = emitter!(self);
        match emitter.emit(slot, active, None) {
            Emitted::Continue => true,
            Emitted::Ended(ending) => {
                self.end_slot(slot, ending);
                false
            }
            Emitted::Shift => {
                self.shift(slot);
                false
            }
            // Only a draft can be rejected.
            Emitted::Rejected => false,
        }
    }

    fn forward(&mut self, work: Vec<Work>) {
        let n_embd = self.model.hparams().n_embd;
        let taps = self.speculation.as_ref().map_or(&[][..], |speculation| speculation.drafter.taps());
        let Assembled { batch, prefill_tokens, decode_tokens } = assemble(&work, &self.slots, taps, n_embd);
        let stops = self.snapshot_stops(&work);
        let mut stop_rows: Vec<usize> = stops.iter().map(|stop| stop.row).collect();
        stop_rows.sort_unstable();
        stop_rows.dedup();
        let mut snapshots = Vec::new();
        let mut take = |context: &dyn Context, row: usize| {
            for stop in stops.iter().filter(|stop| stop.row == row) {
                match context.read_state(stop.slot as u32) {
                    Some(state) if state.cells as usize == stop.cells => snapshots.push((stop.slot, state)),
                    _ => {}
                }
            }
        };
        let mut before_verification = self.states_before_verification(&work);
        let started = Instant::now();
        let ubatch = self.config.ubatch_tokens;
        let output = match forward_with_stops(&mut *self.context, &batch, ubatch, n_embd, &stop_rows, &mut take) {
            Ok(output) => output,
            Err(error) => {
                tracing::error!(%error, "forward pass refused");
                for item in &work {
                    self.fail_slot(item.slot(), EngineError::Internal(error.to_string()));
                }
                return;
            }
        };
        self.count_step(started.elapsed(), prefill_tokens, decode_tokens);

        let n_vocab = self.model.hparams().n_vocab;
        // Logits rows come in batch-row order, so each work item's are
        // consecutive: count them off as the items go by.
        let mut next_logits = 0;
        let mut first_row = 0;
        let mut committed: Vec<Committed> = Vec::new();
        for item in work {
            let slot = item.slot();
            let rows = first_row..first_row + item.rows();
            first_row = rows.end;
            let n_logits = output.logit_rows[next_logits..].iter().take_while(|row| rows.contains(row)).count();
            let logits = &output.logits[next_logits * n_vocab..(next_logits + n_logits) * n_vocab];
            next_logits += n_logits;
            let Some(active) = self.slots[slot].as_mut() else { continue };
            let first_cell = active.cells;
            // Replayed rows were kept before.
            let kept_rows = match &item {
                Work::Decode { replay, .. } => rows.start + replay,
                Work::Prefill { .. } => rows.start,
            };
            match item {
                Work::Prefill { tokens, start, .. } => {
                    active.tokens.extend_from_slice(&active.request.prompt[start..start + tokens]);
                    active.prompt_done += tokens;
                    active.cells += tokens;
                    // A shifted context's prefill is not the prompt's.
                    if active.request.return_progress && active.decode_started.is_none() {
                        active.send(Event::Progress(Progress {
                            total: active.n_prompt,
                            cache: active.cached,
                            processed: active.prompt_done,
                            time_ms: active.admitted.elapsed().as_millis() as u64,
                        }));
                    }
                    if n_logits > 0 {
                        active.held_logits = logits.to_vec();
                        active.phase = Phase::Ready;
                        trace_phase(self.step, slot, active.id, "ready");
                        if active.decode_started.is_none() {
                            active.prompt_ms =
                                active.prompt_started.map_or(0.0, |started| started.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                }
                Work::Decode { drafts, .. } => {
                    active.cells += 1;
                    active.held_logits = logits[..n_vocab].to_vec();
                    let mut emitter = emitter!(self);
                    match emitter.verify(slot, active, &drafts, logits) {
                        Emitted::Ended(ending) => {
                            self.end_slot(slot, ending);
                            continue;
                        }
                        Emitted::Shift => {
                            self.shift(slot);
                            continue;
                        }
                        Emitted::Continue | Emitted::Rejected => {}
                    }
                    // The state ran every row: where drafts were rejected
                    // it goes back to before the pass, and the tokens kept
                    // run again in front of the next one.
                    active.replay = 0;
                    if let Some(before) = before_verification.remove(&slot)
                        && active.cells < first_cell + 1 + drafts.len()
                    {
                        if let Err(error) = self.context.write_state(slot as u32, &before) {
                            self.fail_slot(slot, EngineError::Internal(error.to_string()));
                            continue;
                        }
                        active.replay = active.cells - before.cells as usize;
                    }
                }
            }
            let written = active.cells;
            active.draft.trim(written);
            self.blocks.commit(&mut active.blocks, &active.tokens[..written]);
            self.blocks.slide(&mut active.blocks, written);
            committed.push((slot, first_cell, kept_rows..kept_rows + (written - first_cell)));
            let metrics = &self.shared.metrics;
            Metrics::set(&metrics.n_tokens_max, Metrics::get(&metrics.n_tokens_max).max(written as u64));
        }
        self.keep_snapshots(snapshots);
        if let Some(speculation) = self.speculation.as_mut() {
            drafting::commit(speculation, &mut self.slots, &committed, &output.taps);
        }
    }

    /// Copy a shared block an admission writes into, in the target's and
    /// the drafter's KV.
    fn copy_block(&mut self, copy: Option<(u32, u32)>) {
        let Some((from, to)) = copy else { return };
        self.context.copy_block(from, to);
        if let Some(speculation) = self.speculation.as_mut() {
            speculation.drafter.copy_block(from, to);
        }
    }

    /// Shift a slot whose context is full (see [`shift`]); a slot with
    /// nothing to drop ends as if shifting were off.
    fn shift(&mut self, slot: usize) {
        let Some(active) = self.slots[slot].as_mut() else { return };
        let bos = self.tokenizer.adds_bos();
        let request = &active.request;
        let Some(cut) =
            shift::cut(active.cells, self.config.ctx, active.n_prompt, request.n_keep, request.n_discard, bos)
        else {
            let ending = emit::truncated(slot, active);
            self.end_slot(slot, ending);
            return;
        };
        tracing::info!(slot, keep = cut.keep, discard = cut.discard, cells = active.cells, "context shift");
        trace_phase(self.step, slot, active.id, "prefilling");
        match shift::apply(active, cut, &mut self.blocks) {
            Ok(copy) => self.copy_block(copy),
            Err(error) => self.fail_slot(slot, EngineError::ResourceExhausted(error.to_string())),
        }
    }

    /// Step counters: llama-server's `n_decode`, busy slots and token
    /// throughput, and sluice's step token mix.
    fn count_step(&self, elapsed: Duration, prefill_tokens: usize, decode_tokens: usize) {
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
    }

    fn fail_slot(&mut self, slot: usize, error: EngineError) {
        self.end_slot(slot, Ending { reason: EndReason::Failed, event: Some(Event::Failed(error)) });
    }

    /// Free a slot: release its blocks, tell the client (if there is an
    /// event), and report the end to the policy.
    fn end_slot(&mut self, slot: usize, ending: Ending) {
        let Some(active) = self.slots[slot].take() else { return };
        let Ending { reason, event } = ending;
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
        let cache_slot = self.cache_slot(slot, &active);
        self.keep_final_state(slot, &active);
        let root = active.blocks.root();
        self.blocks.release(active.blocks);
        let mut tokens = active.tokens;
        tokens.truncate(active.cells);
        self.slot_tokens[cache_slot] = (root, tokens);
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
        let window_used = self.blocks.window_used().unwrap_or(0);
        Metrics::set(&metrics.kv_window_blocks_used, window_used as u64);
        let window_free = self.blocks.window_blocks().unwrap_or(0) - window_used;
        Metrics::set(&metrics.kv_window_blocks_free, window_free as u64);
        let running = self.slots.iter().flatten().count();
        let state = self.model.recurrent_state_bytes().unwrap_or(0);
        Metrics::set(&metrics.recurrent_state_bytes, (running * state) as u64);
        let (snapshots, snapshot_bytes) = self.states.as_ref().map_or((0, 0), StateCache::usage);
        Metrics::set(&metrics.recurrent_snapshots, snapshots as u64);
        Metrics::set(&metrics.recurrent_snapshot_bytes, snapshot_bytes as u64);
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
                lora: active.as_ref().map_or_else(Vec::new, |active| active.request.lora.clone()),
            })
            .collect();
        if let Ok(mut slots) = self.shared.slots.lock() {
            *slots = infos;
        }
        let waiting: BTreeSet<u32> =
            self.waiting.iter().flat_map(|waiting| waiting.request.lora.iter().map(|&(id, _)| id)).collect();
        if let Ok(mut adapters) = self.shared.waiting_adapters.lock() {
            adapters.clear();
            adapters.extend(waiting);
        }
    }
}
