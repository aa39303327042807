//! The server under load: how it is started (`-np`, `-c`, `-b`, the
//! config file's limits and policy rules) and the bounds the checks hold it
//! to, shared by the run and by the clients, faults and idle checks.

/// Slots of the server under load (`-np`).
pub const SLOTS: usize = 6;
/// Context per slot: the longest prompt and its tokens fit.
pub const SLOT_CTX: usize = 512;
/// Most tokens one step processes (`-b`): steps stay short on two cores,
/// so a fault shows within a step or two of being loaded.
pub const BATCH_TOKENS: usize = 128;
/// Requests that may wait for a slot; more get 503 with Retry-After. Small,
/// so that it fills.
pub const QUEUE_LIMIT: usize = 12;
/// Most the resident memory may grow from its value after the warm-up.
/// The KV pool (198 blocks of 16 cells, 69 MiB) is paged in as its blocks
/// are first used and then kept by the prefix cache; the rest is room for
/// the allocators (runs grew by 20–35 MiB). Sandbox instances kept after a
/// `memory` fault (two per fault, each up to `policy.memory_mb`, 64 MiB)
/// pass it by the second such fault, which the longer runs reach.
pub const RSS_BOUND_MIB: u64 = 192;
/// Seconds a response write may wait for its client (`server.timeouts.send_s`):
/// the clients that never read their streams are cut after this.
pub const SEND_TIMEOUT_S: u64 = 5;
/// The most probabilities a token the server gives (`server.limits.n_probs`,
/// its default): some requests ask for all of them.
pub const N_PROBS: usize = 100;
/// Steps without a grant that count as a stall: low, so a `stall` fault
/// is quarantined within a few dozen milliseconds.
pub(super) const STALL_STEPS: u32 = 16;
/// Fuel per policy call: more than a call can burn within the deadline,
/// so that the `loop` fault ends by the wall-clock deadline and the engine
/// is held up for two of them (see `faults`), not by fuel in a
/// millisecond.
pub(super) const FUEL: u64 = 1_000_000_000_000;
/// Wall-clock deadline per policy call (the default).
pub(super) const DEADLINE_MS: u64 = 50;
/// The API key the server is started with (`/admin` needs one).
pub(super) const API_KEY: &str = "loadtest";

/// `policy.on_fault`: what the server does once the policy is quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    FailClosed,
    Fallback,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::FailClosed => "fail-closed",
            Mode::Fallback => "fallback",
        }
    }
}
