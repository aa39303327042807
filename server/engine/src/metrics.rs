//! Engine counters, shared with the HTTP layer that renders them
//! (llama-server's `llamacpp:*` names plus `sluice_*`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (seconds) of the policy-call latency histogram.
pub const POLICY_CALL_BUCKETS: [f64; 10] = [1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 1e-3, 1e-2, 1e-1];

/// Monotonic counters and gauges. f64 sums are stored as their bits.
#[derive(Debug, Default)]
pub struct Metrics {
    pub prompt_tokens_total: AtomicU64,
    pub prompt_micros_total: AtomicU64,
    pub tokens_predicted_total: AtomicU64,
    pub predicted_micros_total: AtomicU64,
    pub n_decode_total: AtomicU64,
    pub n_busy_slots_total: AtomicU64,
    pub n_tokens_max: AtomicU64,
    pub requests_processing: AtomicU64,
    pub requests_deferred: AtomicU64,
    pub requests_total: AtomicU64,
    pub steps_total: AtomicU64,
    pub step_prefill_tokens_total: AtomicU64,
    pub step_decode_tokens_total: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_cached: AtomicU64,
    pub kv_blocks_free: AtomicU64,
    /// The sliding-window layers' own store (0 and 0 without one).
    pub kv_window_blocks_used: AtomicU64,
    pub kv_window_blocks_free: AtomicU64,
    /// Recurrent layers' state held by running requests (0 without such
    /// layers).
    pub recurrent_state_bytes: AtomicU64,
    /// Recurrent-state snapshots the prefix cache holds, and their bytes.
    pub recurrent_snapshots: AtomicU64,
    pub recurrent_snapshot_bytes: AtomicU64,
    pub prefix_cache_hit_tokens_total: AtomicU64,
    pub policy_fallbacks_total: AtomicU64,
    /// Steps the trace writer was too far behind to take.
    pub trace_steps_dropped_total: AtomicU64,
    /// Verification passes that carried drafts.
    pub drafts_total: AtomicU64,
    pub draft_tokens_total: AtomicU64,
    /// Accepted drafts by their position in the draft (0 = first).
    pub draft_accepted_per_position: Mutex<Vec<u64>>,
    /// Policy call latency: counts per bucket (last = +Inf), sum in ns.
    pub policy_call_buckets: [AtomicU64; POLICY_CALL_BUCKETS.len() + 1],
    pub policy_call_nanos_total: AtomicU64,
    pub policy_calls_total: AtomicU64,
    /// (policy, reason) → faults.
    pub policy_faults: Mutex<BTreeMap<(String, String), u64>>,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub fn observe_policy_call(&self, seconds: f64) {
        let bucket =
            POLICY_CALL_BUCKETS.iter().position(|bound| seconds <= *bound).unwrap_or(POLICY_CALL_BUCKETS.len());
        Self::add(&self.policy_call_buckets[bucket], 1);
        Self::add(&self.policy_call_nanos_total, (seconds * 1e9) as u64);
        Self::add(&self.policy_calls_total, 1);
    }

    pub fn count_accepted_at(&self, position: usize) {
        if let Ok(mut counts) = self.draft_accepted_per_position.lock() {
            if counts.len() <= position {
                counts.resize(position + 1, 0);
            }
            counts[position] += 1;
        }
    }

    pub fn count_fault(&self, policy: &str, reason: &str) {
        if let Ok(mut faults) = self.policy_faults.lock() {
            *faults.entry((policy.to_owned(), reason.to_owned())).or_default() += 1;
        }
    }
}
