//! Running the server: listen first (every path answers 503 "Loading
//! model" meanwhile), load the model, tokenizer, chat template and engine
//! on a blocking thread, then serve. SIGHUP reloads the policy from the
//! config file; SIGINT and SIGTERM stop the server gracefully.

use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use super::admin::{self, Policies};
use super::{AppState, ModelInfo, Ready, router};
use crate::config::{Config, Overrides};
use crate::engine::policy::SchedulingPolicy;
use crate::engine::{EngineHandle, speculative};
use crate::model::chat_template::{ChatTemplate, TemplateError};
use crate::model::tokenizer::Tokenizer;
use crate::model::transformer::Transformer;
use crate::plugins::{PluginHost, WasmPolicy};

/// How long open requests may run on after a stop signal.
const GRACE: Duration = Duration::from_secs(10);

/// ChatML, for `chat_template = "chatml"` and models without a template
/// (llama-server's fallback too).
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + \
                      '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Everything `serve` needs, checked before anything listens.
pub struct Launch {
    pub config: Config,
    /// Re-read on SIGHUP and by `POST /admin/policy` without a body.
    pub config_file: Option<PathBuf>,
    /// Applied again over the file on reloads.
    pub flags: Overrides,
    pub host: PluginHost,
    /// The configured policy, already loaded (a bad one refuses the start
    /// before the server listens).
    pub policy: WasmPolicy,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {address}: {error}")]
    Bind { address: String, error: std::io::Error },
    #[error("{}: cannot load the model: {error}", path.display())]
    Model { path: PathBuf, error: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("{}: cannot use the draft model: {error}", path.display())]
    Draft { path: PathBuf, error: String },
    #[error("cannot start the engine: {0}")]
    Engine(std::io::Error),
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// Listen, load, serve until a stop signal.
pub async fn serve(launch: Launch) -> Result<(), StartError> {
    let Launch { config, config_file, flags, host, policy } = launch;
    let address = format!("{}:{}", config.server.host, config.server.port);
    let listener = TcpListener::bind((config.server.host.as_str(), config.server.port))
        .await
        .map_err(|error| StartError::Bind { address: address.clone(), error })?;
    let local = listener.local_addr().map_err(|error| StartError::Bind { address, error })?;
    tracing::info!("server is listening on http://{local}");

    let policies = Policies::new(host, config_file, flags, config.policy.clone());
    let state = AppState::new(config, policies);
    let (stop, stopped) = watch::channel(false);
    let app = router(state.clone());
    let mut server =
        tokio::spawn(axum::serve(listener, app).with_graceful_shutdown(wait_for(stopped.clone())).into_future());
    tokio::spawn(signals(state.clone(), stop.clone()));

    tokio::select! {
        loaded = load(&state, policy) => {
            if let Err(error) = loaded {
                let _ = stop.send(true);
                let _ = server.await;
                return Err(error);
            }
        }
        () = wait_for(stopped.clone()) => {}
    }

    tokio::select! {
        finished = &mut server => match finished {
            Ok(result) => result.map_err(StartError::Serve),
            Err(error) => Err(StartError::Serve(std::io::Error::other(error))),
        },
        () = async { wait_for(stopped).await; tokio::time::sleep(GRACE).await } => {
            tracing::warn!("requests still open {} s after the stop signal; closing them", GRACE.as_secs());
            Ok(())
        }
    }
}

async fn wait_for(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

/// SIGINT/SIGTERM stop the server; SIGHUP reloads the policy.
async fn signals(state: AppState, stop: watch::Sender<bool>) {
    let (Ok(mut terminate), Ok(mut hangup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup())) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
            _ = hangup.recv() => {
                let reloading = state.clone();
                match tokio::task::spawn_blocking(move || admin::reload_from_file(&reloading)).await {
                    Ok(Ok(name)) => tracing::info!(policy = name, "SIGHUP: policy reloaded"),
                    Ok(Err(error)) => tracing::error!(%error, "SIGHUP: policy not reloaded; the old one stays"),
                    Err(error) => tracing::error!(%error, "SIGHUP: reload failed"),
                }
            }
        }
    }
    tracing::info!("stopping");
    let _ = stop.send(true);
}

