//! Project automation: `cargo xtask <command>`.

mod bench_cache;
mod bench_constrained;
mod bench_model;
mod bench_serve;
mod bench_vision;
mod cuda;
mod device_bundle;
mod device_check;
mod fuzz;
mod loadtest;
mod models;
mod module_cycles;
mod peer_suite;
mod plugins;
mod toolchain;
mod wheels;
mod workspace;

use std::time::Instant;

use anyhow::bail;
use clap::{Parser, Subcommand};
use workspace::{FEATURES, cargo, repo_root, run};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build every plugin into a component (see plugins/dist/).
    Plugins(plugins::PluginsArgs),
    /// Everything CI runs: the module cycle check, the plugin check, formatting, clippy and docs
    /// with warnings denied, plugin unit tests, all host tests.
    Test,
    /// Fetch the default model if missing and serve it with config/sluice.toml
    /// (127.0.0.1:8080); extra args go to `sluice serve`.
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Download the default model (cached under target/models/, sha256-checked).
    FetchModel,
    /// Compile every CUDA kernel with NVRTC for sm_90 and sm_80 (no GPU
    /// needed; `test` does it too) and print each kernel's registers,
    /// shared memory, stack and spills.
    CudaKernels,
    /// On a machine with an NVIDIA GPU: build, run the CUDA parity suite
    /// (a skip fails), and measure the default model's prefill and decode on
    /// the GPU and the CPU (decode also as a share of the HBM roofline).
    DeviceCheck(device_check::DeviceCheckArgs),
    /// Build the device check's binaries here into target/device/ with a
    /// script, for a GPU machine without Rust: `bash target/device/run.sh`
    /// there (docs/cuda.md).
    DeviceBundle,
    /// Run a benchmark: `plugins` (policy step cost), `model` (decode and
    /// prefill tokens/s of the default model or `--model FILE`s, at
    /// `--depth N`; `--compare-llama BIN` runs llama-bench interleaved and
    /// prints a table of ratios)
    /// `serve` (aggregate tokens/s and latency at 1, 4, 8, 16 streams;
    /// `--llama-server BIN` measures llama-server the same way), `spec`
    /// (decode tokens/s without and with a draft, and the accepted length),
    /// `constrained` (structured outputs: mask time per token, decode
    /// tokens/s with and without a JSON schema; `--llama-server BIN` too),
    /// `cache` (`-m FILE`: prefill of a 4k-token prompt uncached, and of it
    /// plus 64 tokens once cached; `--llama-server BIN` too) or `vision`
    /// (encoding a 448 × 448 image at Qwen2-VL-2B's vision shapes;
    /// `--compare-llama DIR` runs llama-mtmd-cli interleaved).
    Bench {
        #[arg(value_parser = ["plugins", "model", "serve", "spec", "constrained", "cache", "vision"])]
        suite: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the fuzz targets (server/tests/fuzz.rs) for longer than `test`
    /// does: `--seconds N` per target (default 300), `--target NAME`,
    /// `--seed N`; prints inputs per second per target.
    Fuzz(fuzz::FuzzArgs),
    /// Fail if sibling modules of any workspace crate import each other
    /// (two files of one folder, directly or round a longer loop), naming
    /// the files and the imports; `test` runs it first.
    ModuleCycles,
    /// Run llama.cpp's server test suite (pytest) against sluice, and with
    /// `--llama-server BIN` against llama-server, every preset on the default
    /// model; writes target/peer-suite/results.md. Never part of `test`.
    PeerSuite(peer_suite::PeerSuiteArgs),
    /// The load and fault test: 128 clients against a small queue while
    /// the chaos policy faults, in both `on_fault` modes (`--seconds N`,
    /// default 300; `--clients N`; `--seed N`). `test` runs a 60 s form.
    Loadtest {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Plugins(args) => plugins::plugins(args),
        Task::Test => test(),
        Task::Serve { args } => serve(&args),
        Task::FetchModel => models::fetch_model().map(|path| println!("{}", path.display())),
        Task::CudaKernels => cuda_kernels(),
        Task::DeviceCheck(args) => device_check::device_check(args),
        Task::DeviceBundle => device_bundle::device_bundle(),
        Task::Bench { suite, args } => bench(&suite, &args),
        Task::PeerSuite(args) => peer_suite::peer_suite(args),
        Task::Fuzz(args) => fuzz::fuzz(args),
        Task::ModuleCycles => module_cycles::module_cycles(),
        Task::Loadtest { args } => loadtest::loadtest(&args),
    };
    if let Err(error) = result {
        eprintln!("xtask: error: {error:#}");
        std::process::exit(1);
    }
}

