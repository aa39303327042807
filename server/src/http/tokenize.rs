//! `/tokenize`, `/detokenize` and `/apply-template`, as llama-server has
//! them.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::generate::blocking;
use super::openai::chat_prompt;
use super::params::{Fields, JsonBody, object, wrong};

/// `POST /tokenize`: `content`, `add_special` (false), `parse_special`
/// (true), `with_pieces` (false).
pub async fn tokenize(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    blocking(move || {
        let fields = Fields(object(&body)?);
        let add_special = fields.bool_or("add_special", false)?;
        let parse_special = fields.bool_or("parse_special", true)?;
        let with_pieces = fields.bool_or("with_pieces", false)?;
        let Some(content) = fields.str("content")? else { return Ok(Json(json!({ "tokens": [] }))) };
        let tokens = ready.tokenizer.encode(content, add_special, parse_special);
        if !with_pieces {
            return Ok(Json(json!({ "tokens": tokens })));
        }
        let pieces: Vec<Value> = tokens
            .iter()
            .map(|&id| {
                // A piece that is not whole UTF-8 is given as its bytes.
                let bytes = ready.tokenizer.token_bytes(id);
                let piece = match std::str::from_utf8(bytes) {
                    Ok(text) => json!(text),
                    Err(_) => json!(bytes),
                };
                json!({ "id": id, "piece": piece })
            })
            .collect();
        Ok(Json(json!({ "tokens": pieces })))
    })
    .await
}

/// `POST /detokenize`: `tokens` → `content`.
pub async fn detokenize(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    blocking(move || {
        let fields = Fields(object(&body)?);
        let Some(tokens) = fields.get("tokens") else { return Ok(Json(json!({ "content": "" }))) };
        let items = tokens.as_array().ok_or_else(|| wrong("tokens", "an array of token ids"))?;
        let n_vocab = ready.model.n_vocab as u64;
        let ids = items
            .iter()
            .map(|item| {
                let id = item.as_u64().ok_or_else(|| wrong("tokens", "an array of token ids"))?;
                if id >= n_vocab {
                    return Err(ApiError::invalid(format!(
                        "`tokens`: token id {id} is outside the vocabulary of {n_vocab}"
                    )));
                }
                Ok(id as u32)
            })
            .collect::<Result<Vec<u32>, ApiError>>()?;
        Ok(Json(json!({ "content": ready.tokenizer.decode(&ids) })))
    })
    .await
}

/// `POST /apply-template`: `messages` → the rendered `prompt`.
pub async fn apply_template(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let thinking = state.config().defaults.reasoning;
    blocking(move || {
        let fields = Fields(object(&body)?);
        Ok(Json(json!({ "prompt": chat_prompt(&ready, fields, thinking)? })))
    })
    .await
}
