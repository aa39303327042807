//! Anthropic's Messages API over real HTTP: a conversation gets the same
//! greedy reply, counts and stop as on `/v1/chat/completions`; a stream
//! carries llama-server's named events in order and spells the same text;
//! `count_tokens` is the templated prompt's length; bad input is a 400
//! naming the field, unsupported features a 501 naming them.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::{Server, named_events};

const SYSTEM: &str = "You are terse.";
const QUESTION: &str = "Name three colors.";
/// A question the default model answers in a few tokens, then ends its turn.
const SHORT: &str = "Reply with one word: yes or no?";

fn ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, answer) = server.post(path, body);
    assert_eq!(status, StatusCode::OK, "{path} {body}: {answer}\n{}", server.log());
    answer
}

/// The one text block of a message (none for an empty reply).
fn text(message: &Value) -> String {
    match message["content"].as_array().map(Vec::as_slice) {
        Some([]) => String::new(),
        Some([block]) => {
            assert_eq!(block["type"], "text", "{message}");
            assert_eq!(block.as_object().map(|block| block.len()), Some(2), "{message}");
            block["text"].as_str().expect("text").to_owned()
        }
        _ => panic!("content must be at most one text block: {message}"),
    }
}

fn keys(value: &Value) -> Vec<&str> {
    value.as_object().map(|object| object.keys().map(String::as_str).collect()).unwrap_or_default()
}

/// A streamed message: every event as (name, data), checked to be
/// `event: <name>` then `data: <json>` with the name equal to the data's
/// `type`; keep-alive comments are skipped.
struct Events {
    content_type: String,
    events: Vec<(String, Value)>,
}

impl Events {
    fn read(server: &Server, body: &Value) -> Events {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let response = server.client().post(server.url("/v1/messages")).json(&body).send().expect("stream request");
        assert_eq!(response.status(), StatusCode::OK, "{body}\n{}", server.log());
        let content_type =
            response.headers().get("content-type").and_then(|value| value.to_str().ok()).unwrap_or("").to_owned();
        let events = named_events(&response.text().expect("stream body"));
        Events { content_type, events }
    }

    fn names(&self) -> Vec<&str> {
        self.events.iter().map(|(name, _)| name.as_str()).collect()
    }

    fn data(&self, name: &str) -> &Value {
        self.events.iter().find(|(event, _)| event == name).map(|(_, data)| data).expect(name)
    }

    fn text(&self) -> String {
        let deltas = self.events.iter().filter(|(name, _)| name == "content_block_delta");
        deltas
            .map(|(_, data)| {
                assert_eq!(data["index"], 0, "{data}");
                assert_eq!(data["delta"]["type"], "text_delta", "{data}");
                data["delta"]["text"].as_str().expect("delta text").to_owned()
            })
            .collect()
    }

    /// The exact event order: start, one text block if any text, end.
    fn assert_order(&self) {
        let names = self.names();
        let deltas = names.iter().filter(|name| **name == "content_block_delta").count();
        let mut expected = vec!["message_start"];
        if deltas > 0 {
            expected.push("content_block_start");
            expected.extend(std::iter::repeat_n("content_block_delta", deltas));
            expected.push("content_block_stop");
        }
        expected.extend(["message_delta", "message_stop"]);
        assert_eq!(names, expected);
    }
}

