//! LoRA adapters (docs/lora.md): loading and refusing adapters, the
//! unmerged arithmetic against weights merged offline, mixed adapter
//! configurations in one forward pass, and over HTTP on the default model:
//! scale 0, concurrent requests of four configurations, the prefix cache,
//! global scales, `/slots`, `/metrics` and `/v1/models`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::startup::load_model;
use sluice_kernels::backend::{Device, KvTypes};
use sluice_model::Model;
use sluice_model::batch::{Batch, BatchRow, RowInput, text_position};
use sluice_tests::gguf_writer::TinyModel;
use sluice_tests::http::Server;
use sluice_tests::lora::{LoraSpec, Target, default_model_targets, layer_targets};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-lora-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn write(path: &Path, bytes: Vec<u8>) -> PathBuf {
    std::fs::write(path, bytes).expect("write gguf");
    path.to_owned()
}

/// A synthetic llama of the default model's widths (576 wide, 9 heads of
/// 64, 3 KV heads, feed-forward 1536), two layers, F32 weights.
fn wide_model() -> (TinyModel, Vec<Target>) {
    let model = TinyModel { n_embd: 576, n_head: 9, n_head_kv: 3, n_ff: 1536, n_vocab: 96, ..TinyModel::llama(11) };
    let targets = layer_targets(model.n_layer, 576, 192, 1536);
    (model, targets)
}

/// A prompt and its adapter configuration.
type Sequence<'a> = (&'a [u32], Vec<(u32, f32)>);

/// One forward pass over several sequences, each under its own adapter
/// configuration; every sequence's last-row logits.
fn logits(model: &Arc<dyn Model>, sequences: &[Sequence<'_>]) -> Vec<Vec<f32>> {
    let blocks_per_seq = 4;
    let mut context =
        Arc::clone(model).context(blocks_per_seq * sequences.len(), 16, KvTypes::default()).expect("a context");
    let mut batch = Batch::default();
    for (seq, (tokens, lora)) in sequences.iter().enumerate() {
        batch
            .block_tables
            .push((0..blocks_per_seq as u32).map(|block| (seq * blocks_per_seq) as u32 + block).collect());
        batch.adapters.push(lora.clone());
        // A model with recurrent layers carries each sequence's state.
        batch.states.push(seq as u32);
        for (cell, &token) in tokens.iter().enumerate() {
            batch.rows.push(BatchRow {
                input: RowInput::Token(token),
                seq,
                cell: cell as u32,
                pos: text_position(cell as u32),
                logits: cell + 1 == tokens.len(),
            });
        }
    }
    let output = context.forward(&batch).expect("the pass runs");
    let n_vocab = model.hparams().n_vocab;
    output.logits.chunks_exact(n_vocab).map(<[f32]>::to_vec).collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|value| value.to_bits()).collect()
}

#[test]
fn unmerged_deltas_match_weights_merged_offline() {
    let dir = scratch("merged");
    let (tiny, targets) = wide_model();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 96).collect();
    matches_merged(&dir, &tiny.build(), &targets, &LoraSpec::new("llama", 5, 0.2), 0.7, &prompt);
    let _ = std::fs::remove_dir_all(dir);
}

