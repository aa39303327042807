//! Typed faults of a plugin call.

use super::limits::{MemoryCapExceeded, PluginLimits};

/// Why a plugin call produced no usable result. The instance that faulted is
/// discarded; the next call runs on a fresh one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginFault {
    /// The guest trapped (`unreachable`, out-of-bounds access, a panic, …).
    #[error("trap: {0}")]
    Trap(String),
    /// The call used up its fuel budget.
    #[error("fuel exhausted (budget {0} units per call)")]
    Fuel(u64),
    /// The call ran past its wall-clock deadline.
    #[error("deadline exceeded ({0} ms per call)")]
    Deadline(u64),
    /// The guest tried to grow its memory past the cap.
    #[error("memory limit exceeded ({0} MiB)")]
    Memory(u64),
    /// The guest returned something the host cannot decode.
    #[error("malformed result: {0}")]
    Malformed(String),
}

impl PluginFault {
    /// A short label for logs and the `reason` label of fault metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PluginFault::Trap(_) => "trap",
            PluginFault::Fuel(_) => "fuel",
            PluginFault::Deadline(_) => "deadline",
            PluginFault::Memory(_) => "memory",
            PluginFault::Malformed(_) => "malformed",
        }
    }

    /// Classify the error of a failed call.
    pub(super) fn classify(error: wasmtime::Error, limits: &PluginLimits) -> Self {
        if error.downcast_ref::<MemoryCapExceeded>().is_some() {
            return PluginFault::Memory(limits.memory_mb);
        }
        match error.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::OutOfFuel) => PluginFault::Fuel(limits.fuel),
            Some(wasmtime::Trap::Interrupt) => PluginFault::Deadline(limits.deadline_ms),
            Some(trap) => PluginFault::Trap(trap.to_string()),
            // Anything else failed while lifting the guest's result: an
            // invalid discriminant, a string that is not UTF-8, a list out of
            // bounds.
            None => PluginFault::Malformed(format!("{error:#}")),
        }
    }
}