#[test]
fn messages_answer_as_chat_completions_do() {
    let server = Server::start(&[]);
    let history = json!([
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": QUESTION},
    ]);
    let request =
        json!({"model": "claude-anything", "max_tokens": 16, "temperature": 0, "system": SYSTEM, "messages": history});
    let message = ok(&server, "/v1/messages", &request);
    let mut openai_messages = vec![json!({"role": "system", "content": SYSTEM})];
    openai_messages.extend(history.as_array().expect("history").iter().cloned());
    let chat =
        ok(&server, "/v1/chat/completions", &json!({"max_tokens": 16, "temperature": 0, "messages": openai_messages}));

    assert_eq!(keys(&message), ["id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage"]);
    let id = message["id"].as_str().expect("id");
    let random = id.strip_prefix("chatcmpl-").expect("llama-server's id prefix");
    assert!(random.len() == 32 && random.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
    assert_eq!((&message["type"], &message["role"]), (&json!("message"), &json!("assistant")));
    assert_eq!(message["model"], chat["model"], "the server's model, whatever the request names");
    assert!(message.get("timings").is_none());
    let reply = text(&message);
    assert!(!reply.is_empty());
    assert_eq!(reply, chat["choices"][0]["message"]["content"].as_str().expect("chat content"));
    let stop_reason = match chat["choices"][0]["finish_reason"].as_str() {
        Some("length") => "max_tokens",
        Some("stop") => "end_turn",
        other => panic!("finish_reason {other:?}"),
    };
    assert_eq!((&message["stop_reason"], &message["stop_sequence"]), (&json!(stop_reason), &Value::Null));

    let usage = &message["usage"];
    assert_eq!(keys(usage), ["cache_read_input_tokens", "input_tokens", "output_tokens"]);
    assert_eq!(usage["output_tokens"], chat["usage"]["completion_tokens"]);
    let prompt_tokens = chat["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    let input = usage["input_tokens"].as_u64().expect("input_tokens");
    let cached = usage["cache_read_input_tokens"].as_u64().expect("cache_read_input_tokens");
    assert_eq!(input + cached, prompt_tokens, "{usage}");

    // count_tokens: the same prompt, no generation fields needed.
    let count = ok(&server, "/v1/messages/count_tokens", &json!({"system": SYSTEM, "messages": history}));
    assert_eq!(count, json!({"input_tokens": prompt_tokens}));
    // System blocks are joined with nothing between; text blocks as chat
    // joins OpenAI text parts; an assistant turn without content is dropped.
    let blocks = json!({
        "model": "x", "max_tokens": 3,
        "system": [{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there!"}]},
            {"role": "assistant"},
            {"role": "user", "content": QUESTION},
        ],
    });
    let joined = json!({"system": SYSTEM, "messages": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi\nthere!"},
        {"role": "user", "content": QUESTION},
    ]});
    assert_eq!(ok(&server, "/v1/messages/count_tokens", &blocks), ok(&server, "/v1/messages/count_tokens", &joined));

    // The limit.
    let question = json!([{"role": "user", "content": QUESTION}]);
    let limited = ok(&server, "/v1/messages", &json!({"max_tokens": 4, "temperature": 0, "messages": question}));
    let chat = ok(&server, "/v1/chat/completions", &json!({"max_tokens": 4, "temperature": 0, "messages": question}));
    assert_eq!(text(&limited), chat["choices"][0]["message"]["content"].as_str().expect("chat content"));
    assert_eq!(chat["choices"][0]["finish_reason"], "length");
    assert_eq!((&limited["stop_reason"], &limited["stop_sequence"]), (&json!("max_tokens"), &Value::Null));
    assert_eq!(limited["usage"]["output_tokens"], 4);

    // The end of the turn; without max_tokens llama-server's 4096 applies.
    let short = json!([{"role": "user", "content": SHORT}]);
    let ended = ok(&server, "/v1/messages", &json!({"max_tokens": 200, "temperature": 0, "messages": short}));
    let chat = ok(&server, "/v1/chat/completions", &json!({"max_tokens": 200, "temperature": 0, "messages": short}));
    assert_eq!(text(&ended), chat["choices"][0]["message"]["content"].as_str().expect("chat content"));
    assert_eq!(chat["choices"][0]["finish_reason"], "stop");
    assert_eq!((&ended["stop_reason"], &ended["stop_sequence"]), (&json!("end_turn"), &Value::Null));
    assert!(ended["usage"]["output_tokens"].as_u64().is_some_and(|n| n < 200), "{ended}");
    let unlimited = ok(&server, "/v1/messages", &json!({"temperature": 0, "messages": short}));
    assert_eq!(text(&unlimited), text(&ended));
    assert_eq!(unlimited["usage"]["output_tokens"], ended["usage"]["output_tokens"]);

    // A stop sequence ends the turn before it and is reported.
    let words: Vec<&str> = reply.split_whitespace().collect();
    let word = *words.get(2).unwrap_or_else(|| panic!("a reply of three words or more: {reply:?}"));
    let before = &reply[..reply.find(word).expect("the word is in the reply")];
    let stopped = ok(
        &server,
        "/v1/messages",
        &json!({"max_tokens": 16, "temperature": 0, "system": SYSTEM, "messages": history,
                "stop_sequences": ["never-generated-zzz", word]}),
    );
    assert_eq!(text(&stopped), before, "{stopped}");
    assert_eq!((&stopped["stop_reason"], &stopped["stop_sequence"]), (&json!("end_turn"), &json!(word)));

    // A final assistant turn (Anthropic's prefill) is treated as chat treats it.
    let prefill = json!([{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Red,"}]);
    let (status, continued) =
        server.post("/v1/messages", &json!({"max_tokens": 6, "temperature": 0, "messages": prefill}));
    let (chat_status, chat) =
        server.post("/v1/chat/completions", &json!({"max_tokens": 6, "temperature": 0, "messages": prefill}));
    assert_eq!(status, chat_status, "{continued} {chat}");
    if status == StatusCode::OK {
        assert_eq!(text(&continued), chat["choices"][0]["message"]["content"].as_str().expect("chat content"));
    }

    // max_tokens 0 evaluates the prompt only: no text block at all.
    let none = ok(&server, "/v1/messages", &json!({"max_tokens": 0, "messages": short}));
    assert_eq!(none["content"], json!([]));
    assert_eq!((&none["stop_reason"], &none["usage"]["output_tokens"]), (&json!("max_tokens"), &json!(0)));
}

#[test]
fn streams_carry_the_same_message() {
    let server = Server::start(&[]);
    let request = json!({"max_tokens": 16, "temperature": 0, "system": SYSTEM,
                         "messages": [{"role": "user", "content": QUESTION}]});
    let whole = ok(&server, "/v1/messages", &request);
    let stream = Events::read(&server, &request);
    assert!(stream.content_type.starts_with("text/event-stream"), "{}", stream.content_type);
    stream.assert_order();
    assert_eq!(stream.text(), text(&whole));

    let start = &stream.data("message_start")["message"];
    assert_eq!(keys(start), ["id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage"]);
    assert!(start["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-") && id != whole["id"]), "{start}");
    assert_eq!(
        (&start["type"], &start["role"], &start["content"]),
        (&json!("message"), &json!("assistant"), &json!([]))
    );
    assert_eq!(
        (&start["model"], &start["stop_reason"], &start["stop_sequence"]),
        (&whole["model"], &Value::Null, &Value::Null)
    );
    let count = ok(&server, "/v1/messages/count_tokens", &request)["input_tokens"].clone();
    let usage = &start["usage"];
    assert_eq!(keys(usage), ["cache_read_input_tokens", "input_tokens", "output_tokens"]);
    assert_eq!(usage["output_tokens"], 0);
    assert_eq!(
        usage["input_tokens"].as_u64().zip(usage["cache_read_input_tokens"].as_u64()).map(|(a, b)| a + b),
        count.as_u64()
    );
    assert_eq!(
        stream.data("content_block_start"),
        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    assert_eq!(stream.data("content_block_stop"), &json!({"type": "content_block_stop", "index": 0}));
    assert_eq!(
        stream.data("message_delta"),
        &json!({"type": "message_delta", "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": null},
                "usage": {"output_tokens": whole["usage"]["output_tokens"]}})
    );
    assert_eq!(stream.data("message_stop"), &json!({"type": "message_stop"}));

    // The end of the turn and a stop sequence, streamed.
    let short = json!({"max_tokens": 200, "temperature": 0, "messages": [{"role": "user", "content": SHORT}]});
    let (whole, stream) = (ok(&server, "/v1/messages", &short), Events::read(&server, &short));
    stream.assert_order();
    assert_eq!(stream.text(), text(&whole));
    assert_eq!(stream.data("message_delta")["delta"]["stop_reason"], "end_turn");
    let reply = text(&ok(&server, "/v1/messages", &request));
    let word = *reply.split_whitespace().collect::<Vec<_>>().get(2).expect("three words");
    let mut stopping = request.clone();
    stopping["stop_sequences"] = json!([word]);
    let stream = Events::read(&server, &stopping);
    stream.assert_order();
    assert_eq!(stream.text(), reply[..reply.find(word).expect("the word")]);
    assert_eq!(stream.data("message_delta")["delta"], json!({"stop_reason": "end_turn", "stop_sequence": word}));

    // No tokens: the message opens and closes without a content block.
    let stream = Events::read(&server, &json!({"max_tokens": 0, "messages": [{"role": "user", "content": SHORT}]}));
    assert_eq!(stream.names(), ["message_start", "message_delta", "message_stop"]);
    assert_eq!(stream.data("message_delta")["usage"], json!({"output_tokens": 0}));
}

#[test]
fn bad_requests_name_the_field() {
    let server = Server::start(&["-c", "64", "-np", "1"]);
    let user = json!([{"role": "user", "content": "Hi"}]);
    let expect = |path: &str, body: Value, status: StatusCode, kind: &str, mentions: &str| {
        let (got, answer) = server.post(path, &body);
        assert_eq!(got, status, "{path} {body}: {answer}");
        assert_eq!(answer["error"]["type"], kind, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], status.as_u16(), "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.contains(mentions), "{body}: {message:?} should mention {mentions:?}");
    };
    let bad = |body: Value, mentions: &str| {
        expect("/v1/messages", body.clone(), StatusCode::BAD_REQUEST, "invalid_request_error", mentions);
        let mut streamed = body;
        if let Some(object) = streamed.as_object_mut() {
            object.entry("stream").or_insert(json!(true));
        }
        // Refused before streaming: a plain HTTP error.
        expect("/v1/messages", streamed, StatusCode::BAD_REQUEST, "invalid_request_error", mentions);
    };
    let refused = |body: Value, mentions: &str| {
        expect("/v1/messages", body, StatusCode::NOT_IMPLEMENTED, "not_supported_error", mentions);
    };

    bad(json!({"max_tokens": 4}), "messages");
    bad(json!({"max_tokens": 4, "messages": "Hi"}), "messages");
    bad(json!({"max_tokens": 4, "messages": ["Hi"]}), "messages[0]");
    bad(json!({"max_tokens": 4, "messages": [{"content": "Hi"}]}), "messages[0].role");
    bad(json!({"max_tokens": 4, "messages": [{"role": "system", "content": "Hi"}]}), "messages[0].role");
    bad(json!({"max_tokens": 4, "messages": [{"role": "user"}]}), "messages[0].content");
    bad(json!({"max_tokens": 4, "messages": [{"role": "user", "content": 7}]}), "messages[0].content");
    bad(
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"text": "Hi"}]}]}),
        "messages[0].content[0].type",
    );
    bad(
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        "messages[0].content[0].text",
    );
    bad(json!({"max_tokens": 4, "messages": [{"role": "user", "content": ["Hi"]}]}), "messages[0].content[0]");
    bad(json!({"max_tokens": -1, "messages": user}), "max_tokens");
    bad(json!({"max_tokens": "4", "messages": user}), "max_tokens");
    bad(json!({"max_tokens": 1.5, "messages": user}), "max_tokens");
    bad(json!({"max_tokens": 4, "messages": user, "temperature": "hot"}), "temperature");
    bad(json!({"max_tokens": 4, "messages": user, "top_k": [1]}), "top_k");
    bad(json!({"max_tokens": 4, "messages": user, "stream": "yes"}), "stream");
    bad(json!({"max_tokens": 4, "messages": user, "stop_sequences": "END"}), "stop_sequences");
    bad(json!({"max_tokens": 4, "messages": user, "stop_sequences": [1]}), "stop_sequences");
    bad(json!({"max_tokens": 4, "messages": user, "system": 5}), "system");
    bad(json!({"max_tokens": 4, "messages": user, "system": [{"type": "text"}]}), "system[0].text");
    bad(json!({"max_tokens": 4, "messages": user, "tools": {}}), "tools");
    let big = "word ".repeat(200);
    let (status, answer) =
        server.post("/v1/messages", &json!({"max_tokens": 4, "messages": [{"role": "user", "content": big}]}));
    assert_eq!(
        (status, &answer["error"]["type"]),
        (StatusCode::BAD_REQUEST, &json!("exceed_context_size_error")),
        "{answer}"
    );

    for kind in ["image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"] {
        let block = json!([{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": kind}]}]);
        refused(json!({"max_tokens": 4, "messages": block}), &format!("`messages[0].content[1]` of type \"{kind}\""));
    }
    refused(json!({"max_tokens": 4, "messages": user, "system": [{"type": "image"}]}), "system[0]");
    let tool = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    refused(json!({"max_tokens": 4, "messages": user, "tools": tool}), "`tools`");
    refused(json!({"max_tokens": 4, "messages": user, "tool_choice": {"type": "any"}}), "`tool_choice`");
    refused(json!({"max_tokens": 4, "messages": user, "tool_choice": {"type": "tool", "name": "x"}}), "`tool_choice`");
    bad(json!({"max_tokens": 4, "messages": user, "thinking": {"type": "sometimes"}}), "thinking.type");

    let count = |body: Value, status: StatusCode, kind: &str, mentions: &str| {
        expect("/v1/messages/count_tokens", body, status, kind, mentions);
    };
    count(json!({}), StatusCode::BAD_REQUEST, "invalid_request_error", "messages");
    count(
        json!({"messages": [{"role": "user", "content": 1}]}),
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "messages[0].content",
    );
    count(json!({"messages": user, "tools": tool}), StatusCode::NOT_IMPLEMENTED, "not_supported_error", "`tools`");
    let raw = |path: &str, bytes: &'static [u8]| {
        server.send(server.client().post(server.url(path)).header("content-type", "application/json").body(bytes))
    };
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let (status, answer) = raw(path, b"{\"messages\": ");
        assert_eq!((status, &answer["error"]["type"]), (StatusCode::BAD_REQUEST, &json!("invalid_request_error")));
        let (status, answer) = raw(path, b"[1, 2]");
        assert_eq!((status, &answer["error"]["type"]), (StatusCode::BAD_REQUEST, &json!("invalid_request_error")));
    }

    // Generation-only fields mean nothing to count_tokens; the accepted
    // no-op settings are accepted.
    let counted = ok(
        &server,
        "/v1/messages/count_tokens",
        &json!({"messages": user, "max_tokens": -5, "thinking": {"type": "enabled"}}),
    );
    assert!(counted["input_tokens"].as_u64().is_some_and(|n| n > 0), "{counted}");
    let quiet = json!({"max_tokens": 2, "messages": user, "tools": [], "tool_choice": {"type": "auto"},
                       "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"}});
    assert!(!text(&ok(&server, "/v1/messages", &quiet)).is_empty());

    // llama-server serves only the /v1 paths.
    for path in ["/messages", "/messages/count_tokens"] {
        expect(path, json!({"max_tokens": 4, "messages": user}), StatusCode::NOT_FOUND, "not_found_error", "Not Found");
    }
    let (status, _) = server.get("/v1/messages");
    assert_eq!(status, StatusCode::NOT_FOUND);
}
