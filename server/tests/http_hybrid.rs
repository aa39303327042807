//! A hybrid model (Qwen3.5-MoE's layout: Gated DeltaNet layers with their
//! recurrent state, a gated attention layer every fourth, experts) over
//! HTTP, from its synthetic model (`sluice_tests::models::tiny_family`):
//! what a request gets does not depend on what else runs beside it, on
//! streaming, on `cache_prompt` or on a slot's earlier requests; prompts
//! resume from the prefix cache's state snapshots, and slot files carry
//! the state, with the bits of an uncached run; what cannot work with a
//! recurrent state yet (drafts, context shift) is refused by name.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::binary::sluice_binary;
use sluice_tests::http::Server;

fn model(arch: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("sluice-hybrid-{arch}-{}.gguf", std::process::id()));
    std::fs::write(&path, sluice_tests::models::tiny_family(arch).expect("a tiny model").build()).expect("written");
    path
}

fn complete(server: &Server, body: &Value) -> Value {
    let (status, reply) = server.post("/completion", body);
    assert_eq!(status, StatusCode::OK, "{reply}\n{}", server.log());
    reply
}

/// Each generated token with its top log-probs, as the API reports them.
fn steps(reply: &Value) -> Vec<(i64, Vec<(i64, f64)>)> {
    reply["completion_probabilities"]
        .as_array()
        .expect("probabilities")
        .iter()
        .map(|step| {
            let top = step["top_logprobs"].as_array().expect("top");
            let top =
                top.iter().map(|entry| (entry["id"].as_i64().expect("id"), entry["logprob"].as_f64().expect("lp")));
            (step["id"].as_i64().expect("id"), top.collect())
        })
        .collect()
}

#[test]
fn a_hybrid_model_s_replies_do_not_depend_on_what_runs_beside_them() {
    let path = model("qwen35moe");
    let server = Server::start_model(&path, &["-np", "3", "-c", "768", "-t", "2"], &[]);
    let prompt = " a dog ran and a cat sat on a mat! the dog is";
    let body = |cache: bool, seed: u64| {
        json!({"prompt": prompt, "n_predict": 16, "n_probs": 3, "temperature": 0.8, "seed": seed,
               "cache_prompt": cache})
    };
    let alone = complete(&server, &body(false, 7));
    let alone_steps = steps(&alone);
    assert_eq!(alone_steps.len(), 16, "{alone}");

    // The same request again (the slot's last sequence is its prefix),
    // with the cache asked for, and streamed: the same tokens and bits.
    assert_eq!(steps(&complete(&server, &body(true, 7))), alone_steps, "cache_prompt changed the reply");
    let mut streamed = body(true, 7);
    streamed["stream"] = json!(true);
    let stream = server.stream("/completion", &streamed);
    assert_eq!(stream.status, StatusCode::OK, "{}", stream.error);
    let tokens: Vec<i64> = stream
        .events
        .iter()
        .filter(|event| event["stop"] == false)
        .flat_map(|event| event["tokens"].as_array().cloned().unwrap_or_default())
        .filter_map(|token| token.as_i64())
        .collect();
    assert_eq!(tokens, alone_steps.iter().map(|(token, _)| *token).collect::<Vec<_>>(), "streamed differs");

    // Three at once, in a step together: each gets what it gets alone.
    let other = |text: &str, seed: u64| json!({"prompt": text, "n_predict": 24, "temperature": 0.8, "seed": seed});
    std::thread::scope(|scope| {
        let runs: Vec<_> = [other(" the cat sat on the mat!", 1), body(true, 7), other(" Hello world", 2)]
            .into_iter()
            .map(|request| {
                let server = &server;
                scope.spawn(move || complete(server, &request))
            })
            .collect();
        let replies: Vec<Value> = runs.into_iter().map(|run| run.join().expect("a reply")).collect();
        assert_eq!(steps(&replies[1]), alone_steps, "batched with two others differs from alone");
    });

    // A continuation of the first reply, as a chat client sends it back:
    // it resumes where the cached request ended, with an uncached run's
    // bits.
    let continued = format!("{prompt}{}", alone["content"].as_str().expect("content"));
    let request = |cache: bool| json!({"prompt": continued, "n_predict": 8, "n_probs": 3, "temperature": 0, "cache_prompt": cache});
    let cached = complete(&server, &request(true));
    assert!(cached["timings"]["cache_n"].as_u64() > Some(0), "{cached}");
    assert_eq!(steps(&cached), steps(&complete(&server, &request(false))));
    std::fs::remove_file(&path).expect("removed");
}

fn cache_n(reply: &Value) -> usize {
    reply["timings"]["cache_n"].as_u64().expect("cache_n") as usize
}

