//! `cargo xtask fuzz [--seconds N] [--target NAME] [--seed N]`: the fuzz
//! targets of `server/tests/fuzz.rs` for longer than the few seconds each
//! `cargo xtask test` gives them (docs/reliability.md, "Fuzzing").

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::bail;
use clap::Args;

use crate::models;
use crate::workspace::{cargo, run};

/// The targets, named as their tests.
const TARGETS: [&str; 6] = ["gguf", "tokenizer", "chat_template", "decision", "endpoints", "grammar"];

#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 300.0)]
    seconds: f64,
    /// One target (gguf, tokenizer, chat_template, decision, endpoints,
    /// grammar); all when left out.
    #[arg(long)]
    target: Option<String>,
    /// The base seed; a new one (printed) when left out, so that a long run
    /// explores inputs CI's fixed seed never reaches.
    #[arg(long)]
    seed: Option<u64>,
}

pub fn fuzz(args: FuzzArgs) -> anyhow::Result<()> {
    if let Some(target) = &args.target
        && !TARGETS.contains(&target.as_str())
    {
        bail!("unknown fuzz target `{target}` (the targets: {})", TARGETS.join(", "));
    }
    // The tokenizer, template, endpoint and grammar targets read the
    // default model.
    models::fetch_model()?;
    let seed = args
        .seed
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64));
    eprintln!("xtask: fuzzing with seed {seed}, {} s per target", args.seconds);
    let mut command = cargo();
    command.args(["test", "--locked", "--release", "--package", "sluice", "--test", "fuzz", "--"]);
    if let Some(target) = &args.target {
        command.args([target.as_str(), "--exact"]);
    }
    run(command
        .arg("--nocapture")
        .env("SLUICE_FUZZ_SECONDS", args.seconds.to_string())
        .env("SLUICE_FUZZ_SEED", seed.to_string()))
}
