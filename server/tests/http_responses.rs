//! The Responses API and the `input_tokens` endpoints over real HTTP: a
//! response says what chat completions says for the same conversation,
//! streamed or not, in llama-server's shapes and event order; counts are
//! the templated prompt's tokens; bad requests are refused naming the field.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::{Server, named_events};

const INSTRUCTIONS: &str = "You are a helpful assistant.";

/// One conversation in Responses input items (a string, typed parts, a
/// typed assistant message) …
fn input() -> Value {
    json!([
        {"role": "user", "content": "What is the capital of France?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]},
    ])
}

/// … and the same conversation as chat messages.
fn messages() -> Value {
    json!([
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ])
}

fn ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, answer) = server.post(path, body);
    assert_eq!(status, StatusCode::OK, "{path} {body}: {answer}\n{}", server.log());
    answer
}

/// An object's keys, sorted.
fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value.as_object().expect("an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// A 32-alphanumeric id after `prefix`.
fn assert_id(id: &Value, prefix: &str) {
    let id = id.as_str().unwrap_or_else(|| panic!("id {id} is not a string"));
    let rest = id.strip_prefix(prefix).unwrap_or_else(|| panic!("{id} does not start with {prefix}"));
    assert!(rest.len() == 32 && rest.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
}

/// Every event of a Responses stream as (name, data), checking the framing:
/// each event is `event: <type>` then `data: <json>` then a blank line.
fn read_events(server: &Server, path: &str, body: &Value) -> Vec<(String, Value)> {
    let response = server.client().post(server.url(path)).json(body).send().expect("request");
    assert_eq!(response.status(), StatusCode::OK, "{}", server.log());
    let content_type = response.headers().get("content-type").and_then(|value| value.to_str().ok()).unwrap_or("");
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    named_events(&response.text().expect("a whole stream"))
}

#[test]
fn responses_say_what_chat_says_streamed_or_not() {
    let server = Server::start(&[]);
    let (_, models) = server.get("/v1/models");
    let model = &models["data"][0]["id"];
    let chat =
        ok(&server, "/v1/chat/completions", &json!({"messages": messages(), "max_tokens": 16, "temperature": 0}));
    let chat_text = chat["choices"][0]["message"]["content"].as_str().expect("chat content");
    assert!(!chat_text.is_empty(), "{chat}");

    // `model` is ignored (single-model mode): the loaded model answers and is named.
    let request = json!({
        "model": "gpt-4.1", "instructions": INSTRUCTIONS, "input": input(),
        "max_output_tokens": 16, "temperature": 0,
    });
    let response = ok(&server, "/v1/responses", &request);
    assert_eq!(keys(&response), ["completed_at", "created_at", "id", "model", "object", "output", "status", "usage"]);
    assert_id(&response["id"], "resp_");
    assert_eq!(
        (&response["object"], &response["status"], &response["model"]),
        (&json!("response"), &json!("completed"), model)
    );
    assert!(response["created_at"].is_u64() && response["created_at"] == response["completed_at"], "{response}");
    let message_id = &response["output"][0]["id"];
    assert_id(message_id, "msg_");
    let part = json!({"type": "output_text", "annotations": [], "logprobs": [], "text": chat_text});
    let item =
        json!({"type": "message", "id": message_id, "status": "completed", "role": "assistant", "content": [part]});
    assert_eq!(response["output"], json!([item]), "the text is chat's: {chat}");
    let usage = &response["usage"];
    let (input_tokens, output_tokens) = (&chat["usage"]["prompt_tokens"], &chat["usage"]["completion_tokens"]);
    assert_eq!((&usage["input_tokens"], &usage["output_tokens"]), (input_tokens, output_tokens));
    assert_eq!(usage["total_tokens"], chat["usage"]["total_tokens"]);
    let cached = usage["input_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    assert!(cached <= input_tokens.as_u64().expect("prompt_tokens"), "{usage}");

    // A string input is one user message; `/responses` is the same endpoint.
    let short = ok(
        &server,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 8, "temperature": 0,
        }),
    );
    let plain = ok(&server, "/responses", &json!({"input": "Name a color.", "max_output_tokens": 8, "temperature": 0}));
    assert_eq!(plain["output"][0]["content"][0]["text"], short["choices"][0]["message"]["content"]);
    assert_eq!(plain["usage"]["output_tokens"], short["usage"]["completion_tokens"]);

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["timings_per_token"] = json!(true);
    let events = read_events(&server, "/v1/responses", &streamed);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names.iter().filter(|name| **name == "response.output_text.delta").count();
    assert!(deltas > 0, "{names:?}");
    let mut expected =
        vec!["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);

    let data = |name: &str| &events.iter().find(|(event, _)| event == name).expect("the event").1;
    let completed = &data("response.completed")["response"];
    let (id, msg) = (&completed["id"], &data("response.output_item.added")["item"]["id"]);
    assert_id(id, "resp_");
    assert_id(msg, "msg_");
    assert_ne!(id, &response["id"], "every response has its own id");
    let opening = json!({"id": id, "object": "response", "status": "in_progress"});
    assert_eq!(data("response.created"), &json!({"type": "response.created", "response": opening}));
    assert_eq!(data("response.in_progress"), &json!({"type": "response.in_progress", "response": opening}));
    assert_eq!(
        data("response.output_item.added"),
        &json!({"type": "response.output_item.added", "item": {
            "type": "message", "id": msg, "status": "in_progress", "role": "assistant", "content": [],
        }})
    );
    assert_eq!(
        data("response.content_part.added"),
        &json!({"type": "response.content_part.added", "item_id": msg, "part": {"type": "output_text", "text": ""}})
    );
    let mut text = String::new();
    for (_, delta) in events.iter().filter(|(name, _)| name == "response.output_text.delta") {
        assert_eq!(delta["item_id"], *msg);
        assert!(delta["timings"]["predicted_n"].is_u64(), "timings_per_token: {delta}");
        text.push_str(delta["delta"].as_str().expect("delta text"));
    }
    assert_eq!(text, chat_text, "the deltas make the non-streamed text");
    let part = json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
    let item = json!({"type": "message", "id": msg, "status": "completed", "role": "assistant", "content": [part]});
    assert_eq!(
        data("response.output_text.done"),
        &json!({"type": "response.output_text.done", "item_id": msg, "text": text})
    );
    assert_eq!(
        data("response.content_part.done"),
        &json!({"type": "response.content_part.done", "item_id": msg, "part": part})
    );
    assert_eq!(data("response.output_item.done"), &json!({"type": "response.output_item.done", "item": item}));
    assert_eq!(keys(completed), ["created_at", "id", "model", "object", "output", "status", "usage"]);
    assert_eq!(
        (&completed["object"], &completed["status"], &completed["model"]),
        (&json!("response"), &json!("completed"), model)
    );
    assert!(completed["created_at"].is_u64());
    assert_eq!(completed["output"], json!([item]));
    for key in ["input_tokens", "output_tokens", "total_tokens"] {
        assert_eq!(completed["usage"][key], usage[key], "{key}");
    }
    let timings = &data("response.completed")["timings"];
    assert_eq!(timings["predicted_n"], usage["output_tokens"], "{timings}");

    // A stop word the text ends part way into holds that tail back until
    // the end; it still arrives as a delta before `response.output_text.done`.
    let tail: String = chat_text.chars().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect();
    streamed["stop"] = json!([format!("{tail}\u{1}")]);
    let held = read_events(&server, "/v1/responses", &streamed);
    let deltas: String = held
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, delta)| delta["delta"].as_str().expect("delta text"))
        .collect();
    assert_eq!(deltas, chat_text);
    let names: Vec<&str> = held.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[names.len() - 5..names.len() - 3], ["response.output_text.delta", "response.output_text.done"]);
    // Token deltas carry `timings_per_token`; the one released at the end does not.
    let last_delta = &held[names.len() - 5].1;
    assert!(
        last_delta.get("timings").is_none() && last_delta["delta"].as_str().is_some_and(|d| tail.ends_with(d)),
        "{last_delta}"
    );
    assert_eq!(held.last().expect("events").1["response"]["output"][0]["content"][0]["text"], chat_text);
}

