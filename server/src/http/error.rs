//! API errors, mapped to HTTP in this one place. The body is llama-server's
//! `{"error":{"code","message","type"}}` with its types and status codes.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::chat;
use sluice_engine::SubmitError;
use sluice_engine::request::EngineError;

/// llama-server's error types, each with its status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    InvalidRequest,
    Authentication,
    NotFound,
    Permission,
    Server,
    NotSupported,
    Unavailable,
    ExceedContextSize,
}

impl ErrorType {
    pub fn status(self) -> StatusCode {
        match self {
            ErrorType::InvalidRequest | ErrorType::ExceedContextSize => StatusCode::BAD_REQUEST,
            ErrorType::Authentication => StatusCode::UNAUTHORIZED,
            ErrorType::NotFound => StatusCode::NOT_FOUND,
            ErrorType::Permission => StatusCode::FORBIDDEN,
            ErrorType::Server => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::NotSupported => StatusCode::NOT_IMPLEMENTED,
            ErrorType::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorType::InvalidRequest => "invalid_request_error",
            ErrorType::Authentication => "authentication_error",
            ErrorType::NotFound => "not_found_error",
            ErrorType::Permission => "permission_error",
            ErrorType::Server => "server_error",
            ErrorType::NotSupported => "not_supported_error",
            ErrorType::Unavailable => "unavailable_error",
            ErrorType::ExceedContextSize => "exceed_context_size_error",
        }
    }
}

