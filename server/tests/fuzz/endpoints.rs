//! `endpoints`: every POST route's request body over real HTTP, on the real
//! binary serving a tiny synthetic model (a byte-level vocabulary, the
//! default model's chat template; two slots of 256 tokens, so generations
//! end within milliseconds). Bodies are the corpus's with structure-aware
//! mutations, sent to their own route or another, streamed or not, and now
//! and then as JSON text with a key twice or corrupted bytes. For every
//! answer:
//!
//! - the status is never 5xx, except 503 (a full queue, unavailable) and
//!   501 (a feature sluice does not have);
//! - every 4xx and 5xx body is JSON with an `error` object and its message;
//! - a 200 is JSON, or an SSE stream whose events are JSON and carry no
//!   server error;
//! - the server is still running.
//!
//! Routes and field names come from the HTTP sources themselves
//! (`server/src/http`), so a new route or field is fuzzed without an edit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::blocking::Client;
use serde_json::{Value, json};
use sluice_model::gguf::GgufFile;
use sluice_tests::fuzz::{Fuzzer, Rng, bytes, json};
use sluice_tests::gguf_writer::{TinyModel, Value as Meta};
use sluice_tests::http::Server;
use sluice_tests::models::default_model;

/// A request that takes longer than this is a hang (generations here take
/// milliseconds); well below the fuzzer's watchdog.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Fields that set how many tokens are generated: integral values above
/// [`MAX_GENERATED`] are lowered to it, so that the loop is not stuck in
/// long generations (other values still test the validation).
const LENGTH_FIELDS: [&str; 4] = ["n_predict", "max_tokens", "max_completion_tokens", "max_output_tokens"];
const MAX_GENERATED: i64 = 16;
/// Paths no route has (404s) and Vertex AI's prediction route.
const EXTRA_PATHS: [&str; 8] =
    ["/predict", "/infill", "/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/", "/completion/"];
/// The body limit of the server under test: small, so that mutations
/// cross it on every route.
const BODY_LIMIT: usize = 64 << 10;
/// What `{id_slot}` is replaced by.
const SLOT_PATHS: [&str; 9] = [
    "0?action=save",
    "1?action=restore",
    "0?action=erase",
    "7?action=erase",
    "x?action=save",
    "-1?action=save",
    "0?action=",
    "0",
    "1?action=save&action=erase",
];

/// A scratch folder, removed when dropped (a failing run unwinds too).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run() {
    let scratch = Scratch(std::env::temp_dir().join(format!("sluice-fuzz-endpoints-{}", std::process::id())));
    let slots = scratch.0.join("slots");
    std::fs::create_dir_all(&slots).expect("a scratch folder");
    let model = scratch.0.join("tiny.gguf");
    std::fs::write(&model, tiny_model()).expect("write the tiny model");
    let config = scratch.0.join("limits.toml");
    std::fs::write(&config, format!("[server.limits]\nbody_bytes = {BODY_LIMIT}\n")).expect("write the config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let (slot_path, config) = (slots.to_str().expect("a UTF-8 temp path"), config.to_str().expect("a UTF-8 path"));
    let args = ["--config", config, "-np", "2", "-c", "512", "-n", "16", "-t", "1", "--slot-save-path", slot_path];
    // Vertex AI's mode adds `/predict`, which sends instances through the
    // other routes.
    let env = [("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", port.as_str())];
    let mut server = Server::start_model(&model, &args, &env);
    // A connection per request: a server may close one whose body it
    // refused unread, and a pooled connection would carry that race into
    // the next request.
    let client = Client::builder().timeout(REQUEST_TIMEOUT).pool_max_idle_per_host(0).build().expect("an HTTP client");

    let sources = http_sources();
    let names = field_names(&sources);
    let paths = paths(&sources);
    Fuzzer::new("endpoints", Vec::new()).run(
        |rng, input, corpus| mutate(rng, input, corpus, &names, &paths),
        |input| check(&mut server, &client, input),
    );
    assert!(server.is_running(), "the server is gone:\n{}", server.log());
}

