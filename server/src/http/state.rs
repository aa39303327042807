//! What every handler shares: the server's configuration, API key and
//! policies, and (once loaded) the model with its engine.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use super::adapters::Adapters;
use super::auth::ApiKey;
use super::bodies;
use super::error::ApiError;
use super::params;
use super::policies::Policies;
use crate::chat::prompt::Reader;
use crate::chat::{media, structured, tokenizing};
use crate::config::{Config, RequestDefaults, ServerLimits};
use crate::startup::Serving;
use sluice_engine::EngineHandle;
use sluice_engine::constraint::Grammars;
use sluice_model::chat_template::ChatTemplate;
use sluice_model::tokenizer::Tokenizer;

/// What the API reports about the loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The first alias, else the file name.
    pub name: String,
    pub aliases: Vec<String>,
    pub tags: Vec<String>,
    pub path: PathBuf,
    /// The family sluice runs it as (its `general.architecture`).
    pub family: &'static str,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_params: u64,
    /// Bytes of tensor data.
    pub size: u64,
    /// `general.file_type`, when the file says.
    pub ftype: Option<u32>,
}

/// A loaded model with its engine: everything the generation endpoints use.
pub struct Ready {
    pub engine: EngineHandle,
    pub adapters: Adapters,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub model: ModelInfo,
    /// Structured outputs' grammar compiler over this model's vocabulary.
    pub grammars: structured::Compiler,
    /// Image input, with a projector.
    pub vision: Option<media::Vision>,
    /// `[server.limits]`, which requests are checked against.
    pub server_limits: ServerLimits,
    /// The text being tokenized at once.
    pub tokenizing: tokenizing::Gate,
}

impl Ready {
    /// What the API serves from a started model.
    pub fn new(serving: Serving, config: &Config) -> Self {
        let Serving { model, engine, tokenizer, template, vision } = serving;
        let (hparams, file) = (model.hparams(), model.file());
        let adapters = Adapters::new(&model.adapters(), &config.lora);
        let info = ModelInfo {
            name: config.model.name(),
            aliases: config.model.aliases(),
            tags: config.model.tags(),
            path: config.model.path(),
            family: hparams.arch.name(),
            n_vocab: hparams.n_vocab,
            n_ctx_train: hparams.n_ctx_train,
            n_embd: hparams.n_embd,
            n_params: file.tensors().iter().map(|tensor| tensor.elements()).sum(),
            size: file.tensors().iter().map(|tensor| tensor.len as u64).sum(),
            ftype: file.opt_u32("general.file_type").ok().flatten(),
        };
        let grammars = Grammars::new(&tokenizer).map_err(|error| {
            tracing::warn!(%error, "constrained decoding is unavailable");
            error.to_string()
        });
        let (min_tokens, max_tokens) = (config.model.image_min_tokens, config.model.image_max_tokens);
        let vision = vision.map(|encoder| media::Vision::new(encoder, min_tokens, max_tokens));
        let server_limits = config.server.limits.clone();
        let tokenizing = tokenizing::Gate::new(server_limits.tokenizing_mib.saturating_mul(1 << 20));
        Ready { engine, adapters, tokenizer, template, model: info, grammars, vision, server_limits, tokenizing }
    }

    /// What tokenizing a generation's prompt needs: it must fit a slot's
    /// context.
    pub fn reader(&self) -> Reader<'_> {
        Reader { n_ctx: Some(self.engine.config().ctx), ..self.counter() }
    }

    /// What tokenizing a text only to count or show its tokens needs.
    pub fn counter(&self) -> Reader<'_> {
        Reader {
            tokenizer: &self.tokenizer,
            n_vocab: self.model.n_vocab,
            vision: self.vision.as_ref(),
            gate: &self.tokenizing,
            n_ctx: None,
        }
    }

    /// The limits requests are checked against.
    pub fn limits<'a>(&'a self, defaults: &'a RequestDefaults) -> params::Limits<'a> {
        let config = self.engine.config();
        params::Limits {
            defaults,
            slots: config.slots,
            n_ctx: config.ctx,
            n_probs: self.server_limits.n_probs,
            tokenizer: &self.tokenizer,
            adapters: &self.adapters,
            grammars: &self.grammars,
        }
    }
}

/// Shared state of every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    config: Config,
    api_key: Option<ApiKey>,
    ready: OnceLock<Arc<Ready>>,
    policies: Policies,
    rate_window: Mutex<RateWindow>,
    started: SystemTime,
    next_request: AtomicU64,
    /// The large request bodies held at once.
    bodies: bodies::Gate,
}

impl AppState {
    pub fn new(config: Config, policies: Policies) -> Self {
        let api_key = config.server.api_key.as_deref().map(ApiKey::new);
        let bodies = bodies::Gate::new(config.server.limits.bodies_mib.saturating_mul(1 << 20));
        AppState(Arc::new(Inner {
            config,
            api_key,
            ready: OnceLock::new(),
            policies,
            rate_window: Mutex::new(RateWindow::default()),
            started: SystemTime::now(),
            next_request: AtomicU64::new(1),
            bodies,
        }))
    }

    pub fn config(&self) -> &Config {
        &self.0.config
    }

    pub fn api_key(&self) -> Option<&ApiKey> {
        self.0.api_key.as_ref()
    }

    pub fn policies(&self) -> &Policies {
        &self.0.policies
    }

    pub fn started(&self) -> SystemTime {
        self.0.started
    }

    pub(super) fn bodies(&self) -> &bodies::Gate {
        &self.0.bodies
    }

    pub(super) fn rate_window(&self) -> &Mutex<RateWindow> {
        &self.0.rate_window
    }

    /// The loaded model, or 503 "Loading model".
    pub fn ready(&self) -> Result<Arc<Ready>, ApiError> {
        self.0.ready.get().cloned().ok_or_else(ApiError::loading)
    }

    /// Mark the model loaded: from now on the API serves.
    pub fn set_ready(&self, ready: Ready) {
        let _ = self.0.ready.set(Arc::new(ready));
    }

    /// Keep-alive interval of SSE streams (zero = none).
    pub fn ping(&self) -> Duration {
        Duration::from_secs(self.0.config.server.sse_ping_interval)
    }

    pub fn hold_notice(&self) -> Duration {
        Duration::from_millis(self.0.config.server.hold_notice_ms)
    }

    /// A new request's id, for its span and `X-Request-Id`.
    pub(super) fn next_request_id(&self) -> u64 {
        self.0.next_request.fetch_add(1, Ordering::Relaxed)
    }
}

/// Counter values at the previous scrape, for llama-server's per-scrape
/// throughput gauges.
#[derive(Debug, Default)]
pub struct RateWindow {
    pub(super) prompt_tokens: u64,
    pub(super) prompt_micros: u64,
    pub(super) predicted_tokens: u64,
    pub(super) predicted_micros: u64,
}
