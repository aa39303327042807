//! Google Cloud Vertex AI's prediction protocol, as llama-server serves it
//! when `AIP_MODE=PREDICTION`: `AIP_HTTP_PORT` replaces the port,
//! `AIP_HEALTH_ROUTE` also answers as `/health`, and `AIP_PREDICT_ROUTE`
//! (`/predict`) takes `{"instances": [...]}`, each instance naming one of the
//! POST routes in `@requestFormat` (a camelCase alias such as
//! `chatCompletions`, or the path itself) and answered by that route.
//!
//! Instances go through the API router itself, headers and all, so the API
//! key, the body limit and every handler apply to them exactly as to a
//! direct request.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{self, HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::Json;
use axum::routing::{get, post};
use serde_json::{Map, Value, json};
use tower::ServiceExt;

use crate::http::error::{ApiError, ErrorType};
use crate::http::extract::JsonBody;
use crate::http::info;
use crate::http::state::AppState;

/// llama-server's bound on the instances of one prediction request.
const MAX_INSTANCES: usize = 128;

/// The port Vertex AI gives a container that sets no `AIP_HTTP_PORT`.
const DEFAULT_PORT: u16 = 8080;

/// The prediction settings, read once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Replaces the configured port.
    pub port: u16,
    pub predict_route: String,
    /// A further path answering as `/health`; `None` when unset or when it
    /// is already a GET route, which keeps it (as in llama-server, where the
    /// first handler of a path wins).
    pub health_route: Option<String>,
}

/// Why the prediction settings refuse the start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error("AIP_HTTP_PORT={0:?} is not a port number")]
    Port(String),
    #[error("{name}={route:?} is not a route path (no `{{`, `}}`, or segment starting with `:` or `*`)")]
    Route { name: &'static str, route: String },
    #[error("AIP_PREDICT_ROUTE={0} conflicts with an existing route")]
    Conflict(String),
}

/// The API's paths: what instances name, and what the prediction routes
/// must not take over.
#[derive(Debug, Clone)]
pub struct Paths {
    pub get: Vec<&'static str>,
    pub post: Vec<&'static str>,
}

impl Settings {
    /// The settings of this process's environment; `None` unless
    /// `AIP_MODE=PREDICTION`.
    pub fn from_env(paths: &Paths) -> Result<Option<Settings>, SettingsError> {
        Settings::parse(|name| std::env::var(name).ok(), paths)
    }

    /// The settings `var` gives (a variable's value by name); empty values
    /// count as unset, as in llama-server.
    pub fn parse(var: impl Fn(&str) -> Option<String>, paths: &Paths) -> Result<Option<Settings>, SettingsError> {
        let var = |name: &str| var(name).filter(|value| !value.is_empty());
        if var("AIP_MODE").as_deref() != Some("PREDICTION") {
            return Ok(None);
        }
        let port = match var("AIP_HTTP_PORT") {
            Some(port) => port.trim().parse().map_err(|_| SettingsError::Port(port))?,
            None => DEFAULT_PORT,
        };
        let predict_route = route("AIP_PREDICT_ROUTE", var("AIP_PREDICT_ROUTE").as_deref().unwrap_or("/predict"))?;
        let gets = &paths.get;
        if gets.iter().chain(&paths.post).any(|path| *path == predict_route) {
            return Err(SettingsError::Conflict(predict_route));
        }
        let health_route = var("AIP_HEALTH_ROUTE")
            .map(|health| route("AIP_HEALTH_ROUTE", &health))
            .transpose()?
            .filter(|health| !gets.contains(&health.as_str()));
        Ok(Some(Settings { port, predict_route, health_route }))
    }
}

/// `value` as a path with its leading `/`, refused where the router would
/// read it as a capture or refuse it.
fn route(name: &'static str, value: &str) -> Result<String, SettingsError> {
    let path = if value.starts_with('/') { value.to_owned() } else { format!("/{value}") };
    let bad_segment = path.split('/').any(|segment| segment.starts_with([':', '*']));
    if bad_segment || path.contains(['{', '}']) {
        return Err(SettingsError::Route { name, route: path });
    }
    Ok(path)
}

