//! LoRA adapters over HTTP (docs/lora.md): `GET /lora-adapters` lists
//! them, `POST /lora-adapters` sets the global scales.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::error::ApiError;
use super::extract::JsonBody;
use super::state::AppState;

/// `GET /lora-adapters`: `[{id, path, scale, task_name, prompt_prefix}]`
/// (llama-server's fields) plus each adapter's `name`.
pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let scales = ready.adapters.scales();
    let list: Vec<Value> = ready
        .adapters
        .list()
        .iter()
        .zip(scales)
        .enumerate()
        .map(|(id, (adapter, scale))| {
            json!({
                "id": id,
                "path": adapter.path.display().to_string(),
                "scale": scale,
                "task_name": adapter.task_name,
                "prompt_prefix": adapter.prompt_prefix,
                "name": adapter.name,
            })
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

/// `POST /lora-adapters`: `[{"id", "scale"}]` sets the global scales
/// (unlisted adapters: 0) for requests that arrive from now on.
pub async fn set(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    ready.adapters.set_scales(&body, "body")?;
    Ok(Json(json!({ "success": true })))
}