/// `base` under `spec`'s adapter of `targets` at `scale` gives, on
/// `prompt`, the logits of the weights merged offline, to 1e-3 of their
/// range, while the adapter moves them by far more. Returns the base's file.
fn matches_merged(
    dir: &Path,
    base: &sluice_tests::gguf_writer::GgufBuilder,
    targets: &[Target],
    spec: &LoraSpec,
    scale: f32,
    prompt: &[u32],
) -> PathBuf {
    let base_path = write(&dir.join("base.gguf"), base.build());
    let adapter = write(&dir.join("adapter.gguf"), spec.build(targets).build());
    let merged = write(&dir.join("merged.gguf"), spec.merged(base, targets, scale).build());
    let adapted = load_model(&base_path, Device::Cpu, 2, &[adapter]).expect("base and adapter load");
    let merged = load_model(&merged, Device::Cpu, 2, &[]).expect("merged model loads");
    let unmerged = &logits(&adapted, &[(prompt, vec![(0, scale)])])[0];
    let reference = &logits(&merged, &[(prompt, Vec::new())])[0];
    let base_logits = &logits(&adapted, &[(prompt, Vec::new())])[0];
    let largest = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    let (off, moved) = (largest(unmerged, reference), largest(base_logits, reference));
    // The two compute keys and values that differ in their last bits, and
    // the KV cache rounds both to f16: the stated tolerance is 1e-3 of the
    // logits' range, while the adapter itself moves them by far more.
    let range = reference.iter().fold(0.0f32, |max, value| max.max(value.abs()));
    assert!(off <= 1e-3 * range.max(1.0), "unmerged vs merged: {off} (logits up to {range})");
    assert!(moved > 20.0 * off.max(1e-6), "the adapter moves the logits by {moved}, the error is {off}");
    base_path
}

/// On a mixture of experts (the synthetic Qwen3-MoE), adapters of the
/// attention tensors compute what the weights merged offline compute, and
/// an adapter of an expert tensor is refused naming it.
#[test]
fn adapters_on_a_mixture_of_experts_adapt_its_attention() {
    let dir = scratch("moe");
    let base = sluice_tests::models::tiny_family("qwen3moe").expect("a tiny MoE model");
    let targets: Vec<Target> =
        layer_targets(4, 64, 32, 128).into_iter().filter(|target| target.name.contains("attn_")).collect();
    let spec = LoraSpec::new("qwen3moe", 9, 0.2);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 250).collect();
    let base_path = matches_merged(&dir, &base, &targets, &spec, 0.8, &prompt);
    let expert = [Target { name: "blk.1.ffn_gate_exps.weight".into(), n_in: 64, n_out: 32 }];
    let refused = write(&dir.join("expert.gguf"), spec.build(&expert).build());
    let error = load_model(&base_path, Device::Cpu, 2, &[refused]).err().expect("refused").to_string();
    assert!(error.contains("blk.1.ffn_gate_exps.weight"), "{error}");
    let _ = std::fs::remove_dir_all(dir);
}

