//! Running the server: listen first (every path answers 503 "Loading
//! model" meanwhile), load the model, tokenizer, chat template and engine
//! on a blocking thread (`startup`), then serve. SIGHUP reloads the policy
//! from the config file; SIGINT and SIGTERM stop the server gracefully:
//! nothing new is accepted, what runs may finish within
//! `server.timeouts.shutdown_s`, and then every open stream gets an error
//! event and every queued request a 503; if any had to be cut so, the
//! server exits with an error.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use super::api::vertex;
use super::conn::Timeouts;
use super::policies::Policies;
use super::routes::{self, router};
use super::state::{AppState, Ready};
use super::{admin, listen};
use crate::config::{Config, Overrides, ServerTimeouts};
use crate::startup;
use sluice_engine::request::EngineError;
use sluice_plugin_host::{PluginHost, WasmPolicy};

/// How long the connections get to deliver the errors that end the
/// requests cut at the shutdown deadline.
const FLUSH: Duration = Duration::from_secs(2);

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
    /// The configured shadow policies, loaded likewise.
    pub shadows: Vec<WasmPolicy>,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {address}: {error}")]
    Bind { address: String, error: std::io::Error },
    #[error(transparent)]
    Start(#[from] startup::StartError),
    #[error(transparent)]
    Vertex(#[from] vertex::SettingsError),
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("{0} requests were still open at the shutdown deadline and were ended with an error")]
    Cut(usize),
}

/// Listen, load, serve until a stop signal.
pub async fn serve(launch: Launch) -> Result<(), StartError> {
    let Launch { mut config, config_file, flags, host, policy, shadows } = launch;
    let vertex = vertex::Settings::from_env(&routes::paths())?;
    if let Some(vertex) = &vertex {
        if vertex.port != config.server.port {
            tracing::warn!("Vertex AI: AIP_HTTP_PORT {} replaces the port {}", vertex.port, config.server.port);
        }
        config.server.port = vertex.port;
    }
    let mut listeners = Vec::new();
    // llama-server takes a comma-separated list of addresses.
    for address in config.server.host.split(',').map(str::trim).filter(|address| !address.is_empty()) {
        let port = config.server.port;
        let named = if address.contains(':') { format!("[{address}]:{port}") } else { format!("{address}:{port}") };
        let listener = TcpListener::bind((address, port))
            .await
            .map_err(|error| StartError::Bind { address: named.clone(), error })?;
        let local = listener.local_addr().map_err(|error| StartError::Bind { address: named, error })?;
        tracing::info!("server is listening on http://{local}");
        listeners.push(listener);
    }
    if listeners.is_empty() {
        let error = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address given");
        return Err(StartError::Bind { address: config.server.host.clone(), error });
    }

    let policies = Policies::new(host, config_file, flags, config.policy.clone());
    let state = AppState::new(config, policies);
    let (stop, stopped) = watch::channel(false);
    let app = router(state.clone(), vertex.as_ref());
    let timeouts = timeouts(&state.config().server.timeouts);
    let servers =
        listeners.into_iter().map(|listener| listen::serve(listener, app.clone(), timeouts, wait_for(stopped.clone())));
    let mut server = tokio::spawn(futures_util::future::try_join_all(servers));
    tokio::spawn(signals(state.clone(), stop.clone()));

    tokio::select! {
        loaded = load(&state, policy, shadows) => {
            if let Err(error) = loaded {
                let _ = stop.send(true);
                let _ = server.await;
                return Err(error);
            }
        }
        () = wait_for(stopped.clone()) => {}
    }

    tokio::select! {
        finished = &mut server => return served(finished),
        () = wait_for(stopped) => {}
    }
    // The listeners have stopped accepting; kept-alive connections close
    // after the response they are sending.
    let grace = Duration::from_secs(state.config().server.timeouts.shutdown_s);
    let Ok(ready) = state.ready() else { return Ok(()) };
    ready.engine.drain();
    tracing::info!(seconds = grace.as_secs(), "stopping: open requests may finish");
    if let Ok(finished) = tokio::time::timeout(grace, &mut server).await {
        return served(finished);
    }
    let engine = ready.engine.clone();
    let error = EngineError::Unavailable("the server is shutting down".into());
    let cut = tokio::task::spawn_blocking(move || engine.end_all(error, FLUSH)).await.ok().flatten().unwrap_or(0);
    // Let the connections deliver those errors.
    let _ = tokio::time::timeout(FLUSH, &mut server).await;
    if cut > 0 {
        tracing::warn!(
            requests = cut,
            seconds = grace.as_secs(),
            "requests still open at the shutdown deadline were ended with an error"
        );
        return Err(StartError::Cut(cut));
    }
    Ok(())
}

fn served(finished: Result<std::io::Result<Vec<()>>, tokio::task::JoinError>) -> Result<(), StartError> {
    match finished {
        Ok(result) => result.map(drop).map_err(StartError::Serve),
        Err(error) => Err(StartError::Serve(std::io::Error::other(error))),
    }
}

/// `[server.timeouts]` as the connections keep them (0 = off).
fn timeouts(config: &ServerTimeouts) -> Timeouts {
    let seconds = |seconds: u64| (seconds > 0).then(|| Duration::from_secs(seconds));
    Timeouts { header: seconds(config.header_s), idle: seconds(config.idle_s), send: seconds(config.send_s) }
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
async fn load(state: &AppState, policy: WasmPolicy, shadows: Vec<WasmPolicy>) -> Result<(), StartError> {
    let config = state.config().clone();
    let path = config.model.path();
    tracing::info!(path = %path.display(), "loading model");
    let started = Instant::now();
    let host = state.policies().host().clone();
    let mut loading = tokio::task::spawn_blocking(move || {
        let serving = startup::serve_model(&config, &host, Box::new(policy), shadows)?;
        Ok::<_, startup::StartError>(Ready::new(serving, &config))
    });
    let mut progress = tokio::time::interval(Duration::from_secs(2));
    progress.tick().await;
    let ready = loop {
        tokio::select! {
            built = &mut loading => break built,
            _ = progress.tick() => tracing::info!(seconds = started.elapsed().as_secs(), "still loading the model"),
        }
    };
    let ready =
        ready.map_err(|error| StartError::Start(startup::StartError::Model { path, error: error.to_string() }))??;
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
