//! `cargo xtask bench model`: decode and prefill speed of `sluice bench
//! model` on the default model or on `--model FILE`s, and with
//! `--compare-llama BIN` the same measurements from llama.cpp's
//! `llama-bench`, run alternately (one repetition of each per round, so
//! that drifting machine load hits both alike) with the ratios printed as a
//! Markdown table. Its last columns put both programs' decoding in bytes of
//! weights read per second beside a read-only stream of the same threads
//! (measured by `sluice bench model` each round): where both are near the
//! stream, decoding is bound by memory, not by either program.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::models;
use crate::workspace::{cargo, repo_root, run};

/// What the command line asked for.
struct Plan {
    models: Vec<PathBuf>,
    llama_bench: Option<PathBuf>,
    threads: Vec<usize>,
    depths: Vec<usize>,
    rounds: usize,
    /// The KV cache types, as llama-bench takes them (`-ctk q8_0`): both
    /// programs measure the same cache.
    kv_types: Vec<String>,
    /// Everything else, passed to `sluice bench model` as is.
    rest: Vec<String>,
}

fn parse(args: &[String]) -> anyhow::Result<Plan> {
    let mut plan = Plan {
        models: Vec::new(),
        llama_bench: None,
        threads: vec![2],
        depths: vec![0],
        rounds: 3,
        kv_types: Vec::new(),
        rest: Vec::new(),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().with_context(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "-m" | "--model" => plan.models.push(PathBuf::from(value("--model")?)),
            "--compare-llama" => plan.llama_bench = Some(PathBuf::from(value("--compare-llama")?)),
            "-t" | "--threads" => plan.threads = list(value("--threads")?, "--threads")?,
            "--depth" => plan.depths = list(value("--depth")?, "--depth")?,
            "--rounds" => {
                let rounds = value("--rounds")?;
                plan.rounds = rounds
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("--rounds: `{rounds}` is not a positive whole number"))?;
            }
            "--reps" => bail!("--reps is --rounds here (one repetition of each program per round)"),
            "-ctk" | "--cache-type-k" | "-ctv" | "--cache-type-v" => {
                let (llama, sluice) =
                    if arg.ends_with('k') { ("-ctk", "--cache-type-k") } else { ("-ctv", "--cache-type-v") };
                let kv_type = value(sluice)?;
                plan.kv_types.extend([llama.to_owned(), kv_type.clone()]);
                plan.rest.extend([sluice.to_owned(), kv_type.clone()]);
            }
            _ => plan.rest.push(arg.clone()),
        }
    }
    if plan.threads.contains(&0) {
        bail!("--threads: 0 threads");
    }
    Ok(plan)
}

/// `2` or `1,2` (for tables over several values).
fn list(value: &str, flag: &str) -> anyhow::Result<Vec<usize>> {
    value
        .split(',')
        .map(|part| part.trim().parse::<usize>().with_context(|| format!("{flag}: `{part}` is not a whole number")))
        .collect()
}

pub fn bench_model(args: &[String]) -> anyhow::Result<()> {
    let mut plan = parse(args)?;
    if plan.models.is_empty() {
        plan.models.push(models::fetch_model()?);
    }
    for model in &plan.models {
        if !model.is_file() {
            bail!("--model {}: no such file", model.display());
        }
    }
    run(cargo().args(["build", "--quiet", "--release", "--package", "sluice"]))?;
    let sluice = repo_root().join("target/release/sluice");
    let Some(llama_bench) = &plan.llama_bench else {
        for model in &plan.models {
            for &threads in &plan.threads {
                for &depth in &plan.depths {
                    run(sluice_command(&sluice, model, threads, depth, &plan.rest).args(["--reps", "3"]))?;
                }
            }
        }
        return Ok(());
    };
    println!(
        "| model | threads | depth | sluice pp | llama.cpp pp | ratio | sluice tg | llama.cpp tg | ratio | \
         stream GB/s | sluice tg GB/s | llama.cpp tg GB/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for model in &plan.models {
        for &threads in &plan.threads {
            for &depth in &plan.depths {
                let (mut ours, mut theirs, mut streams) = (Vec::new(), Vec::new(), Vec::new());
                let mut weight_bytes = 0.0;
                for round in 0..plan.rounds {
                    eprintln!("xtask: {} t{threads} d{depth}: round {}/{}", name(model), round + 1, plan.rounds);
                    let mut command = sluice_command(&sluice, model, threads, depth, &plan.rest);
                    let field = json_line(command.args(["--reps", "1"]), "sluice bench model")?;
                    ours.push((field("prefill_tps")?, field("decode_tps")?));
                    streams.push(field("stream_gb_s")?);
                    weight_bytes = field("weight_bytes")?;
                    theirs.push(llama_once(llama_bench, model, threads, depth, &plan.kv_types)?);
                }
                let (ours, theirs, stream) = (medians(&ours), medians(&theirs), median(streams));
                let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}×", a / b) } else { "–".into() };
                // Bytes a step reads per second, as a share of the stream.
                let rate = |tps: f64| {
                    let gb_s = tps * weight_bytes / 1e9;
                    if stream > 0.0 { format!("{gb_s:.1} ({:.2})", gb_s / stream) } else { format!("{gb_s:.1}") }
                };
                println!(
                    "| {} | {threads} | {depth} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {} | {} | {} |",
                    name(model),
                    ours.0,
                    theirs.0,
                    ratio(ours.0, theirs.0),
                    ours.1,
                    theirs.1,
                    ratio(ours.1, theirs.1),
                    if stream > 0.0 { format!("{stream:.1}") } else { "–".into() },
                    rate(ours.1),
                    rate(theirs.1),
                );
            }
        }
    }
    Ok(())
}

