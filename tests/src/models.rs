//! The model files end-to-end tests run on.

use std::path::PathBuf;

/// SmolLM2-135M-Instruct Q4_1, the default model (docs/architecture.md, "Test models").
/// Panics with the command that fetches it when it is not there.
pub fn default_model() -> PathBuf {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(path.is_file(), "{} is missing: run `cargo xtask fetch-model` first", path.display());
    path
}
