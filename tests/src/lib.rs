//! Helpers for sluice's end-to-end tests (`server/tests`): the real binary
//! over HTTP, fixture plugins, synthetic GGUF files (models, LoRA adapters), llama.cpp's outputs
//! on the default model, the fuzzer of `server/tests/fuzz.rs`, the load
//! and fault test (`loadtest`) and the hostile-client battery (`battery`).

pub mod battery;
pub mod binary;
pub mod fuzz;
pub mod gguf_writer;
pub mod http;
pub mod hybrid;
pub mod loadtest;
pub mod lora;
pub mod models;
pub mod plugin_fixtures;
pub mod projector;
pub mod raw;
pub mod shapes;
pub mod vocab;

/// A file of `tests/fixtures/`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}
