//! `/tokenize`, `/detokenize` and `/apply-template`, as llama-server has
//! them.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Value, json};

use super::error::ApiError;
use super::extract::JsonBody;
use super::generate::blocking;
use super::spliced::json_response;
use super::state::{AppState, Ready};
use crate::chat::fields::{Fields, object, wrong};
use crate::chat::messages::chat_prompt;
use sluice_model::tokenizer::Tokenizer;

/// `POST /tokenize`: `content`, `add_special` (false), `parse_special`
/// (true), `with_pieces` (false). The answer is written straight from the
/// ids: a `Value` per token (and a map per piece) cost tens of times the
/// text for a large one.
pub async fn tokenize(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    blocking(move || {
        let fields = Fields(object(&body)?);
        let add_special = fields.bool_or("add_special", false)?;
        let parse_special = fields.bool_or("parse_special", true)?;
        let with_pieces = fields.bool_or("with_pieces", false)?;
        let tokens = match fields.str("content")? {
            Some(content) => {
                let _turn = ready.counter().admit(content, 0)?;
                ready.tokenizer.encode(content, add_special, parse_special)
            }
            None => Vec::new(),
        };
        // About what each token's entry takes, so the body is not regrown.
        let per_token = if with_pieces { 24 } else { 7 };
        let pieces = if with_pieces { piece_bytes(&ready.tokenizer, &tokens) } else { 0 };
        let size = (tokens.len() * per_token).saturating_add(pieces).saturating_add(16);
        answer_fits(&ready, size, "tokenize less text at once, or without `with_pieces`")?;
        let answer = Answer { tokens: Tokens { tokenizer: &ready.tokenizer, ids: &tokens, with_pieces } };
        Ok(json_response(&answer, size))
    })
    .await
}

/// The bytes of the pieces of `ids`.
fn piece_bytes(tokenizer: &Tokenizer, ids: &[u32]) -> usize {
    ids.iter().map(|&id| tokenizer.token_bytes(id).len()).sum()
}

/// Refuse an answer of about `bytes` over `server.limits.response_mib`: it
/// is built whole before it is sent, and a client that reads it slowly
/// holds all of it meanwhile (a text of one-byte tokens makes an answer
/// with pieces 25 times its size).
fn answer_fits(ready: &Ready, bytes: usize, instead: &str) -> Result<(), ApiError> {
    let mib = ready.server_limits.response_mib;
    if mib == 0 || bytes <= mib.saturating_mul(1 << 20) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "the answer would hold about {} MiB, more than an answer may (server.limits.response_mib, {mib}); {instead}",
        bytes >> 20
    )))
}

/// `{"tokens": …}`.
#[derive(Serialize)]
struct Answer<'a> {
    tokens: Tokens<'a>,
}

/// Token ids, or `{id, piece}` objects with each piece as text, or as its
/// bytes when it is not whole UTF-8.
struct Tokens<'a> {
    tokenizer: &'a Tokenizer,
    ids: &'a [u32],
    with_pieces: bool,
}

impl Serialize for Tokens<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if !self.with_pieces {
            return self.ids.serialize(serializer);
        }
        serializer.collect_seq(self.ids.iter().map(|&id| Piece { id, bytes: self.tokenizer.token_bytes(id) }))
    }
}

struct Piece<'a> {
    id: u32,
    bytes: &'a [u8],
}

impl Serialize for Piece<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("id", &self.id)?;
        match std::str::from_utf8(self.bytes) {
            Ok(text) => map.serialize_entry("piece", text)?,
            Err(_) => map.serialize_entry("piece", self.bytes)?,
        }
        map.end()
    }
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
        answer_fits(&ready, piece_bytes(&ready.tokenizer, &ids), "detokenize fewer tokens at once")?;
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
        Ok(Json(json!({ "prompt": chat_prompt(&ready.template, ready.counter(), fields, thinking)? })))
    })
    .await
}