#[test]
fn input_tokens_count_the_templated_prompt() {
    let server = Server::start(&[]);
    // llama-server tokenizes the templated prompt with specials added and parsed.
    let templated = |messages: &Value| {
        let prompt = ok(&server, "/apply-template", &json!({"messages": messages}))["prompt"].clone();
        let tokens = ok(&server, "/tokenize", &json!({"content": prompt, "add_special": true}))["tokens"].clone();
        tokens.as_array().expect("tokens").len()
    };
    let count = templated(&messages());
    let answer = json!({"object": "response.input_tokens", "input_tokens": count});
    for path in ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"] {
        assert_eq!(ok(&server, path, &json!({"messages": messages(), "model": "x"})), answer, "{path}");
    }
    let request = json!({"instructions": INSTRUCTIONS, "input": input()});
    for path in ["/v1/responses/input_tokens", "/responses/input_tokens"] {
        assert_eq!(ok(&server, path, &request), answer, "{path}");
    }
    let short = json!({"input": "Hi"});
    let short_count = templated(&json!([{"role": "user", "content": "Hi"}]));
    assert_eq!(ok(&server, "/v1/responses/input_tokens", &short)["input_tokens"], short_count);
    // What a response then reports as its input.
    let response = ok(&server, "/v1/responses", &json!({"input": "Hi", "max_output_tokens": 1, "temperature": 0}));
    assert_eq!(response["usage"]["input_tokens"], short_count);
    assert_eq!(response["usage"]["output_tokens"], 1);
}

