//! The engine's public face: start it on its own thread, submit requests,
//! cancel them, and read its state. Everything here is cheap and never
//! blocks on the model.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use tokio::sync::mpsc as events;

use super::core::{Command, Engine, Models};
use super::metrics::Metrics;
use super::policy::{Phase, SchedulingPolicy};
use super::request::{Event, GenerationRequest, RequestId};
use super::speculative::Speculation;
use crate::config::OnFault;
use crate::model::tokenizer::Tokenizer;
use crate::model::transformer::Transformer;

/// Builds the policy to fall back to after a quarantine (`on_fault =
/// "fallback"`); `None` when it cannot be built (then the engine fails closed).
pub type FallbackPolicy = Box<dyn Fn() -> Option<Box<dyn SchedulingPolicy>> + Send>;

/// Engine settings: the config file's `[engine]` section (read straight
/// into this type), plus the thread count and the policy's fault rules,
/// which come from other sections (`Config::engine_config`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Sequences decoded together (llama-server `-np`).
    pub slots: usize,
    /// Context of each slot in tokens (llama-server `-c`, as with its
    /// unified KV cache: every slot may use all of it); 0 in the file = the
    /// model's training context.
    pub ctx: usize,
    /// Most tokens one step may process (llama-server `-b`).
    pub batch_tokens: usize,
    /// Tokens per KV-cache block.
    pub kv_block_tokens: usize,
    /// Share prompt prefixes between requests.
    pub prefix_cache: bool,
    /// Most requests waiting for a slot; more are refused with 503.
    pub queue_limit: usize,
    /// Kernel threads (`[model] threads`).
    #[serde(skip)]
    pub threads: usize,
    /// `[policy] stall_steps`.
    #[serde(skip)]
    pub stall_steps: u32,
    /// `[policy] on_fault`.
    #[serde(skip)]
    pub on_fault: OnFault,
}

impl EngineConfig {
    /// KV blocks and cells per block: room for every slot's whole context,
    /// plus one block per slot for a partial tail shared copy-on-write.
    pub fn kv_blocks(&self) -> (usize, usize) {
        let block_tokens = self.kv_block_tokens.max(1);
        ((self.slots * self.ctx).div_ceil(block_tokens) + self.slots, block_tokens)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            slots: 4,
            ctx: 4096,
            batch_tokens: 512,
            kv_block_tokens: 16,
            prefix_cache: true,
            queue_limit: 256,
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            stall_steps: 64,
            on_fault: OnFault::FailClosed,
        }
    }
}

/// The engine's health, as `/health` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// Running on the fallback policy after the configured one faulted.
    Degraded {
        policy: String,
        fault: String,
    },
    /// The policy failed closed; requests are refused until a reload.
    FailedClosed {
        policy: String,
        fault: String,
    },
}

/// A slot as `/slots` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotInfo {
    pub id: u32,
    pub n_ctx: usize,
    pub phase: Option<Phase>,
    pub request_id: Option<RequestId>,
    pub prompt_tokens: usize,
    pub prompt_done: usize,
    pub prompt_cached: usize,
    pub generated: usize,
    pub max_tokens: Option<usize>,
    pub priority: i32,
    pub adapter_group: u32,
}

/// State the engine publishes for the HTTP layer.
#[derive(Debug)]
pub struct Shared {
    pub metrics: Metrics,
    pub health: Mutex<Health>,
    pub slots: Mutex<Vec<SlotInfo>>,
    pub policy_name: Mutex<String>,
    pub waiting: AtomicU64,
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting); retry later")]
    QueueFull(usize),
    #[error("{0}")]
    Unavailable(String),
    #[error("the prompt has {n_prompt_tokens} tokens; the context holds {n_ctx}")]
    ExceedsContext { n_prompt_tokens: usize, n_ctx: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("image segments: {0}")]
    Images(String),
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
}

impl EngineHandle {
    /// Start the engine thread.
    pub fn start(
        model: Arc<Transformer>,
        tokenizer: Arc<Tokenizer>,
        policy: Box<dyn SchedulingPolicy>,
        fallback: FallbackPolicy,
        config: EngineConfig,
        speculation: Option<Speculation>,
    ) -> std::io::Result<Self> {
        let (commands, receiver) = mpsc::channel();
        let shared = Arc::new(Shared {
            metrics: Metrics::default(),
            health: Mutex::new(Health::Ok),
            slots: Mutex::new(Vec::new()),
            policy_name: Mutex::new(policy.name().to_owned()),
            waiting: AtomicU64::new(0),
        });
        let hparams = model.hparams();
        let image_width = hparams.rope.is_multimodal().then_some(hparams.n_embd);
        let speculative = speculation.is_some();
        let models = Models { model, tokenizer, speculation };
        let engine = Engine::new(models, policy, fallback, config.clone(), Arc::clone(&shared), receiver);
        std::thread::Builder::new().name("engine".into()).spawn(move || engine.run())?;
        Ok(EngineHandle { commands, shared, next_id: Arc::new(AtomicU64::new(1)), config, image_width, speculative })
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
    pub fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(RequestId, events::UnboundedReceiver<Event>), SubmitError> {
        if let Ok(health) = self.shared.health.lock()
            && let Health::FailedClosed { policy, fault } = &*health
        {
            return Err(SubmitError::Unavailable(format!(
                "scheduling policy `{policy}` failed closed ({fault}); reload the policy to resume"
            )));
        }
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
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
        let waiting = self.shared.waiting.load(Ordering::Relaxed) as usize;
        if waiting >= self.config.queue_limit {
            return Err(SubmitError::QueueFull(waiting));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = events::unbounded_channel();
        self.shared.waiting.fetch_add(1, Ordering::Relaxed);
        self.commands
            .send(Command::Submit { id, request: Box::new(request), events: sender })
            .map_err(|_| SubmitError::Unavailable("the engine has stopped".into()))?;
        Ok((id, receiver))
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

    pub fn health(&self) -> Health {
        self.shared.health.lock().map(|health| health.clone()).unwrap_or(Health::Ok)
    }

    pub fn slots(&self) -> Vec<SlotInfo> {
        self.shared.slots.lock().map(|slots| slots.clone()).unwrap_or_default()
    }

    pub fn policy_name(&self) -> String {
        self.shared.policy_name.lock().map(|name| name.clone()).unwrap_or_default()
    }
}
