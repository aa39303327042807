//! `cargo xtask device-check`: what a machine with an NVIDIA GPU runs to
//! prove the CUDA backend, in one go: build, the parity suite against the
//! CPU backend (a skip is a failure there), then prefill and decode speed of
//! the default model (GPU beside CPU) and of an 8B-shaped random Q4_K model
//! (GPU): prefill of 2048 tokens, decode at batch 1 (with and without CUDA
//! graphs, and as a share of the HBM roofline), 8 and 64.
//!
//! The machine needs NVRTC (CUDA 12.8 or later): `--nvrtc PATH`,
//! `SLUICE_NVRTC`, the copy `cargo xtask test` keeps under `target/cuda/`,
//! or a CUDA toolkit on the loader's path.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use clap::Args;

use crate::workspace::{FEATURES, cargo, repo_root, run};
use crate::{bench_model, models};

#[derive(Args)]
pub struct DeviceCheckArgs {
    /// `libnvrtc.so.12`, or the folder holding it.
    #[arg(long, value_name = "PATH")]
    nvrtc: Option<PathBuf>,
    /// Memory bandwidth for the roofline, in TB/s (an H200's HBM3e).
    #[arg(long, default_value_t = 4.8)]
    bandwidth_tb_s: f64,
}

pub fn device_check(args: DeviceCheckArgs) -> anyhow::Result<()> {
    let given = args
        .nvrtc
        .or_else(|| std::env::var_os("SLUICE_NVRTC").map(PathBuf::from))
        .or_else(|| {
            Some(repo_root().join("target/cuda/nvrtc-12.8.93/nvidia/cuda_nvrtc/lib")).filter(|dir| dir.is_dir())
        })
        .or_else(find_nvrtc);
    let nvrtc = given.as_deref().map(nvrtc_as_12).transpose()?;
    match (&given, &nvrtc) {
        (Some(given), Some(dir)) => eprintln!("xtask: NVRTC {} (as {})", given.display(), dir.display()),
        _ => eprintln!("xtask: NVRTC from the loader's search path"),
    }
    let env = |command: &mut Command| {
        if let Some(dir) = &nvrtc {
            command.env("SLUICE_NVRTC", dir).env("LD_LIBRARY_PATH", dir);
        }
        command.env("SLUICE_REQUIRE_GPU", "1");
    };
    let _ = run(Command::new("nvidia-smi").args(["--query-gpu=name,driver_version,memory.total", "--format=csv"]));
    let model = models::fetch_model()?;
    eprintln!("xtask: building (release, {})", FEATURES[1]);
    let mut build = cargo();
    build.args(["build", "--release", "--package", "sluice", "--bins"]).args(FEATURES);
    for (binary, _) in INVARIANCE_TESTS {
        build.args(["--test", binary]);
    }
    run(&mut build)?;
    eprintln!("xtask: the parity suite (CUDA against the CPU backend)");
    let mut parity = cargo();
    parity.args(["test", "--release", "--package", "sluice-kernels", "--features", "cuda", "--lib", "cuda::parity"]);
    parity.args(["--", "--nocapture", "--test-threads", "1"]);
    env(&mut parity);
    run(&mut parity)?;
    // One `sluice bench model` run: (prefill, decode) tokens/s for a prompt
    // of `prefill` tokens and 128 tokens decoded by each of `batch`
    // sequences (their total; 0 for none), with the switches `off` set to 0.
    let bench = |model: &Path, device: &str, prefill: usize, batch: usize, off: &[&str]| {
        let mut bench = Command::new(repo_root().join("target/release/sluice"));
        bench.args(["bench", "model", "--model"]).arg(model).args(["--device", device]);
        let decode = if batch == 0 { "0" } else { "128" };
        bench.args(["--prefill", &prefill.to_string(), "--decode", decode, "--reps", "2"]);
        bench.args(["--batch", &batch.max(1).to_string()]);
        env(&mut bench);
        bench.envs(off.iter().map(|switch| (switch, "0")));
        bench_model::measure(&mut bench).with_context(|| format!("on {device} at batch {batch}, {off:?} off"))
    };
    let report = |model: &Path, device: &str| -> anyhow::Result<()> {
        let bytes = std::fs::metadata(model).with_context(|| format!("reading {}", model.display()))?.len() as f64;
        let name = model.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let (prefill, decode) = bench(model, device, 2048, 1, &[])?;
        // Every weight byte is read once per decoded token.
        let roofline = args.bandwidth_tb_s * 1e12 / bytes;
        println!(
            "{name} on {device}: prefill 2048 {prefill:.0} tokens/s, decode (batch 1) {decode:.1} tokens/s = {:.1} % \
             of the {roofline:.0} tokens/s roofline ({:.0} MB of weights at {} TB/s)",
            100.0 * decode / roofline,
            bytes / 1e6,
            args.bandwidth_tb_s
        );
        if device == "cpu" {
            return Ok(());
        }
        let (_, launched) = bench(model, device, 0, 1, &["SLUICE_CUDA_GRAPHS"])?;
        println!("{name} on {device}: decode (batch 1) without CUDA graphs {launched:.1} tokens/s");
        for batch in [8, 64] {
            let (_, total) = bench(model, device, 0, batch, &[])?;
            println!(
                "{name} on {device}: decode at batch {batch} {total:.0} tokens/s in all = {:.1}× batch 1",
                total / decode
            );
        }
        Ok(())
    };
    invariance_on_the_gpu(&env)?;
    report(&model, "cuda:0")?;
    report(&model, "cpu")?;
    // An 8B-shaped model with random Q4_K weights: the size users run on a
    // GPU (the CPU would take minutes over its prompt, so GPU only).
    let written = |shape: &str, name: &str, kind: &str| -> anyhow::Result<PathBuf> {
        let path = repo_root().join("target/bench").join(name);
        if !path.exists() {
            std::fs::create_dir_all(repo_root().join("target/bench"))?;
            run(cargo()
                .args(["run", "--quiet", "--release", "--package", "sluice-tests", "--bin", "write-model", "--"])
                .arg(shape)
                .arg(&path)
                .args(["1", kind]))?;
        }
        Ok(path)
    };
    let large = written("llama-3.1-8b", "llama-3.1-8b-q4_k.gguf", "q4_k")?;
    report(&large, "cuda:0")?;
    // f16 weights: cuBLAS against the tiled kernel on prompts.
    let f16 = written("llama-3.2-1b", "llama-3.2-1b-f16.gguf", "f16")?;
    let (with, _) = bench(&f16, "cuda:0", 2048, 0, &[])?;
    let (without, _) = bench(&f16, "cuda:0", 2048, 0, &["SLUICE_CUBLAS"])?;
    println!(
        "llama-3.2-1b-f16 on cuda:0: prefill 2048 {with:.0} tokens/s with cuBLAS, {without:.0} with the tiled kernel"
    );
    Ok(())
}

