//! `cargo xtask device-bundle`: the device check for a GPU machine that has
//! no Rust toolchain and no registry to fetch crates from. It builds here
//! what `device-check` would build there (the kernels' test binary with the
//! CUDA parity suite, `sluice` with the `cuda` feature, `write-model`),
//! compresses them into `target/device/` beside `run.sh`, and that machine
//! runs `bash target/device/run.sh` (it needs only `bash`, `xz` or
//! `python3`, `curl`, NVIDIA's driver and a CUDA toolkit's NVRTC).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::workspace::{cargo, repo_root, run};

const SCRIPT: &str = include_str!("device_bundle/run.sh");

pub fn device_bundle() -> anyhow::Result<()> {
    let out = repo_root().join("target/device");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let parity = kernels_test_binary()?;
    run(cargo().args([
        "build",
        "--locked",
        "--release",
        "--package",
        "sluice",
        "--features",
        "cuda",
        "--bin",
        "sluice",
    ]))?;
    run(cargo().args(["build", "--locked", "--release", "--package", "sluice-tests", "--bin", "write-model"]))?;
    let release = repo_root().join("target/release");
    for (from, name) in
        [(parity, "kernels-test"), (release.join("sluice"), "sluice"), (release.join("write-model"), "write-model")]
    {
        let to = out.join(name);
        std::fs::copy(&from, &to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        run(Command::new("xz").args(["-T0", "-6", "-f"]).arg(&to))?;
    }
    std::fs::write(out.join("run.sh"), SCRIPT)?;
    eprintln!("xtask: wrote {}; on the GPU machine: bash target/device/run.sh", out.display());
    Ok(())
}

/// Build the kernels crate's unit tests with `cuda` and return the test
/// binary cargo reports.
fn kernels_test_binary() -> anyhow::Result<PathBuf> {
    let output = cargo()
        .args(["test", "--locked", "--release", "--package", "sluice-kernels", "--features", "cuda", "--lib"])
        .args(["--no-run", "--message-format=json"])
        .output()
        .context("building the kernels' tests")?;
    if !output.status.success() {
        bail!("building the kernels' tests failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    executable_in(&stdout).context("cargo named no test binary for the kernels")
}

/// The test executable in cargo's JSON messages.
fn executable_in(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact" && message["profile"]["test"] == true)
        .find_map(|message| message["executable"].as_str().map(|path| Path::new(path).to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_binary_is_found_among_cargos_messages() {
        let messages = r#"{"reason":"compiler-artifact","profile":{"test":false},"executable":null}
not json
{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/release/deps/sluice_kernels-1a"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(executable_in(messages), Some(PathBuf::from("/t/release/deps/sluice_kernels-1a")));
        assert_eq!(executable_in("{\"reason\":\"build-finished\"}"), None);
    }
}