/// Load the model on a blocking thread, logging progress, then open the API.
async fn load(state: &AppState, policy: WasmPolicy) -> Result<(), StartError> {
    let config = state.config().clone();
    let path = config.model.path();
    tracing::info!(path = %path.display(), "loading model");
    let started = Instant::now();
    let fallback = state.policies().fallback();
    let host = state.policies().host().clone();
    let mut loading = tokio::task::spawn_blocking(move || build(&config, &host, Box::new(policy), fallback));
    let mut progress = tokio::time::interval(Duration::from_secs(2));
    progress.tick().await;
    let ready = loop {
        tokio::select! {
            built = &mut loading => break built,
            _ = progress.tick() => tracing::info!(seconds = started.elapsed().as_secs(), "still loading the model"),
        }
    };
    let ready = ready.map_err(|error| StartError::Model { path, error: error.to_string() })??;
    tracing::info!(
        model = ready.model.name,
        slots = ready.engine.config().slots,
        ctx = ready.engine.config().ctx,
        policy = ready.engine.policy_name(),
        ms = started.elapsed().as_millis() as u64,
        "model loaded; serving"
    );
    state.set_ready(ready);
    Ok(())
}

/// The model, tokenizer, chat template and a started engine.
fn build(
    config: &Config,
    host: &PluginHost,
    policy: Box<dyn SchedulingPolicy>,
    fallback: Box<dyn Fn() -> Option<Box<dyn SchedulingPolicy>> + Send>,
) -> Result<Ready, StartError> {
    let path = config.model.path();
    let failed = |error: String| StartError::Model { path: path.clone(), error };
    let model = Transformer::load(&path).map_err(|error| failed(error.to_string()))?;
    read_weights(&model);
    let tokenizer =
        Arc::new(Tokenizer::from_gguf(model.file()).map_err(|error| failed(format!("tokenizer: {error}")))?);
    let template = chat_template(config.model.chat_template.as_deref(), &model, &tokenizer)?;
    let hparams = model.hparams();
    let mut engine_config = config.engine_config(hparams.n_ctx_train);
    if engine_config.ctx > hparams.n_ctx_train {
        tracing::warn!(
            ctx = engine_config.ctx,
            n_ctx_train = hparams.n_ctx_train,
            "the context is larger than the model was trained for; using the training context"
        );
        engine_config.ctx = hparams.n_ctx_train;
    }
    let file = model.file();
    let info = ModelInfo {
        name: config.model.name(),
        path: path.clone(),
        n_vocab: hparams.n_vocab,
        n_ctx_train: hparams.n_ctx_train,
        n_embd: hparams.n_embd,
        n_params: file.tensors().iter().map(|tensor| tensor.elements()).sum(),
        size: file.tensors().iter().map(|tensor| tensor.len as u64).sum(),
        ftype: file.opt_u32("general.file_type").ok().flatten(),
    };
    let model = Arc::new(model);
    let speculation = speculative::load(&config.speculative, host, config.policy.limits(), &model, &engine_config)
        .map_err(|(path, error)| StartError::Draft { path, error })?;
    let engine = EngineHandle::start(model, Arc::clone(&tokenizer), policy, fallback, engine_config, speculation)
        .map_err(StartError::Engine)?;
    Ok(Ready { engine, tokenizer, template, model: info })
}

/// Pages the weights in before serving, with a progress bar on a terminal
/// (log lines at each quarter otherwise).
fn read_weights(model: &Transformer) {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template("loading weights {bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        model.file().prefault(|done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        return;
    }
    let mut next_quarter = 1;
    model.file().prefault(|done, total| {
        while next_quarter <= 4 && done * 4 >= total * next_quarter {
            tracing::info!(percent = next_quarter * 25, bytes = done, "loading weights");
            next_quarter += 1;
        }
    });
}

/// The configured template (Jinja source or `chatml`), else the model's,
/// else ChatML.
fn chat_template(
    configured: Option<&str>,
    model: &Transformer,
    tokenizer: &Tokenizer,
) -> Result<ChatTemplate, StartError> {
    let source = match configured {
        Some("chatml") => Some(CHATML),
        Some(source) if source.contains("{{") || source.contains("{%") => Some(source),
        Some(name) => {
            return Err(StartError::Template(format!(
                "{name:?} is neither a Jinja template nor a known template name (chatml)"
            )));
        }
        None => None,
    };
    match ChatTemplate::from_gguf(model.file(), tokenizer, source) {
        Err(TemplateError::Missing) => {
            tracing::warn!("the model has no chat template; using ChatML");
            ChatTemplate::from_gguf(model.file(), tokenizer, Some(CHATML))
                .map_err(|error| StartError::Template(error.to_string()))
        }
        loaded => loaded.map_err(|error| StartError::Template(error.to_string())),
    }
}