fn tokens(server: &Server, text: &str) -> Vec<i64> {
    let (status, reply) = server.post("/tokenize", &json!({"content": text}));
    assert_eq!(status, StatusCode::OK, "{reply}");
    reply["tokens"].as_array().expect("tokens").iter().filter_map(Value::as_i64).collect()
}

#[test]
fn hybrid_prompts_resume_from_state_snapshots_and_slot_files_with_uncached_bits() {
    let path = model("qwen35");
    let slots = std::env::temp_dir().join(format!("sluice-hybrid-slots-{}", std::process::id()));
    std::fs::create_dir_all(&slots).expect("a folder");
    let save_path = slots.to_str().expect("UTF-8");
    // Snapshots every 32 tokens (two KV blocks), passes of at most 40 rows.
    let args = ["-np", "2", "-c", "2048", "-cms", "32", "-ub", "40", "--slot-save-path", save_path];
    let server = Server::start_model(&path, &args, &[]);
    let sentence = " the dog ran after the cat and the cat sat on the mat";
    let prompt: String = (0..12).map(|i| format!("{sentence} {i}.")).collect();
    let n_prompt = tokens(&server, &prompt).len();
    assert!(n_prompt > 100, "{n_prompt}");
    let body = |text: &str, cache: bool| json!({"prompt": text, "n_predict": 6, "n_probs": 3, "temperature": 0, "cache_prompt": cache, "id_slot": 0});
    let uncached = complete(&server, &body(&prompt, false));
    assert_eq!(cache_n(&uncached), 0);
    let first = complete(&server, &body(&prompt, true));
    assert_eq!(steps(&first), steps(&uncached));
    assert!(server.metric("sluice_recurrent_snapshots") > 0.0);
    assert!(server.metric("sluice_recurrent_snapshot_bytes") > 0.0);

    // The same prompt again: from the snapshot 4 tokens before its end.
    let again = complete(&server, &body(&prompt, true));
    assert_eq!(cache_n(&again), n_prompt - 4, "{again}");
    assert_eq!(steps(&again), steps(&uncached));

    // A prompt that parts from it after its first sentences: from the last
    // 32-token snapshot before they part.
    let parted = format!("{}{sentence} but then", &prompt[..prompt.len() / 2]);
    let shared = tokens(&server, &prompt).iter().zip(tokens(&server, &parted)).take_while(|(a, b)| **a == *b).count();
    let reply = complete(&server, &body(&parted, true));
    assert_eq!(cache_n(&reply), shared / 32 * 32, "{reply}");
    assert!(cache_n(&reply) > 0);
    assert_eq!(steps(&reply), steps(&complete(&server, &body(&parted, false))));

    // The first reply continued: from where a request on it ended.
    let continued = format!("{prompt}{}", first["content"].as_str().expect("content"));
    let reference = complete(&server, &body(&continued, false));
    complete(&server, &body(&prompt, true));
    let reply = complete(&server, &body(&continued, true));
    assert!(cache_n(&reply) > n_prompt, "{reply}");
    assert_eq!(steps(&reply), steps(&reference));

    // Slot 0 saved after a request on the prompt, restored into a fresh
    // server: the continuation resumes from the file's state.
    complete(&server, &body(&prompt, true));
    let (status, saved) = server.post("/slots/0?action=save", &json!({"filename": "slot.bin"}));
    assert_eq!(status, StatusCode::OK, "{saved}");
    let n_saved = saved["n_saved"].as_u64().expect("n_saved") as usize;
    assert!(n_saved > n_prompt, "{saved}");
    drop(server);
    let server = Server::start_model(&path, &args, &[]);
    let (status, restored) = server.post("/slots/1?action=restore", &json!({"filename": "slot.bin"}));
    assert_eq!(status, StatusCode::OK, "{restored}");
    assert_eq!(restored["n_restored"].as_u64(), Some(n_saved as u64));
    let mut resumed = body(&continued, true);
    resumed["id_slot"] = json!(1);
    let reply = complete(&server, &resumed);
    assert!(cache_n(&reply) > n_prompt, "{reply}");
    assert_eq!(steps(&reply), steps(&reference));
    drop(server);
    std::fs::remove_dir_all(&slots).expect("removed");
    std::fs::remove_file(&path).expect("removed");
}

#[test]
fn drafts_and_context_shift_are_refused_by_name() {
    let path = model("qwen35");
    let refused = |args: &[&str], why: &str| {
        let output = Command::new(sluice_binary())
            .args(["serve", "--port", "0", "-m"])
            .arg(&path)
            .args(args)
            .output()
            .expect("sluice runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
    };
    refused(&["--context-shift"], "recurrent layers cannot drop their oldest positions");
    let draft = path.to_str().expect("UTF-8");
    refused(&["-md", draft], "the target (qwen35) has recurrent layers");
    std::fs::remove_file(Path::new(&path)).expect("removed");
}