/// On a hybrid model (the synthetic Qwen3.5: Gated DeltaNet layers, a
/// gated full-attention layer every fourth, dense feed-forwards), adapters
/// of every projection (the Gated DeltaNet layers' Q|K|V, z, β, α and
/// output; the attention layers' query twice as wide, each head's query
/// and gate) and of every feed-forward compute what the weights merged
/// offline compute. On Qwen3-Next's fused projections (`ssm_in`, `ssm_ba`)
/// an adapter is refused naming the tensor.
#[test]
fn adapters_on_a_hybrid_model_adapt_every_projection() {
    let dir = scratch("hybrid");
    let base = sluice_tests::models::tiny_family("qwen35").expect("a tiny hybrid model");
    let matrices = |layer: usize, sites: &[(&str, u64, u64)]| -> Vec<Target> {
        sites
            .iter()
            .map(|&(name, n_in, n_out)| Target { name: format!("blk.{layer}.{name}.weight"), n_in, n_out })
            .collect()
    };
    let mut targets: Vec<Target> =
        layer_targets(8, 64, 32, 128).into_iter().filter(|target| target.name.contains("ffn_")).collect();
    for layer in 0..8 {
        targets.extend(match layer % 4 {
            3 => {
                matrices(layer, &[("attn_q", 64, 128), ("attn_k", 64, 32), ("attn_v", 64, 32), ("attn_output", 64, 64)])
            }
            _ => matrices(
                layer,
                &[
                    ("attn_qkv", 64, 128),
                    ("attn_gate", 64, 64),
                    ("ssm_beta", 64, 4),
                    ("ssm_alpha", 64, 4),
                    ("ssm_out", 64, 64),
                ],
            ),
        });
    }
    let spec = LoraSpec::new("qwen35", 13, 0.2);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 250).collect();
    matches_merged(&dir, &base, &targets, &spec, 0.8, &prompt);
    let next = write(&dir.join("next.gguf"), sluice_tests::models::tiny_family("qwen3next").expect("a model").build());
    let next_spec = LoraSpec::new("qwen3next", 13, 0.2);
    for (name, n_out, named) in
        [("blk.0.ssm_in.weight", 192, "blk.0.ssm_in.weight"), ("blk.1.ssm_beta.weight", 4, "blk.1.ssm_ba.weight")]
    {
        let fused =
            write(&dir.join("fused.gguf"), next_spec.build(&[Target { name: name.into(), n_in: 64, n_out }]).build());
        let error = load_model(&next, Device::Cpu, 2, &[fused]).err().expect("refused").to_string();
        assert!(error.contains(named), "{error}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A three-layer synthetic llama written to `dir`, and its adapter targets.
fn tiny_base(dir: &Path) -> (PathBuf, Vec<Target>) {
    let tiny = TinyModel::llama(3);
    let targets = layer_targets(tiny.n_layer, 32, 16, 64);
    (write(&dir.join("base.gguf"), tiny.build().build()), targets)
}

#[test]
fn rows_of_different_adapter_configurations_share_a_pass_bit_for_bit() {
    let dir = scratch("mixed");
    let (base, targets) = tiny_base(&dir);
    let first = write(&dir.join("a.gguf"), LoraSpec::new("llama", 1, 0.5).build(&targets).build());
    // The second adapter changes only the feed-forward, at another rank and
    // with no alpha.
    let ffn: Vec<Target> = targets.iter().filter(|target| target.name.contains("ffn")).cloned().collect();
    let spec = LoraSpec { rank: 4, alpha: 0.0, ..LoraSpec::new("llama", 2, 0.5) };
    let second = write(&dir.join("b.gguf"), spec.build(&ffn).build());
    let model = load_model(&base, Device::Cpu, 2, &[first, second]).expect("loads");
    let prompts: [Vec<u32>; 4] =
        std::array::from_fn(|seq| (0..(9 + seq as u32 * 5)).map(|i| (i * 5 + seq as u32) % 64).collect());
    let configs = [vec![], vec![(0, 0.3)], vec![(0, 1.0), (1, 0.5)], vec![(1, -0.7)]];
    let sequences: Vec<Sequence<'_>> =
        prompts.iter().zip(&configs).map(|(prompt, config)| (prompt.as_slice(), config.clone())).collect();
    let together = logits(&model, &sequences);
    for (seq, sequence) in sequences.iter().enumerate() {
        let alone = &logits(&model, std::slice::from_ref(sequence))[0];
        assert_eq!(bits(&together[seq]), bits(alone), "sequence {seq} alone and in the mixed pass");
    }
    let base_only = logits(&model, &[(prompts[1].as_slice(), Vec::new())]);
    assert_ne!(bits(&together[1]), bits(&base_only[0]), "an adapter changes the logits");
    let zero = logits(&model, &[(prompts[1].as_slice(), vec![(0, 0.0)])]);
    assert_eq!(bits(&zero[0]), bits(&base_only[0]), "scale 0 is the base model");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn broken_adapters_are_refused_naming_the_file_and_tensor() {
    let dir = scratch("broken");
    let (base, targets) = tiny_base(&dir);
    let good = LoraSpec::new("llama", 1, 0.5).build(&targets);
    let wrong_shape = {
        let mut targets = targets.clone();
        targets[1].n_out = 32;
        LoraSpec::new("llama", 1, 0.5).build(&targets)
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("shape", wrong_shape.build(), "blk.0.attn_k.weight.lora_a"),
        (
            "pair",
            good.clone().without_tensor("blk.1.ffn_up.weight.lora_b").build(),
            "blk.1.ffn_up.weight.lora_b is missing",
        ),
        (
            "type",
            good.clone().meta("general.type", sluice_tests::gguf_writer::Value::Str("model".into())).build(),
            "`general.type` is \"model\"",
        ),
        (
            "arch",
            good.clone().meta("general.architecture", sluice_tests::gguf_writer::Value::Str("qwen2".into())).build(),
            "architecture \"qwen2\"",
        ),
        (
            "alora",
            good.clone()
                .meta("adapter.alora.invocation_tokens", sluice_tests::gguf_writer::Value::U32s(vec![1, 2]))
                .build(),
            "adapter.alora.invocation_tokens",
        ),
        ("truncated", good.build()[..2000].to_vec(), ""),
        (
            "unknown",
            LoraSpec::new("llama", 1, 0.5)
                .build(&[Target { name: "blk.7.attn_q.weight".into(), n_in: 32, n_out: 32 }])
                .build(),
            "blk.7.attn_q.weight",
        ),
    ];
    for (name, bytes, named) in cases {
        let path = write(&dir.join(format!("{name}.gguf")), bytes);
        let error = load_model(&base, Device::Cpu, 1, std::slice::from_ref(&path)).err().expect(name).to_string();
        assert!(error.contains(&path.display().to_string()), "{name}: names the file: {error}");
        assert!(error.contains(named), "{name}: names {named:?}: {error}");
    }
    // Over HTTP's front door too: the start is refused with the reason.
    let path = dir.join("shape.gguf");
    let output = std::process::Command::new(sluice_tests::binary::sluice_binary())
        .args(["serve", "--port", "0", "-m"])
        .arg(&base)
        .arg("--lora")
        .arg(&path)
        .output()
        .expect("sluice runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("blk.0.attn_k.weight.lora_a") && !stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Two adapters for the default model: attention only, and everything.
fn default_adapters(dir: &Path) -> (PathBuf, PathBuf) {
    let all = default_model_targets();
    let attention: Vec<Target> = all.iter().filter(|target| target.name.contains("attn")).cloned().collect();
    let first = write(&dir.join("attention.gguf"), LoraSpec::new("llama", 21, 0.05).build(&attention).build());
    let second = write(&dir.join("everything.gguf"), LoraSpec::new("llama", 22, 0.03).build(&all).build());
    (first, second)
}

fn completion(server: &Server, body: &Value) -> Value {
    let (status, answer) = server.post("/completion", body);
    assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
    answer
}

/// Tokens and their probabilities: equal outputs are equal logits' picks.
fn output(answer: &Value) -> (Value, Value) {
    (answer["tokens"].clone(), answer["completion_probabilities"].clone())
}

fn body(prompt: &str, lora: Option<Value>) -> Value {
    let mut body = json!({ "prompt": prompt, "n_predict": 12, "temperature": 0, "ignore_eos": true,
                           "return_tokens": true, "n_probs": 3 });
    if let Some(lora) = lora {
        body["lora"] = lora;
    }
    body
}

#[test]
fn over_http_adapters_scale_mix_and_keep_their_own_cache() {
    let dir = scratch("http");
    let (first, second) = default_adapters(&dir);
    let adapters = format!("{},{}", first.display(), second.display());
    let plain = Server::start(&["-np", "4"]);
    let server = Server::start(&["-np", "4", "--lora", &adapters, "--lora-init-without-apply"]);
    let prompt = "The quick brown fox jumps over the lazy dog because";

    // The list, with names, scales 0 after --lora-init-without-apply.
    let (status, list) = server.get("/lora-adapters");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list.as_array().map(Vec::len), Some(2), "{list}");
    assert_eq!(
        (list[0]["id"].clone(), list[0]["scale"].clone(), list[0]["name"].clone()),
        (json!(0), json!(0.0), json!("attention"))
    );

    // Scale 0, per request and global, is the base model bit for bit.
    let base = output(&completion(&plain, &body(prompt, None)));
    assert_eq!(output(&completion(&server, &body(prompt, None))), base, "global scales 0");
    let zero = json!([{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]);
    assert_eq!(output(&completion(&server, &body(prompt, Some(zero)))), base, "per-request scale 0");

    // Six requests over four slots in four configurations, half streamed:
    // each gets what it gets alone.
    let configs = [
        json!([{"id": 0, "scale": 0.3}]),
        json!([{"id": 0, "scale": 0.7}]),
        json!([{"id": 0, "scale": 1.0}]),
        json!([{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]),
        json!([]),
        json!([{"id": 0, "scale": 0.7}]),
    ];
    let prompts = [
        "Once upon a time",
        "The capital of France is",
        "def add(a, b):",
        "List three animals:",
        "Water boils at",
        "My favourite colour is",
    ];
    let bodies: Vec<Value> =
        prompts.iter().zip(&configs).map(|(prompt, lora)| body(prompt, Some(lora.clone()))).collect();
    let alone: Vec<(Value, Value)> = bodies.iter().map(|body| output(&completion(&server, body))).collect();
    let unadapted = output(&completion(&server, &body(prompts[0], Some(json!([])))));
    assert_ne!(unadapted.1, alone[0].1, "an adapter changes the output");
    let full = output(&completion(&server, &body(prompts[0], Some(configs[2].clone()))));
    assert_ne!(full, alone[0], "scales 0.3 and 1.0 differ");
    let together: Vec<(Value, Value)> = std::thread::scope(|scope| {
        let running: Vec<_> = bodies
            .iter()
            .enumerate()
            .map(|(index, body)| {
                let server = &server;
                scope.spawn(move || {
                    let mut body = body.clone();
                    body["cache_prompt"] = json!(false);
                    if index % 2 == 1 {
                        body["stream"] = json!(true);
                        let events = server.stream("/completion", &body).events;
                        let tokens: Vec<Value> = events
                            .iter()
                            .flat_map(|event| event["tokens"].as_array().cloned().unwrap_or_default())
                            .collect();
                        let probs: Vec<Value> = events
                            .iter()
                            .flat_map(|event| event["completion_probabilities"].as_array().cloned().unwrap_or_default())
                            .collect();
                        (Value::Array(tokens), Value::Array(probs))
                    } else {
                        output(&completion(server, &body))
                    }
                })
            })
            .collect();
        running.into_iter().map(|handle| handle.join().expect("request thread")).collect()
    });
    for (index, (together, alone)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(together, alone, "request {index} ({}) together and alone", configs[index]);
    }

    // The prefix cache: KV computed under adapter 0 is not reused for
    // adapter 1, and is again for adapter 0.
    let long = "In the beginning the universe was created. This has made a lot of people very angry and \
                been widely regarded as a bad move. Many were increasingly of the opinion that";
    let cached = |lora: Value| {
        let answer = completion(&server, &body(long, Some(lora)));
        (answer["tokens_cached"].as_u64().expect("tokens_cached"), output(&answer))
    };
    let (first_cached, first_output) = cached(json!([{"id": 0, "scale": 1.0}]));
    let (other_cached, other_output) = cached(json!([{"id": 1, "scale": 1.0}]));
    let (again_cached, again_output) = cached(json!([{"id": 0, "scale": 1.0}]));
    assert_eq!((first_cached, other_cached), (0, 0), "nothing cached under adapter 1");
    assert!(again_cached > 16, "adapter 0's prompt is reused: {again_cached}");
    assert_eq!(again_output, first_output);
    assert_ne!(other_output, first_output);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn global_scales_change_later_requests_not_running_ones() {
    let dir = scratch("global");
    let (first, _) = default_adapters(&dir);
    let server = Server::start(&["-np", "2", "--lora", first.to_str().expect("utf-8 path")]);
    let prompt = "Tell me a story about a dragon who";
    let long = |lora: Option<Value>| {
        let mut body = body(prompt, lora);
        body["n_predict"] = json!(64);
        body
    };
    let at_one = output(&completion(&server, &long(None)));
    let at_half = output(&completion(&server, &long(Some(json!([{"id": 0, "scale": 0.5}])))));
    assert_ne!(at_one, at_half);

    // A streamed request at the global scale 1, then a POST mid-stream.
    let mut streamed = long(None);
    streamed["stream"] = json!(true);
    let mut stream = server.open_stream("/completion", &streamed);
    let first_event = stream.next_data().expect("a first token");
    let (status, answer) = server.post("/lora-adapters", &json!([{"id": 0, "scale": 0.5}]));
    assert_eq!((status, answer), (StatusCode::OK, json!({"success": true})));
    let mut events = vec![first_event];
    while let Some(event) = stream.next_data() {
        events.push(event);
    }
    let tokens: Vec<Value> = events
        .iter()
        .filter_map(|event| serde_json::from_str::<Value>(event).ok())
        .flat_map(|event| event["tokens"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(Value::Array(tokens), at_one.0, "the running request kept scale 1");
    assert_eq!(output(&completion(&server, &long(None))), at_half, "later requests use 0.5");
    let (_, list) = server.get("/lora-adapters");
    assert_eq!(list[0]["scale"], json!(0.5));

    // Bad lists name the field; nothing changes.
    for (bad, named) in [
        (json!([{"id": 3, "scale": 1.0}]), "`body[0].id`: there is no LoRA adapter with id 3"),
        (json!([{"id": 0, "scale": "high"}]), "`body[0].scale`"),
        (json!({"id": 0}), "`body` must be an array"),
    ] {
        let (status, answer) = server.post("/lora-adapters", &bad);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(answer["error"]["message"].as_str().is_some_and(|message| message.contains(named)), "{answer}");
    }
    let (status, answer) = server.post("/completion", &body(prompt, Some(json!([{"id": 1, "scale": 1.0}]))));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|message| message.contains("`lora[0].id`")), "{answer}");
    assert_eq!(server.get("/lora-adapters").1[0]["scale"], json!(0.5));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn slots_metrics_and_models_show_the_adapters() {
    let dir = scratch("visible");
    let (first, second) = default_adapters(&dir);
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[[lora]]\npath = {:?}\nname = \"attn\"\nscale = 0.0\n[[lora]]\npath = {:?}\nscale = 0.0\n",
            first.display().to_string(),
            second.display().to_string()
        ),
    )
    .expect("config");
    let server = Server::start(&["--config", config.to_str().expect("utf-8 path"), "-np", "1"]);
    let (_, models) = server.get("/v1/models");
    let ids: Vec<&str> =
        models["data"].as_array().expect("data").iter().filter_map(|model| model["id"].as_str()).collect();
    assert_eq!(&ids[1..], ["attn", "everything"], "{models}");
    assert_eq!(models["data"][1]["parent"], models["data"][0]["id"]);

    // One long request runs with adapter 1 (named by `model`); another
    // waits behind it with adapter 0.
    let mut running = server.open_stream(
        "/v1/completions",
        &json!({"model": "everything", "prompt": "Count to a hundred:", "max_tokens": 200, "stream": true,
                "ignore_eos": true}),
    );
    running.next_data().expect("running");
    let waiting = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| completion(&server, &body("Hello", Some(json!([{"id": 0, "scale": 1.0}])))));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut seen = (Value::Null, String::new());
        while std::time::Instant::now() < deadline {
            let (_, slots) = server.get("/slots");
            let metrics = server.get_text("/metrics");
            seen = (slots, metrics);
            if seen.1.contains("waiting_lora_adapters=\"attn\"") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        drop(running);
        waiter.join().expect("waiter");
        seen
    });
    let (slots, metrics) = waiting;
    assert_eq!(slots[0]["params"]["lora"], json!([{"id": 1, "scale": 1.0}]), "{slots}");
    assert!(
        metrics.contains("sluice_lora_requests_info{running_lora_adapters=\"everything\",waiting_lora_adapters=\"attn\",max_lora=\"2\"}"),
        "{metrics}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Where two correct implementations may pick different tokens: the
/// fixture's top two log-probs within this of each other.
const NEAR_TIE: f64 = 0.02;
/// How far each of our top-5 log-probs may be from llama.cpp's.
const LOGPROB_TOLERANCE: f64 = 0.01;

/// The default model under the adapter tests/fixtures/lora-llamacpp.json
/// names, at each of its scales: greedy tokens equal llama.cpp's until its
/// first near tie, and top-5 log-probs within [`LOGPROB_TOLERANCE`]. The
/// deltas sum as llama.cpp sums them for a one-token batch (docs/lora.md),
/// and the fixture's prompts are one token each, so every llama.cpp batch
/// is one row (its prompts of several tokens take another order, which
/// sluice's batch invariance cannot also follow).
#[test]
fn greedy_continuations_under_an_adapter_match_llama_cpp_until_a_near_tie() {
    let text = std::fs::read_to_string(sluice_tests::fixture("lora-llamacpp.json")).expect("fixture present");
    let fixture: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let adapter = &fixture["adapter"];
    let number = |value: &Value| value.as_f64().expect("a number");
    let spec = LoraSpec::new("llama", number(&adapter["seed"]) as u64, number(&adapter["magnitude"]) as f32);
    assert_eq!((spec.rank as f64, f64::from(spec.alpha)), (number(&adapter["rank"]), number(&adapter["alpha"])));
    let dir = scratch("llamacpp");
    let path = write(&dir.join("adapter.gguf"), spec.build(&default_model_targets()).build());
    let server = Server::start(&["--lora", &path.display().to_string(), "--lora-init-without-apply"]);

    let (mut compared, mut worst) = (0, 0.0f64);
    for run in fixture["runs"].as_array().expect("runs") {
        let scale = number(&run["scale"]);
        for expected in run["completions"].as_array().expect("completions") {
            let steps = expected["steps"].as_array().expect("steps");
            let body = json!({ "prompt": expected["prompt_tokens"], "n_predict": steps.len(), "temperature": 0,
                               "n_probs": 5, "ignore_eos": true, "cache_prompt": false,
                               "lora": [{"id": 0, "scale": scale}] });
            let answer = completion(&server, &body);
            let ours = answer["completion_probabilities"].as_array().expect("probabilities");
            for (index, (step, ours)) in steps.iter().zip(ours).enumerate() {
                let theirs: Vec<(u64, f64)> = step["top"]
                    .as_array()
                    .expect("top")
                    .iter()
                    .map(|pair| (pair[0].as_u64().expect("id"), number(&pair[1])))
                    .collect();
                let at = format!("scale {scale}, prompt {:?}, step {index}", expected["prompt"]);
                for candidate in ours["top_logprobs"].as_array().expect("top_logprobs") {
                    let token = candidate["id"].as_u64().expect("id");
                    if let Some((_, their)) = theirs.iter().find(|(id, _)| *id == token) {
                        let difference = (number(&candidate["logprob"]) - their).abs();
                        worst = worst.max(difference);
                        assert!(
                            difference <= LOGPROB_TOLERANCE,
                            "{at}: token {token} {candidate} vs llama.cpp {their}"
                        );
                    }
                }
                compared += 1;
                if theirs[0].1 - theirs[1].1 < NEAR_TIE {
                    break;
                }
                assert_eq!(ours["id"].as_u64(), Some(theirs[0].0), "{at}: diverges before any near tie");
            }
        }
    }
    eprintln!("compared {compared} steps; worst top-5 log-prob difference {worst:.4}");
    assert!(compared >= 100, "too few steps compared: {compared}");
    let _ = std::fs::remove_dir_all(dir);
}
