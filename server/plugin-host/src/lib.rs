//! The wasmtime host for sluice plugins (the WIT package of `sluice-plugin-api`).
//!
//! Plugins are components with no imports: no WASI, no host functions. Every
//! call runs under a fuel budget (deterministic), an epoch deadline (a
//! wall-clock guard driven by a ticker thread) and a memory cap. A call that
//! breaks any of them, traps, or returns something the host cannot decode is
//! a [`PluginFault`]; the instance is then discarded and the next call gets a
//! fresh one.
//!
//! * [`PluginHost`]: the shared compiler and epoch ticker.
//! * [`WasmPolicy`]: a `scheduler`-world component behind the engine's
//!   [`SchedulingPolicy`](sluice_engine::policy::SchedulingPolicy) seam
//!   (plugins depend on the engine's seam, never the other way).
//! * [`WasmFixup`]: a `draft-fixup`-world component.

mod builtin;
mod component;
mod fault;
mod fixup;
mod host;
mod limits;
mod scheduler;
mod settings;

pub use builtin::{BUILTIN_FIXUPS, BUILTIN_POLICIES, builtin_fixup, builtin_policy};
pub use component::{LoadError, PACKAGE_VERSION, PluginSource};
pub use fault::PluginFault;
pub use fixup::{FixupError, WasmFixup};
pub use host::PluginHost;
pub use limits::PluginLimits;
pub use scheduler::WasmPolicy;
pub use settings::settings_from_toml;

/// The settings of the `scheduler` world (the step view and decision are
/// the SDK's records: `sluice_engine::policy`).
pub mod policy_types {
    pub use super::scheduler::bindings::exports::sluice::plugin::policy::{Setting, SettingValue};
}

/// Types of the `draft-fixup` world.
pub mod fixup_types {
    pub use super::fixup::bindings::exports::sluice::plugin::fixup::{
        Edit, MetaEntry, MetaValue, ModelInfo, TensorInfo,
    };
}
