//! CORS as llama-server answers it: every response names the allowed
//! origin, and a preflight `OPTIONS` is answered before the loading gate and
//! the API key (browsers send preflights without credentials).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::state::AppState;

const ALLOW_METHODS: &str = "GET, POST, DELETE, OPTIONS";

/// The `Access-Control-Allow-Origin` value for a request, if any.
fn allowed_origin(configured: &str, request: &HeaderMap) -> Option<HeaderValue> {
    let origin = request.get(header::ORIGIN);
    match configured {
        // With credentials allowed, "*" is not valid: echo the origin.
        "*" => origin.cloned(),
        "localhost" => origin.filter(|origin| origin.to_str().is_ok_and(is_local_origin)).cloned(),
        fixed => HeaderValue::from_str(fixed).ok(),
    }
}

/// `scheme://localhost[:port]`, `scheme://127.0.0.1[:port]` or `scheme://[::1][:port]`.
fn is_local_origin(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else { return false };
    let host = match rest.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']').map_or("", |(host, _)| host),
        None => rest.split(':').next().unwrap_or(""),
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

pub async fn cors(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let origin = allowed_origin(&state.config().server.cors_origins, request.headers());
    let mut response = if request.method() == Method::OPTIONS {
        let mut preflight = StatusCode::OK.into_response();
        let headers = preflight.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(ALLOW_METHODS));
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("*"));
        preflight
    } else {
        next.run(request).await
    };
    if let Some(origin) = origin {
        response.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(origin: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ORIGIN, HeaderValue::from_str(origin).expect("header"));
        headers
    }

    #[test]
    fn origins_are_echoed_filtered_or_fixed() {
        let remote = headers("https://example.org");
        assert_eq!(allowed_origin("*", &remote), Some(HeaderValue::from_static("https://example.org")));
        assert_eq!(allowed_origin("*", &HeaderMap::new()), None);
        assert_eq!(allowed_origin("localhost", &remote), None);
        for local in ["http://localhost:5173", "http://127.0.0.1", "http://[::1]:8080"] {
            assert!(allowed_origin("localhost", &headers(local)).is_some(), "{local}");
        }
        assert_eq!(allowed_origin("https://app.test", &remote), Some(HeaderValue::from_static("https://app.test")));
        assert!(!is_local_origin("http://localhost.evil.test"));
    }
}