/// An error answer: type, message, and the extra fields some types carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub kind: ErrorType,
    pub message: String,
    /// Status override (413 for a body over the limit, which llama-server
    /// has no type for).
    pub status: Option<StatusCode>,
    /// Extra keys of the error object (`n_prompt_tokens`, `n_ctx`, …).
    pub extra: Vec<(&'static str, Value)>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

/// The longest message an answer carries. Messages quote what the client
/// sent so that it can find its mistake; a quoted value of megabytes is
/// cut here rather than sent back whole.
const MESSAGE_BYTES: usize = 2048;

impl ApiError {
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        ApiError { kind, message: clipped(message.into()), status: None, extra: Vec::new(), retry_after: None }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorType::InvalidRequest, message)
    }

    /// 501 for a feature sluice does not implement yet; `what` names it.
    pub fn unsupported(what: &str) -> Self {
        chat::Error::Unsupported(what.to_owned()).into()
    }

    pub fn loading() -> Self {
        Self::new(ErrorType::Unavailable, "Loading model")
    }

    pub fn not_found() -> Self {
        Self::new(ErrorType::NotFound, "File Not Found")
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: Some(StatusCode::PAYLOAD_TOO_LARGE),
            ..Self::invalid(format!("the request body is larger than the limit of {limit} bytes"))
        }
    }

    pub fn body_timeout(seconds: u64) -> Self {
        ApiError {
            status: Some(StatusCode::REQUEST_TIMEOUT),
            ..Self::invalid(format!("the request body did not arrive within {seconds} s"))
        }
    }

    pub fn with(mut self, key: &'static str, value: Value) -> Self {
        self.extra.push((key, value));
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or(self.kind.status())
    }

    /// The `{"error": {...}}` object, also sent as an SSE event when a
    /// stream fails after its first token.
    pub fn body(&self) -> Value {
        let mut error = json!({
            "code": self.status().as_u16(),
            "message": self.message,
            "type": self.kind.name(),
        });
        if let Some(object) = error.as_object_mut() {
            for (key, value) in &self.extra {
                object.insert((*key).to_owned(), value.clone());
            }
        }
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<SubmitError> for ApiError {
    fn from(error: SubmitError) -> Self {
        match error {
            // A retry may fit, here or (shutting down) on another replica.
            SubmitError::QueueFull(_) | SubmitError::ShuttingDown => {
                ApiError { retry_after: Some(1), ..ApiError::new(ErrorType::Unavailable, error.to_string()) }
            }
            SubmitError::Unavailable(message) => ApiError::new(ErrorType::Unavailable, message),
            SubmitError::ExceedsContext { n_prompt_tokens, n_ctx } => exceeds_context(n_prompt_tokens, n_ctx),
            SubmitError::EmptyPrompt | SubmitError::Images(_) | SubmitError::Adapter(_) => {
                ApiError::invalid(error.to_string())
            }
        }
    }
}

impl From<chat::Error> for ApiError {
    fn from(error: chat::Error) -> Self {
        let message = error.to_string();
        match error {
            chat::Error::Invalid(_) => ApiError::invalid(message),
            chat::Error::Unsupported(_) => ApiError::new(ErrorType::NotSupported, message),
            chat::Error::ExceedsContext { least, n_ctx } => ApiError::new(ErrorType::ExceedContextSize, message)
                .with("n_prompt_tokens", json!(least))
                .with("n_ctx", json!(n_ctx)),
            // Another turn may come soon.
            chat::Error::Busy { .. } => {
                ApiError { retry_after: Some(1), ..ApiError::new(ErrorType::Unavailable, message) }
            }
            chat::Error::Server(_) => ApiError::new(ErrorType::Server, message),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Unavailable(message) => ApiError::new(ErrorType::Unavailable, message),
            EngineError::ResourceExhausted(message) => ApiError::new(ErrorType::Unavailable, message),
            EngineError::Internal(message) => ApiError::new(ErrorType::Server, message),
            EngineError::ClientBehind(message) => ApiError::invalid(message),
        }
    }
}

fn clipped(mut message: String) -> String {
    if message.len() <= MESSAGE_BYTES {
        return message;
    }
    let whole = message.len();
    let mut end = MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(&format!("… (cut; the message had {whole} bytes)"));
    message
}

/// llama-server's error for a prompt that does not fit the context.
pub fn exceeds_context(n_prompt_tokens: usize, n_ctx: usize) -> ApiError {
    ApiError::new(
        ErrorType::ExceedContextSize,
        format!("the request exceeds the available context size ({n_prompt_tokens} prompt tokens, context {n_ctx})"),
    )
    .with("n_prompt_tokens", json!(n_prompt_tokens))
    .with("n_ctx", json!(n_ctx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_follow_llama_server() {
        let body = ApiError::loading().body();
        assert_eq!(body, json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}));
        let exceeded = ApiError::from(SubmitError::ExceedsContext { n_prompt_tokens: 9, n_ctx: 8 });
        assert_eq!(exceeded.status(), StatusCode::BAD_REQUEST);
        assert_eq!(exceeded.body()["error"]["type"], "exceed_context_size_error");
        assert_eq!(
            (exceeded.body()["error"]["n_prompt_tokens"].clone(), exceeded.body()["error"]["n_ctx"].clone()),
            (json!(9), json!(8))
        );
        let full = ApiError::from(SubmitError::QueueFull(3));
        assert_eq!((full.status(), full.retry_after), (StatusCode::SERVICE_UNAVAILABLE, Some(1)));
        assert_eq!(ApiError::too_large(10).body()["error"]["code"], 413);
    }

    #[test]
    fn a_message_quoting_megabytes_is_cut() {
        let message = format!("`x` must be a number, not \"{}é\"", "a".repeat(10 << 20));
        let error = ApiError::invalid(message.clone());
        assert!(error.message.len() < MESSAGE_BYTES + 64, "{}", error.message.len());
        assert!(error.message.starts_with("`x` must be a number, not \"aaa"), "{}", &error.message[..40]);
        assert!(error.message.ends_with(&format!("(cut; the message had {} bytes)", message.len())));
        // A cut inside a character stays on its boundary.
        let wide = "é".repeat(MESSAGE_BYTES);
        assert!(ApiError::invalid(wide).message.starts_with('é'));
        assert_eq!(ApiError::invalid("short").message, "short");
    }
}
