//! Helpers for sluice's end-to-end tests: the real binary, fixture plugins.

pub mod binary;
pub mod gguf_writer;
pub mod http;
pub mod models;
pub mod plugin_fixtures;
