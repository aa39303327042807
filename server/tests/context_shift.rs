//! A full context, as llama-server handles it: without `--context-shift` a
//! request stops when the token it sampled would take the context's last
//! cell (`truncated`); with it, the older half of what follows `n_keep` is
//! dropped and generation goes on, exactly as a fresh request holding what
//! was kept would go on.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::gguf_writer::Value as Meta;
use sluice_tests::http::Server;
use sluice_tests::models::tiny_family;

const CTX: usize = 64;
const PROMPT: &str = "Once upon a time, in a small village by the sea,";

fn complete(server: &Server, body: &Value) -> Value {
    let (status, answer) = server.post("/completion", body);
    assert_eq!(status, StatusCode::OK, "{body}: {answer}\n{}", server.log());
    answer
}

fn ids(value: &Value) -> Vec<u64> {
    value.as_array().expect("an array of token ids").iter().map(|id| id.as_u64().expect("a token id")).collect()
}

fn prompt_tokens(server: &Server) -> Vec<u64> {
    let (status, answer) = server.post("/tokenize", &json!({ "content": PROMPT, "add_special": true }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    ids(&answer["tokens"])
}

/// `shifted`, a request of `prompt` keeping all of it and generating
/// twice the context, was truncated at its first shift exactly as a fresh
/// request holding what it kept goes on; its tokens.
fn assert_goes_on_as_fresh(server: &Server, prompt: &[u64], shifted: &Value) -> Vec<u64> {
    let (n_prompt, n_predict) = (prompt.len(), 2 * CTX);
    assert_eq!(shifted["tokens_predicted"].as_u64(), Some(n_predict as u64), "{shifted}");
    assert_eq!(shifted["truncated"], true, "a shifted context is reported as truncated");
    assert_eq!(shifted["timings"]["prompt_n"].as_u64(), Some(n_prompt as u64), "the prompt is counted once");
    let generated = ids(&shifted["tokens"]);
    assert_eq!(generated.len(), n_predict);

    // The first shift comes when the token sampled would take the last
    // cell: it drops half of the cells after the kept prompt.
    let pending = CTX - n_prompt;
    let cells: Vec<u64> = prompt.iter().chain(&generated[..pending - 1]).copied().collect();
    assert_eq!(cells.len(), CTX - 1);
    let discard = (cells.len() - n_prompt) / 2;
    let mut kept: Vec<u64> = cells[..n_prompt].to_vec();
    kept.extend_from_slice(&cells[n_prompt + discard..]);
    kept.push(generated[pending - 1]);

    // A fresh request holding exactly that (and keeping the same prompt
    // when it shifts in its turn) generates what the shifted one did.
    let fresh = complete(
        server,
        &json!({
            "prompt": kept, "n_predict": n_predict - pending, "ignore_eos": true, "temperature": 0,
            "n_keep": n_prompt, "return_tokens": true, "cache_prompt": false,
        }),
    );
    assert_eq!(ids(&fresh["tokens"]), generated[pending..].to_vec(), "{fresh}");
    generated
}

#[test]
fn without_shift_a_full_context_ends_the_request() {
    let ctx = CTX.to_string();
    let server = Server::start(&["-c", &ctx, "-np", "1"]);
    let n_prompt = prompt_tokens(&server).len();
    let answer = complete(&server, &json!({ "prompt": PROMPT, "n_predict": -1, "ignore_eos": true, "temperature": 0 }));
    // Prompt and generated tokens fill the context exactly.
    assert_eq!(answer["tokens_predicted"].as_u64(), Some((CTX - n_prompt) as u64), "{answer}");
    assert_eq!(answer["truncated"], true);
    assert_eq!(answer["stop_type"], "limit");

    // A limit reached first is not a truncation.
    let answer = complete(&server, &json!({ "prompt": PROMPT, "n_predict": 4, "ignore_eos": true, "temperature": 0 }));
    assert_eq!(answer["truncated"], false, "{answer}");

    let long: Vec<u64> = (0..CTX as u64).map(|i| 300 + i).collect();
    let (status, answer) = server.post("/completion", &json!({ "prompt": long, "n_predict": 4 }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("exceeds the available context size")));
}

#[test]
fn a_shifted_request_goes_on_as_a_fresh_one_with_what_it_kept() {
    let ctx = CTX.to_string();
    let server = Server::start(&["-c", &ctx, "-np", "1", "--context-shift"]);
    let prompt = prompt_tokens(&server);
    let n_prompt = prompt.len();
    let n_predict = 2 * CTX;
    let body = json!({
        "prompt": PROMPT, "n_predict": n_predict, "ignore_eos": true, "temperature": 0,
        "n_keep": n_prompt, "return_tokens": true,
    });
    let shifted = complete(&server, &body);
    let generated = assert_goes_on_as_fresh(&server, &prompt, &shifted);

    // Streaming shifts the same way.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let stream = server.stream("/completion", &streamed);
    assert_eq!(stream.status, StatusCode::OK, "{}", stream.error);
    let tokens: Vec<u64> =
        stream.events.iter().filter(|event| event["stop"] == false).flat_map(|event| ids(&event["tokens"])).collect();
    assert_eq!(tokens, generated);
    let last = stream.events.last().expect("a final event");
    assert_eq!(last["truncated"], true, "{last}");
}

/// The tiny Gemma 3 (six window layers of 5 positions, one global), its
/// window layers freeing their old cells: a shift goes on as a fresh
/// request does; a repeated prompt is computed whole, never served from the
/// prefix cache (the window cells it would resume from are gone), and slot
/// files are refused. With `--swa-full` every cell is kept: the same
/// tokens, and the prompt served from the prefix cache.
#[test]
fn a_window_model_shifts_and_computes_every_prompt_whole() {
    let dir = std::env::temp_dir().join(format!("sluice-shift-gemma3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let model = dir.join("gemma3.gguf");
    std::fs::write(&model, tiny_family("gemma3").expect("a tiny Gemma 3").build()).expect("written");
    let (ctx, folder) = (CTX.to_string(), dir.to_str().expect("utf-8"));
    let args = ["-c", &ctx, "-np", "1", "--context-shift", "-b", "32", "-ub", "32", "--slot-save-path", folder];
    let server = Server::start_model(&model, &args, &[]);
    assert!(server.log().contains("KV: 6 window layers"), "{}", server.log());
    let prompt: Vec<u64> = (0..20).map(|i| 134 + (i * 5) % 16).collect();
    let body = json!({
        "prompt": prompt, "n_predict": 2 * CTX, "ignore_eos": true, "temperature": 0,
        "n_keep": prompt.len(), "return_tokens": true,
    });
    let shifted = complete(&server, &body);
    let generated = assert_goes_on_as_fresh(&server, &prompt, &shifted);
    let again = complete(&server, &body);
    assert_eq!(ids(&again["tokens"]), generated);
    assert_eq!(again["timings"]["cache_n"], 0, "{again}");
    // Idle, the window store has every block back.
    assert_eq!(server.metric("sluice_kv_window_blocks_used"), 0.0);
    assert!(server.metric("sluice_kv_window_blocks_free") > 0.0);
    let (status, answer) = server.post("/slots/0?action=save", &json!({ "filename": "slot.bin" }));
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("--swa-full")), "{answer}");

    let full = Server::start_model(&model, &[&args[..], &["--swa-full"]].concat(), &[]);
    assert!(full.log().contains("every cell kept: --swa-full"), "{}", full.log());
    assert_eq!(ids(&complete(&full, &body)["tokens"]), generated);
    let again = complete(&full, &body);
    assert_eq!(ids(&again["tokens"]), generated);
    assert_eq!(full.metric("sluice_kv_window_blocks_free"), 0.0, "no window store");
    assert_eq!(again["timings"]["cache_n"].as_u64(), Some(prompt.len() as u64 - 1), "{again}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model whose every layer attends through a window (the tiny Gemma 3
/// with a pattern period of 0): no paged layer at all. It serves long
/// generations with its old cells freed, as it does with every cell kept.
#[test]
fn an_all_window_model_answers_as_with_every_cell_kept() {
    let dir = std::env::temp_dir().join(format!("sluice-all-window-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let model = dir.join("gemma3-local.gguf");
    let local = tiny_family("gemma3").expect("a tiny Gemma 3");
    let local = local.meta("gemma3.attention.sliding_window_pattern", Meta::U32(0));
    std::fs::write(&model, local.build()).expect("written");
    let ctx = CTX.to_string();
    let args = ["-c", &ctx, "-np", "1", "-b", "32", "-ub", "32"];
    let body = json!({
        "prompt": (0..20).map(|i| 134 + (i * 5) % 16).collect::<Vec<u64>>(), "n_predict": 40,
        "ignore_eos": true, "temperature": 0, "return_tokens": true,
    });
    let server = Server::start_model(&model, &args, &[]);
    assert!(server.log().contains("KV: 7 window layers"), "{}", server.log());
    let windowed = ids(&complete(&server, &body)["tokens"]);
    assert_eq!(windowed.len(), 40);
    assert_eq!(server.metric("sluice_kv_window_blocks_used"), 0.0);
    let full = Server::start_model(&model, &[&args[..], &["--swa-full"]].concat(), &[]);
    assert_eq!(ids(&complete(&full, &body)["tokens"]), windowed);
    let _ = std::fs::remove_dir_all(&dir);
}
