//! Running the server: listen first (every path answers 503 "Loading
//! model" meanwhile), load the model, tokenizer, chat template and engine
//! on a blocking thread (`startup`), then serve. SIGHUP reloads the policy
//! from the config file; SIGINT and SIGTERM stop the server gracefully.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use super::admin::{self, Policies};
use super::{AppState, Ready, listen, router, vertex};
use crate::config::{Config, Overrides};
use crate::plugins::{PluginHost, WasmPolicy};
use crate::startup;

/// How long open requests may run on after a stop signal.
const GRACE: Duration = Duration::from_secs(10);

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
    #[error(transparent)]
    Start(#[from] startup::StartError),
    #[error(transparent)]
    Vertex(#[from] vertex::SettingsError),
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// Listen, load, serve until a stop signal.
pub async fn serve(launch: Launch) -> Result<(), StartError> {
    let Launch { mut config, config_file, flags, host, policy } = launch;
    let vertex = vertex::Settings::from_env()?;
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
    let servers = listeners.into_iter().map(|listener| listen::serve(listener, app.clone(), wait_for(stopped.clone())));
    let mut server = tokio::spawn(futures_util::future::try_join_all(servers));
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
            Ok(result) => result.map(drop).map_err(StartError::Serve),
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
    let host = state.policies().host().clone();
    let mut loading = tokio::task::spawn_blocking(move || {
        let serving = startup::serve_model(&config, &host, Box::new(policy))?;
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
