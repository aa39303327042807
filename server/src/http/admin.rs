//! Operator actions: loading and replacing the scheduling policy (at start,
//! on SIGHUP, and through `POST /admin/policy`).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ErrorType};
use super::generate::blocking;
use super::params::{Fields, JsonBody, object, wrong};
use crate::config::{Config, Overrides, PolicyConfig};
use crate::engine::policy::SchedulingPolicy;
use crate::plugins::{PluginHost, WasmPolicy};
use crate::startup::{PluginError, load_policy};

/// Longest wait for the engine to take a new policy (it does so between
/// two steps, so this only matters if a step hangs).
const SWAP_WAIT: Duration = Duration::from_secs(5);

/// The policy side of the server: the plugin host, where the configuration
/// came from (for reloads), and the active policy's configuration.
pub struct Policies {
    host: PluginHost,
    config_file: Option<PathBuf>,
    flags: Overrides,
    active: Mutex<PolicyConfig>,
}

impl Policies {
    pub fn new(host: PluginHost, config_file: Option<PathBuf>, flags: Overrides, active: PolicyConfig) -> Self {
        Policies { host, config_file, flags, active: Mutex::new(active) }
    }

    /// The plugin host (shared by policies and draft fixups).
    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// The active policy's configuration.
    pub fn active(&self) -> PolicyConfig {
        self.active.lock().map(|active| active.clone()).unwrap_or_default()
    }

    /// Load `config`'s policy and make it the one `/props` reports.
    pub fn load(&self, config: PolicyConfig) -> Result<WasmPolicy, PluginError> {
        let policy = load_policy(&self.host, &config)?;
        if let Ok(mut active) = self.active.lock() {
            *active = config;
        }
        Ok(policy)
    }

    /// The `[policy]` section as it stands now: the config file read again,
    /// with the command-line flags applied over it.
    pub fn from_file(&self) -> Result<PolicyConfig, PluginError> {
        let mut config = match &self.config_file {
            Some(path) => Config::load(path).map_err(|error| PluginError::Config(error.to_string()))?,
            None => Config::default(),
        };
        config.apply(&self.flags).map_err(PluginError::Config)?;
        Ok(config.policy)
    }
}

/// Reload the policy from the config file and hand it to the engine (the
/// SIGHUP action). Blocking: it compiles the plugin.
pub fn reload_from_file(state: &AppState) -> Result<String, PluginError> {
    let policies = state.policies();
    let policy = policies.load(policies.from_file()?)?;
    install(state, policy)
}

fn install(state: &AppState, policy: WasmPolicy) -> Result<String, PluginError> {
    let name = policy.name().to_owned();
    let ready = state.ready().map_err(|error| PluginError::Config(error.message))?;
    ready.engine.replace_policy(Box::new(policy), SWAP_WAIT).map_err(|error| PluginError::Config(error.to_string()))?;
    tracing::info!(policy = name, "scheduling policy reloaded");
    Ok(name)
}

/// `POST /admin/policy`: `{"policy": NAME|PATH, "settings": {...}}` loads
/// that policy with the configured limits and the given settings (none when
/// left out: another policy's settings would not fit it); no `policy`
/// reloads the config file's.
/// Needs the API key: without one configured the endpoint is closed.
pub async fn replace_policy(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    if state.api_key().is_none() {
        return Err(ApiError::new(
            ErrorType::Permission,
            "/admin endpoints need an API key (`server.api_key` or --api-key)",
        ));
    }
    let fields = Fields(object(&body)?);
    let requested = fields.str("policy")?.map(str::to_owned);
    let settings = match body.get("settings") {
        None | Some(Value::Null) => toml::Table::new(),
        Some(value) => settings_table(value)?,
    };
    let worker = state.clone();
    let name = blocking(move || {
        let policies = worker.policies();
        let loaded = match requested {
            Some(plugin) => policies.load(PolicyConfig { plugin, settings, ..policies.active() }),
            None => policies.from_file().and_then(|config| policies.load(config)),
        };
        let policy = loaded.map_err(|error| ApiError::invalid(error.to_string()))?;
        install(&worker, policy).map_err(|error| ApiError::new(ErrorType::Unavailable, error.to_string()))
    })
    .await?;
    Ok(Json(json!({ "success": true, "policy": name })))
}

/// A JSON object of booleans, numbers and strings as `[policy.settings]`.
fn settings_table(value: &Value) -> Result<toml::Table, ApiError> {
    let expected = "an object of booleans, numbers and strings";
    let object = value.as_object().ok_or_else(|| wrong("settings", expected))?;
    object
        .iter()
        .map(|(key, value)| {
            let value = match value {
                Value::Bool(flag) => toml::Value::Boolean(*flag),
                Value::String(text) => toml::Value::String(text.clone()),
                Value::Number(number) => match number.as_i64() {
                    Some(integer) => toml::Value::Integer(integer),
                    None => toml::Value::Float(number.as_f64().ok_or_else(|| wrong("settings", expected))?),
                },
                _ => return Err(wrong(&format!("settings.{key}"), "a boolean, number or string")),
            };
            Ok((key.clone(), value))
        })
        .collect()
}
