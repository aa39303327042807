//! Subcommands that run a model directly (no server).

pub mod bench;
pub mod bench_spec;
pub mod generate;
pub mod lab;
pub mod model_info;
