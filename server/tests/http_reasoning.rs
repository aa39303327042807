//! Reasoning split out of chat replies (`--reasoning-format`, `-rea`) over
//! real HTTP on the default model. The model never thinks by itself, so the
//! tests give it a chat template whose generation prompt opens a `<think>`
//! block (as DeepSeek-R1's and Qwen3's do): the whole greedy reply is then
//! reasoning, never closed. A server that splits must give as reasoning
//! exactly what one started with `--reasoning-format none` gives as text, on
//! every chat API, streamed or not.

use std::path::PathBuf;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::{Server, named_events};

/// ChatML whose generation prompt opens the think block, or closes it right
/// away when `enable_thinking` is false (Qwen3's convention).
const TEMPLATE: &str = r#"{%- for message in messages %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{% endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '\n</think>\n\n' }}{% endif %}{% endif %}"#;

const QUESTION: &str = "What is the capital of France?";

/// The server that splits (the default format) and one that does not and
/// has thinking off, to whose requests [`think`] turns it back on: both then
/// render the same prompt.
struct Servers {
    split: Server,
    plain: Server,
}

impl Servers {
    /// `name` keeps each test's template file its own.
    fn start(name: &str) -> Servers {
        let path: PathBuf = std::env::temp_dir().join(format!("sluice-reasoning-{name}-{}.jinja", std::process::id()));
        std::fs::write(&path, TEMPLATE).expect("write the chat template");
        let file = path.to_str().expect("a UTF-8 temp path");
        let split = Server::start(&["--chat-template-file", file]);
        let plain = Server::start(&["--chat-template-file", file, "--reasoning-format", "none", "-rea", "off"]);
        let _ = std::fs::remove_file(&path);
        Servers { split, plain }
    }
}

/// `body` with `enable_thinking` on in `chat_template_kwargs`.
fn think(body: &Value) -> Value {
    let mut body = body.clone();
    body["chat_template_kwargs"] = json!({"enable_thinking": true});
    body
}

fn ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, answer) = server.post(path, body);
    assert_eq!(status, StatusCode::OK, "{path} {body}: {answer}\n{}", server.log());
    answer
}

fn named(server: &Server, path: &str, body: &Value) -> Vec<(String, Value)> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let response = server.client().post(server.url(path)).json(&body).send().expect("stream request");
    assert_eq!(response.status(), StatusCode::OK, "{body}\n{}", server.log());
    named_events(&response.text().expect("a whole stream"))
}

/// A chat stream's reasoning and content deltas, joined, and how many
/// chunks carried logprobs. Deltas are never empty strings (llama-server's
/// suite checks that).
struct ChatStream {
    reasoning: String,
    content: String,
    logprobs: usize,
}

fn chat_stream(server: &Server, body: &Value) -> ChatStream {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let stream = server.stream("/v1/chat/completions", &body);
    assert_eq!(stream.status, StatusCode::OK, "{:?}\n{}", stream.error, server.log());
    assert!(stream.done);
    let mut joined = ChatStream { reasoning: String::new(), content: String::new(), logprobs: 0 };
    for choice in stream.events.iter().filter_map(|event| event["choices"].get(0)) {
        let delta = &choice["delta"];
        if let Some(text) = delta["reasoning_content"].as_str() {
            assert!(!text.is_empty(), "an empty reasoning delta: {choice}");
            joined.reasoning.push_str(text);
        }
        if let Some(text) = delta["content"].as_str() {
            joined.content.push_str(text);
        }
        joined.logprobs += usize::from(choice.get("logprobs").is_some());
    }
    joined
}

fn message(answer: &Value) -> &Value {
    &answer["choices"][0]["message"]
}

