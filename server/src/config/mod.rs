//! The TOML configuration (`config/sluice.toml`): its schema, reading and
//! validating a file, and the `sluice serve` flags that override it.
//! Errors name the file, the line and the key.
//!
//! `startup` turns these sections into the engine's settings; the config
//! takes from the engine only the values both name (`on_fault`, the
//! sampling defaults), so that each has one definition.

mod flags;
mod llama_args;
mod llama_table;
mod load;
mod schema;

pub use flags::{Overrides, policy_spec};
pub use llama_args::{LlamaArgs, flag_table, help_epilogue, llama_style_args};
pub use load::{ConfigError, Invalid, policy_source, threads_or_cores};
pub use schema::*;

#[cfg(test)]
mod tests;
