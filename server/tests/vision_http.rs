//! Images over HTTP: a synthetic Qwen2-VL text model with a synthetic
//! projector (`--mmproj`), images sent through `/completion`'s
//! `multimodal_data` and chat `image_url` parts, and bad images refused.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::gguf_writer::TinyModel;
use sluice_tests::http::Server;
use sluice_tests::projector::{TinyProjector, test_png, vision_model, vision_vocabulary};

/// A folder of its own for each call: the tests run at once, and one
/// rewriting a file another's server has mapped (truncating it first) made
/// that server die of SIGBUS at its next read of the weights.
fn scratch() -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("sluice-vision-http-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A qwen2vl text model whose vocabulary holds lowercase letters, the
/// newline and space, and the chat and vision markers as control tokens.
fn files() -> (PathBuf, PathBuf) {
    let model = TinyModel { sections: Some([2, 3, 3, 0]), ..TinyModel::recipe("qwen2vl", 21) };
    let dir = scratch();
    let (model_path, projector_path) = (dir.join("model.gguf"), dir.join("mmproj.gguf"));
    std::fs::write(&model_path, vision_model(&model).build()).expect("write model");
    std::fs::write(&projector_path, TinyProjector::qwen2vl(model.n_embd, 5).build().build()).expect("write projector");
    (model_path, projector_path)
}

/// A legacy DFlash draft (no rope sections) of the model above: one layer
/// tapping the target's layers 1 and 2, blocks of 4.
fn legacy_draft() -> PathBuf {
    let vocabulary = vision_vocabulary();
    let draft =
        TinyModel { n_layer: 1, n_vocab: vocabulary.len(), tokens: Some(vocabulary), ..TinyModel::recipe("qwen3", 9) };
    let path = scratch().join("draft.gguf");
    std::fs::write(&path, draft.dflash(&[1, 2], 64, 4).build()).expect("write draft");
    path
}

/// A PNG whose header claims `width × height` (its CRC fixed), for
/// refusals that must come before decoding.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = test_png(8, 8);
    // Signature (8), length (4), "IHDR" (4), then width and height.
    bytes[16..20].copy_from_slice(&width.to_be_bytes());
    bytes[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&bytes[12..29]);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    bytes
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn tokens(response: &Value) -> Vec<u64> {
    response["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("id")).collect()
}

#[test]
fn images_reach_the_model_through_both_apis_and_bad_ones_are_refused() {
    let (model, projector) = files();
    let server = Server::start_model(&model, &["--mmproj", projector.to_str().expect("utf-8")], &[]);
    let (status, props) = server.get("/props");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(props["modalities"]["vision"], true);
    let marker = props["media_marker"].as_str().expect("a media marker").to_owned();

    let image = STANDARD.encode(test_png(56, 56));
    let completion = |prompt: &str, files: Vec<String>| {
        server.post(
            "/completion",
            &json!({"prompt": {"prompt_string": prompt, "multimodal_data": files},
                    "n_predict": 8, "temperature": 0, "return_tokens": true, "cache_prompt": false}),
        )
    };
    let (status, native) = completion(&format!("ab{marker}cd"), vec![image.clone()]);
    assert_eq!(status, StatusCode::OK, "{native}");
    // a b, <|vision_start|>, 7 × 7 rows (56 pixels in patches of 4, merged
    // 2 × 2), <|vision_end|>, c d.
    assert_eq!(native["tokens_evaluated"], 2 + 1 + 49 + 1 + 2);
    assert_eq!(tokens(&native).len(), 8);
    let (_, again) = completion(&format!("ab{marker}cd"), vec![image.clone()]);
    assert_eq!(tokens(&again), tokens(&native), "the same image gives the same tokens");
    let (_, other) = completion(&format!("ab{marker}cd"), vec![STANDARD.encode(test_png(64, 48))]);
    assert_eq!(other["tokens_evaluated"], 2 + 1 + 48 + 1 + 2);

    // Chat: the rendered conversation through /completion gives what the
    // chat endpoint gives.
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": "ab"},
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{image}")}},
        {"type": "text", "text": "cd"}]}]);
    let (status, rendered) = server.post("/apply-template", &json!({"messages": messages}));
    assert_eq!(status, StatusCode::OK, "{rendered}");
    let rendered = rendered["prompt"].as_str().expect("prompt").to_owned();
    assert!(rendered.contains(&format!("ab{marker}cd")), "{rendered}");
    let (status, chat) = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 8, "temperature": 0, "return_tokens": true}),
    );
    assert_eq!(status, StatusCode::OK, "{chat}");
    let (_, via_completion) = completion(&rendered, vec![image.clone()]);
    assert_eq!(chat["choices"][0]["message"]["content"], via_completion["content"]);
    assert_eq!(chat["usage"]["prompt_tokens"], via_completion["tokens_evaluated"]);

    // Bad images: each a 400 naming what is wrong; the server stays up.
    let whole = test_png(56, 56);
    for (files, says) in [
        (vec![STANDARD.encode(&whole[..whole.len() / 2])], "could not be decoded"),
        (vec!["!!not base64!!".to_owned()], "not valid base64"),
        (vec![STANDARD.encode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")], "not supported"),
        (vec![STANDARD.encode(b"plain text, no image")], "not PNG, JPEG or WebP"),
        (vec![STANDARD.encode(png_claiming(10_000, 10_000))], "more than the"),
        (vec![STANDARD.encode(png_claiming(0, 0))], "dimensions"),
        (vec![], "media markers"),
    ] {
        let (status, error) = completion(&format!("ab{marker}cd"), files);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{says}: {error}");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(message.contains(says), "expected {says:?} in {message:?}");
    }
    let (status, error) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}]}]}),
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"]["message"].as_str().expect("message").contains("fetches nothing"), "{error}");
    let (status, _) = server.get("/health");
    assert_eq!(status, StatusCode::OK);
}

