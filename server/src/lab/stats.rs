//! Latency and throughput figures of a run, computed the same way for the
//! simulator and for live replays.

use serde::Serialize;

/// What happened to one request, times in milliseconds from the start of
/// the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    pub arrival_ms: f64,
    /// When each output token reached the client (the first is the TTFT point).
    pub token_ms: Vec<f64>,
    pub end_ms: f64,
    pub prompt_tokens: u32,
    pub error: Option<String>,
}

impl RequestRecord {
    pub fn ttft_ms(&self) -> Option<f64> {
        self.token_ms.first().map(|first| first - self.arrival_ms)
    }

    pub fn output_tokens(&self) -> usize {
        self.token_ms.len()
    }
}

/// Nearest-rank percentiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    /// `None` for no samples.
    pub fn of(mut samples: Vec<f64>) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let rank = |p: f64| samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
        Some(Percentiles { p50: rank(0.50), p90: rank(0.90), p99: rank(0.99) })
    }
}

/// Service-level objectives for goodput: a request counts when it succeeded
/// and met both.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: f64,
    pub itl_ms: f64,
}

/// The summary of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub requests: usize,
    pub failed: usize,
    pub output_tokens: usize,
    pub duration_ms: f64,
    /// Output tokens per second over the run.
    pub throughput_tps: f64,
    /// Requests per second that met the SLO.
    pub goodput_rps: f64,
    pub ttft_ms: Option<Percentiles>,
    /// Gaps between consecutive tokens of the same request.
    pub itl_ms: Option<Percentiles>,
    pub e2e_ms: Option<Percentiles>,
}

impl Summary {
    pub fn of(records: &[RequestRecord], slo: Slo) -> Self {
        let succeeded: Vec<&RequestRecord> = records.iter().filter(|record| record.error.is_none()).collect();
        let start = records.iter().map(|record| record.arrival_ms).fold(f64::INFINITY, f64::min);
        let end = records.iter().map(|record| record.end_ms).fold(f64::NEG_INFINITY, f64::max);
        let duration_ms = if records.is_empty() { 0.0 } else { (end - start).max(0.0) };
        let output_tokens: usize = succeeded.iter().map(|record| record.output_tokens()).sum();
        let gaps = |record: &RequestRecord| -> Vec<f64> { record.token_ms.windows(2).map(|w| w[1] - w[0]).collect() };
        let met = succeeded
            .iter()
            .filter(|record| {
                record.ttft_ms().is_some_and(|ttft| ttft <= slo.ttft_ms)
                    && gaps(record).iter().all(|gap| *gap <= slo.itl_ms)
            })
            .count();
        let per_second = |count: f64| if duration_ms > 0.0 { count * 1000.0 / duration_ms } else { 0.0 };
        Summary {
            requests: records.len(),
            failed: records.len() - succeeded.len(),
            output_tokens,
            duration_ms,
            throughput_tps: per_second(output_tokens as f64),
            goodput_rps: per_second(met as f64),
            ttft_ms: Percentiles::of(succeeded.iter().filter_map(|record| record.ttft_ms()).collect()),
            itl_ms: Percentiles::of(succeeded.iter().flat_map(|record| gaps(record)).collect()),
            e2e_ms: Percentiles::of(succeeded.iter().map(|record| record.end_ms - record.arrival_ms).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(Percentiles::of(samples), Some(Percentiles { p50: 50.0, p90: 90.0, p99: 99.0 }));
        assert_eq!(Percentiles::of(vec![7.0]), Some(Percentiles { p50: 7.0, p90: 7.0, p99: 7.0 }));
        assert_eq!(Percentiles::of(Vec::new()), None);
    }

    #[test]
    fn summary_counts_tokens_gaps_and_goodput() {
        let fast = RequestRecord {
            arrival_ms: 0.0,
            token_ms: vec![10.0, 20.0, 30.0],
            end_ms: 30.0,
            prompt_tokens: 4,
            error: None,
        };
        let slow = RequestRecord { arrival_ms: 10.0, token_ms: vec![200.0, 400.0], end_ms: 400.0, ..fast.clone() };
        let failed = RequestRecord { error: Some("boom".into()), token_ms: vec![], end_ms: 50.0, ..fast.clone() };
        let summary = Summary::of(&[fast, slow, failed], Slo { ttft_ms: 100.0, itl_ms: 50.0 });
        assert_eq!((summary.requests, summary.failed, summary.output_tokens), (3, 1, 5));
        assert_eq!(summary.duration_ms, 400.0);
        assert_eq!(summary.throughput_tps, 5.0 * 1000.0 / 400.0);
        assert_eq!(summary.goodput_rps, 1000.0 / 400.0);
        assert_eq!(summary.ttft_ms.map(|p| (p.p50, p.p99)), Some((10.0, 190.0)));
        assert_eq!(summary.itl_ms.map(|p| (p.p50, p.p99)), Some((10.0, 200.0)));
    }
}
