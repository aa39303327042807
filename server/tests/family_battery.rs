//! The hostile-client battery (`sluice_tests::battery`) on every family
//! that issues P, Q and R added, each served from its synthetic model: the
//! malformed bodies, wrong field values and named hostile requests of
//! `bad_inputs`, then what only these families bring: chat templates that
//! refuse conversations they do not take (Gemma's alternation rule),
//! sliding windows (prompts many windows long, slot files refused without
//! `--swa-full`), recurrent layers (slot files with their state), vocabularies smaller than the probabilities asked for,
//! and token ids past the vocabulary.

use std::path::PathBuf;

use serde_json::{Value, json};
use sluice_tests::battery::{self, Expect, Report, Target};
use sluice_tests::http::Server;
use sluice_tests::models::tiny_family;

const FAMILIES: [&str; 16] = [
    "gemma2",
    "gemma3",
    "phi3",
    "mistral3",
    "smollm3",
    "granite",
    "glm4",
    "olmo2",
    "qwen3moe",
    "qwen2moe",
    "mixtral",
    "gpt-oss",
    "glm4moe",
    "qwen35",
    "qwen35moe",
    "qwen3next",
];
const KEY: &str = "family-battery-key";

/// Requests that reach what differs between families.
fn family_cases() -> Vec<(String, &'static str, Value, Expect)> {
    let chat = |messages: Value| json!({ "messages": messages, "max_tokens": 2 });
    let user = |text: &str| json!({ "role": "user", "content": text });
    let turn = |role: &str, text: &str| json!({ "role": role, "content": text });
    // 55 to 200 tokens by family: many of Gemma's 5-position windows,
    // within a slot's 256 positions.
    let long_prompt = "the cat sat on the mat and the dog ran. ".repeat(5);
    vec![
        (
            "two user turns in a row".into(),
            "/v1/chat/completions",
            chat(json!([user("Hello"), user("the cat")])),
            Expect::Any,
        ),
        (
            "an assistant turn first".into(),
            "/v1/chat/completions",
            chat(json!([turn("assistant", "Hello"), user("the cat")])),
            Expect::Any,
        ),
        ("a system turn alone".into(), "/v1/chat/completions", chat(json!([turn("system", "be brief")])), Expect::Any),
        (
            "a system turn after a user turn".into(),
            "/v1/chat/completions",
            chat(json!([user("Hello"), turn("system", "be brief"), user("the cat")])),
            Expect::Any,
        ),
        (
            "a tool answer without a call".into(),
            "/v1/chat/completions",
            chat(json!([user("Hello"), json!({ "role": "tool", "tool_call_id": "x", "content": "42" })])),
            Expect::Any,
        ),
        // As llama-server, the template decides: some render nothing and
        // generate from there, others raise.
        ("an empty conversation".into(), "/v1/chat/completions", chat(json!([])), Expect::Any),
        (
            "the template of a role no template knows".into(),
            "/apply-template",
            json!({ "messages": [turn("narrator", "once")] }),
            Expect::Any,
        ),
        (
            "a prompt many windows long".into(),
            "/completion",
            json!({ "prompt": long_prompt, "n_predict": 4 }),
            Expect::Status(200, &[]),
        ),
        (
            "a prompt many windows long, streamed".into(),
            "/completion",
            json!({ "prompt": long_prompt, "n_predict": 4, "stream": true }),
            Expect::Status(200, &[]),
        ),
        (
            "more probabilities than the vocabulary holds".into(),
            "/completion",
            json!({ "prompt": "Hello", "n_predict": 2, "n_probs": 100 }),
            Expect::Status(200, &[]),
        ),
        (
            "a token id past the vocabulary".into(),
            "/completion",
            json!({ "prompt": [1, 1_000_000], "n_predict": 1 }),
            Expect::Status(400, &["prompt"]),
        ),
        (
            "a detokenized id past the vocabulary".into(),
            "/detokenize",
            json!({ "tokens": [1_000_000] }),
            Expect::Refused,
        ),
        (
            "special tokens parsed from text".into(),
            "/tokenize",
            json!({ "content": "<start_of_turn><|im_start|>[INST]<|user|><bos>", "add_special": true, "with_pieces": true }),
            Expect::Status(200, &[]),
        ),
        ("a slot saved".into(), "/slots/0?action=save", json!({ "filename": "slot.bin" }), Expect::Any),
        (
            "a slot restored from a file never saved".into(),
            "/slots/0?action=restore",
            json!({ "filename": "missing.bin" }),
            Expect::Refused,
        ),
    ]
}

#[test]
fn every_new_family_keeps_every_rule_under_the_battery() {
    let scratch = std::env::temp_dir().join(format!("sluice-family-battery-{}", std::process::id()));
    let slots = scratch.join("slots");
    std::fs::create_dir_all(&slots).expect("a scratch folder");
    let mut failed = Vec::new();
    for arch in FAMILIES {
        let model: PathBuf = scratch.join(format!("{arch}.gguf"));
        std::fs::write(&model, tiny_family(arch).expect("a tiny model of the family").build()).expect("written");
        let slots = slots.to_str().expect("a UTF-8 path");
        let args = ["-t", "1", "-np", "2", "-c", "512", "--api-key", KEY, "--slot-save-path", slots];
        let server = Server::start_model(&model, &args, &[]);
        let mut report = Report::default();
        let target = Target {
            server: &server,
            key: KEY,
            slot_ctx: 256,
            n_probs_cap: 100,
            body_limit: 16 << 20,
            extra_routes: Vec::new(),
            plugin_dir: None,
        };
        battery::bad_inputs(&target, &mut report);
        battery::requests(&target, &mut report, "family requests", family_cases());
        eprintln!("{arch}:\n{}", report.table());
        if !report.failures().is_empty() {
            let log = server.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            failed.push(format!(
                "{arch}:\n{}\nlog, last lines first:\n{}",
                report.failures().join("\n"),
                tail.join("\n")
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    let _ = std::fs::remove_dir_all(&scratch);
}