/// A path's `@requestFormat` alias as llama-server derives it: a leading
/// `/v1` and `/` dropped, then camelCase at each `/`, `-` and `_`, up to a
/// path parameter: `/v1/chat/completions` → `chatCompletions`.
pub fn alias(path: &str) -> String {
    // llama-server drops a leading "/v1" from any longer path, not only "/v1/…".
    let rest = if path.len() > 3 { path.strip_prefix("/v1").unwrap_or(path) } else { path };
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    let mut alias = String::with_capacity(rest.len());
    let mut upper = false;
    for c in rest.chars() {
        match c {
            '{' => break,
            '/' | '-' | '_' => upper = true,
            c => {
                alias.push(if upper { c.to_ascii_uppercase() } else { c });
                upper = false;
            }
        }
    }
    alias
}

/// Add the prediction routes to `routes`; `api` (the router without them)
/// answers the instances.
pub fn add_routes(
    routes: Router<AppState>,
    settings: &Settings,
    api: Router,
    posts: &[&'static str],
) -> Router<AppState> {
    let dispatch = Arc::new(Dispatch::new(api, posts));
    let predict = post(move |uri: Uri, headers: HeaderMap, JsonBody(body): JsonBody| {
        let dispatch = Arc::clone(&dispatch);
        async move {
            let (body, _turn) = body.into_parts();
            dispatch.predict(&uri, &headers, body).await
        }
    });
    let routes = routes.route(&settings.predict_route, predict);
    match &settings.health_route {
        Some(health) => routes.route(health, get(info::health)),
        None => routes,
    }
}

struct Dispatch {
    api: Router,
    /// `@requestFormat` → POST path: every alias (the first path listed
    /// wins) and every path by itself; the two never clash, as only paths
    /// start with `/`.
    targets: HashMap<String, &'static str>,
}

impl Dispatch {
    fn new(api: Router, posts: &[&'static str]) -> Self {
        let mut targets = HashMap::new();
        for path in posts {
            targets.entry(alias(path)).or_insert(*path);
        }
        targets.extend(posts.iter().map(|path| ((*path).to_owned(), *path)));
        Dispatch { api, targets }
    }

    async fn predict(&self, uri: &Uri, headers: &HeaderMap, body: Value) -> Result<Json<Value>, ApiError> {
        let Value::Object(mut body) = body else {
            return Err(ApiError::invalid("request body must be a JSON object"));
        };
        let Some(Value::Array(instances)) = body.remove("instances") else {
            return Err(ApiError::invalid("request body must include an array field named instances"));
        };
        if instances.len() > MAX_INSTANCES {
            return Err(ApiError::invalid(format!("instances array exceeds maximum size of {MAX_INSTANCES}")));
        }
        let answers = instances.into_iter().map(|instance| self.instance(uri, headers, instance));
        let predictions = futures_util::future::join_all(answers).await;
        Ok(Json(json!({ "predictions": predictions })))
    }

    /// One instance's prediction: its route's JSON answer, error bodies
    /// included.
    async fn instance(&self, uri: &Uri, headers: &HeaderMap, instance: Value) -> Value {
        let Value::Object(mut payload) = instance else {
            return ApiError::invalid("each instance must be a JSON object").body();
        };
        // The rest of the instance is the route's body, in the order given
        // (chat templates see it).
        let Some(Value::String(format)) = payload.shift_remove("@requestFormat") else {
            return ApiError::invalid("each instance must include a string @requestFormat").body();
        };
        let Some(path) = self.targets.get(&format) else {
            return ApiError::invalid(format!("no handler registered for @requestFormat: {format}")).body();
        };
        if payload.contains_key("stream") {
            tracing::warn!("ignoring an instance's stream field: the predict route does not stream");
            payload.insert("stream".to_owned(), Value::Bool(false));
        }
        match self.send(path, uri, headers, payload).await {
            Ok(answer) => answer,
            Err(error) => error.body(),
        }
    }

    async fn send(
        &self,
        path: &str,
        uri: &Uri,
        headers: &HeaderMap,
        payload: Map<String, Value>,
    ) -> Result<Value, ApiError> {
        let internal = |error: &dyn std::fmt::Display| ApiError::new(ErrorType::Server, error.to_string());
        let target = match uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path.to_owned(),
        };
        let body = serde_json::to_vec(&payload).map_err(|error| internal(&error))?;
        let mut request = http::Request::builder()
            .method(Method::POST)
            .uri(target)
            .body(Body::from(body))
            .map_err(|error| internal(&error))?;
        let forwarded = request.headers_mut();
        *forwarded = headers.clone();
        // The outer request's framing does not describe the new body.
        forwarded.remove(header::CONTENT_LENGTH);
        forwarded.remove(header::TRANSFER_ENCODING);
        forwarded.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let response = match self.api.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.map_err(|error| internal(&error))?;
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        // A body that is not JSON comes back as a string, as in llama-server.
        Ok(serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routes in the order and of the kinds the API has (its own table is
    /// checked end to end in `http_vertex`).
    fn paths() -> Paths {
        Paths {
            get: vec!["/health", "/props"],
            post: vec!["/completion", "/completions", "/v1/completions", "/v1/chat/completions", "/chat/completions"],
        }
    }

    fn parse(vars: &[(&str, &str)]) -> Result<Option<Settings>, SettingsError> {
        let var = |name: &str| vars.iter().find(|(key, _)| *key == name).map(|(_, value)| (*value).to_owned());
        Settings::parse(var, &paths())
    }

    #[test]
    fn aliases_follow_llama_server() {
        for (path, expected) in [
            ("/v1/chat/completions", "chatCompletions"),
            ("/chat/completions", "chatCompletions"),
            ("/apply-template", "applyTemplate"),
            ("/completion", "completion"),
            ("/v1/messages/count_tokens", "messagesCountTokens"),
            ("/v1/responses/input_tokens", "responsesInputTokens"),
            ("/slots/{id_slot}", "slots"),
            ("/v1", "v1"),
            ("/", ""),
        ] {
            assert_eq!(alias(path), expected, "{path}");
        }
    }

    #[test]
    fn the_first_path_of_an_alias_wins_and_paths_stand_for_themselves() {
        let dispatch = Dispatch::new(Router::new(), &paths().post);
        assert_eq!(dispatch.targets.get("completions"), Some(&"/completions"));
        assert_eq!(dispatch.targets.get("chatCompletions"), Some(&"/v1/chat/completions"));
        assert_eq!(dispatch.targets.get("/completion"), Some(&"/completion"));
        assert_eq!(dispatch.targets.get("health"), None, "GET routes take no instances");
    }

    #[test]
    fn settings_need_prediction_mode() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&[("AIP_MODE", "prediction"), ("AIP_HTTP_PORT", "9000")]), Ok(None));
        let defaults = Settings { port: 8080, predict_route: "/predict".into(), health_route: None };
        assert_eq!(parse(&[("AIP_MODE", "PREDICTION")]), Ok(Some(defaults.clone())));
        let empty =
            [("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", ""), ("AIP_PREDICT_ROUTE", ""), ("AIP_HEALTH_ROUTE", "")];
        assert_eq!(parse(&empty), Ok(Some(defaults)));
    }

    #[test]
    fn settings_read_port_and_routes() {
        let vars = [
            ("AIP_MODE", "PREDICTION"),
            ("AIP_HTTP_PORT", "9001"),
            ("AIP_PREDICT_ROUTE", "v1/endpoints/e/predict"),
            ("AIP_HEALTH_ROUTE", "/ping"),
        ];
        let expected = Settings {
            port: 9001,
            predict_route: "/v1/endpoints/e/predict".into(),
            health_route: Some("/ping".into()),
        };
        assert_eq!(parse(&vars), Ok(Some(expected)));
        // A GET route keeps its own handler; a POST-only path can also answer GET.
        let health = |route| {
            parse(&[("AIP_MODE", "PREDICTION"), ("AIP_HEALTH_ROUTE", route)]).map(|s| s.and_then(|s| s.health_route))
        };
        assert_eq!(health("/props"), Ok(None));
        assert_eq!(health("/completion"), Ok(Some("/completion".into())));
    }

    #[test]
    fn settings_refuse_bad_ports_and_routes() {
        let with = |name, value| parse(&[("AIP_MODE", "PREDICTION"), (name, value)]);
        assert_eq!(with("AIP_HTTP_PORT", "http"), Err(SettingsError::Port("http".into())));
        assert_eq!(with("AIP_HTTP_PORT", "70000"), Err(SettingsError::Port("70000".into())));
        assert_eq!(with("AIP_PREDICT_ROUTE", "/completion"), Err(SettingsError::Conflict("/completion".into())));
        assert_eq!(with("AIP_PREDICT_ROUTE", "health"), Err(SettingsError::Conflict("/health".into())));
        for bad in ["/p/{x}", "/p/:x", "*p", "/p}"] {
            assert!(matches!(with("AIP_PREDICT_ROUTE", bad), Err(SettingsError::Route { .. })), "{bad}");
            assert!(matches!(with("AIP_HEALTH_ROUTE", bad), Err(SettingsError::Route { .. })), "{bad}");
        }
    }
}
