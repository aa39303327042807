//! Read-only state: `/health`, `/props`, `/v1/models`, `/slots` and
//! `/metrics` (llama-server's `llamacpp:*` names plus `sluice_*`).

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::error::{ApiError, ErrorType};
use super::params::{self, settings_json};
use super::state::{AppState, RateWindow, Ready};
use crate::chat::fields::Fields;
use crate::chat::tools;
use sluice_engine::Health;
use sluice_engine::metrics::{Metrics, POLICY_CALL_BUCKETS};
use sluice_engine::policy::Phase;
use sluice_engine::shadow::ShadowRecord;

/// `GET /health`: `{"status":"ok"}`; "degraded" on the fallback policy;
/// 503 naming the policy and its fault when it failed closed.
pub async fn health(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    match ready.engine.health() {
        Health::Ok => Ok(Json(json!({ "status": "ok" }))),
        Health::Degraded { policy, fault } => {
            Ok(Json(json!({ "status": "degraded", "policy": policy, "fault": fault })))
        }
        Health::FailedClosed { policy, fault } => Err(ApiError::new(
            ErrorType::Unavailable,
            format!("scheduling policy `{policy}` failed closed ({fault}); reload the policy to resume"),
        )
        .with("policy", json!(policy))
        .with("fault", json!(fault))),
        Health::Stopped { reason } => Err(ApiError::new(ErrorType::Unavailable, reason)),
    }
}

fn health_name(health: &Health) -> &'static str {
    match health {
        Health::Ok => "ok",
        Health::Degraded { .. } => "degraded",
        Health::FailedClosed { .. } => "failed-closed",
        Health::Stopped { .. } => "stopped",
    }
}

/// `GET /props`: server and model properties, plus the active policy.
pub async fn props(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let config = state.config();
    let defaults = params::generation(Fields(&Map::new()), &ready.limits(&config.defaults))?;
    let text = |id: Option<u32>| id.map_or("", |id| ready.tokenizer.piece(id)).to_owned();
    let policy = state.policies().active();
    Ok(Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": ready.engine.config().ctx,
            "speculative": ready.engine.speculative(),
            "is_processing": false,
            "params": settings_json(&defaults),
        },
        "total_slots": ready.engine.config().slots,
        "model_alias": ready.model.name,
        "model_path": ready.model.path.display().to_string(),
        "model_ftype": ready.model.ftype,
        // sluice's own: the family the model runs as.
        "model_family": ready.model.family,
        "modalities": { "vision": ready.vision.is_some(), "video": false, "audio": false },
        "media_marker": ready.vision.as_ref().map(|vision| vision.marker()),
        "endpoint_slots": config.server.slots,
        "endpoint_props": false,
        "endpoint_metrics": config.server.metrics,
        // sluice serves no web UI (`--ui` and `--no-ui` are accepted and ignored).
        "ui": false,
        "ui_settings": {},
        "cors_proxy_enabled": false,
        "chat_template": ready.template.source(),
        "chat_template_caps": tools::template_caps(ready.template.source()),
        "structured_outputs": structured_outputs(&ready),
        "bos_token": text(ready.tokenizer.bos()),
        "eos_token": text(ready.tokenizer.eos()),
        "build_info": format!("sluice {}", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
        "policy": {
            "name": ready.engine.policy_name(),
            "plugin": policy.plugin,
            "on_fault": policy.on_fault.as_str(),
            "stall_steps": policy.stall_steps,
            "limits": { "fuel": policy.fuel, "deadline_ms": policy.deadline_ms, "memory_mb": policy.memory_mb },
            "settings": serde_json::to_value(&policy.settings).unwrap_or(Value::Null),
            "shadows": ready.engine.shadow_records().iter().map(|record| &record.policy).collect::<Vec<_>>(),
            "health": health_name(&ready.engine.health()),
            "faults": ready.engine.faults().iter().map(|fault| json!({
                "step": fault.step,
                "policy": fault.policy,
                "reason": fault.reason,
                "detail": fault.detail,
                "action": fault.action.name(),
            })).collect::<Vec<_>>(),
        },
    })))
}

