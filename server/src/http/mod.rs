//! The HTTP API: llama-server's endpoints, fields, response shapes, SSE
//! framing and errors, on axum. One module per API family:
//!
//! * [`completion`]: `/completion` (native); [`openai`]: `/v1/completions`,
//!   `/v1/chat/completions`; [`anthropic`]: `/v1/messages`; [`responses`]:
//!   `/v1/responses` and the `input_tokens` counts; all on [`generate`]
//!   (engine submission, results, shared JSON), [`params`] (request fields),
//!   [`prompt`], [`reasoning`] (chat replies' thinking split out) and
//!   [`sse`] (streams).
//! * [`tokenize`]: `/tokenize`, `/detokenize`, `/apply-template`.
//! * [`info`]: `/health`, `/props`, `/v1/models`, `/slots`, `/metrics`;
//!   [`slot_files`]: `/slots/{id}?action=save|restore|erase`.
//! * [`admin`]: `/admin/policy`, policy (re)loading; shadow policies.
//! * [`lora`]: `/lora-adapters` and the adapters of a request.
//! * [`vertex`]: Vertex AI's prediction route (`AIP_MODE=PREDICTION`).
//! * [`auth`], [`error`]; [`server`]: listening, loading the model, signals.
//!
//! Until the model is loaded every path answers 503 "Loading model".

pub mod admin;
pub mod anthropic;
pub mod auth;
mod bodies;
pub mod completion;
mod conn;
mod cors;
pub mod error;
pub mod extract;
pub mod fields;
pub mod generate;
pub mod ids;
pub mod info;
mod listen;
pub mod lora;
pub mod media;
pub mod openai;
pub mod params;
pub mod probs;
pub mod prompt;
pub mod reasoning;
pub mod responses;
pub mod server;
pub mod slot_files;
pub mod spliced;
pub mod sse;
pub mod structured;
pub mod tokenize;
pub mod tokenizing;
pub mod tools;
pub mod vertex;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use tracing::Instrument;

use crate::config::{Config, RequestDefaults, ServerLimits};
use crate::startup::Serving;
use admin::Policies;
use auth::ApiKey;
use error::ApiError;
use sluice_engine::EngineHandle;
use sluice_engine::constraint::Grammars;
use sluice_model::chat_template::ChatTemplate;
use sluice_model::tokenizer::Tokenizer;

pub use server::{StartError, serve};

/// What the API reports about the loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The first alias, else the file name.
    pub name: String,
    pub aliases: Vec<String>,
    pub tags: Vec<String>,
    pub path: PathBuf,
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
    pub adapters: lora::Adapters,
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
        let adapters = lora::Adapters::new(&model.adapters(), &config.lora);
        let info = ModelInfo {
            name: config.model.name(),
            aliases: config.model.aliases(),
            tags: config.model.tags(),
            path: config.model.path(),
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
    pub fn reader(&self) -> prompt::Reader<'_> {
        prompt::Reader { n_ctx: Some(self.engine.config().ctx), ..self.counter() }
    }

    /// What tokenizing a text only to count or show its tokens needs.
    pub fn counter(&self) -> prompt::Reader<'_> {
        prompt::Reader {
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
    rate_window: Mutex<info::RateWindow>,
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
            rate_window: Mutex::new(info::RateWindow::default()),
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

    fn bodies(&self) -> &bodies::Gate {
        &self.0.bodies
    }

    fn rate_window(&self) -> &Mutex<info::RateWindow> {
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
}

/// The GET routes.
fn get_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/health", get(info::health)),
        ("/v1/health", get(info::health)),
        ("/props", get(info::props)),
        ("/v1/models", get(info::models)),
        ("/models", get(info::models)),
        ("/slots", get(info::slots)),
        ("/metrics", get(info::metrics)),
        ("/lora-adapters", get(lora::list)),
        ("/admin/policy/shadow", get(admin::shadow_report)),
    ]
}

/// The POST routes: also what Vertex AI instances can name, where an alias
/// shared by several paths names the first (`completions`: `/completions`).
fn post_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/completion", post(completion::completion)),
        ("/completions", post(completion::completion)),
        ("/v1/completions", post(openai::completions)),
        ("/v1/chat/completions", post(openai::chat)),
        ("/chat/completions", post(openai::chat)),
        ("/v1/chat/completions/input_tokens", post(responses::chat_input_tokens)),
        ("/chat/completions/input_tokens", post(responses::chat_input_tokens)),
        ("/v1/responses", post(responses::responses)),
        ("/responses", post(responses::responses)),
        ("/v1/responses/input_tokens", post(responses::responses_input_tokens)),
        ("/responses/input_tokens", post(responses::responses_input_tokens)),
        ("/v1/messages", post(anthropic::messages)),
        ("/v1/messages/count_tokens", post(anthropic::count_tokens)),
        ("/tokenize", post(tokenize::tokenize)),
        ("/detokenize", post(tokenize::detokenize)),
        ("/apply-template", post(tokenize::apply_template)),
        ("/props", post(info::set_props)),
        ("/slots/{id_slot}", post(slot_files::action)),
        ("/lora-adapters", post(lora::set)),
        ("/admin/policy", post(admin::replace_policy)),
        ("/admin/policy/shadow", post(admin::attach_shadow).delete(admin::detach_shadow)),
        ("/admin/policy/promote", post(admin::promote)),
    ]
}

/// Every route, behind the request span, CORS, the loading gate and the
/// API key; with `vertex`, also Vertex AI's prediction routes.
pub fn router(state: AppState, vertex: Option<&vertex::Settings>) -> Router {
    let routes = || {
        get_routes()
            .into_iter()
            .chain(post_routes())
            .fold(Router::new(), |router, (path, method)| router.route(path, method))
    };
    let api = layered(routes(), state.clone());
    match vertex {
        Some(settings) => layered(vertex::add_routes(routes(), settings, api), state),
        None => api,
    }
}

fn layered(routes: Router<AppState>, state: AppState) -> Router {
    let body_limit = state.config().server.limits.body_bytes;
    routes
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), auth::require_key))
        .layer(middleware::from_fn_with_state(state.clone(), loading_gate))
        .layer(middleware::from_fn_with_state(state.clone(), cors::cors))
        .layer(middleware::from_fn_with_state(state.clone(), request_span))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Unknown paths (and known paths with another method), as llama-server
/// answers them.
async fn not_found() -> ApiError {
    ApiError::not_found()
}

/// 503 "Loading model" on every path until the model is loaded.
async fn loading_gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match state.ready() {
        Ok(_) => next.run(request).await,
        Err(loading) => loading.into_response(),
    }
}

/// One span per request, carrying its id; the id is also sent back in
/// `X-Request-Id`.
async fn request_span(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let id = state.0.next_request.fetch_add(1, Ordering::Relaxed);
    let span = tracing::info_span!("request", id, method = %request.method(), path = %request.uri().path());
    async move {
        let started = Instant::now();
        let mut response = next.run(request).await;
        let status = response.status().as_u16();
        tracing::info!(status, ms = started.elapsed().as_secs_f64() * 1e3, "handled");
        response.headers_mut().insert("x-request-id", HeaderValue::from(id));
        response
    }
    .instrument(span)
    .await
}
