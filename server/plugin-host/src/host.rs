//! The shared wasmtime engine, the epoch ticker and per-instance stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Config, Engine, Store};

use super::fault::PluginFault;
use super::limits::{PluginLimits, StoreState};

/// How often the ticker advances the epoch; deadlines are whole ticks.
const EPOCH_TICK: Duration = Duration::from_millis(2);

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
        let mut store = Store::new(&self.engine, StoreState::new(limits));
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
