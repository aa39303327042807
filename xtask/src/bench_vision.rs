//! `cargo xtask bench vision`: the time to encode one 448 × 448 image with
//! a synthetic projector at Qwen2-VL-2B's vision shapes (`sluice bench
//! vision`), and with `--compare-llama DIR` (a folder holding llama.cpp's
//! `llama-mtmd-cli`) the same file's encode time in llama.cpp's mtmd, run
//! alternately, one of each per round.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::bench_model::json_line;
use crate::workspace::{cargo, repo_root, run};

struct Plan {
    llama: Option<PathBuf>,
    threads: usize,
    rounds: usize,
}

fn parse(args: &[String]) -> anyhow::Result<Plan> {
    let mut plan = Plan { llama: None, threads: 2, rounds: 3 };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().with_context(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--compare-llama" => plan.llama = Some(PathBuf::from(value("--compare-llama")?)),
            "-t" | "--threads" => {
                plan.threads = value("--threads")?.parse().context("--threads must be a whole number")?;
            }
            "--rounds" => {
                plan.rounds = value("--rounds")?.parse().context("--rounds must be a whole number")?;
                if plan.rounds == 0 {
                    bail!("--rounds must be at least 1");
                }
            }
            other => bail!("unknown argument `{other}` (expected --compare-llama DIR, --threads N, --rounds N)"),
        }
    }
    Ok(plan)
}

pub fn bench_vision(args: &[String]) -> anyhow::Result<()> {
    let plan = parse(args)?;
    let dir = repo_root().join("target/bench");
    eprintln!("xtask: writing the synthetic projector (about 2.5 GB of f32 weights) to {}", dir.display());
    run(cargo()
        .args(["run", "--quiet", "--release", "--package", "sluice-tests", "--bin", "write-vision-pair", "--"])
        .arg(&dir))?;
    run(cargo().args(["build", "--quiet", "--release", "--package", "sluice"]))?;
    let sluice = repo_root().join("target/release/sluice");
    let files = Files {
        model: dir.join("vision-model-2b.gguf"),
        mmproj: dir.join("vision-mmproj-2b.gguf"),
        image: dir.join("image-448.png"),
    };
    let (mut ours, mut first, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        eprintln!("xtask: round {}/{}", round + 1, plan.rounds);
        let (warm, cold) = sluice_once(&sluice, &files, plan.threads)?;
        ours.push(warm);
        first.push(cold);
        if let Some(llama) = &plan.llama {
            theirs.push(llama_once(&llama.join("llama-mtmd-cli"), &files, plan.threads)?);
        }
    }
    let (ours, first) = (median(ours), median(first));
    println!("| threads | sluice encode (first) | sluice encode (warm) | llama.cpp mtmd encode | ratio |");
    println!("|---:|---:|---:|---:|---:|");
    let (theirs, ratio) = match plan.llama {
        Some(_) => {
            let theirs = median(theirs);
            (format!("{theirs:.0} ms"), format!("{:.2}×", theirs / first))
        }
        None => ("–".into(), "–".into()),
    };
    println!("| {} | {first:.0} ms | {ours:.0} ms | {theirs} | {ratio} |", plan.threads);
    eprintln!("xtask: the ratio is llama.cpp's time over sluice's first encode (each llama-mtmd-cli run encodes once)");
    Ok(())
}

struct Files {
    model: PathBuf,
    mmproj: PathBuf,
    image: PathBuf,
}

/// (warm median, first) encode milliseconds of one `sluice bench vision`.
fn sluice_once(sluice: &Path, files: &Files, threads: usize) -> anyhow::Result<(f64, f64)> {
    let mut command = Command::new(sluice);
    command
        .args(["bench", "vision", "--model"])
        .arg(&files.model)
        .arg("--mmproj")
        .arg(&files.mmproj)
        .arg("--image")
        .arg(&files.image)
        .args(["--threads", &threads.to_string(), "--reps", "3"]);
    let field = json_line(&mut command, "sluice bench vision")?;
    Ok((field("encode_ms")?, field("first_encode_ms")?))
}

/// The encode milliseconds llama-mtmd-cli logs for the image.
fn llama_once(mtmd_cli: &Path, files: &Files, threads: usize) -> anyhow::Result<f64> {
    let output = Command::new(mtmd_cli)
        .arg("-m")
        .arg(&files.model)
        .arg("--mmproj")
        .arg(&files.mmproj)
        .arg("--image")
        .arg(&files.image)
        .args(["-p", "abc", "-n", "1", "--temp", "0", "-t", &threads.to_string(), "--chat-template", "chatml"])
        .output()
        .with_context(|| format!("running {}", mtmd_cli.display()))?;
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("{} failed: {log}", mtmd_cli.display());
    }
    encode_ms(&log).with_context(|| format!("no \"encoding done in N ms\" line in {}'s log", mtmd_cli.display()))
}

/// The milliseconds of mtmd's "… batch encoding done in N ms" log line
/// (older builds: "… slice encoded in N ms").
fn encode_ms(log: &str) -> Option<f64> {
    log.lines().find_map(|line| {
        let after = line.split("encoding done in ").nth(1).or_else(|| line.split("slice encoded in ").nth(1))?;
        after.split_whitespace().next()?.parse().ok()
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtmds_encode_line_is_read() {
        let log =
            "load_hparams: ...\nencoding image slice...\nimage slice encoded in 1843 ms\ndecoding image batch 1/1";
        assert_eq!(encode_ms(log), Some(1843.0));
        assert_eq!(encode_ms("nothing here"), None);
    }

    #[test]
    fn flags_are_checked() {
        let args = |line: &str| line.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(parse(&args("--rounds 0")).is_err());
        assert!(parse(&args("--threads")).is_err());
        assert!(parse(&args("--bogus")).is_err());
        let plan = parse(&args("--compare-llama build/bin -t 4 --rounds 5")).expect("parses");
        assert_eq!((plan.threads, plan.rounds), (4, 5));
        assert_eq!(plan.llama, Some(PathBuf::from("build/bin")));
    }
}