/// The tiny model: GPT-2's byte-level alphabet as the vocabulary (so any
/// text tokenizes), ChatML's special tokens, the default model's template.
fn tiny_model() -> Vec<u8> {
    let mut tokens: Vec<String> = (0..=255u8).map(|byte| byte_char(byte).to_string()).collect();
    tokens.extend(["<|im_start|>", "<|im_end|>", "<|endoftext|>"].map(String::from));
    let mut types = vec![1; 256];
    types.extend([3, 3, 3]);
    let file = GgufFile::open(&default_model()).expect("the default model opens");
    let template = file.str("tokenizer.chat_template").expect("the default model has a chat template").to_owned();
    let shape = TinyModel { n_vocab: tokens.len(), tokens: Some(tokens), ..TinyModel::llama(11) };
    shape
        .build()
        .meta("tokenizer.ggml.token_type", Meta::I32s(types))
        .meta("tokenizer.ggml.bos_token_id", Meta::U32(256))
        .meta("tokenizer.ggml.eos_token_id", Meta::U32(257))
        .meta("tokenizer.chat_template", Meta::Str(template))
        .build()
}

/// GPT-2's byte-level alphabet: printable Latin-1 bytes stand for
/// themselves, the other 68 for U+0100 onwards, in order.
fn byte_char(byte: u8) -> char {
    let printable = |byte: u8| matches!(byte, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    if printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&lower| !printable(lower)).count() as u32;
    char::from_u32(0x100 + rank).expect("below U+0144")
}

/// The text of every module of `server/src/http`.
fn http_sources() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("server/src/http is readable")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "rs"))
        .collect();
    files.sort();
    files.iter().map(|path| std::fs::read_to_string(path).expect("a readable source")).collect()
}

