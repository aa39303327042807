//! `sluice bench model` on models written by `sluice_tests::shapes` (the
//! random-weight writer behind `write-model`): both architectures load and
//! run, and `--depth` fills the cache before measuring.

use std::process::Command;

use sluice_tests::binary::sluice_binary;
use sluice_tests::shapes::{Matrices, NAMED, Shape};

fn tiny(arch_of: usize) -> Shape {
    Shape { n_vocab: 512, n_embd: 256, n_layer: 2, n_head: 4, n_head_kv: 2, n_ff: 512, ..NAMED[arch_of].1.clone() }
}

/// Runs `sluice bench model` on `shape` written to a file named after `test`.
fn bench(test: &str, shape: &Shape, matrices: Matrices, extra: &[&str]) -> (bool, String) {
    let path = std::env::temp_dir().join(format!("sluice-{test}-{}-{}.gguf", shape.arch, std::process::id()));
    shape.write(&path, 4, matrices).expect("written");
    let output = Command::new(sluice_binary())
        .args(["bench", "model", "--threads", "2", "--reps", "1", "--json", "--model"])
        .arg(&path)
        .args(extra)
        .output()
        .expect("sluice runs");
    std::fs::remove_file(&path).expect("removed");
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn written_shapes_of_both_architectures_run_at_depth() {
    // llama with tied embeddings, qwen2 with biases and an LM head.
    for arch_of in [1, 2] {
        let shape = tiny(arch_of);
        let (ok, text) = bench("depth", &shape, Matrices::F16, &["--prefill", "8", "--decode", "4", "--depth", "40"]);
        assert!(ok, "{}: {text}", shape.arch);
        assert!(text.contains("pp8 @ d40:") && text.contains("tg4 @ d40:"), "{text}");
        let json = text.lines().find(|line| line.starts_with('{')).expect("a JSON line");
        let json: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
        assert_eq!(json["depth"], 40);
        assert!(json["prefill_tps"].as_f64().is_some_and(|tps| tps > 0.0), "{json}");
        assert!(json["decode_tps"].as_f64().is_some_and(|tps| tps > 0.0), "{json}");
        // The weights a decoding step reads, beside the memory stream.
        assert!(json["stream_gb_s"].as_f64().is_some_and(|rate| rate > 0.0), "{json}");
        assert!(text.contains("memory stream (read-only, 2 threads):"), "{text}");
        assert!(json["weight_bytes"].as_u64().is_some_and(|bytes| bytes > 0), "{json}");
    }
}

#[test]
fn nothing_to_measure_reports_zero_instead_of_failing() {
    let (ok, text) = bench("zero", &tiny(1), Matrices::F16, &["--prefill", "0", "--decode", "2"]);
    assert!(ok, "{text}");
    assert!(text.contains("\"prefill_tps\": 0.00"), "{text}");
}

#[test]
fn a_shape_written_with_random_q4_k_blocks_loads_and_runs() {
    let (ok, text) = bench("q4k", &tiny(1), Matrices::Q4K, &["--prefill", "8", "--decode", "4"]);
    assert!(ok, "{text}");
    assert!(text.contains("tg4:"), "{text}");
}

#[test]
fn decode_of_several_sequences_together_is_measured_as_their_total() {
    let (ok, text) = bench("batch", &tiny(1), Matrices::F16, &["--prefill", "0", "--decode", "4", "--batch", "3"]);
    assert!(ok, "{text}");
    assert!(text.contains("tg4 × 3 sequences:"), "{text}");
}
