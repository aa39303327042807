//! The shared wasmtime engine, the epoch ticker and per-instance stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Config, Engine, ResourceLimiter, Store};

use super::fault::PluginFault;

/// How often the ticker advances the epoch; deadlines are whole ticks.
const EPOCH_TICK: Duration = Duration::from_millis(2);

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

/// Compiles plugins and drives their deadlines. One per process; cheap to
/// clone.
#[derive(Clone)]
pub struct PluginHost {
    engine: Engine,
    _ticker: Arc<Ticker>,
}

impl PluginHost {
    /// Start the host and its epoch ticker thread.
    pub fn new() -> anyhow::Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(true);
        config.epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|error| anyhow::anyhow!("cannot start wasmtime: {error}"))?;
        let ticker = Ticker::start(engine.clone())?;
        Ok(PluginHost { engine, _ticker: Arc::new(ticker) })
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A store for one instance, with the memory cap installed and the
    /// call limits armed for instantiation.
    pub(super) fn store(&self, limits: PluginLimits) -> Result<Store<StoreState>, PluginFault> {
        let mut store = Store::new(&self.engine, StoreState { memory_cap: limits.memory_bytes() });
        store.limiter(|state| state);
        arm(&mut store, limits)?;
        Ok(store)
    }
}

/// Reset fuel and deadline before a call: fuel is cumulative per store and
/// the epoch deadline is relative to the current epoch.
pub(super) fn arm(store: &mut Store<StoreState>, limits: PluginLimits) -> Result<(), PluginFault> {
    store.set_fuel(limits.fuel).map_err(|error| PluginFault::Trap(format!("cannot set fuel: {error}")))?;
    let tick_ms = EPOCH_TICK.as_millis() as u64;
    // +1: the current tick is already partly over.
    store.set_epoch_deadline(limits.deadline_ms.div_ceil(tick_ms) + 1);
    Ok(())
}

/// Host-side state of one instance.
pub(super) struct StoreState {
    memory_cap: usize,
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

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped.
struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Ticker {
    fn start(engine: Engine) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        std::thread::Builder::new().name("plugin-epoch".into()).spawn(move || {
            while !thread_stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })?;
        Ok(Ticker { stop })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
