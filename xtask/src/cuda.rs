//! NVIDIA's NVRTC for the CUDA kernel check: every CI machine compiles every
//! kernel through the path the server uses, with no GPU and no CUDA toolkit
//! installed. The library comes from NVIDIA's PyPI wheel, pinned and
//! hash-checked, and is kept under `target/cuda/`.

use std::path::PathBuf;

use anyhow::Context;

use crate::wheels::{Wheel, extract};
use crate::workspace::repo_root;

const NVRTC: Wheel = Wheel {
    requirement: "nvidia-cuda-nvrtc-cu12==12.8.93",
    file: "nvidia_cuda_nvrtc_cu12-12.8.93-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "a7756528852ef889772a84c6cd89d41dfa74667e24cca16bb31f8f061e3e9994",
};
/// The library and the builtins it opens from its own folder; the wheel's
/// other members (an alternative build, headers) are not needed.
const MEMBERS: [&str; 2] = ["nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8"];
const LIBRARY_DIR: &str = "nvidia/cuda_nvrtc/lib";

/// The folder holding `libnvrtc.so.12`, fetched unless already there.
pub fn fetch_nvrtc() -> anyhow::Result<PathBuf> {
    let root = repo_root().join("target/cuda/nvrtc-12.8.93");
    // Written last: its presence means both members were taken out of a
    // verified wheel.
    let complete = root.join(".complete");
    if !complete.exists() {
        let download = repo_root().join("target/cuda/download");
        let wheel = NVRTC.fetch(&download)?;
        extract(&wheel, &MEMBERS, &root)?;
        std::fs::write(&complete, NVRTC.sha256).with_context(|| format!("writing {}", complete.display()))?;
        // 88 MB that the extracted library makes unneeded.
        std::fs::remove_file(&wheel).with_context(|| format!("removing {}", wheel.display()))?;
    }
    Ok(root.join(LIBRARY_DIR))
}
