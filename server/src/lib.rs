//! sluice: an LLM inference server whose scheduling policies and
//! draft-metadata fixups are sandboxed WebAssembly components.
//!
//! A request's path reads top to bottom: `config` → `http` → `engine`
//! (→ `plugins` for each step's decision) → `model` → `sluice-kernels`.

pub mod config;
pub mod engine;
pub mod http;
pub mod lab;
pub mod model;
pub mod plugins;
