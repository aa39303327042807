//! Request bodies as axum extractors: read within the size limit and the
//! body timeout, each with its turn among large bodies (`bodies`), every
//! failure a JSON error.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::http::header::CONTENT_LENGTH;
use serde_json::Value;

use super::bodies::{self, Turn};
use super::error::ApiError;
use super::state::AppState;

/// A request body parsed as JSON, with its turn among large bodies
/// (`bodies`), which lasts while the value does.
pub struct JsonBody(pub Parsed);

/// A parsed body and its turn; it reads as the value.
pub struct Parsed {
    value: Value,
    turn: Turn,
}

impl Parsed {
    /// The value, owned, and the turn to keep while it lives.
    pub fn into_parts(self) -> (Value, Turn) {
        (self.value, self.turn)
    }
}

impl std::ops::Deref for Parsed {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.value
    }
}

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let RawBody(bytes, turn) = RawBody::from_request(request, state).await?;
        serde_json::from_slice(&bytes)
            .map(|value| JsonBody(Parsed { value, turn }))
            .map_err(|error| ApiError::invalid(format!("the request body is not valid JSON: {error}")))
    }
}

/// A request body as bytes, within the size limit and the body timeout,
/// every failure a JSON error; with its turn among large bodies.
pub struct RawBody(pub Bytes, pub Turn);

impl FromRequest<AppState> for RawBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.config().server.limits.body_bytes;
        // A declared length over the limit is refused before any of the
        // body is awaited: a client that declares a terabyte and sends a
        // few bytes must not hold the handler until the body timeout.
        let declared = request.headers().get(CONTENT_LENGTH).and_then(|length| length.to_str().ok());
        let declared = declared.and_then(|length| length.trim().parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit as u64) {
            return Err(ApiError::too_large(limit));
        }
        // A declared body takes its turn before it is read; one that
        // declares no length, once it is (its size is known then).
        let early = match declared {
            Some(length) => Some(state.bodies().enter(length as usize).await?),
            None => None,
        };
        let reading = Bytes::from_request(request, state);
        // A client that sends its body slowly must not hold the handler.
        let read = match state.config().server.timeouts.body_s {
            0 => reading.await,
            seconds => tokio::time::timeout(Duration::from_secs(seconds), reading)
                .await
                .map_err(|_| ApiError::body_timeout(seconds))?,
        };
        let bytes = read.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(limit)
            } else {
                ApiError::invalid(format!("cannot read the request body: {}", rejection.body_text()))
            }
        })?;
        let held = bodies::held(&bytes);
        let turn = match early {
            Some(turn) => state.bodies().widen(turn, held).await?,
            None => state.bodies().enter(held).await?,
        };
        Ok(RawBody(bytes, turn))
    }
}
