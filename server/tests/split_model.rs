//! Split models (gguf-split's `NAME-0000i-of-0000N.gguf` shards) served from
//! their first shard, and `sluice model info` on whole, split and refused
//! files.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sluice_tests::binary::sluice_binary;
use sluice_tests::gguf_writer::{GgufBuilder, TinyModel, Value as Meta};
use sluice_tests::http::Server;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-split-model-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn write(&self, name: &str, builder: &GgufBuilder) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, builder.build()).expect("write a model");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn model() -> GgufBuilder {
    TinyModel { n_layer: 3, ..TinyModel::recipe("llama", 17) }.build()
}

/// Greedy tokens and their top log-probs for one prompt.
fn greedy(server: &Server) -> (Vec<u64>, Value) {
    let body = json!({"prompt": [1, 5, 9, 2], "n_predict": 12, "temperature": 0, "n_probs": 3,
                      "ignore_eos": true, "return_tokens": true, "cache_prompt": false});
    let (status, response) = server.post("/completion", &body);
    assert_eq!(status, 200, "{response}");
    let tokens = response["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("id")).collect();
    (tokens, response["completion_probabilities"].clone())
}

#[test]
fn a_split_model_serves_from_its_first_shard_as_the_whole_file_does() {
    let scratch = Scratch::new("serve");
    let whole_path = scratch.write("whole.gguf", &model());
    let shards = model().write_split(&scratch.0, "tiny", 3);

    let whole = Server::start_model(&whole_path, &["-t", "1"], &[]);
    let expected = greedy(&whole);
    drop(whole);
    let split = Server::start_model(&shards[0], &["-t", "1"], &[]);
    assert_eq!(greedy(&split), expected);
    let (_, props) = split.get("/props");
    assert_eq!(props["model_family"], "llama");
    assert_eq!(props["model_path"], shards[0].display().to_string());
}

/// `sluice serve -m PATH` that must stop: its exit code and stderr.
fn refused_start(model: &Path) -> (Option<i32>, String) {
    let output =
        Command::new(sluice_binary()).args(["serve", "--port", "0", "-m"]).arg(model).output().expect("sluice runs");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_later_shard_or_a_missing_one_stops_the_start_naming_the_file() {
    let scratch = Scratch::new("refused");
    let shards = model().write_split(&scratch.0, "tiny", 3);
    let (code, stderr) = refused_start(&shards[1]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("shard 2 of 3 of a split model; load the model from its first shard, tiny-00001-of-00003.gguf")
    );
    std::fs::remove_file(&shards[2]).expect("remove a shard");
    let (code, stderr) = refused_start(&shards[0]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}: shard 3 of 3 is missing", shards[2].display())), "{stderr}");
    // The first shard's path once in the error, not again inside it.
    let error = stderr.lines().find(|line| line.contains("cannot load the model")).expect("the error line");
    assert_eq!(error.matches(&*shards[0].display().to_string()).count(), 1, "{error}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `sluice model info PATH`: exit code, stdout, stderr.
fn model_info(path: &Path) -> (Option<i32>, String, String) {
    let output = Command::new(sluice_binary()).args(["model", "info"]).arg(path).output().expect("sluice runs");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[test]
fn model_info_names_the_family_layer_kinds_weight_types_and_shards() {
    let scratch = Scratch::new("info");
    let qwen3 = TinyModel { n_layer: 3, ..TinyModel::recipe("qwen3", 4) }.build();
    let n_tensors = qwen3.tensors.len();
    let shards = qwen3.write_split(&scratch.0, "q", 2);
    let (code, stdout, stderr) = model_info(&shards[0]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().take(7).collect();
    let per_shard = n_tensors.div_ceil(2);
    let shard_line = |index: usize, count: usize| {
        let bytes: usize = qwen3.split(2)[index].tensors.iter().map(|tensor| tensor.data.len()).sum();
        format!("  {}: {count} tensors, {bytes} bytes", shards[index].display())
    };
    assert_eq!(
        lines,
        [
            format!(
                "{}: GGUF v3, {} metadata entries, {n_tensors} tensors",
                shards[0].display(),
                qwen3.metadata.len() + 3
            ),
            "split into 2 shards:".to_owned(),
            shard_line(0, per_shard),
            shard_line(1, n_tensors - per_shard),
            "family: qwen3".to_owned(),
            "layers: 3".to_owned(),
            "  0-2: attention with Q/K norms, SwiGLU feed-forward".to_owned(),
        ]
    );
    assert!(stdout.contains(&format!("\nweight types: F32 × {n_tensors}\n")), "{stdout}");
}

#[test]
fn model_info_into_a_reader_that_stops_early_ends_without_a_panic() {
    use std::io::BufRead;
    use std::process::Stdio;
    let scratch = Scratch::new("info-pipe");
    let path = scratch.0.join("tiny.gguf");
    // 200 layers: a tensor table longer than a pipe holds (64 KiB), so
    // that writing it meets the closed pipe.
    std::fs::write(&path, TinyModel { n_layer: 200, ..TinyModel::llama(4) }.build().build()).expect("written");
    let mut child = Command::new(sluice_binary())
        .args(["model", "info"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice runs");
    // One line read, then the pipe closed, as `| head -1` does.
    let mut first = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    stdout.read_line(&mut first).expect("a first line");
    drop(stdout);
    let output = child.wait_with_output().expect("sluice ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(first.contains("GGUF v3"), "{first}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn model_info_on_a_refused_file_says_which_architecture_or_weight_type() {
    let scratch = Scratch::new("info-refused");
    let mamba = scratch.write("mamba.gguf", &model().meta("general.architecture", Meta::Str("mamba".into())));
    let (code, stdout, stderr) = model_info(&mamba);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stdout.contains("\nfamily: refused: general.architecture = \"mamba\" is not supported (llama, "),
        "{stdout}"
    );
    assert!(stderr.contains("sluice does not run this file: general.architecture = \"mamba\""), "{stderr}");

    let mut nvfp4 = model();
    let at = nvfp4.tensors.iter().position(|tensor| tensor.name == "blk.1.ffn_up.weight").expect("present");
    nvfp4.tensors[at].type_id = 40;
    let (code, _, stderr) = model_info(&scratch.write("nvfp4.gguf", &nvfp4));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("tensor \"blk.1.ffn_up.weight\": weight type NVFP4 (type 40) is not supported"),
        "{stderr}"
    );
}

#[test]
fn model_info_load_names_a_missing_tensor() {
    let scratch = Scratch::new("info-load");
    let missing = scratch.write("missing.gguf", &model().without_tensor("blk.2.ffn_gate.weight"));
    let output =
        Command::new(sluice_binary()).args(["model", "info", "--load"]).arg(&missing).output().expect("sluice runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("tensor \"blk.2.ffn_gate.weight\": missing"), "{stderr}");
    let (code, stdout, _) = model_info(&scratch.write("whole.gguf", &model()));
    assert_eq!(code, Some(0));
    assert!(!stdout.contains("load:"), "without --load nothing is loaded");
}
