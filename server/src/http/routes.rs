//! The route table and the layers every request passes: its span, CORS,
//! the loading gate, the API key and the body limit.

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use tracing::Instrument;

use super::api::{anthropic, completion, openai, responses, vertex};
use super::error::{ApiError, ErrorType};
use super::state::AppState;
use super::{admin, auth, cors, info, lora, slot_files, tokenize};

/// The GET routes.
fn get_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/health", get(info::health)),
        ("/v1/health", get(info::health)),
        ("/props", get(info::props)),
        ("/v1/models", get(info::models)),
        ("/models", get(info::models)),
        ("/slots", get(info::slots)),
        ("/metrics", get(info::metrics)),
        ("/lora-adapters", get(lora::list)),
        ("/admin/policy/shadow", get(admin::shadow_report)),
    ]
}

/// The POST routes: also what Vertex AI instances can name, where an alias
/// shared by several paths names the first (`completions`: `/completions`).
fn post_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/completion", post(completion::completion)),
        ("/completions", post(completion::completion)),
        ("/v1/completions", post(openai::completions)),
        ("/v1/chat/completions", post(openai::chat)),
        ("/chat/completions", post(openai::chat)),
        ("/v1/chat/completions/input_tokens", post(responses::chat_input_tokens)),
        ("/chat/completions/input_tokens", post(responses::chat_input_tokens)),
        ("/v1/responses", post(responses::responses)),
        ("/responses", post(responses::responses)),
        ("/v1/responses/input_tokens", post(responses::responses_input_tokens)),
        ("/responses/input_tokens", post(responses::responses_input_tokens)),
        ("/v1/messages", post(anthropic::messages)),
        ("/v1/messages/count_tokens", post(anthropic::count_tokens)),
        ("/tokenize", post(tokenize::tokenize)),
        ("/detokenize", post(tokenize::detokenize)),
        ("/apply-template", post(tokenize::apply_template)),
        ("/props", post(info::set_props)),
        ("/slots/{id_slot}", post(slot_files::action)),
        ("/lora-adapters", post(lora::set)),
        ("/admin/policy", post(admin::replace_policy)),
        ("/admin/policy/shadow", post(admin::attach_shadow).delete(admin::detach_shadow)),
        ("/admin/policy/promote", post(admin::promote)),
    ]
}

/// The paths of the routes, which Vertex AI's instances name.
pub fn paths() -> vertex::Paths {
    let paths = |routes: Vec<(&'static str, _)>| routes.into_iter().map(|(path, _)| path).collect();
    vertex::Paths { get: paths(get_routes()), post: paths(post_routes()) }
}

/// Every route, behind the request span, CORS, the loading gate and the
/// API key; with `vertex`, also Vertex AI's prediction routes.
pub fn router(state: AppState, vertex: Option<&vertex::Settings>) -> Router {
    let routes = || {
        get_routes()
            .into_iter()
            .chain(post_routes())
            .fold(Router::new(), |router, (path, method)| router.route(path, method))
    };
    let api = layered(routes(), state.clone());
    match vertex {
        Some(settings) => layered(vertex::add_routes(routes(), settings, api, &paths().post), state),
        None => api,
    }
}

fn layered(routes: Router<AppState>, state: AppState) -> Router {
    let body_limit = state.config().server.limits.body_bytes;
    routes
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .layer(middleware::from_fn_with_state(state.clone(), loading_gate))
        .layer(middleware::from_fn_with_state(state.clone(), cors::cors))
        .layer(middleware::from_fn_with_state(state.clone(), request_span))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Unknown paths (and known paths with another method), as llama-server
/// answers them.
async fn not_found() -> ApiError {
    ApiError::not_found()
}

/// 401 for a request without the right key.
async fn require_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if auth::admits(state.api_key(), &request) {
        next.run(request).await
    } else {
        ApiError::new(ErrorType::Authentication, "Invalid API Key").into_response()
    }
}

/// 503 "Loading model" on every path until the model is loaded.
async fn loading_gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match state.ready() {
        Ok(_) => next.run(request).await,
        Err(loading) => loading.into_response(),
    }
}

/// One span per request, carrying its id; the id is also sent back in
/// `X-Request-Id`.
async fn request_span(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let id = state.next_request_id();
    let span = tracing::info_span!("request", id, method = %request.method(), path = %request.uri().path());
    async move {
        let started = Instant::now();
        let mut response = next.run(request).await;
        let status = response.status().as_u16();
        tracing::info!(status, ms = started.elapsed().as_secs_f64() * 1e3, "handled");
        response.headers_mut().insert("x-request-id", HeaderValue::from(id));
        response
    }
    .instrument(span)
    .await
}