/// Every string literal of the HTTP sources that could be a field name:
/// the fields the handlers read, and the ones they write (harmless noise).
fn field_names(sources: &[String]) -> Vec<String> {
    let literal = regex::Regex::new(r#""(@?[A-Za-z_][A-Za-z0-9_]{0,40})""#).expect("constant regex");
    let names: BTreeSet<String> = sources
        .iter()
        .flat_map(|source| literal.captures_iter(source).map(|found| found[1].to_owned()).collect::<Vec<_>>())
        .collect();
    names.into_iter().collect()
}

/// The POST routes the router declares (`("/path", post(...))`), with
/// `{id_slot}` replaced by slots and actions good and bad, and
/// [`EXTRA_PATHS`].
fn paths(sources: &[String]) -> Vec<String> {
    let route = regex::Regex::new(r#"\("(/[^"]*)",\s*post\("#).expect("constant regex");
    let mut paths: BTreeSet<String> = EXTRA_PATHS.iter().map(|path| (*path).to_owned()).collect();
    for source in sources {
        for found in route.captures_iter(source) {
            match found[1].strip_suffix("{id_slot}") {
                Some(prefix) => paths.extend(SLOT_PATHS.iter().map(|slot| format!("{prefix}{slot}"))),
                None => {
                    paths.insert(found[1].to_owned());
                }
            }
        }
    }
    assert!(paths.len() > 20, "found only these POST routes in server/src/http: {paths:?}");
    paths.into_iter().collect()
}

/// A corpus entry is `{"path": …, "body": …}`, or `{"path": …, "raw": …}`
/// for a body that is not a JSON document (a key twice, broken bytes).
fn mutate(rng: &mut Rng, input: &mut Value, corpus: &[Value], names: &[String], paths: &[String]) {
    if !input.is_object() {
        *input = json!({"path": "/completion", "body": input.clone()});
    }
    match rng.below(12) {
        0 => input["path"] = Value::String(rng.pick(paths).clone()),
        1 => {
            if let Some(body) = input.get_mut("body").and_then(Value::as_object_mut) {
                let streaming = body.get("stream") == Some(&Value::Bool(true));
                body.insert("stream".into(), Value::Bool(!streaming));
            }
        }
        2 => {
            if let Some(body) = input.get("body").cloned() {
                let text = json::to_text(rng, &body, true);
                set_raw(input, text.into_bytes());
            }
        }
        _ => match input.get("raw").and_then(Value::as_str).map(|raw| raw.as_bytes().to_vec()) {
            Some(mut raw) => {
                let donors: Vec<Vec<u8>> = corpus.iter().map(|entry| entry["body"].to_string().into_bytes()).collect();
                bytes::mutate(rng, &mut raw, &donors, 64 << 10);
                set_raw(input, raw);
            }
            None => json::mutate(rng, &mut input["body"], corpus, names),
        },
    }
}

/// The body as raw text, or as a document again when the text is exactly
/// one (no key given twice), so that a document stays one.
fn set_raw(input: &mut Value, raw: Vec<u8>) {
    let Some(object) = input.as_object_mut() else { return };
    let text = String::from_utf8_lossy(&raw).into_owned();
    match serde_json::from_str::<Value>(&text) {
        Ok(body) if serde_json::to_string(&body).is_ok_and(|written| written == text) => {
            object.remove("raw");
            object.insert("body".into(), body);
        }
        _ => {
            object.remove("body");
            object.insert("raw".into(), Value::String(text));
        }
    }
}

/// Integral lengths above [`MAX_GENERATED`] become it, in the body and in
/// each of a prediction's instances.
fn cap_lengths(body: &mut Value) {
    let cap = |object: &mut serde_json::Map<String, Value>| {
        for field in LENGTH_FIELDS {
            if let Some(value) = object.get_mut(field) {
                let long = value.as_i64().is_some_and(|n| n > MAX_GENERATED)
                    || value.as_f64().is_some_and(|n| n.fract() == 0.0 && n > MAX_GENERATED as f64 && n < 9.0e18);
                if long {
                    *value = Value::from(MAX_GENERATED);
                }
            }
        }
    };
    if let Some(object) = body.as_object_mut() {
        cap(object);
    }
    if let Some(instances) = body.get_mut("instances").and_then(Value::as_array_mut) {
        instances.iter_mut().filter_map(Value::as_object_mut).for_each(cap);
    }
}

/// An error with its causes.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    text
}

fn check(server: &mut Server, client: &Client, input: &Value) -> Result<(), String> {
    let path = input["path"].as_str().unwrap_or("/completion");
    let body = match (input.get("raw").and_then(Value::as_str), input.get("body")) {
        (Some(raw), _) => raw.as_bytes().to_vec(),
        (None, Some(body)) => {
            let mut body = body.clone();
            cap_lengths(&mut body);
            body.to_string().into_bytes()
        }
        (None, None) => Vec::new(),
    };
    // The route, for messages that tell one bug from another.
    let route = match path.split('?').next().unwrap_or(path) {
        slot if slot.starts_with("/slots/") => "/slots/{id_slot}",
        route => route,
    };
    let oversized = body.len() > BODY_LIMIT;
    let sent = client.post(server.url(path)).header("content-type", "application/json").body(body).send();
    let response = match sent {
        Ok(response) => response,
        Err(error) if !server.is_running() => return Err(format!("POST {route}: the server died ({error})")),
        // A server may answer a body it refuses before reading all of it,
        // and close the connection under the client still sending.
        Err(_) if oversized => return Ok(()),
        Err(error) => return Err(format!("POST {route}: no answer ({})", chain(&error))),
    };
    let status = response.status().as_u16();
    let streamed = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|kind| kind.starts_with("text/event-stream"));
    let text = response.text().map_err(|error| format!("POST {route}: the body breaks off ({error})"))?;
    if !server.is_running() {
        return Err(format!("POST {route}: the server died answering {status}"));
    }
    if status >= 400 {
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let message = answer["error"]["message"].as_str();
        let Some(message) = message else {
            return Err(format!("POST {route}: {status} without a JSON error\n{text}"));
        };
        if status >= 500 && status != 503 && status != 501 {
            return Err(format!("POST {route}: {status} {message}"));
        }
        return Ok(());
    }
    if !streamed {
        return match serde_json::from_str::<Value>(&text) {
            Ok(_) => Ok(()),
            Err(error) => Err(format!("POST {route}: {status} whose body is not JSON ({error})\n{text}")),
        };
    }
    for data in text.lines().filter_map(|line| line.strip_prefix("data: ")).filter(|data| *data != "[DONE]") {
        let event: Value = serde_json::from_str(data)
            .map_err(|error| format!("POST {route}: a stream event is not JSON ({error})\n{data}"))?;
        let code = event["error"]["code"].as_u64().or_else(|| event["error"]["status"].as_u64());
        if code.is_some_and(|code| code >= 500 && code != 503 && code != 501) {
            return Err(format!(
                "POST {route}: the stream ends in a server error {}\n{data}",
                event["error"]["message"]
            ));
        }
    }
    Ok(())
}
