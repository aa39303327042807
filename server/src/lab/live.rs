//! Sending workload requests to a running server (sluice or llama-server:
//! both speak the native streaming `/completion`) and timing every token.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::stats::RequestRecord;
use super::workload::{TraceRequest, synthetic_prompt};

/// Where requests go.
#[derive(Clone, Debug)]
pub struct Target {
    /// `http://host:port`, without a trailing path.
    pub base_url: String,
    pub api_key: Option<String>,
    /// Synthetic prompt ids are drawn from this range of the vocabulary.
    pub token_range: (u32, u32),
    /// Sampling seed sent with every request, so runs are repeatable.
    pub seed: u64,
}

/// A client for one run; requests share its connection pool.
pub struct Client {
    http: reqwest::Client,
    target: Target,
}

impl Client {
    pub fn new(target: Target) -> anyhow::Result<Self> {
        let http =
            reqwest::Client::builder().pool_max_idle_per_host(64).connect_timeout(Duration::from_secs(10)).build()?;
        Ok(Client { http, target })
    }

    /// Polls `/health` until it answers 200, for at most `timeout`.
    pub async fn wait_healthy(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let url = format!("{}/health", self.target.base_url);
        loop {
            let last = match self.http.get(&url).send().await {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => format!("HTTP {}", response.status()),
                Err(error) => error.to_string(),
            };
            if Instant::now() >= deadline {
                anyhow::bail!("{url} not healthy after {} s: {last}", timeout.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sends request `index` of a workload now and follows its stream to
    /// the end; times are milliseconds since `start`. Failures are recorded,
    /// not returned: a run reports them alongside the successes.
    pub async fn send(&self, index: usize, request: &TraceRequest, start: Instant) -> RequestRecord {
        let since_start = || start.elapsed().as_secs_f64() * 1000.0;
        let mut record = RequestRecord {
            arrival_ms: since_start(),
            prompt_tokens: request.prompt_tokens,
            ..RequestRecord::default()
        };
        if let Err(error) = self.stream(index, request, &mut record, &since_start).await {
            record.error = Some(format!("{error:#}"));
        }
        record.end_ms = since_start();
        record
    }

    async fn stream(
        &self,
        index: usize,
        request: &TraceRequest,
        record: &mut RequestRecord,
        since_start: &impl Fn() -> f64,
    ) -> anyhow::Result<()> {
        let (low, high) = self.target.token_range;
        let prompt = match &request.prompt {
            Some(text) => json!(text),
            None => json!(synthetic_prompt(index, request.prompt_tokens, low, high)),
        };
        let mut body = json!({
            "prompt": prompt,
            "n_predict": request.max_tokens,
            "stream": true,
            // Lengths are the workload's: generation runs to max_tokens.
            "ignore_eos": true,
            "seed": self.target.seed,
            "priority": request.priority,
        });
        // A live server knows adapters by id: a numeric name is one.
        if let Some(id) = request.adapter.as_deref().and_then(|name| name.parse::<u32>().ok()) {
            body["lora"] = json!([{ "id": id, "scale": 1.0 }]);
        }
        let mut post = self.http.post(format!("{}/completion", self.target.base_url)).json(&body);
        if let Some(key) = &self.target.api_key {
            post = post.bearer_auth(key);
        }
        let response = post.send().await?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            anyhow::bail!("HTTP {status}: {text}");
        }
        let mut events = response.bytes_stream();
        let mut pending = Vec::new();
        while let Some(chunk) = events.next().await {
            pending.extend_from_slice(&chunk?);
            while let Some(end) = pending.windows(2).position(|pair| pair == b"\n\n") {
                let event: Vec<u8> = pending.drain(..end + 2).collect();
                if event_ends_stream(&event, record, since_start())? {
                    return Ok(());
                }
            }
        }
        anyhow::bail!("the stream ended without a final event")
    }
}

/// Applies one SSE event to `record`; true when it was the last one.
fn event_ends_stream(event: &[u8], record: &mut RequestRecord, now_ms: f64) -> anyhow::Result<bool> {
    let text = String::from_utf8_lossy(event);
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else { continue };
        let value: Value = serde_json::from_str(data.trim())?;
        if let Some(error) = value.get("error") {
            anyhow::bail!("error event: {error}");
        }
        // Each non-final event carries one token (its text may be empty
        // while a multi-byte character is incomplete).
        if value.get("stop").and_then(Value::as_bool) == Some(true) {
            return Ok(true);
        }
        record.token_ms.push(now_ms);
    }
    Ok(false)
}

/// Replays a workload in real time: each request is sent at its arrival
/// time whether or not earlier ones have finished (open loop).
pub async fn replay(client: &Client, trace: &[TraceRequest]) -> Vec<RequestRecord> {
    let start = Instant::now();
    let sends = trace.iter().enumerate().map(|(index, request)| async move {
        tokio::time::sleep_until((start + Duration::from_secs_f64(request.arrival_ms / 1000.0)).into()).await;
        client.send(index, request, start).await
    });
    futures_util::future::join_all(sends).await
}

/// Runs `requests` with exactly `streams` in flight: each stream sends its
/// next request when the previous one ends (closed loop). Request `i` is
/// sent as workload index `first_index + i` (which seeds synthetic prompts).
pub async fn closed_loop(
    client: &Client,
    requests: &[TraceRequest],
    streams: usize,
    first_index: usize,
) -> Vec<RequestRecord> {
    let start = Instant::now();
    let streams = streams.max(1);
    let lanes = (0..streams).map(|lane| async move {
        let mut records = Vec::new();
        for index in (lane..requests.len()).step_by(streams) {
            records.push((index, client.send(first_index + index, &requests[index], start).await));
        }
        records
    });
    let mut records: Vec<(usize, RequestRecord)> =
        futures_util::future::join_all(lanes).await.into_iter().flatten().collect();
    records.sort_by_key(|(index, _)| *index);
    records.into_iter().map(|(_, record)| record).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_events_are_timed_until_the_final_one() {
        let mut record = RequestRecord::default();
        assert!(!event_ends_stream(b"data: {\"content\":\"a\",\"stop\":false}\n\n", &mut record, 5.0).expect("ok"));
        assert!(!event_ends_stream(b": keep-alive\n\n", &mut record, 6.0).expect("ok"));
        assert!(!event_ends_stream(b"data: {\"content\":\"\",\"stop\":false}\n\n", &mut record, 7.0).expect("ok"));
        assert!(event_ends_stream(b"data: {\"content\":\"\",\"stop\":true}\n\n", &mut record, 9.0).expect("ok"));
        assert_eq!(record.token_ms, vec![5.0, 7.0]);
        let error = event_ends_stream(b"data: {\"error\":{\"code\":503}}\n\n", &mut record, 10.0).expect_err("error");
        assert!(error.to_string().contains("503"), "{error}");
    }
}