fn name(model: &Path) -> String {
    model.file_name().map_or_else(|| model.display().to_string(), |name| name.to_string_lossy().into_owned())
}

fn sluice_command(sluice: &Path, model: &Path, threads: usize, depth: usize, rest: &[String]) -> Command {
    let mut command = Command::new(sluice);
    command
        .args(["bench", "model", "--model"])
        .arg(model)
        .args(["--threads", &threads.to_string(), "--depth", &depth.to_string()])
        .args(rest);
    command
}

/// (prefill, decode) tokens/s from a `sluice bench model` command (`--json`
/// is added).
pub fn measure(command: &mut Command) -> anyhow::Result<(f64, f64)> {
    let field = json_line(command, "sluice bench model")?;
    Ok((field("prefill_tps")?, field("decode_tps")?))
}

/// The numbers of the JSON line a `sluice bench …` command ends with
/// (`--json` is added), by key.
pub fn json_line(command: &mut Command, what: &str) -> anyhow::Result<impl Fn(&str) -> anyhow::Result<f64>> {
    let output = command.arg("--json").output().with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().with_context(|| format!("{what} printed nothing"))?.to_owned();
    let json: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("its JSON line `{line}`"))?;
    Ok(move |key: &str| json[key].as_f64().with_context(|| format!("no `{key}` in `{line}`")))
}

/// (prefill, decode) tokens/s of one llama-bench repetition of pp512 and
/// tg128 at the same depth and thread count.
fn llama_once(
    llama_bench: &Path,
    model: &Path,
    threads: usize,
    depth: usize,
    kv_types: &[String],
) -> anyhow::Result<(f64, f64)> {
    let output = Command::new(llama_bench)
        .arg("-m")
        .arg(model)
        .args(["-t", &threads.to_string(), "-d", &depth.to_string(), "-p", "512", "-n", "128", "-r", "1", "-o", "json"])
        .args(kv_types)
        .output()
        .with_context(|| format!("running {}", llama_bench.display()))?;
    if !output.status.success() {
        bail!("{} failed: {}", llama_bench.display(), String::from_utf8_lossy(&output.stderr));
    }
    let tests: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).context("llama-bench's JSON output (-o json)")?;
    let speed = |prompt: bool| {
        tests
            .iter()
            .find(|test| (test["n_prompt"].as_u64().unwrap_or(0) > 0) == prompt)
            .and_then(|test| test["avg_ts"].as_f64())
            .with_context(|| format!("no {} test in llama-bench's output", if prompt { "pp" } else { "tg" }))
    };
    Ok((speed(true)?, speed(false)?))
}

fn medians(values: &[(f64, f64)]) -> (f64, f64) {
    (median(values.iter().map(|v| v.0).collect()), median(values.iter().map(|v| v.1).collect()))
}

/// 0 for none.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_are_split_between_xtask_and_sluice() {
        let plan = parse(&args("--model a.gguf -m b.gguf --threads 1,2 --depth 0,2048 --rounds 5 --prefill 256"))
            .expect("valid");
        assert_eq!(plan.models, [PathBuf::from("a.gguf"), PathBuf::from("b.gguf")]);
        assert_eq!((plan.threads, plan.depths, plan.rounds), (vec![1, 2], vec![0, 2048], 5));
        assert_eq!(plan.rest, ["--prefill", "256"]);
        assert!(plan.llama_bench.is_none());
        let plan = parse(&args("-ctk q8_0 --cache-type-v q8_0")).expect("valid");
        assert_eq!(plan.kv_types, ["-ctk", "q8_0", "-ctv", "q8_0"], "llama-bench's spelling");
        assert_eq!(plan.rest, ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"], "sluice's");
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (line, flag) in
            [("--depth x", "--depth"), ("--threads 0", "--threads"), ("--model", "--model"), ("--rounds 0", "--rounds")]
        {
            let error = parse(&args(line)).err().expect("refused").to_string();
            assert!(error.contains(flag), "{line}: {error}");
        }
        assert!(parse(&args("--reps 3")).is_err());
    }
}
