//! The API key: `Authorization: Bearer <key>` or `X-Api-Key: <key>` on
//! every endpoint but `/health`. Keys are compared as SHA-256 digests in
//! constant time, so neither the key's content nor its length shows in the
//! timing of a refusal.

use axum::extract::Request;
use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

/// The configured key, kept only as its digest.
#[derive(Clone)]
pub struct ApiKey([u8; 32]);

impl ApiKey {
    pub fn new(key: &str) -> Self {
        ApiKey(Sha256::digest(key.as_bytes()).into())
    }

    /// Whether `candidate` is the key.
    pub fn matches(&self, candidate: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(candidate.as_bytes()).into();
        // Fold every byte difference so the loop runs in full whatever the
        // first mismatch.
        digest.iter().zip(self.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// Paths served without a key (llama-server's public endpoints).
fn is_public(path: &str) -> bool {
    matches!(path, "/health" | "/v1/health")
}

/// The key a request presents, if any.
fn presented(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()) {
        return Some(value.strip_prefix("Bearer ").unwrap_or(value).trim());
    }
    headers.get("x-api-key").and_then(|value| value.to_str().ok()).map(str::trim)
}

/// Whether a request may pass: no key is configured, its path is public,
/// or it presents the key.
pub fn admits(key: Option<&ApiKey>, request: &Request) -> bool {
    match key {
        None => true,
        Some(_) if is_public(request.uri().path()) => true,
        Some(key) => presented(request.headers()).is_some_and(|candidate| key.matches(candidate)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let key = ApiKey::new("secret");
        assert!(key.matches("secret"));
        assert!(!key.matches("secret "));
        assert!(!key.matches("Secret"));
        assert!(!key.matches(""));
    }

    #[test]
    fn bearer_and_x_api_key_are_read() {
        let mut headers = HeaderMap::new();
        assert_eq!(presented(&headers), None);
        headers.insert("x-api-key", "k1".parse().expect("header"));
        assert_eq!(presented(&headers), Some("k1"));
        headers.insert(header::AUTHORIZATION, "Bearer k2".parse().expect("header"));
        assert_eq!(presented(&headers), Some("k2"));
    }
}