/// What constrained decoding this server offers (sluice's own field).
fn structured_outputs(ready: &Ready) -> Value {
    match &ready.grammars {
        Ok(_) => json!({
            "available": true,
            "json_schema": true,
            "response_format": ["text", "json_object", "json_schema"],
            "grammar": ["gbnf", "llguidance"],
            "tool_format": tools::format_name(ready.template.source()),
        }),
        Err(reason) => json!({ "available": false, "reason": reason }),
    }
}

/// `GET /v1/models` and `/models`: OpenAI's list plus llama-server's
/// Ollama-style `models`.
pub async fn models(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let model = &ready.model;
    // Ollama's names: "tools" once calls can be held to their schemas.
    let capabilities = if ready.grammars.is_ok() { json!(["completion", "tools"]) } else { json!(["completion"]) };
    let created = state.started().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
    // Adapters are models a request's `model` can name (see `lora`), as
    // vLLM lists them: with the base model as `parent`.
    let adapters = ready.adapters.list().iter().map(|adapter| {
        json!({
            "id": adapter.name,
            "object": "model",
            "created": created,
            "owned_by": "llamacpp",
            "parent": model.name,
            "root": adapter.path.display().to_string(),
        })
    });
    let mut data = vec![json!({
        "id": model.name,
        "aliases": model.aliases,
        "tags": model.tags,
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
        "meta": {
            "n_vocab": model.n_vocab,
            "n_ctx": ready.engine.config().ctx,
            "n_ctx_train": model.n_ctx_train,
            "n_embd": model.n_embd,
            "n_params": model.n_params,
            "size": model.size,
        },
        "capabilities": capabilities,
    })];
    data.extend(adapters);
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "models": [{
            "name": model.name,
            "model": model.name,
            "type": "model",
            "capabilities": capabilities,
            "details": { "format": "gguf" },
        }],
    })))
}

fn phase_name(phase: Option<Phase>) -> &'static str {
    match phase {
        None => "idle",
        Some(Phase::Prefilling) => "prefilling",
        Some(Phase::Ready) => "ready",
        Some(Phase::Decoding) => "decoding",
    }
}

/// `POST /props`: llama-server changes nothing here unless started with
/// `--props`; sluice has no writable properties, so it always answers 501.
pub async fn set_props() -> ApiError {
    ApiError::new(ErrorType::NotSupported, "This server does not support changing global properties.")
}

/// `GET /slots`: each slot's state; `?fail_on_no_slot=1` answers 503 when
/// none is idle.
pub async fn slots(State(state): State<AppState>, RawQuery(query): RawQuery) -> Result<Json<Value>, ApiError> {
    if !state.config().server.slots {
        return Err(ApiError::new(
            ErrorType::NotSupported,
            "This server does not support slots endpoint. Start it with `--slots`",
        ));
    }
    let ready = state.ready()?;
    let slots = ready.engine.slots();
    let fail_on_no_slot = query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .any(|(key, value)| key == "fail_on_no_slot" && matches!(value, "1" | "true"));
    if fail_on_no_slot && slots.iter().all(|slot| slot.phase.is_some()) {
        return Err(ApiError::new(ErrorType::Unavailable, "no slot available"));
    }
    let policy = ready.engine.policy_name();
    let speculative = ready.engine.speculative();
    let slots: Vec<Value> = slots
        .iter()
        .map(|slot| {
            let mut value = json!({
                "id": slot.id,
                "n_ctx": slot.n_ctx,
                "speculative": speculative,
                "is_processing": slot.phase.is_some(),
                "phase": phase_name(slot.phase),
                "policy": policy,
            });
            if let (Some(request), Some(object)) = (slot.request_id, value.as_object_mut()) {
                let n_predict = slot.max_tokens.map_or(-1, |max| max as i64);
                let n_remain = slot.max_tokens.map_or(-1, |max| max.saturating_sub(slot.generated) as i64);
                let extra = json!({
                    "id_task": request,
                    "n_prompt_tokens": slot.prompt_tokens,
                    "n_prompt_tokens_processed": slot.prompt_done,
                    "n_prompt_tokens_cache": slot.prompt_cached,
                    "params": {
                        "n_predict": n_predict,
                        "lora": slot.lora.iter().map(|&(id, scale)| json!({"id": id, "scale": scale})).collect::<Vec<_>>(),
                    },
                    "next_token": [{
                        "has_next_token": true,
                        "has_new_line": false,
                        "n_remain": n_remain,
                        "n_decoded": slot.generated,
                    }],
                    "priority": slot.priority,
                    "adapter_group": slot.adapter_group,
                });
                if let Some(extra) = extra.as_object() {
                    object.extend(extra.clone());
                }
            }
            value
        })
        .collect();
    Ok(Json(Value::Array(slots)))
}

