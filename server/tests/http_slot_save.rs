//! Slot files (`--slot-save-path`, `POST /slots/{id}?action=save|restore|erase`):
//! a saved, erased and restored cache gives what the original cache gave,
//! bit for bit, in the same server or a fresh one; bad names, ids, actions
//! and files get llama-server's errors and nothing is written outside the
//! folder.

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::Server;

const PROMPT: &str = "The history of Paris begins with a small settlement on an island in the Seine, where";

/// A fresh scratch folder (emptied if a previous run left it).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-slot-save-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn path_arg(dir: &Path) -> &str {
    dir.to_str().expect("utf-8 path")
}

fn token_ids(server: &Server, text: &str) -> Vec<Value> {
    let (status, answer) = server.post("/tokenize", &json!({ "content": text }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer["tokens"].as_array().expect("tokens").clone()
}

/// Greedy, with probabilities: equal answers mean equal logits.
fn complete(server: &Server, prompt: &[Value], slot: u32) -> Value {
    let body = json!({ "prompt": prompt, "id_slot": slot, "cache_prompt": true, "n_predict": 8,
                       "temperature": 0.0, "ignore_eos": true, "return_tokens": true, "n_probs": 2 });
    let (status, answer) = server.post("/completion", &body);
    assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
    answer
}

/// What a completion leaves cached in its slot: its prompt and every
/// generated token but the last, which never ran.
fn cached_after(answer: &Value) -> u64 {
    answer["tokens_evaluated"].as_u64().expect("tokens_evaluated") + answer["tokens_predicted"].as_u64().expect("n") - 1
}

fn ran_in(answer: &Value) -> u32 {
    answer["id_slot"].as_u64().and_then(|slot| u32::try_from(slot).ok()).expect("id_slot")
}

fn slot_action(server: &Server, slot: u32, action: &str, body: &Value) -> (StatusCode, Value) {
    server.post(&format!("/slots/{slot}?action={action}"), body)
}

fn ok(answer: (StatusCode, Value)) -> Value {
    assert_eq!(answer.0, StatusCode::OK, "{}", answer.1);
    answer.1
}

fn same_generation(got: &Value, expected: &Value) {
    for key in ["content", "tokens", "completion_probabilities"] {
        assert_eq!(got[key], expected[key], "{key} differs");
    }
    assert_eq!(got["timings"]["cache_n"], expected["timings"]["cache_n"]);
    assert_eq!(got["timings"]["prompt_n"], expected["timings"]["prompt_n"]);
}

#[test]
fn a_restored_slot_generates_what_the_original_cache_did() {
    let dir = scratch("round-trip");
    let server = Server::start(&["-np", "2", "--slot-save-path", path_arg(&dir)]);
    let prompt = token_ids(&server, PROMPT);
    // Slot 1 as llama-server clients name it; the policy may run the
    // request in another slot (`continuous` takes the first free one).
    let first = complete(&server, &prompt, 1);
    assert_eq!(first["timings"]["cache_n"], 0);
    let n_cached = cached_after(&first);

    let saved = ok(slot_action(&server, 1, "save", &json!({ "filename": "slot.bin" })));
    assert_eq!((saved["id_slot"].clone(), saved["filename"].clone()), (json!(1), json!("slot.bin")));
    assert_eq!(saved["n_saved"], n_cached, "{saved}");
    let on_disk = std::fs::metadata(dir.join("slot.bin")).expect("the file is there").len();
    assert_eq!(saved["n_written"], on_disk);
    assert!(saved["timings"]["save_ms"].is_f64(), "{saved}");

    // The prompt again, with every generated token and more: the whole
    // cache is its prefix.
    let follow: Vec<Value> =
        [&prompt[..], first["tokens"].as_array().expect("tokens"), &token_ids(&server, " Then")].concat();
    let original = complete(&server, &follow, 1);
    assert_eq!(original["timings"]["cache_n"], n_cached, "{original}");

    let erased = ok(slot_action(&server, 1, "erase", &json!({})));
    assert_eq!(erased, json!({ "id_slot": 1, "n_erased": cached_after(&original) }));
    let uncached = complete(&server, &prompt, 1);
    assert_eq!(uncached["timings"]["cache_n"], 0, "erasing dropped the slot's tokens");
    ok(slot_action(&server, 1, "erase", &json!({})));

    let restored = ok(slot_action(&server, 0, "restore", &json!({ "filename": "slot.bin" })));
    assert_eq!(restored["n_restored"], n_cached, "{restored}");
    assert_eq!(restored["n_read"], on_disk);
    assert!(restored["timings"]["restore_ms"].is_f64(), "{restored}");
    same_generation(&complete(&server, &follow, 0), &original);
    drop(server);

    // A fresh server has nothing cached but the file's bytes.
    let fresh = Server::start(&["-np", "2", "--slot-save-path", path_arg(&dir)]);
    let restored = ok(slot_action(&fresh, 1, "restore", &json!({ "filename": "slot.bin" })));
    assert_eq!((restored["id_slot"].clone(), restored["n_restored"].clone()), (json!(1), json!(n_cached)));
    same_generation(&complete(&fresh, &follow, 1), &original);

    // An action on a busy slot waits for its request to end. Without
    // `id_slot`, a request becomes the cache of the slot it runs in.
    let body = json!({ "prompt": prompt, "n_predict": 48, "ignore_eos": true, "stream": true });
    let mut stream = fresh.open_stream("/completion", &body);
    let event: Value = serde_json::from_str(&stream.next_data().expect("the first token")).expect("JSON");
    let busy = ran_in(&event);
    let saved = ok(slot_action(&fresh, busy, "save", &json!({ "filename": "busy.bin" })));
    let n_prompt = first["tokens_evaluated"].as_u64().expect("tokens_evaluated");
    assert_eq!(saved["n_saved"], n_prompt + 47, "saved once the request ended: {saved}");
    while stream.next_data().is_some() {}
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn bad_requests_get_llama_server_errors() {
    let dir = scratch("errors");
    let folder = dir.join("slots");
    let server = Server::start(&["-np", "2", "--slot-save-path", path_arg(&folder)]);
    let error = |answer: (StatusCode, Value), status: StatusCode, kind: &str, mentions: &str| {
        let (got, body) = answer;
        assert_eq!((got, body["error"]["type"].as_str()), (status, Some(kind)), "{body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(mentions), "{message:?} should mention {mentions:?}");
    };
    let bad = StatusCode::BAD_REQUEST;
    let invalid = "invalid_request_error";

    let names = ["../escape.bin", "a/b.bin", "a\\b.bin", "", ".", "..", "x\u{0}y", "/tmp/abs.bin", "trail."];
    for action in ["save", "restore"] {
        for name in names {
            error(slot_action(&server, 0, action, &json!({ "filename": name })), bad, invalid, "Invalid filename");
        }
        error(slot_action(&server, 0, action, &json!({})), bad, invalid, "Invalid filename");
        error(slot_action(&server, 0, action, &json!({ "filename": 3 })), bad, invalid, "Invalid filename");
    }
    assert!(!dir.join("escape.bin").exists() && !Path::new("/tmp/abs.bin").exists(), "nothing escaped");
    error(server.post("/slots/2?action=save", &json!({ "filename": "s.bin" })), bad, invalid, "Invalid slot ID");
    error(server.post("/slots/-1?action=erase", &json!({})), bad, invalid, "Invalid slot ID");
    error(server.post("/slots/one?action=erase", &json!({})), bad, invalid, "Invalid slot ID");
    error(server.post("/slots/0?action=explode", &json!({})), bad, invalid, "Invalid action");
    error(server.post("/slots/0", &json!({})), bad, invalid, "Invalid action");
    let restore = |name: &str| slot_action(&server, 0, "restore", &json!({ "filename": name }));
    error(restore("absent.bin"), bad, invalid, "\"absent.bin\"");

    // A real file to spoil: saved after one request.
    complete(&server, &token_ids(&server, PROMPT), 0);
    let saved = ok(slot_action(&server, 0, "save", &json!({ "filename": "good.bin" })));
    let good = std::fs::read(folder.join("good.bin")).expect("saved");
    assert_eq!(saved["n_written"], good.len());
    let spoiled = |name: &str, change: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        change(&mut bytes);
        std::fs::write(folder.join(name), bytes).expect("write");
    };
    spoiled("model.bin", &|bytes| bytes[12] ^= 1);
    error(restore("model.bin"), bad, invalid, "saved for another model");
    spoiled("layers.bin", &|bytes| bytes[20] += 1);
    error(restore("layers.bin"), bad, invalid, "n_layer");
    spoiled("version.bin", &|bytes| bytes[8] = 9);
    error(restore("version.bin"), bad, invalid, "version 9");
    spoiled("short.bin", &|bytes| bytes.truncate(bytes.len() - 1));
    error(restore("short.bin"), bad, invalid, "truncated");
    spoiled("garbage.bin", &|bytes| bytes.iter_mut().for_each(|byte| *byte = 0x5a));
    error(restore("garbage.bin"), bad, invalid, "not a sluice slot file");
    std::fs::write(folder.join("empty.bin"), b"").expect("write");
    error(restore("empty.bin"), bad, invalid, "\"empty.bin\"");
    // Larger than any slot: refused before it is read.
    let huge = std::fs::File::create(folder.join("huge.bin")).expect("create");
    huge.set_len(1 << 40).expect("a sparse file");
    error(restore("huge.bin"), bad, invalid, "more than a slot");
    std::fs::remove_file(folder.join("huge.bin")).expect("clean up");
    std::fs::create_dir(folder.join("folder.bin")).expect("mkdir");
    error(restore("folder.bin"), bad, invalid, "not a regular file");
    ok(restore("good.bin"));
    drop(server);

    // Another KV layout: blocks of 32 tokens.
    let config = dir.join("blocks32.toml");
    std::fs::write(&config, "[engine]\nkv_block_tokens = 32\n").expect("config");
    let other = Server::start(&["--config", path_arg(&config), "--slot-save-path", path_arg(&folder)]);
    let answer = slot_action(&other, 0, "restore", &json!({ "filename": "good.bin" }));
    error(answer, bad, invalid, "KV block size (tokens per block): the file has 16, this server 32");
    drop(other);

    let without = Server::start(&[]);
    for action in ["save", "restore", "erase"] {
        let answer = slot_action(&without, 0, action, &json!({ "filename": "good.bin" }));
        let message = "This server does not support slots action. Start it with `--slot-save-path`";
        error(answer, StatusCode::NOT_IMPLEMENTED, "not_supported_error", message);
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
}
