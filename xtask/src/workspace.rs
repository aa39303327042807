//! The repository xtask works on: where it is, the cargo that builds it and
//! the features it is checked with, and running a command in it.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

/// The repository root (xtask lives one level below it).
pub fn repo_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().map(PathBuf::from).unwrap_or(manifest_dir)
}

/// Run a command in the foreground, failing on a non-zero exit.
pub fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = command.status().with_context(|| format!("starting {command:?}"))?;
    if !status.success() {
        bail!("{:?} failed with {status}", command.get_program());
    }
    Ok(())
}

pub fn cargo() -> Command {
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.current_dir(repo_root());
    cargo
}

/// The features everything is checked and tested with: the lab too (`sluice
/// serve` alone links none of it), and CUDA (whose kernels every machine
/// compiles; its device code has nothing to run on a CI machine).
pub const FEATURES: [&str; 2] = ["--features", "sluice/lab,sluice/cuda"];