/// Prometheus text, one family at a time.
struct Exposition(String);

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(self.0, "{name}{labels} {value}");
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help, &[(String::new(), value)]);
    }
}

/// What the shadow policies have shown, one sample per shadow (and part or
/// reason).
fn shadow_metrics(out: &mut Exposition, records: &[ShadowRecord]) {
    let by_policy = |value: &dyn Fn(&ShadowRecord) -> f64| -> Vec<(String, f64)> {
        records.iter().map(|record| (format!("{{policy=\"{}\"}}", label(&record.policy)), value(record))).collect()
    };
    let steps = by_policy(&|record| record.steps as f64);
    out.family("sluice_shadow_steps_total", "counter", "Steps whose decision a shadow policy was compared on.", &steps);
    let agreed: Vec<(String, f64)> = records
        .iter()
        .flat_map(|record| {
            let agreed = record.agreed;
            [("admit", agreed.admit), ("prefill", agreed.prefill), ("decode", agreed.decode), ("all", agreed.all)].map(
                |(part, count)| (format!("{{policy=\"{}\",part=\"{part}\"}}", label(&record.policy)), count as f64),
            )
        })
        .collect();
    let help = "Compared steps on which a shadow policy agreed with the active one, by decision part.";
    out.family("sluice_shadow_agreed_steps_total", "counter", help, &agreed);
    let skipped = by_policy(&|record| record.skipped as f64);
    let help = "Steps a shadow policy skipped because the step's shadow budget was spent.";
    out.family("sluice_shadow_skipped_steps_total", "counter", help, &skipped);
    let faults: Vec<(String, f64)> = records
        .iter()
        .flat_map(|record| {
            record.faults.iter().map(|(reason, count)| {
                (format!("{{policy=\"{}\",reason=\"{}\"}}", label(&record.policy), label(reason)), *count as f64)
            })
        })
        .collect();
    out.family("sluice_shadow_faults_total", "counter", "Shadow policy faults, by policy and reason.", &faults);
    let quarantined = by_policy(&|record| f64::from(u8::from(record.quarantined.is_some())));
    out.family("sluice_shadow_quarantined", "gauge", "1 once a shadow policy is quarantined.", &quarantined);
    let seconds = by_policy(&|record| record.seconds);
    out.family("sluice_shadow_seconds_total", "counter", "Time spent in a shadow policy's calls.", &seconds);
}

/// A label value with Prometheus escapes.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    if !state.config().server.metrics {
        return Err(ApiError::new(
            ErrorType::NotSupported,
            "This server does not support metrics endpoint. Start it with `--metrics`",
        ));
    }
    let ready = state.ready()?;
    let text = render_metrics(&state, &ready);
    let mut response = text.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    let started = state.started().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
    headers.insert("process-start-time-unix", HeaderValue::from(started));
    Ok(response)
}

