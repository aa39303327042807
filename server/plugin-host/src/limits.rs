//! What one plugin call may use (fuel, wall-clock, memory), and the store
//! state that enforces the memory cap.

use wasmtime::ResourceLimiter;

/// Per-call limits of a plugin (`[policy]` `fuel`, `deadline_ms`, `memory_mb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginLimits {
    /// Fuel units per call (roughly one per wasm instruction). Deterministic.
    pub fuel: u64,
    /// Wall-clock bound per call, in milliseconds.
    pub deadline_ms: u64,
    /// Cap on the instance's linear memory, in MiB.
    pub memory_mb: u64,
}

impl Default for PluginLimits {
    /// Generous for a policy step (about 100× what `continuous` spends on 64
    /// slots + 64 waiting requests) yet small enough that a runaway call
    /// ends within a few milliseconds.
    fn default() -> Self {
        PluginLimits { fuel: 10_000_000, deadline_ms: 50, memory_mb: 64 }
    }
}

impl PluginLimits {
    fn memory_bytes(&self) -> usize {
        usize::try_from(self.memory_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

/// Host-side state of one instance.
pub(super) struct StoreState {
    memory_cap: usize,
}

impl StoreState {
    pub(super) fn new(limits: PluginLimits) -> Self {
        StoreState { memory_cap: limits.memory_bytes() }
    }
}

/// The error a memory growth past the cap traps with.
#[derive(Debug, thiserror::Error)]
#[error("memory growth to {desired} bytes exceeds the cap of {cap} bytes")]
pub(super) struct MemoryCapExceeded {
    desired: usize,
    cap: usize,
}

impl ResourceLimiter for StoreState {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            // Trap instead of letting `memory.grow` return -1: a guest that
            // ignores the failure would otherwise spin until fuel runs out
            // and the fault would be misreported.
            return Err(wasmtime::Error::new(MemoryCapExceeded { desired, cap: self.memory_cap }));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Tables hold function references; a policy needs a handful.
        Ok(desired <= 10_000)
    }
}