#[test]
fn chat_gives_as_reasoning_what_none_leaves_as_content() {
    let servers = Servers::start("chat");
    let (split, plain) = (&servers.split, &servers.plain);
    let request = json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16,
                         "temperature": 0, "seed": 42});

    // -rea off closes the block; the request's kwargs open it again, to the
    // prompt the splitting server renders by default.
    let prompt = |server: &Server, body: &Value| ok(server, "/apply-template", body)["prompt"].clone();
    let opened = prompt(split, &request);
    assert!(opened.as_str().is_some_and(|prompt| prompt.ends_with("<think>\n")), "{opened}");
    assert!(prompt(plain, &request).as_str().is_some_and(|prompt| prompt.ends_with("</think>\n\n")));
    assert_eq!(prompt(plain, &think(&request)), opened);

    let reference = ok(plain, "/v1/chat/completions", &think(&request));
    let text = message(&reference)["content"].as_str().expect("content").to_owned();
    assert!(!text.trim().is_empty(), "{reference}");
    assert!(message(&reference).get("reasoning_content").is_none(), "{reference}");

    let answer = ok(split, "/v1/chat/completions", &request);
    assert_eq!(message(&answer)["reasoning_content"], json!(text), "{answer}");
    assert_eq!(message(&answer)["content"], "", "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], reference["usage"]["completion_tokens"]);

    let streamed = chat_stream(split, &request);
    assert_eq!((streamed.reasoning.as_str(), streamed.content.as_str()), (text.as_str(), ""));
    let reference_stream = chat_stream(plain, &think(&request));
    assert_eq!((reference_stream.reasoning.as_str(), reference_stream.content.as_str()), ("", text.as_str()));

    // Logprobs stay one per token, reasoning or not.
    let with_logprobs = |body: &Value| {
        let mut body = body.clone();
        body["logprobs"] = json!(true);
        body["top_logprobs"] = json!(1);
        body
    };
    let counted = chat_stream(split, &with_logprobs(&request));
    let reference_counted = chat_stream(plain, &with_logprobs(&think(&request)));
    assert_eq!(counted.reasoning, text);
    assert!(counted.logprobs > 0 && counted.logprobs == reference_counted.logprobs);
    let whole = ok(split, "/v1/chat/completions", &with_logprobs(&request));
    let tokens = ok(plain, "/v1/chat/completions", &with_logprobs(&think(&request)));
    assert_eq!(whole["choices"][0]["logprobs"], tokens["choices"][0]["logprobs"]);

    // The request's format wins over the server's.
    let mut none = request.clone();
    none["reasoning_format"] = json!("none");
    assert_eq!(message(&ok(split, "/v1/chat/completions", &none))["content"], json!(text));
    assert_eq!(chat_stream(split, &none).content, text);
    let mut legacy = request.clone();
    legacy["reasoning_format"] = json!("deepseek-legacy");
    assert_eq!(message(&ok(split, "/v1/chat/completions", &legacy))["reasoning_content"], json!(text));
    let tagged = chat_stream(split, &legacy);
    assert_eq!((tagged.reasoning.as_str(), tagged.content), ("", format!("<think>{text}")));
    let mut bad = request.clone();
    bad["reasoning_format"] = json!("nothink");
    let (status, error) = split.post("/v1/chat/completions", &bad);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");

    // A stop string ends the reasoning as it ends the text.
    let words: Vec<&str> = text.split_whitespace().collect();
    let word = *words.get(1).unwrap_or_else(|| panic!("a reply of two words or more: {text:?}"));
    let mut stopped = request.clone();
    stopped["stop"] = json!([word]);
    let cut = message(&ok(plain, "/v1/chat/completions", &think(&stopped)))["content"].clone();
    assert!(cut.as_str().is_some_and(|cut| cut.len() < text.len() && !cut.contains(word)), "{cut}");
    assert_eq!(message(&ok(split, "/v1/chat/completions", &stopped))["reasoning_content"], cut);
    assert_eq!(json!(chat_stream(split, &stopped).reasoning), cut);

    // Thinking off: the prompt closed the block, the reply is all content.
    let mut off = request.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let answer = ok(split, "/v1/chat/completions", &off);
    assert!(message(&answer).get("reasoning_content").is_none(), "{answer}");
    assert!(message(&answer)["content"].as_str().is_some_and(|content| !content.is_empty()), "{answer}");
    let mut effort = request.clone();
    effort["reasoning_effort"] = json!("none");
    assert_eq!(prompt(split, &effort), prompt(split, &off));
}

