//! The server as the test's own code sees it: every endpoint but /health
//! needs the API key, so one client carries it for the clients, the fault
//! schedule and the checks alike.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::blocking::{Client, Response};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::Value;

use crate::http::Server;

/// Bound on one request of the load, streams included: past it the request
/// counts as hung.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(45);
/// Bound on a control request (metrics, props, a reload).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Api {
    pub client: Client,
    base: String,
    pid: u32,
}

impl Api {
    pub fn new(server: &Server, key: &str) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {key}")).expect("ascii key"));
        let client = Client::builder().default_headers(headers).timeout(REQUEST_TIMEOUT).build().expect("http client");
        Api { client, base: server.url(""), pid: server.pid() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The server's listening address, for raw connections.
    pub fn address(&self) -> std::net::SocketAddr {
        self.base.trim_start_matches("http://").trim_end_matches('/').parse().expect("an address")
    }

    /// GET a JSON answer: its status and body (`Null` when not JSON).
    pub fn get(&self, path: &str) -> Result<(u16, Value), String> {
        let response = self.client.get(self.url(path)).timeout(CONTROL_TIMEOUT).send();
        read(response)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<(u16, Value), String> {
        let response = self.client.post(self.url(path)).json(body).timeout(CONTROL_TIMEOUT).send();
        read(response)
    }

    /// Every sample of `/metrics`, by name with its labels.
    pub fn metrics(&self) -> Result<BTreeMap<String, f64>, String> {
        let text = self
            .client
            .get(self.url("/metrics"))
            .timeout(CONTROL_TIMEOUT)
            .send()
            .and_then(Response::text)
            .map_err(|error| format!("GET /metrics: {error}"))?;
        Ok(text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' '))
            .filter_map(|(name, value)| Some((name.to_owned(), value.trim().parse().ok()?)))
            .collect())
    }

    /// The server's resident memory (VmRSS) in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        crate::http::rss_kib(self.pid)
    }
}

fn read(response: reqwest::Result<Response>) -> Result<(u16, Value), String> {
    let response = response.map_err(|error| error.to_string())?;
    let status = response.status().as_u16();
    let text = response.text().map_err(|error| error.to_string())?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// A gauge or counter, 0 when absent (a family with no samples yet).
pub fn sample(metrics: &BTreeMap<String, f64>, name: &str) -> f64 {
    metrics.get(name).copied().unwrap_or(0.0)
}
