//! The engine's public face: start it on its own thread, submit requests,
//! cancel them, and read its state. Everything here is cheap and never
//! blocks on the model.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use sluice_kernels::backend::BackendError;
use tokio::sync::oneshot;

use super::adapters::check as check_lora;
use super::core::{Engine, Models};
use super::delivery::{self, EventReceiver};
use super::policy::SchedulingPolicy;
use super::request::{EngineError, GenerationRequest, RequestId};
use super::shadow::ShadowRecord;
use super::slot_store::{KvLayout, SlotAction, SlotActionError, SlotFile, SlotReply};
use super::speculative::Speculation;
use super::state::{Command, EngineConfig, Promoted, ShadowCommand, Shared, SlotInfo};
use super::supervisor::{FallbackPolicy, FaultEvent, Health, Supervisor};
use super::trace::TraceRecorder;
use sluice_model::Model;
use sluice_model::tokenizer::Tokenizer;

/// A panic's message, when it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(message), _) => (*message).to_owned(),
        (None, Some(message)) => message.clone(),
        (None, None) => "a panic without a message".to_owned(),
    }
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineStartError {
    #[error("cannot create the model's context: {0}")]
    Context(#[from] BackendError),
    #[error("cannot start the engine thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting); retry later")]
    QueueFull(usize),
    #[error("{0}")]
    Unavailable(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the prompt has {n_prompt_tokens} tokens; the context holds {n_ctx}")]
    ExceedsContext { n_prompt_tokens: usize, n_ctx: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("image segments: {0}")]
    Images(String),
    #[error("`lora`: {0}")]
    Adapter(String),
}

/// A cheap, cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    next_id: Arc<AtomicU64>,
    config: EngineConfig,
    /// Hidden size of image rows, for targets with M-RoPE (the only ones
    /// that take images).
    image_width: Option<usize>,
    /// Whether a draft is paired with the model.
    speculative: bool,
    /// What slot files must match.
    kv_layout: Arc<KvLayout>,
    /// LoRA adapters the model has.
    n_adapters: usize,
}

impl EngineHandle {
    /// Start the engine thread; `policy` decides under the supervisor's
    /// fault rules (`config.faults`), falling back to what `fallback` builds.
    pub fn start(
        model: Arc<dyn Model>,
        tokenizer: Arc<Tokenizer>,
        policy: Box<dyn SchedulingPolicy>,
        fallback: FallbackPolicy,
        config: EngineConfig,
        speculation: Option<Speculation>,
    ) -> Result<Self, EngineStartError> {
        let (commands, receiver) = mpsc::channel();
        let shared = Arc::new(Shared::new(policy.name()));
        let hparams = model.hparams();
        let image_width = hparams.rope.is_multimodal().then_some(hparams.n_embd);
        let speculative = speculation.is_some();
        let n_adapters = model.adapters().len();
        let models = Models { model, tokenizer, speculation };
        let supervisor = Supervisor::new(policy, fallback, config.faults);
        let engine = Engine::new(models, supervisor, config.clone(), Arc::clone(&shared), receiver)?;
        let kv_layout = Arc::new(engine.kv_layout());
        let watched = Arc::clone(&shared);
        std::thread::Builder::new().name("engine".into()).spawn(move || {
            // A panic here is a bug, but the server must say so rather than
            // look healthy with nothing serving: unwinding drops the engine
            // (every request's channel ends), and health turns `Stopped`.
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| engine.run())) {
                let reason = panic_message(panic.as_ref());
                tracing::error!(reason, "the engine thread panicked; a restart is needed to serve again");
                let _ = watched.stopped.set(format!("the engine stopped: {reason}"));
            }
        })?;
        let next_id = Arc::new(AtomicU64::new(1));
        Ok(EngineHandle { commands, shared, next_id, config, image_width, speculative, kv_layout, n_adapters })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Whether requests are decoded with a draft.
    pub fn speculative(&self) -> bool {
        self.speculative
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Queue a request; its events arrive on the returned receiver.
    pub fn submit(&self, request: GenerationRequest) -> Result<(RequestId, EventReceiver), SubmitError> {
        if let Some(refusal) = self.health().refusal() {
            return Err(SubmitError::Unavailable(refusal));
        }
        if self.shared.draining.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        check_lora(&request.lora, self.n_adapters).map_err(SubmitError::Adapter)?;
        if let Some(image) = request.images.first() {
            let Some(width) = self.image_width else {
                return Err(SubmitError::Images("this model has no M-RoPE positions for images".into()));
            };
            if let Some(bad) =
                request.images.iter().find(|image| image.embeddings.len() != (image.nx * image.ny) as usize * width)
            {
                return Err(SubmitError::Images(format!(
                    "a {} × {} image needs {} values of width {width}, got {}",
                    bad.nx,
                    bad.ny,
                    (bad.nx * bad.ny) as usize * width,
                    bad.embeddings.len()
                )));
            }
            if !request.images_match_prompt() || request.layout().is_none() {
                return Err(SubmitError::Images(format!(
                    "the segment at cell {} does not match the prompt's placeholders, or segments overlap",
                    image.start
                )));
            }
        }
        if request.prompt.len() >= self.config.ctx {
            return Err(SubmitError::ExceedsContext { n_prompt_tokens: request.prompt.len(), n_ctx: self.config.ctx });
        }
        let ticket = self.shared.queue.enter(self.config.queue_limit).map_err(SubmitError::QueueFull)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = delivery::channel(self.config.stream_window_bytes);
        self.commands
            .send(Command::Submit { id, request: Box::new(request), events: sender, ticket })
            .map_err(|_| SubmitError::Unavailable("the engine has stopped".into()))?;
        Ok((id, receiver))
    }

    /// Refuse new requests from now on; those already queued or running go
    /// on (the server's shutdown grace).
    pub fn drain(&self) {
        self.shared.draining.store(true, Ordering::Release);
    }

    /// End every queued and running request with `error`, waiting up to
    /// `wait` for the engine to do it; how many there were (`None` if the
    /// engine did not answer).
    pub fn end_all(&self, error: EngineError, wait: Duration) -> Option<usize> {
        let (ended, count) = mpsc::channel();
        self.commands.send(Command::EndAll(error, ended)).ok()?;
        count.recv_timeout(wait).ok()
    }

    /// Cancel a request (waiting or running); its slot is freed within one
    /// step. Dropping the event receiver does the same.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// Replace the scheduling policy (an operator reload); clears a
    /// failed-closed or degraded state. The engine swaps between steps;
    /// this waits up to `wait` for the swap, so that `/props` and `/health`
    /// read after it see the new policy.
    pub fn replace_policy(&self, policy: Box<dyn SchedulingPolicy>, wait: Duration) -> Result<(), SubmitError> {
        let (applied, done) = mpsc::channel();
        self.commands
            .send(Command::ReplacePolicy(policy, applied))
            .map_err(|_| SubmitError::Unavailable("the engine has stopped".into()))?;
        if let Err(mpsc::RecvTimeoutError::Disconnected) = done.recv_timeout(wait) {
            return Err(SubmitError::Unavailable("the engine has stopped".into()));
        }
        Ok(())
    }

    /// Ask the engine something it answers between steps, waiting up to
    /// `wait`.
    fn ask<T>(&self, command: ShadowCommand, answer: mpsc::Receiver<T>, wait: Duration) -> Result<T, String> {
        self.commands.send(Command::Shadow(command)).map_err(|_| "the engine has stopped".to_owned())?;
        answer.recv_timeout(wait).map_err(|error| match error {
            mpsc::RecvTimeoutError::Timeout => format!("the engine did not answer within {} s", wait.as_secs()),
            mpsc::RecvTimeoutError::Disconnected => "the engine has stopped".to_owned(),
        })
    }

    /// Attach a shadow policy (see [`crate::shadow`]).
    pub fn attach_shadow(&self, policy: Box<dyn SchedulingPolicy>, wait: Duration) -> Result<(), String> {
        let (reply, answer) = mpsc::channel();
        self.ask(ShadowCommand::Attach(policy, reply), answer, wait)?
    }

    pub fn detach_shadow(&self, name: &str, wait: Duration) -> Result<(), String> {
        let (reply, answer) = mpsc::channel();
        self.ask(ShadowCommand::Detach(name.to_owned(), reply), answer, wait)?
    }

    /// Detach every shadow policy, then attach `policies`.
    pub fn replace_shadows(&self, policies: Vec<Box<dyn SchedulingPolicy>>, wait: Duration) -> Result<(), String> {
        let (reply, answer) = mpsc::channel();
        self.ask(ShadowCommand::Replace(policies, reply), answer, wait)?
    }

    /// Make the shadow `name` the active policy between two steps; the one
    /// it replaces becomes a shadow.
    pub fn promote(&self, name: &str, wait: Duration) -> Result<Promoted, String> {
        let (reply, answer) = mpsc::channel();
        self.ask(ShadowCommand::Promote(name.to_owned(), reply), answer, wait)?
    }

    /// What each shadow policy has shown so far.
    pub fn shadow_records(&self) -> Vec<ShadowRecord> {
        self.shared.shadows.lock().map(|records| records.clone()).unwrap_or_default()
    }

    /// Record every step to `recorder`'s trace from now on.
    pub fn record(&self, recorder: TraceRecorder) -> Result<(), SubmitError> {
        self.commands
            .send(Command::Record(recorder))
            .map_err(|_| SubmitError::Unavailable("the engine has stopped".into()))
    }

    /// What a slot file must match to be restored here.
    pub fn kv_layout(&self) -> &KvLayout {
        &self.kv_layout
    }

    /// The slot's cached tokens and their KV blocks. Like every slot
    /// action, on a busy slot this waits until its request ends.
    pub async fn save_slot(&self, slot: usize) -> Result<SlotFile, SlotActionError> {
        self.slot_action(slot, SlotAction::Save).await
    }

    /// Cache `file`'s tokens and KV as `slot`'s; the tokens restored.
    pub async fn restore_slot(&self, slot: usize, file: SlotFile) -> Result<usize, SlotActionError> {
        self.slot_action(slot, |reply| SlotAction::Restore(file, reply)).await
    }

    /// Drop the slot's cached tokens; how many there were.
    pub async fn erase_slot(&self, slot: usize) -> Result<usize, SlotActionError> {
        self.slot_action(slot, SlotAction::Erase).await
    }

    async fn slot_action<T>(
        &self,
        slot: usize,
        action: impl FnOnce(SlotReply<T>) -> SlotAction,
    ) -> Result<T, SlotActionError> {
        let (reply, done) = oneshot::channel();
        self.commands.send(Command::Slot { slot, action: action(reply) }).map_err(|_| SlotActionError::Stopped)?;
        done.await.map_err(|_| SlotActionError::Stopped)?
    }

    /// The policy's health, unless the engine stopped: a dead engine thread
    /// or a lock poisoned by a panic is `Stopped`, never `Ok`.
    pub fn health(&self) -> Health {
        if let Some(reason) = self.shared.stopped.get() {
            return Health::Stopped { reason: reason.clone() };
        }
        match self.shared.health.lock() {
            Ok(health) => health.clone(),
            Err(_) => Health::Stopped { reason: "the engine's state was left half-written by a panic".into() },
        }
    }

    pub fn slots(&self) -> Vec<SlotInfo> {
        self.shared.slots.lock().map(|slots| slots.clone()).unwrap_or_default()
    }

    pub fn policy_name(&self) -> String {
        self.shared.policy_name.lock().map(|name| name.clone()).unwrap_or_default()
    }

    /// The most recent policy faults, oldest first, with what was done.
    pub fn faults(&self) -> Vec<FaultEvent> {
        self.shared.faults.lock().map(|faults| faults.iter().cloned().collect()).unwrap_or_default()
    }
}
