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

/// `arch`'s synthetic model in a file of this test's own.
fn model(arch: &str) -> PathBuf {
    static WRITTEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let nth = WRITTEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("sluice-hybrid-{arch}-{}-{nth}.gguf", std::process::id()));
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
    let tokens = streamed_tokens(&server, &body(true, 7));
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

/// The tokens a stream carried.
fn streamed_tokens(server: &Server, body: &Value) -> Vec<i64> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let stream = server.stream("/completion", &body);
    assert_eq!(stream.status, StatusCode::OK, "{}", stream.error);
    stream
        .events
        .iter()
        .filter(|event| event["stop"] == false)
        .flat_map(|event| event["tokens"].as_array().cloned().unwrap_or_default())
        .filter_map(|token| token.as_i64())
        .collect()
}

/// An attention-only draft for a hybrid target, greedy and sampled,
/// streamed and not, several requests at once: every reply is the target's
/// own, token for token and bit for bit, while some drafts are kept whole
/// and others cut short (the state put back and the kept tokens replayed).
#[test]
fn drafts_on_a_hybrid_target_give_the_target_s_own_replies() {
    let path = model("qwen35");
    let draft = std::env::temp_dir().join(format!("sluice-hybrid-draft-{}.gguf", std::process::id()));
    std::fs::write(&draft, sluice_tests::models::qwen35_draft().build()).expect("written");
    let alone = Server::start_model(&path, &["-np", "3", "-t", "2"], &[]);
    let args = ["-np", "3", "-t", "2", "-md", draft.to_str().expect("UTF-8"), "--spec-draft-p-min", "0"];
    let drafted = Server::start_model(&path, &[&args[..], &["--spec-draft-n-max", "4"]].concat(), &[]);
    let prompts = [" the cat sat on the mat!", " a dog ran and a cat sat on a mat! the dog is", " Hello world"];
    let bodies: Vec<Value> = prompts
        .iter()
        .enumerate()
        .flat_map(|(index, prompt)| {
            [(0.0, 0), (0.8, 11 + index as u64)].map(|(temperature, seed)| {
                json!({"prompt": prompt, "n_predict": 40, "n_probs": 3, "temperature": temperature, "seed": seed,
                       "cache_prompt": false})
            })
        })
        .collect();
    let expected: Vec<Value> = bodies.iter().map(|body| complete(&alone, body)).collect();
    std::thread::scope(|scope| {
        let runs: Vec<_> = bodies
            .iter()
            .map(|body| {
                let drafted = &drafted;
                scope.spawn(move || complete(drafted, body))
            })
            .collect();
        for ((run, want), body) in runs.into_iter().zip(&expected).zip(&bodies) {
            assert_eq!(steps(&run.join().expect("a reply")), steps(want), "{body}");
        }
    });
    for (body, want) in bodies.iter().zip(&expected) {
        let tokens: Vec<i64> = steps(want).iter().map(|(token, _)| *token).collect();
        assert_eq!(streamed_tokens(&drafted, body), tokens, "streamed {body}");
    }
    let drafts = drafted.metric("llamacpp:spec_decode_num_draft_tokens_total");
    let accepted = drafted.metric("llamacpp:spec_decode_num_accepted_tokens_total");
    assert!(accepted > 0.0 && accepted < drafts, "{accepted} of {drafts} drafted tokens accepted");
    drop((alone, drafted));
    std::fs::remove_file(&draft).expect("removed");
    std::fs::remove_file(&path).expect("removed");
}

/// The deployment's pair in small, text only: a hybrid mixture of experts
/// with interleaved M-RoPE (Qwen3.5-MoE's layout, as Nex's models have it)
/// and a legacy DFlash draft without rope sections, paired through
/// `mrope-temporal`, tapping two Gated DeltaNet layers. Greedy and
/// sampled, streamed and not, cold and resumed from the prefix cache: the
/// target's own tokens, with drafts made.
#[test]
fn a_nex_shaped_pair_with_a_legacy_dflash_draft_changes_nothing_on_text() {
    let path = model("qwen35moe");
    let draft = std::env::temp_dir().join(format!("sluice-hybrid-dflash-{}.gguf", std::process::id()));
    std::fs::write(&draft, sluice_tests::models::tiny_dflash("qwen35moe").expect("a draft").build()).expect("written");
    let alone = Server::start_model(&path, &["-np", "2", "-t", "2"], &[]);
    let args = ["-np", "2", "-t", "2", "-md", draft.to_str().expect("UTF-8"), "--spec-draft-p-min", "0"];
    let drafted = Server::start_model(&path, &args, &[]);
    // Long enough (over 64 tokens) to leave a snapshot 4 tokens before its
    // end, which the continuation resumes from.
    let first = " a dog ran and a cat sat on a mat! the dog is".repeat(6);
    let continued = format!("{first} on the mat and the cat");
    for stream in [false, true] {
        for temperature in [0.0, 0.8] {
            let case = format!("stream {stream}, temperature {temperature}");
            for (name, prompt, cache) in
                [("cold", &first, false), ("first turn", &first, true), ("continued", &continued, true)]
            {
                let body = json!({"prompt": prompt, "n_predict": 24, "temperature": temperature, "seed": 7,
                                  "return_tokens": true, "ignore_eos": true, "cache_prompt": cache});
                let tokens = |server: &Server| match stream {
                    true => streamed_tokens(server, &body),
                    false => {
                        let reply = complete(server, &body);
                        reply["tokens"].as_array().expect("tokens").iter().filter_map(Value::as_i64).collect()
                    }
                };
                let want = tokens(&alone);
                assert_eq!(want.len(), 24, "{name}, {case}");
                assert_eq!(tokens(&drafted), want, "{name}, {case}: the draft changed the output");
            }
        }
    }
    assert!(drafted.metric("llamacpp:spec_decode_num_drafts_total") > 0.0, "no drafts");
    assert!(drafted.metric("sluice_prefix_cache_hit_tokens_total") > 0.0, "no continuation resumed");
    drop((alone, drafted));
    std::fs::remove_file(&draft).expect("removed");
    std::fs::remove_file(&path).expect("removed");
}

#[test]
fn a_recurrent_draft_and_context_shift_are_refused_by_name() {
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
    refused(&["-md", draft], "the draft (qwen35) has recurrent layers");
    std::fs::remove_file(Path::new(&path)).expect("removed");
}
