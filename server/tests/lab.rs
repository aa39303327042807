//! `sluice lab` as an operator runs it: the same workload, seed and plugins
//! give the same decision hash; a trace replayed live completes every
//! request; bad workloads are refused naming the file and line.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sluice_tests::binary::sluice_binary;
use sluice_tests::models::default_model;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-lab-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(
        dir.join("cost.json"),
        r#"{"base_ms": 2.0, "prefill_token_ms": 0.3, "decode_token_ms": 1.5, "attention_kpair_ms": 0.001}"#,
    )
    .expect("cost model");
    dir
}

fn lab(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(sluice_binary())
        .arg("lab")
        .arg("--cost-model")
        .arg(dir.join("cost.json"))
        .arg("--out")
        .arg(dir.join("out"))
        .args(args)
        .output()
        .expect("sluice lab runs")
}

fn report(output: &std::process::Output) -> Value {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON report")
}

#[test]
fn simulated_runs_are_deterministic_per_policy() {
    let dir = scratch("sim");
    let args = [
        "--policy",
        "continuous",
        "--policy",
        "cohort",
        "--policy",
        "prefill-first",
        "--policy",
        "priority,aging_ms=500",
        "--arrivals",
        "gamma:8:2",
        "--requests",
        "40",
        "--prompt-tokens",
        "8..300",
        "--max-tokens",
        "4..64",
        "--batch-tokens",
        "64",
        "--seed",
        "3",
        "--json",
    ];
    let first = report(&lab(&dir, &args));
    let second = report(&lab(&dir, &args));
    let hashes = |report: &Value| -> Vec<String> {
        report["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|run| run["decision_hash"].as_str().expect("hash").to_owned())
            .collect()
    };
    assert_eq!(hashes(&first), hashes(&second));
    assert_eq!(first["runs"].as_array().map(Vec::len), Some(4));
    for run in first["runs"].as_array().expect("runs") {
        assert_eq!(run["summary"]["requests"], 40, "{run}");
        assert_eq!(run["summary"]["failed"], 0, "{run}");
        assert!(run["fault"].is_null(), "{run}");
    }
    // Policies decide differently on a bursty mixed workload.
    let distinct: std::collections::HashSet<String> = hashes(&first).into_iter().collect();
    assert!(distinct.len() >= 3, "{distinct:?}");
    let mut other_seed = args.to_vec();
    let seed_at = other_seed.len() - 2;
    other_seed[seed_at] = "4";
    assert_ne!(hashes(&report(&lab(&dir, &other_seed))), hashes(&first));
    for picture in ["timeline-cohort.svg", "ttft-cdf.svg", "e2e-cdf.svg"] {
        let svg = std::fs::read_to_string(dir.join("out").join(picture)).expect(picture);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{picture}");
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_trace_replayed_live_completes_every_request() {
    let dir = scratch("live");
    let trace = dir.join("trace.jsonl");
    std::fs::write(
        &trace,
        "# arrival_ms, prompt_tokens, max_tokens\n\
         {\"arrival_ms\": 0, \"prompt_tokens\": 30, \"max_tokens\": 8}\n\
         {\"arrival_ms\": 20, \"prompt_tokens\": 5, \"max_tokens\": 4, \"prompt\": \"Hello there\"}\n\
         {\"arrival_ms\": 40, \"prompt_tokens\": 60, \"max_tokens\": 6, \"priority\": 2}\n",
    )
    .expect("trace");
    let model = default_model();
    let output = lab(
        &dir,
        &[
            "--policy",
            "cohort",
            "--trace",
            trace.to_str().expect("utf-8"),
            "--live",
            "-m",
            model.to_str().expect("utf-8"),
            "--slots",
            "2",
            "--json",
        ],
    );
    let report = report(&output);
    let runs = report["runs"].as_array().expect("runs");
    let live = runs.iter().find(|run| run["engine"] == "live").expect("a live run");
    assert_eq!(live["summary"]["requests"], 3, "{live}");
    assert_eq!(live["summary"]["failed"], 0, "{live}");
    assert_eq!(live["summary"]["output_tokens"], 18, "{live}");
    assert!(live["sim_vs_live_relative_error"]["throughput"].is_number(), "{live}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn bad_workloads_are_refused_with_file_and_line() {
    let dir = scratch("bad");
    let trace = dir.join("bad.jsonl");
    std::fs::write(&trace, "{\"arrival_ms\": 0, \"prompt_tokens\": 3, \"max_tokens\": 2}\n{\"arrival_ms\": 1}\n")
        .expect("trace");
    let output = lab(&dir, &["--trace", trace.to_str().expect("utf-8")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.jsonl:2: missing field `prompt_tokens`"), "{stderr}");
    let output = lab(&dir, &["--arrivals", "uniform:3"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("--arrivals"), "refused");
    let output =
        Command::new(sluice_binary()).args(["lab", "--cost-model", "/nonexistent/cost.json"]).output().expect("runs");
    assert!(String::from_utf8_lossy(&output.stderr).contains("sluice bench calibrate"));
    std::fs::remove_dir_all(&dir).expect("clean up");
}
