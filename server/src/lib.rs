//! sluice: an LLM inference server whose scheduling policies and
//! draft-metadata fixups are sandboxed WebAssembly components.
//!
//! A request's path reads top to bottom: `config` → `http` (transport,
//! routes, the API dialects) → `chat` (what every dialect's chat input
//! becomes) → `sluice_engine` (each step's decision from a policy, which
//! `sluice_plugin_host` runs in its sandbox) → `sluice_model` →
//! `sluice_kernels::backend`. `startup` wires them together; `lab` (cargo
//! feature `lab`) compares policies offline and live.
//! docs/architecture.md draws the seams.

mod chat;
pub mod config;
pub mod http;
#[cfg(feature = "lab")]
pub mod lab;
pub mod startup;