/// (test binary, test) of the engine's invariance tests over HTTP.
const INVARIANCE_TESTS: [(&str, &str); 6] = [
    ("http_completion", "native_stream_and_non_stream_agree"),
    ("http_completion", "openai_stream_and_non_stream_agree"),
    ("http_completion", "cache_and_no_cache_agree_with_cached_counts"),
    ("http_slots", "one_slot_and_four_slots_give_solo_outputs"),
    ("http_slot_save", "a_restored_slot_generates_what_the_original_cache_did"),
    ("http_speculative", "drafts_never_change_the_output"),
];

/// The engine's end-to-end invariance tests (streamed or not, prompt cache
/// or not, 1 slot or 4, with a draft or without) with every server on
/// cuda:0: each passes only if its outputs agree bit for bit. Reported
/// one by one rather than stopping the check: the CUDA backend promises
/// determinism, not batch invariance (docs/cuda.md), so a difference
/// between 1 and 4 slots is a finding, not a broken build.
fn invariance_on_the_gpu(env: &dyn Fn(&mut Command)) -> anyhow::Result<()> {
    eprintln!("xtask: the engine's invariance tests on cuda:0");
    for (binary, test) in INVARIANCE_TESTS {
        let mut command = cargo();
        command.args(["test", "--release", "--package", "sluice", "--test", binary]).args(FEATURES);
        command.args(["--", "--exact", test, "--test-threads", "1"]).env("SLUICE_TEST_DEVICE", "cuda:0");
        env(&mut command);
        let held = command.status().with_context(|| format!("running {binary}::{test}"))?.success();
        println!(
            "invariance on cuda:0: {binary}::{test}: {}",
            if held { "holds" } else { "FAILS (see above: a difference or an error)" }
        );
    }
    Ok(())
}

