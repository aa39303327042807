//! Helpers for sluice's end-to-end tests: the real binary, fixture plugins.

pub mod binary;
pub mod plugin_fixtures;
