//! Operator actions: loading and replacing the scheduling policy (at start,
//! on SIGHUP, and through `POST /admin/policy`), and the shadow policies:
//! attach, detach, report and promote (`/admin/policy/shadow`,
//! `/admin/policy/promote`).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::error::{ApiError, ErrorType};
use super::extract::JsonBody;
use super::generate::blocking;
use super::state::AppState;
use crate::chat::fields::{Fields, object, wrong};
use crate::config::{PolicyConfig, PolicySpec, policy_source};
use crate::startup::{PluginError, confine, load_policy, load_shadows};
use sluice_engine::policy::SchedulingPolicy;
use sluice_engine::shadow::ShadowRecord;
use sluice_plugin_host::{PluginSource, WasmPolicy};

/// Longest wait for the engine to take a new policy or shadow (it does so
/// between two steps, and a step with a long prefill can take seconds on a
/// CPU, so this only runs out if a step hangs).
const SWAP_WAIT: Duration = Duration::from_secs(60);

/// Reload the policy and its shadows from the config file and hand them to
/// the engine (the SIGHUP action). Blocking: it compiles the plugins.
pub fn reload_from_file(state: &AppState) -> Result<String, PluginError> {
    let policies = state.policies();
    let config = policies.reread()?;
    let shadows = load_shadows(policies.host(), &config)?;
    let policy = policies.load(config)?;
    let name = install(state, policy)?;
    let ready = state.ready().map_err(|error| PluginError::Config(error.message))?;
    let shadows = shadows.into_iter().map(|shadow| Box::new(shadow) as Box<dyn SchedulingPolicy>).collect();
    ready.engine.replace_shadows(shadows, SWAP_WAIT).map_err(PluginError::Config)?;
    Ok(name)
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
/// reloads the config file's, its shadows too.
/// Needs the API key: without one configured the endpoint is closed.
pub async fn replace_policy(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    require_key(&state)?;
    let (requested, settings) = requested_policy(&body)?;
    let requested = requested.map(|plugin| confined(&state, plugin)).transpose()?;
    let worker = state.clone();
    let name = blocking(move || {
        let policies = worker.policies();
        let Some(plugin) = requested else {
            return reload_from_file(&worker).map_err(|error| ApiError::invalid(error.to_string()));
        };
        let policy = policies
            .load(PolicyConfig { plugin, settings, ..policies.active() })
            .map_err(|error| ApiError::invalid(format!("`policy`: {error}")))?;
        install(&worker, policy).map_err(|error| ApiError::new(ErrorType::Unavailable, error.to_string()))
    })
    .await?;
    Ok(Json(json!({ "success": true, "policy": name })))
}

/// A body's `policy` (NAME|PATH) and `settings` (none when left out:
/// another policy's settings would not fit it).
fn requested_policy(body: &Value) -> Result<(Option<String>, toml::Table), ApiError> {
    let fields = Fields(object(body)?);
    let plugin = fields.str("policy")?.map(str::to_owned);
    // Checked here so that a bad name is reported as the field sent.
    if let Some(plugin) = &plugin {
        policy_source(plugin, "policy").map_err(ApiError::invalid)?;
    }
    let settings = match body.get("settings") {
        None | Some(Value::Null) => toml::Table::new(),
        Some(value) => settings_table(value)?,
    };
    Ok((plugin, settings))
}

/// A plugin named in a request: a built-in name as it is, a path only
/// inside `policy.plugin_dir` (resolved there). Whoever holds the API key
/// must not be able to make the server read any file it can reach.
fn confined(state: &AppState, plugin: String) -> Result<String, ApiError> {
    let PluginSource::Path(path) = policy_source(&plugin, "policy").map_err(ApiError::invalid)? else {
        return Ok(plugin);
    };
    let folder = state.policies().active().plugin_dir;
    let resolved = confine(&path, folder.as_deref()).map_err(|why| ApiError::invalid(format!("`policy`: {why}")))?;
    Ok(resolved.display().to_string())
}

/// `/admin` endpoints are closed unless an API key is configured (the key
/// itself is checked by the router's middleware).
fn require_key(state: &AppState) -> Result<(), ApiError> {
    match state.api_key() {
        Some(_) => Ok(()),
        None => Err(ApiError::new(
            ErrorType::Permission,
            "/admin endpoints need an API key (`server.api_key` or --api-key)",
        )),
    }
}

/// `POST /admin/policy/shadow`: `{"policy": NAME|PATH, "settings": {...}}`
/// attaches a shadow policy under the active policy's limits.
pub async fn attach_shadow(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    require_key(&state)?;
    let (plugin, settings) = requested_policy(&body)?;
    let plugin = confined(&state, plugin.ok_or_else(|| ApiError::invalid("`policy` is required"))?)?;
    let worker = state.clone();
    let name = blocking(move || {
        let policies = worker.policies();
        let spec = PolicySpec { plugin, settings };
        let policy = load_policy(policies.host(), &policies.active().for_shadow(&spec))
            .map_err(|error| ApiError::invalid(format!("`policy`: {error}")))?;
        let name = policy.name().to_owned();
        let ready = worker.ready()?;
        ready.engine.attach_shadow(Box::new(policy), SWAP_WAIT).map_err(ApiError::invalid)?;
        policies.edit(|active| active.shadow.push(spec));
        Ok(name)
    })
    .await?;
    Ok(Json(json!({ "success": true, "shadow": name })))
}

/// `DELETE /admin/policy/shadow`: `{"policy": NAME}` detaches it.
pub async fn detach_shadow(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    require_key(&state)?;
    let name = policy_name(&body)?;
    let ready = state.ready()?;
    let engine = ready.engine.clone();
    let detached = name.clone();
    blocking(move || engine.detach_shadow(&detached, SWAP_WAIT).map_err(ApiError::invalid)).await?;
    state.policies().edit(|active| active.shadow.retain(|spec| spec.plugin != name));
    Ok(Json(json!({ "success": true })))
}

/// `GET /admin/policy/shadow`: per shadow, the steps compared, agreement
/// by decision part (counts and rates), skips, faults, quarantine, and the
/// first divergent steps with their views and both decisions.
pub async fn shadow_report(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    require_key(&state)?;
    let ready = state.ready()?;
    let shadows: Vec<Value> = ready.engine.shadow_records().iter().map(record_json).collect();
    Ok(Json(json!({
        "policy": ready.engine.policy_name(),
        "budget_us": ready.engine.config().shadow_budget.as_micros() as u64,
        "shadows": shadows,
    })))
}

fn record_json(record: &ShadowRecord) -> Value {
    let rate = |agreed: u64| if record.steps == 0 { Value::Null } else { json!(agreed as f64 / record.steps as f64) };
    let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
    value["agreement"] = json!({
        "admit": rate(record.agreed.admit),
        "prefill": rate(record.agreed.prefill),
        "decode": rate(record.agreed.decode),
        "all": rate(record.agreed.all),
    });
    value
}

/// `POST /admin/policy/promote`: `{"policy": NAME}` makes that shadow the
/// active policy between two steps; the one it replaces becomes a shadow.
pub async fn promote(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    require_key(&state)?;
    let name = policy_name(&body)?;
    let ready = state.ready()?;
    let engine = ready.engine.clone();
    let promoted = blocking(move || engine.promote(&name, SWAP_WAIT).map_err(ApiError::invalid)).await?;
    state.policies().edit(|active| {
        let Some(at) = active.shadow.iter().position(|spec| spec.plugin == promoted.active) else { return };
        let spec = active.shadow.remove(at);
        let replaced = PolicySpec {
            plugin: std::mem::replace(&mut active.plugin, spec.plugin),
            settings: std::mem::replace(&mut active.settings, spec.settings),
        };
        // When the fallback had taken over, it is what became the shadow.
        let previous = if replaced.plugin == promoted.previous {
            replaced
        } else {
            PolicySpec { plugin: promoted.previous.clone(), settings: toml::Table::new() }
        };
        if promoted.kept_as_shadow {
            active.shadow.push(previous);
        }
    });
    tracing::info!(policy = promoted.active, previous = promoted.previous, "shadow policy promoted");
    Ok(Json(json!({
        "success": true,
        "policy": promoted.active,
        "previous": promoted.previous,
        "previous_is_shadow": promoted.kept_as_shadow,
    })))
}

fn policy_name(body: &Value) -> Result<String, ApiError> {
    requested_policy(body)?.0.ok_or_else(|| ApiError::invalid("`policy` is required"))
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
        .collect::<Result<_, _>>()
        .map_err(ApiError::from)
}