fn test() -> anyhow::Result<()> {
    let started = Instant::now();
    let plugins_native = ["--manifest-path", "plugins/Cargo.toml", "--target-dir", "target/plugins/native"];
    stage("no import cycles between sibling modules", module_cycles::module_cycles)?;
    stage("plugins/dist/ against a fresh pinned build", || plugins::plugins(plugins::PluginsArgs::check()))?;
    stage("the default model", || models::fetch_model().map(drop))?;
    let nvrtc = stage_value("NVIDIA's NVRTC, for the CUDA kernel check", cuda::fetch_nvrtc)?;
    stage("formatting (cargo fmt --check)", || {
        run(cargo().args(["fmt", "--all", "--check"]))?;
        run(cargo().args(["fmt", "--all", "--check", "--manifest-path", "plugins/Cargo.toml"]))
    })?;
    stage("clippy, warnings denied (all features, `sluice serve`'s default build, the plugins)", || {
        let deny = ["--", "-D", "warnings"];
        run(cargo().args(["clippy", "--locked", "--workspace", "--all-targets"]).args(FEATURES).args(deny))?;
        run(cargo().args(["clippy", "--locked", "--package", "sluice"]).args(deny))?;
        run(cargo().args(["clippy", "--locked", "--all-targets"]).args(plugins_native).args(deny))
    })?;
    stage("docs, warnings denied", || {
        run(cargo()
            .args(["doc", "--locked", "--workspace", "--no-deps"])
            .args(FEATURES)
            .env("RUSTDOCFLAGS", "-D warnings"))
    })?;
    stage("plugin unit tests (native)", || run(cargo().args(["test", "--locked"]).args(plugins_native)))?;
    stage("host workspace tests (release)", || {
        run(cargo()
            .args(["test", "--locked", "--release", "--workspace", "--all-targets"])
            .args(FEATURES)
            .env("SLUICE_NVRTC", &nvrtc)
            .env("SLUICE_REQUIRE_NVRTC", "1"))
    })?;
    eprintln!("xtask: all tests passed in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Run one stage of `test`, saying what it is and how long it took.
fn stage(name: &str, work: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    stage_value(name, work)
}

fn stage_value<T>(name: &str, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    eprintln!("xtask: {name}");
    let started = Instant::now();
    let value = work()?;
    eprintln!("xtask: {name}: done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(value)
}

fn cuda_kernels() -> anyhow::Result<()> {
    let nvrtc = cuda::fetch_nvrtc()?;
    run(cargo()
        .args(["test", "--locked", "--release", "--package", "sluice-kernels", "--features", "cuda"])
        .args(["--test", "cuda_kernels", "--", "--nocapture", "--test-threads", "1"])
        .env("SLUICE_NVRTC", &nvrtc)
        .env("SLUICE_REQUIRE_NVRTC", "1"))
}

fn serve(args: &[String]) -> anyhow::Result<()> {
    models::fetch_model()?;
    run(cargo()
        .args(["run", "--release", "--package", "sluice", "--", "serve", "--config", "config/sluice.toml"])
        .args(args))
}

/// Draft decoding: the default model drafting for itself, then a synthetic
/// DFlash pair (written by the tests crate's `write-dflash-pair`).
fn bench_spec(args: &[String]) -> anyhow::Result<()> {
    let model = models::fetch_model()?;
    let spec = |target: &std::path::Path, draft: &std::path::Path| {
        run(cargo()
            .args(["run", "--quiet", "--release", "--package", "sluice", "--", "bench", "spec", "--model"])
            .arg(target)
            .arg("--model-draft")
            .arg(draft)
            .args(args))
    };
    eprintln!("xtask: the default model drafting for itself");
    spec(&model, &model)?;
    let dir = repo_root().join("target/bench");
    run(cargo()
        .args(["run", "--quiet", "--release", "--package", "sluice-tests", "--bin", "write-dflash-pair", "--"])
        .arg(&dir))?;
    eprintln!("xtask: a synthetic DFlash pair (random weights: acceptance is near zero, the cost of drafting shows)");
    spec(&dir.join("dflash-target.gguf"), &dir.join("dflash-draft.gguf"))
}

fn bench(suite: &str, args: &[String]) -> anyhow::Result<()> {
    match suite {
        "plugins" => run(cargo().args(["bench", "--package", "sluice", "--bench", "plugins"])),
        "model" => bench_model::bench_model(args),
        "serve" => bench_serve::bench_serve(args),
        "constrained" => bench_constrained::bench_constrained(args),
        "cache" => bench_cache::bench_cache(args),
        "spec" => bench_spec(args),
        "vision" => bench_vision::bench_vision(args),
        other => bail!("unknown benchmark suite `{other}`"),
    }
}