#[test]
fn bad_requests_are_refused_naming_the_field() {
    let server = Server::start(&[]);
    let text_part = |part: Value| json!({"input": [{"role": "user", "content": [part]}]});
    let cases = [
        ("/v1/responses", json!({}), 400, "`input`"),
        ("/v1/responses", json!([1]), 400, "JSON object"),
        ("/v1/responses", json!({"input": 7}), 400, "`input`"),
        ("/v1/responses", json!({"input": []}), 400, "`input`"),
        ("/v1/responses", json!({"input": ["hi"]}), 400, "`input[0]`"),
        ("/v1/responses", json!({"input": [{"content": "hi"}]}), 400, "`input[0].role`"),
        ("/v1/responses", json!({"input": [{"role": "robot", "content": "hi"}]}), 400, "`input[0].role`"),
        ("/v1/responses", json!({"input": [{"role": "user"}]}), 400, "`input[0].content`"),
        ("/v1/responses", json!({"input": [{"type": "foo", "role": "user", "content": "x"}]}), 400, "`input[0].type`"),
        ("/v1/responses", text_part(json!({"type": "text", "text": "x"})), 400, "`input[0].content[0].type`"),
        ("/v1/responses", text_part(json!({"type": "input_text"})), 400, "`input[0].content[0].text`"),
        (
            "/v1/responses",
            text_part(json!({"type": "input_image", "image_url": "data:"})),
            501,
            "`input[0].content[0]`",
        ),
        ("/v1/responses", json!({"input": "x", "instructions": 5}), 400, "`instructions`"),
        ("/v1/responses", json!({"input": "x", "max_output_tokens": -2}), 400, "`max_output_tokens`"),
        ("/v1/responses", json!({"input": "x", "max_output_tokens": "many"}), 400, "`max_output_tokens`"),
        ("/v1/responses", json!({"input": "x", "temperature": "hot"}), 400, "`temperature`"),
        ("/v1/responses", json!({"input": "x", "top_p": "all"}), 400, "`top_p`"),
        ("/v1/responses", json!({"input": "x", "stream": "yes"}), 400, "`stream`"),
        ("/v1/responses", json!({"input": "x", "n": 2}), 400, "`n`"),
        ("/v1/responses", json!({"input": "x", "previous_response_id": "resp_1"}), 501, "`previous_response_id`"),
        ("/v1/responses", json!({"input": "x", "tools": [{"type": "function", "name": "f"}]}), 501, "`tools`"),
        ("/v1/responses", json!({"input": "x", "tools": {}}), 400, "`tools`"),
        ("/v1/responses", json!({"input": "x", "reasoning": "low"}), 400, "`reasoning`"),
        ("/v1/responses", json!({"input": "x", "text": {"format": {"type": "json_schema"}}}), 501, "`text.format`"),
        (
            "/v1/responses",
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]}),
            501,
            "`input[0]`",
        ),
        ("/v1/responses/input_tokens", json!({"instructions": "x"}), 400, "`input`"),
        ("/v1/responses/input_tokens", json!({"input": "x", "tools": [{"type": "function"}]}), 501, "`tools`"),
        ("/v1/chat/completions/input_tokens", json!({}), 400, "'messages'"),
        (
            "/v1/chat/completions/input_tokens",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{}]}),
            400,
            "`tools[0].function`",
        ),
    ];
    for (path, body, status, named) in cases {
        for stream in [false, true] {
            let mut body = body.clone();
            if stream && body.is_object() && body.get("stream").is_none() {
                body["stream"] = json!(true);
            }
            // Refused before anything is streamed: a plain JSON error.
            let (got, answer) = server.post(path, &body);
            assert_eq!(got.as_u16(), status, "{path} {body}: {answer}");
            let error = &answer["error"];
            let kind = if status == 501 { "not_supported_error" } else { "invalid_request_error" };
            assert_eq!((&error["code"], &error["type"]), (&json!(status), &json!(kind)), "{answer}");
            let message = error["message"].as_str().expect("a message");
            assert!(message.contains(named), "{path} {body}: {message:?} does not name {named}");
        }
    }
    let raw = server.client().post(server.url("/v1/responses")).body("{").send().expect("request");
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    assert!(server.log().lines().all(|line| !line.contains("panicked")), "{}", server.log());
}