/// `--image-min-tokens` and `--image-max-tokens` move the resize bounds
/// as in llama-server: rows of 8 × 8 pixels here (patches of 4, merged
/// 2 × 2).
#[test]
fn image_token_bounds_resize_images() {
    let (model, projector) = files();
    let flags =
        ["--mmproj", projector.to_str().expect("utf-8"), "--image-min-tokens", "50", "--image-max-tokens", "100"];
    let server = Server::start_model(&model, &flags, &[]);
    let (_, props) = server.get("/props");
    let marker = props["media_marker"].as_str().expect("a media marker").to_owned();
    for ((width, height), rows) in [
        // 49 rows grow by √(3200 / 3136) and ceil to 64 × 64.
        ((56, 56), 64),
        // 128 rows shrink by √(8192 / 6400) and floor to 112 × 56.
        ((128, 64), 98),
        // Within the bounds: as it is.
        ((80, 64), 80),
    ] {
        let (status, response) = server.post(
            "/completion",
            &json!({"prompt": {"prompt_string": format!("ab{marker}cd"),
                               "multimodal_data": [STANDARD.encode(test_png(width, height))]},
                    "n_predict": 1, "cache_prompt": false}),
        );
        assert_eq!(status, StatusCode::OK, "{response}");
        assert_eq!(response["tokens_evaluated"], 2 + 1 + rows + 1 + 2, "{width} × {height}");
    }
}

#[test]
fn a_model_without_a_projector_refuses_images() {
    let (model, _) = files();
    let server = Server::start_model(&model, &[], &[]);
    let (_, props) = server.get("/props");
    assert_eq!(props["modalities"]["vision"], false);
    let (status, error) = server.post(
        "/completion",
        &json!({"prompt": {"prompt_string": "ab", "multimodal_data": [STANDARD.encode(test_png(56, 56))]}, "n_predict": 1}),
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"]["message"].as_str().expect("message").contains("--mmproj"), "{error}");
}

/// What one native request gave: its tokens and its timings (the final
/// event's when streamed).
fn run(server: &Server, body: &Value) -> (Vec<u64>, Value) {
    if body["stream"] != true {
        let (status, response) = server.post("/completion", body);
        assert_eq!(status, StatusCode::OK, "{response}");
        return (tokens(&response), response["timings"].clone());
    }
    let stream = server.stream("/completion", body);
    assert_eq!(stream.status, StatusCode::OK, "{:?}", stream.error);
    let tokens = stream.events.iter().flat_map(tokens).collect();
    let last = stream.events.last().expect("a final event");
    assert_eq!(last["stop"], true, "{last}");
    (tokens, last["timings"].clone())
}

/// The seed's three cases (a cold image, an image then a continuation
/// that reuses its cached KV, plain text) over HTTP, streamed and not: a
/// server with a legacy DFlash draft paired through `mrope-temporal` gives
/// exactly what the target alone gives, and drafts after the image.
#[test]
fn a_legacy_dflash_draft_changes_nothing_after_an_image() {
    let (model, projector) = files();
    let draft = legacy_draft();
    let projector = projector.to_str().expect("utf-8");
    // One marker for both servers, fixed as llama-server lets it be.
    let env = [("LLAMA_MEDIA_MARKER", "<__image__>")];
    let alone = Server::start_model(&model, &["--mmproj", projector], &env);
    let drafted = Server::start_model(
        &model,
        &["--mmproj", projector, "-md", draft.to_str().expect("utf-8"), "--spec-draft-p-min", "0"],
        &env,
    );
    let (_, props) = drafted.get("/props");
    assert_eq!(props["media_marker"], "<__image__>");
    let image = STANDARD.encode(test_png(56, 56));
    let image_rows = 1 + 49 + 1;
    let body = |prompt: &str, files: &[&String], temperature: f64, cache: bool, stream: bool| {
        json!({"prompt": {"prompt_string": prompt, "multimodal_data": files},
               "n_predict": 24, "temperature": temperature, "seed": 7, "return_tokens": true, "ignore_eos": true,
               "cache_prompt": cache, "stream": stream})
    };
    for stream in [false, true] {
        for temperature in [0.0, 0.8] {
            let cold = body("ab<__image__>cd", &[&image], temperature, false, stream);
            let first = body("ba<__image__>dc", &[&image], temperature, true, stream);
            let continued = body("ba<__image__>dcefghijklmnop", &[&image], temperature, true, stream);
            let text = body("abcdefgh", &[], temperature, false, stream);
            let case = format!("stream {stream}, temperature {temperature}");
            for (name, request) in [("cold", &cold), ("first turn", &first), ("continued", &continued), ("text", &text)]
            {
                let (want, _) = run(&alone, request);
                let (got, timings) = run(&drafted, request);
                assert_eq!(got, want, "{name}, {case}: the draft changed the output");
                assert_eq!(got.len(), 24, "{name}, {case}");
                if name != "text" {
                    assert!(
                        timings["draft_n"].as_u64() > Some(0),
                        "{name}, {case}: no drafts after the image: {timings}"
                    );
                }
                if name == "continued" {
                    let cached = timings["cache_n"].as_u64().expect("cache_n");
                    assert!(cached >= 2 + image_rows, "{case}: the image's KV was not reused: {timings}");
                }
            }
        }
    }
    for server in [&alone, &drafted] {
        let (status, _) = server.get("/health");
        assert_eq!(status, StatusCode::OK);
    }
}