/// An NVRTC library on this machine: a CUDA toolkit's, or one of NVIDIA's
/// Python wheels (a GPU machine's image often has only those).
fn find_nvrtc() -> Option<PathBuf> {
    let mut roots =
        vec![PathBuf::from("/usr/local/cuda/lib64"), PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib")];
    let site = Command::new("python3")
        .args(["-c", "import site; print('\\n'.join(site.getsitepackages()))"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    roots.extend(site.lines().map(|dir| PathBuf::from(dir).join("nvidia")));
    roots.iter().find_map(|root| library_under(root, 4))
}

fn library_under(dir: &Path, depth: usize) -> Option<PathBuf> {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|entry| entry.path()).collect();
    entries.iter().find(|path| is_nvrtc(path)).cloned().or_else(|| {
        (depth > 0)
            .then(|| entries.iter().filter(|path| path.is_dir()).find_map(|sub| library_under(sub, depth - 1)))?
    })
}

/// `libnvrtc.so.<major>` itself (not its builtins, not the alternative build).
fn is_nvrtc(path: &Path) -> bool {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    name.strip_prefix("libnvrtc.so.").is_some_and(|major| major.chars().all(|c| c.is_ascii_digit()))
}

/// A folder where `libnvrtc.so.12` is the given library, whatever its
/// major version: cudarc (built for CUDA 12.8) opens NVRTC by that name,
/// and the functions sluice calls are the same in CUDA 13. The library's
/// neighbours (its builtins, which it opens from its own folder) are
/// linked beside it.
fn nvrtc_as_12(given: &Path) -> anyhow::Result<PathBuf> {
    let library = if given.is_dir() {
        library_under(given, 0).with_context(|| format!("no libnvrtc.so.N in {}", given.display()))?
    } else {
        given.to_path_buf()
    };
    if library.file_name().is_some_and(|name| name == "libnvrtc.so.12") {
        return Ok(library.parent().map(Path::to_path_buf).unwrap_or_default());
    }
    let links = repo_root().join("target/cuda/nvrtc-as-12");
    let _ = std::fs::remove_dir_all(&links);
    std::fs::create_dir_all(&links).with_context(|| format!("creating {}", links.display()))?;
    let folder = library.parent().context("NVRTC's folder")?;
    for entry in std::fs::read_dir(folder)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with("libnvrtc") {
            std::os::unix::fs::symlink(entry.path(), links.join(entry.file_name()))?;
        }
    }
    std::os::unix::fs::symlink(&library, links.join("libnvrtc.so.12"))?;
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cuda_13_nvrtc_is_linked_as_12_with_its_builtins() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("sluice-nvrtc-13-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        for name in ["libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libnvrtc.alt.so.13", "other.so"] {
            std::fs::write(dir.join(name), name)?;
        }
        assert!(is_nvrtc(&dir.join("libnvrtc.so.13")) && !is_nvrtc(&dir.join("libnvrtc.alt.so.13")));
        let links = nvrtc_as_12(&dir)?;
        assert_eq!(std::fs::read_to_string(links.join("libnvrtc.so.12"))?, "libnvrtc.so.13");
        assert_eq!(std::fs::read_to_string(links.join("libnvrtc-builtins.so.13.0"))?, "libnvrtc-builtins.so.13.0");
        assert!(!links.join("other.so").exists());
        std::fs::write(dir.join("libnvrtc.so.12"), "12")?;
        assert_eq!(nvrtc_as_12(&dir.join("libnvrtc.so.12"))?, dir, "a CUDA 12 library is used where it is");
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
