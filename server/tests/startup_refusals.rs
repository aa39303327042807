//! The server refuses to start on a bad plugin, config or projector: it
//! prints the path and the reason and exits non-zero, without panicking.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_tests::binary::sluice_binary;
use sluice_tests::gguf_writer::TinyModel;
use sluice_tests::plugin_fixtures::{
    BENIGN, FIXUP_WIT, OK, SCHEDULER_WIT, componentize, fixup_module, policy_module, version,
};
use sluice_tests::projector::TinyProjector;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-startup-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).expect("write fixture");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run `sluice serve` with `args`; return (exit code, stderr).
fn serve(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(sluice_binary()).arg("serve").args(args).output().expect("sluice runs");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

fn assert_refused(policy: &Path, reason: &str) {
    let (code, stderr) = serve(&["--policy", policy.to_str().expect("utf-8 path")]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}: {reason}", policy.display())), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_plugins_stop_the_server_with_path_and_reason() {
    let scratch = Scratch::new("plugins");
    assert_refused(&scratch.0.join("absent.wasm"), "cannot read plugin");
    assert_refused(&scratch.write("text.wasm", b"hello"), "not a WebAssembly file");
    let core = wat::parse_str(policy_module(version(), BENIGN, OK, "")).expect("core module");
    assert_refused(&scratch.write("core.wasm", &core), "a core wasm module, not a component");
    let fixup = componentize(&fixup_module(OK), FIXUP_WIT, "draft-fixup");
    assert_refused(&scratch.write("fixup.wasm", &fixup), "is a `draft-fixup` plugin, expected a `scheduler` plugin");
    let wit = SCHEDULER_WIT.replace(&format!("sluice:plugin@{}", version()), "sluice:plugin@1.0.0");
    let future = componentize(&policy_module("1.0.0", BENIGN, OK, ""), &wit, "scheduler");
    assert_refused(&scratch.write("future.wasm", &future), "built for sluice:plugin@1.0.0");
}

#[test]
fn a_good_plugin_loads() {
    let scratch = Scratch::new("good");
    let policy = scratch
        .write("good.wasm", &componentize(&policy_module(version(), BENIGN, OK, ""), SCHEDULER_WIT, "scheduler"));
    // The policy loads before the model, which is absent here, so the
    // server reports the policy and then stops on the model.
    let (code, stderr) =
        serve(&["--policy", policy.to_str().expect("utf-8 path"), "-m", "/nonexistent/model.gguf", "--port", "0"]);
    assert!(stderr.contains(&format!("policy `{}` loaded", policy.display())), "{stderr}");
    assert_eq!(code, Some(1), "{stderr}");
}

#[test]
fn a_bad_config_names_file_line_and_key() {
    let scratch = Scratch::new("config");
    let config = scratch.write("sluice.toml", b"[policy]\nplugin = \"continuous\"\ndeadline = 5\n");
    let (code, stderr) = serve(&["--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}:", config.display())), "{stderr}");
    assert!(stderr.contains("line 3") && stderr.contains("unknown field `deadline`"), "{stderr}");
}

#[test]
fn a_device_this_build_cannot_run_on_stops_the_start_with_the_reason() {
    // The device is refused before anything listens or any weight is read,
    // so the model file need not exist.
    let (code, stderr) = serve(&["--device", "cuda:0", "--port", "0", "-m", "/nonexistent/model.gguf"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("device cuda:0: ") && stderr.contains("use --device cpu"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let (code, stderr) = serve(&["--device", "tpu"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("`model.device`: \"tpu\" is not a device"), "{stderr}");
}

#[test]
fn a_projector_that_does_not_fit_the_model_stops_the_start() {
    let scratch = Scratch::new("mmproj");
    let mrope = TinyModel { sections: Some([2, 3, 3, 0]), ..TinyModel::recipe("qwen2vl", 1) };
    let mrope = scratch.write("qwen2vl.gguf", &mrope.build().build());
    let text = scratch.write("llama.gguf", &TinyModel::recipe("llama", 1).build().build());
    let fitting = scratch.write("fits.gguf", &TinyProjector::qwen2vl(64, 2).build().build());
    let narrow = scratch.write("narrow.gguf", &TinyProjector::qwen2vl(48, 2).build().build());
    for (model, projector, reason) in [
        (&text, &fitting, "has no M-RoPE positions"),
        (&mrope, &narrow, "mm.2.weight"),
        (&mrope, &PathBuf::from("/nonexistent/mmproj.gguf"), "/nonexistent/mmproj.gguf"),
    ] {
        let path = |path: &PathBuf| path.to_str().expect("utf-8 path").to_owned();
        let (code, stderr) = serve(&["-m", &path(model), "--mmproj", &path(projector), "--port", "0"]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(&path(projector)) && stderr.contains(reason), "{reason}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