fn render_metrics(state: &AppState, ready: &Ready) -> String {
    let metrics = &ready.engine.shared().metrics;
    let get = |counter| Metrics::get(counter) as f64;
    let prompt_tokens = Metrics::get(&metrics.prompt_tokens_total);
    let prompt_micros = Metrics::get(&metrics.prompt_micros_total);
    let predicted_tokens = Metrics::get(&metrics.tokens_predicted_total);
    let predicted_micros = Metrics::get(&metrics.predicted_micros_total);
    // Throughput since the previous scrape; each scrape starts a new window.
    let (prompt_rate, predicted_rate) = match state.rate_window().lock() {
        Ok(mut window) => {
            let rate = |tokens: u64, micros: u64| if micros == 0 { 0.0 } else { tokens as f64 * 1e6 / micros as f64 };
            let rates = (
                rate(
                    prompt_tokens.saturating_sub(window.prompt_tokens),
                    prompt_micros.saturating_sub(window.prompt_micros),
                ),
                rate(
                    predicted_tokens.saturating_sub(window.predicted_tokens),
                    predicted_micros.saturating_sub(window.predicted_micros),
                ),
            );
            *window = RateWindow { prompt_tokens, prompt_micros, predicted_tokens, predicted_micros };
            rates
        }
        Err(_) => (0.0, 0.0),
    };
    let decodes = Metrics::get(&metrics.n_decode_total);
    let busy_per_decode = if decodes == 0 { 0.0 } else { get(&metrics.n_busy_slots_total) / decodes as f64 };

    let mut out = Exposition(String::new());
    out.one("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", prompt_tokens as f64);
    out.one(
        "llamacpp:prompt_tokens_cached_total",
        "counter",
        "Number of prompt tokens served from the prompt cache.",
        get(&metrics.prefix_cache_hit_tokens_total),
    );
    out.one("llamacpp:prompt_seconds_total", "counter", "Prompt process time", prompt_micros as f64 / 1e6);
    out.one(
        "llamacpp:tokens_predicted_total",
        "counter",
        "Number of generation tokens processed.",
        predicted_tokens as f64,
    );
    out.one(
        "llamacpp:tokens_predicted_seconds_total",
        "counter",
        "Predict process time",
        predicted_micros as f64 / 1e6,
    );
    out.one("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", decodes as f64);
    out.one("llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.", get(&metrics.n_tokens_max));
    out.one(
        "llamacpp:spec_decode_num_draft_tokens_total",
        "counter",
        "Number of drafted tokens.",
        get(&metrics.draft_tokens_total),
    );
    let accepted = metrics.draft_accepted_per_position.lock().map(|counts| counts.clone()).unwrap_or_default();
    out.one(
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "counter",
        "Number of accepted drafted tokens.",
        accepted.iter().sum::<u64>() as f64,
    );
    out.one("llamacpp:spec_decode_num_drafts_total", "counter", "Number of drafts.", get(&metrics.drafts_total));
    // As llama-server: only once something was accepted.
    let per_position: Vec<(String, f64)> = accepted
        .iter()
        .enumerate()
        .map(|(position, count)| (format!("{{position=\"{position}\"}}"), *count as f64))
        .collect();
    if !per_position.is_empty() {
        out.family(
            "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            "Accepted drafted tokens by their position in the draft.",
            &per_position,
        );
    }
    out.one("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_rate);
    out.one("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", predicted_rate);
    out.one(
        "llamacpp:requests_processing",
        "gauge",
        "Number of requests processing.",
        get(&metrics.requests_processing),
    );
    out.one("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", get(&metrics.requests_deferred));
    out.one(
        "llamacpp:n_busy_slots_per_decode",
        "gauge",
        "Average number of busy slots per llama_decode() call",
        busy_per_decode,
    );

    out.one("sluice_requests_total", "counter", "Requests submitted to the engine.", get(&metrics.requests_total));
    out.one("sluice_steps_total", "counter", "Engine steps that ran a forward pass.", get(&metrics.steps_total));
    out.family(
        "sluice_step_tokens_total",
        "counter",
        "Tokens processed by engine steps, by kind.",
        &[
            ("{kind=\"prefill\"}".into(), get(&metrics.step_prefill_tokens_total)),
            ("{kind=\"decode\"}".into(), get(&metrics.step_decode_tokens_total)),
        ],
    );
    let window = "the sliding-window layers' own KV store";
    for (name, help, gauge) in [
        ("sluice_kv_blocks_used", "KV-cache blocks held by running requests.".into(), &metrics.kv_blocks_used),
        ("sluice_kv_blocks_cached", "KV-cache blocks held only by the prefix cache.".into(), &metrics.kv_blocks_cached),
        ("sluice_kv_blocks_free", "Free KV-cache blocks.".into(), &metrics.kv_blocks_free),
        (
            "sluice_kv_window_blocks_used",
            format!("Blocks of {window} held by running requests (0 without such a store)."),
            &metrics.kv_window_blocks_used,
        ),
        (
            "sluice_kv_window_blocks_free",
            format!("Free blocks of {window} (0 without such a store)."),
            &metrics.kv_window_blocks_free,
        ),
        (
            "sluice_recurrent_state_bytes",
            "Bytes of recurrent-layer state held by running requests (0 without such layers).".into(),
            &metrics.recurrent_state_bytes,
        ),
        (
            "sluice_recurrent_snapshots",
            "Recurrent-state snapshots the prefix cache holds (0 without recurrent layers).".into(),
            &metrics.recurrent_snapshots,
        ),
        (
            "sluice_recurrent_snapshot_bytes",
            "Bytes of the recurrent-state snapshots the prefix cache holds.".into(),
            &metrics.recurrent_snapshot_bytes,
        ),
    ] {
        out.one(name, "gauge", &help, get(gauge));
    }
    out.one(
        "sluice_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        get(&metrics.prefix_cache_hit_tokens_total),
    );

    let mut cumulative = 0u64;
    let mut buckets: Vec<(String, f64)> = Vec::with_capacity(POLICY_CALL_BUCKETS.len() + 1);
    for (index, counter) in metrics.policy_call_buckets.iter().enumerate() {
        cumulative += Metrics::get(counter);
        let bound = POLICY_CALL_BUCKETS.get(index).map_or_else(|| "+Inf".to_owned(), |bound| format!("{bound}"));
        buckets.push((format!("_bucket{{le=\"{bound}\"}}"), cumulative as f64));
    }
    let _ = writeln!(out.0, "# HELP sluice_policy_call_seconds Latency of scheduling policy calls.");
    let _ = writeln!(out.0, "# TYPE sluice_policy_call_seconds histogram");
    for (suffix, value) in buckets {
        let _ = writeln!(out.0, "sluice_policy_call_seconds{suffix} {value}");
    }
    let _ = writeln!(out.0, "sluice_policy_call_seconds_sum {}", get(&metrics.policy_call_nanos_total) / 1e9);
    let _ = writeln!(out.0, "sluice_policy_call_seconds_count {}", get(&metrics.policy_calls_total));

    let faults: Vec<(String, f64)> = metrics
        .policy_faults
        .lock()
        .map(|faults| {
            faults
                .iter()
                .map(|((policy, reason), count)| {
                    (format!("{{policy=\"{}\",reason=\"{}\"}}", label(policy), label(reason)), *count as f64)
                })
                .collect()
        })
        .unwrap_or_default();
    out.family("sluice_policy_faults_total", "counter", "Scheduling policy faults, by policy and reason.", &faults);
    out.one(
        "sluice_policy_fallbacks_total",
        "counter",
        "Switches to the fallback policy.",
        get(&metrics.policy_fallbacks_total),
    );
    shadow_metrics(&mut out, &ready.engine.shadow_records());
    out.one(
        "sluice_trace_steps_dropped_total",
        "counter",
        "Steps the step trace's writer was too far behind to record.",
        get(&metrics.trace_steps_dropped_total),
    );
    let health = ready.engine.health();
    out.one(
        "sluice_policy_degraded",
        "gauge",
        "1 while running on the fallback policy.",
        f64::from(u8::from(matches!(health, Health::Degraded { .. }))),
    );
    out.one(
        "sluice_policy_failed_closed",
        "gauge",
        "1 while the policy has failed closed and requests are refused.",
        f64::from(u8::from(matches!(health, Health::FailedClosed { .. }))),
    );
    out.one(
        "sluice_engine_stopped",
        "gauge",
        "1 once the engine thread has stopped (a restart is needed).",
        f64::from(u8::from(matches!(health, Health::Stopped { .. }))),
    );
    gateway_metrics(&mut out, ready);
    lora_info(&mut out, ready);
    out.0
}

/// What an inference gateway's endpoint picker reads of a model server
/// (the Gateway API Inference Extension's model-server protocol), named as
/// vLLM names them with `sluice_` for `vllm:` (docs/deploy.md).
fn gateway_metrics(out: &mut Exposition, ready: &Ready) {
    let metrics = &ready.engine.shared().metrics;
    let get = |gauge| Metrics::get(gauge) as f64;
    out.one(
        "sluice_num_requests_waiting",
        "gauge",
        "Requests queued for a slot (TotalQueuedRequests).",
        get(&metrics.requests_deferred),
    );
    out.one(
        "sluice_num_requests_running",
        "gauge",
        "Requests holding a slot (TotalRunningRequests).",
        get(&metrics.requests_processing),
    );
    // Blocks only the prefix cache holds are reusable at once, so they
    // count as free, as vLLM counts them.
    let used = get(&metrics.kv_blocks_used);
    let total = used + get(&metrics.kv_blocks_cached) + get(&metrics.kv_blocks_free);
    out.one(
        "sluice_kv_cache_usage_perc",
        "gauge",
        "Fraction of KV-cache blocks held by running requests, 0 to 1 (KVCacheUtilization).",
        if total > 0.0 { used / total } else { 0.0 },
    );
    let config = ready.engine.config();
    out.family(
        "sluice_cache_config_info",
        "gauge",
        "The KV cache's block size in tokens and its number of blocks (labels).",
        &[(format!("{{block_size=\"{}\",num_gpu_blocks=\"{}\"}}", config.kv_block_tokens, total), 1.0)],
    );
}

/// The adapters running and waiting, the way gateways read them for LoRA
/// affinity (vLLM's `vllm:lora_requests_info`): names in the labels, the
/// time of the scrape as the value. Every loaded adapter can serve in any
/// batch, so `max_lora` is how many are loaded.
fn lora_info(out: &mut Exposition, ready: &Ready) {
    let adapters = ready.adapters.list();
    let names = |ids: &mut dyn Iterator<Item = u32>| {
        let mut ids: Vec<u32> = ids.collect();
        ids.sort_unstable();
        ids.dedup();
        let names: Vec<&str> =
            ids.iter().filter_map(|&id| adapters.get(id as usize)).map(|adapter| adapter.name.as_str()).collect();
        label(&names.join(","))
    };
    let slots = ready.engine.slots();
    let running = names(&mut slots.iter().flat_map(|slot| slot.lora.iter().map(|&(id, _)| id)));
    let waiting = ready.engine.shared().waiting_adapters.lock().map(|ids| ids.clone()).unwrap_or_default();
    let waiting = names(&mut waiting.into_iter());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |elapsed| elapsed.as_secs_f64());
    let labels = format!(
        "{{running_lora_adapters=\"{running}\",waiting_lora_adapters=\"{waiting}\",max_lora=\"{}\"}}",
        adapters.len()
    );
    out.family(
        "sluice_lora_requests_info",
        "gauge",
        "LoRA adapters of running and waiting requests (labels); the value is the time of the scrape.",
        &[(labels, now)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn families_have_help_and_type() {
        let mut out = Exposition(String::new());
        out.one("x_total", "counter", "Things.", 3.0);
        assert_eq!(out.0, "# HELP x_total Things.\n# TYPE x_total counter\nx_total 3\n");
    }
}