#[test]
fn messages_give_reasoning_as_a_thinking_block() {
    let servers = Servers::start("messages");
    let (split, plain) = (&servers.split, &servers.plain);
    let request = json!({"max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": QUESTION}],
                         "thinking": {"type": "enabled", "budget_tokens": 1024}});

    let reference = ok(plain, "/v1/messages", &think(&request));
    let [block] = reference["content"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        panic!("one text block: {reference}")
    };
    assert_eq!(block["type"], "text");
    let text = block["text"].clone();
    let answer = ok(split, "/v1/messages", &request);
    assert_eq!(answer["content"], json!([{"type": "thinking", "thinking": text, "signature": ""}]), "{answer}");
    assert_eq!(answer["usage"]["output_tokens"], reference["usage"]["output_tokens"]);

    let events = named(split, "/v1/messages", &request);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names.len() - 6;
    let mut expected = vec!["message_start", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_delta", "content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    assert_eq!(events[1].1["content_block"], json!({"type": "thinking", "thinking": ""}));
    let mut thought = String::new();
    for (_, data) in &events[2..2 + deltas] {
        assert_eq!((&data["index"], &data["delta"]["type"]), (&json!(0), &json!("thinking_delta")), "{data}");
        thought.push_str(data["delta"]["thinking"].as_str().expect("thinking"));
    }
    assert_eq!(json!(thought), text);
    assert_eq!(events[2 + deltas].1["delta"], json!({"type": "signature_delta", "signature": ""}));
    assert_eq!(events[3 + deltas].1["index"], 0);

    let reference_events = named(plain, "/v1/messages", &think(&request));
    let streamed: String = reference_events
        .iter()
        .filter(|(name, data)| name == "content_block_delta" && data["delta"]["type"] == "text_delta")
        .filter_map(|(_, data)| data["delta"]["text"].as_str())
        .collect();
    assert_eq!(json!(streamed), text);
}

#[test]
fn responses_give_reasoning_as_a_reasoning_item() {
    let servers = Servers::start("responses");
    let (split, plain) = (&servers.split, &servers.plain);
    let request = json!({"input": QUESTION, "max_output_tokens": 16, "temperature": 0,
                         "reasoning": {"effort": "medium"}});

    let reference = ok(plain, "/v1/responses", &think(&request));
    let text = reference["output"][0]["content"][0]["text"].clone();
    assert!(text.as_str().is_some_and(|text| !text.is_empty()), "{reference}");
    let answer = ok(split, "/v1/responses", &request);
    let [item] = answer["output"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        panic!("one reasoning item: {answer}")
    };
    let id = item["id"].as_str().expect("an id");
    assert!(id.starts_with("rs_"), "{id}");
    assert_eq!(
        *item,
        json!({"id": id, "summary": [], "type": "reasoning", "encrypted_content": "", "status": "completed",
               "content": [{"type": "reasoning_text", "text": text}]})
    );

    let events = named(split, "/v1/responses", &request);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names.len() - 5;
    let mut expected = vec!["response.created", "response.in_progress", "response.output_item.added"];
    expected.extend(std::iter::repeat_n("response.reasoning_text.delta", deltas));
    expected.extend(["response.output_item.done", "response.completed"]);
    assert_eq!(names, expected);
    let added = &events[2].1["item"];
    let stream_id = added["id"].clone();
    assert_eq!(
        *added,
        json!({"id": stream_id, "summary": [], "type": "reasoning", "content": [], "encrypted_content": "",
               "status": "in_progress"})
    );
    let thought: String = events[3..3 + deltas]
        .iter()
        .map(|(_, data)| {
            assert_eq!(data["item_id"], stream_id, "{data}");
            data["delta"].as_str().expect("a delta")
        })
        .collect();
    assert_eq!(json!(thought), text);
    let done = json!({"id": stream_id, "summary": [], "type": "reasoning", "encrypted_content": "",
                      "content": [{"type": "reasoning_text", "text": text}]});
    assert_eq!(events[3 + deltas].1["item"], done);
    assert_eq!(events[4 + deltas].1["response"]["output"], json!([done]));
}
