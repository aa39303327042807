//! Grammars and schemas at and past the limits of docs/structured-outputs.md
//! ("Limits"), on every endpoint that takes one: deep ones within the
//! limits compile (a 700-rule chain once overflowed the handler thread's
//! stack and aborted the server), deeper and wider ones are 400s naming
//! the limit, and so is a schema with a number at -2^63 (which once sent
//! llguidance into endless recursion), no answer carries a panic, a
//! backtrace or a parser dump, and the server goes on serving.

use reqwest::StatusCode;
use serde_json::{Map, Value, json};
use sluice_tests::http::{Server, named_events};

/// `root ::= r0` and a chain of `n` rules, `r{i} ::= {link(next)}`, the
/// last one `"a"`.
fn gbnf_chain(n: usize, link: impl Fn(usize) -> String) -> String {
    let mut text = String::from("root ::= r0\n");
    for i in 0..n {
        text.push_str(&format!("r{i} ::= {}\n", link(i + 1)));
    }
    text + &format!("r{n} ::= \"a\"\n")
}

fn sequence(next: usize) -> String {
    format!("\"a\" r{next}")
}

fn alternation(next: usize) -> String {
    format!("\"a\" | r{next}")
}

/// A schema whose `$defs` r0 … r{n-1} each hold an object whose one
/// property refers to the next.
fn ref_chain(n: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        let next = json!({"$ref": format!("#/$defs/r{}", i + 1)});
        defs.insert(format!("r{i}"), json!({"type": "object", "properties": {"a": next}, "required": ["a"]}));
    }
    defs.insert(format!("r{n}"), json!({"type": "string", "maxLength": 2}));
    json!({"$ref": "#/$defs/r0", "$defs": defs})
}

/// `choices` alternatives `"a0" | "a1" | …`, after `prefix`.
fn alternatives(prefix: &str, choices: usize) -> String {
    let options: Vec<String> = (0..choices).map(|i| format!("\"a{i}\"")).collect();
    format!("root ::= {prefix}({})\n", options.join(" | "))
}

/// No internals in an answer: what llguidance appends to its messages.
fn assert_clean(answer: &Value) {
    let text = answer.to_string();
    for internal in ["panic", "backtrace", "<state>", "<grammar>", "Tokens:", "non-verbose", "\\n"] {
        assert!(!text.contains(internal), "{internal:?} in {text}");
    }
}

/// An endpoint and the body that asks it for a grammar or schema.
struct Endpoint {
    path: &'static str,
    body: fn(Value) -> Value,
    /// Its stream names its events (`event:` lines).
    named: bool,
}

fn native_grammar(grammar: Value) -> Value {
    json!({"prompt": "hi", "n_predict": 1, "grammar": grammar})
}

fn native_schema(schema: Value) -> Value {
    json!({"prompt": "hi", "n_predict": 1, "json_schema": schema})
}

fn openai_schema(schema: Value) -> Value {
    json!({"prompt": "hi", "max_tokens": 1, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
}

fn chat_schema(schema: Value) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
}

fn responses_grammar(grammar: Value) -> Value {
    json!({"input": "hi", "max_output_tokens": 1, "grammar": grammar})
}

const GRAMMAR_ENDPOINTS: [Endpoint; 3] = [
    Endpoint { path: "/completion", body: native_grammar, named: false },
    Endpoint { path: "/v1/completions", body: native_grammar, named: false },
    Endpoint { path: "/v1/responses", body: responses_grammar, named: true },
];

const SCHEMA_ENDPOINTS: [Endpoint; 3] = [
    Endpoint { path: "/completion", body: native_schema, named: false },
    Endpoint { path: "/v1/completions", body: openai_schema, named: false },
    Endpoint { path: "/v1/chat/completions", body: chat_schema, named: false },
];

/// Each endpoint answers `input` with `status`, streamed or not; the
/// error messages, which must contain `names`.
fn answers(server: &Server, endpoints: &[Endpoint], input: &Value, status: StatusCode, names: &str) {
    for endpoint in endpoints {
        let body = (endpoint.body)(input.clone());
        let (got, answer) = server.post(endpoint.path, &body);
        assert_eq!(got, status, "{}: {answer}", endpoint.path);
        if status != StatusCode::OK {
            assert_clean(&answer);
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(names), "{}: {message}", endpoint.path);
        }
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (got, events) = stream(server, endpoint, &streamed);
        assert_eq!(got, status, "{} streamed: {events:?}", endpoint.path);
        for event in &events {
            match status {
                StatusCode::OK => assert!(event.get("error").is_none(), "{}: {event}", endpoint.path),
                _ => assert_clean(event),
            }
        }
    }
}

/// A streamed request's status and its events' data (the error body when
/// it was refused before streaming).
fn stream(server: &Server, endpoint: &Endpoint, body: &Value) -> (StatusCode, Vec<Value>) {
    if !endpoint.named {
        let stream = server.stream(endpoint.path, body);
        let events = if stream.status == StatusCode::OK { stream.events } else { vec![stream.error] };
        return (stream.status, events);
    }
    let response = server.client().post(server.url(endpoint.path)).json(body).send().expect("an answer");
    let status = response.status();
    let text = response.text().expect("a whole answer");
    if status != StatusCode::OK {
        return (status, vec![serde_json::from_str(&text).unwrap_or(Value::Null)]);
    }
    let events = named_events(&text);
    assert!(events.iter().all(|(name, _)| !name.contains("fail") && name != "error"), "{events:?}");
    (status, events.into_iter().map(|(_, data)| data).collect())
}

fn assert_serving(server: &Server) {
    let (status, _) = server.get("/health");
    assert_eq!(status, StatusCode::OK, "{}", server.log());
    let (status, answer) = server.post("/completion", &json!({"prompt": "Hello", "n_predict": 4}));
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["tokens_predicted"], 4);
}

#[test]
fn deep_grammars_within_the_limits_compile_on_every_endpoint() {
    let server = Server::start(&["-np", "2"]);
    for link in [sequence, alternation] {
        answers(&server, &GRAMMAR_ENDPOINTS, &json!(gbnf_chain(700, link)), StatusCode::OK, "");
    }
    // Through llguidance's own syntax, the same chain.
    let lark = format!("%llguidance {{}}\nstart: r0\n{}r700: \"a\"\n", {
        (0..700).map(|i| format!("r{i}: \"a\" r{}\n", i + 1)).collect::<String>()
    });
    answers(&server, &GRAMMAR_ENDPOINTS[..1], &json!(lark), StatusCode::OK, "");
    answers(&server, &SCHEMA_ENDPOINTS, &ref_chain(700), StatusCode::OK, "");
    assert_serving(&server);
}

#[test]
fn grammars_past_the_limits_are_400s_naming_them() {
    let server = Server::start(&["-np", "1"]);
    let depth = "at most 5000";
    for link in [sequence, alternation] {
        answers(&server, &GRAMMAR_ENDPOINTS, &json!(gbnf_chain(40_000, link)), StatusCode::BAD_REQUEST, depth);
    }
    answers(&server, &SCHEMA_ENDPOINTS, &ref_chain(2_000), StatusCode::BAD_REQUEST, depth);
    // One number was enough: llguidance recursed without end on it.
    let bottom = json!({"type": "object", "properties": {"n": {"const": -9_223_372_036_854_775_807i64}}});
    answers(&server, &SCHEMA_ENDPOINTS, &bottom, StatusCode::BAD_REQUEST, "at or below -2^63");
    let wide = "alternatives; at most 2000";
    for (prefix, choices) in [("", 2_001), ("\"x\" ", 2_001), ("", 20_001)] {
        let grammar = json!(alternatives(prefix, choices));
        answers(&server, &GRAMMAR_ENDPOINTS[..1], &grammar, StatusCode::BAD_REQUEST, wide);
    }
    let lark = format!("%llguidance {{}}\n{}", alternatives("\"x\" ", 2_500).replace("root ::=", "start:"));
    answers(&server, &GRAMMAR_ENDPOINTS[..1], &json!(lark), StatusCode::BAD_REQUEST, wide);
    // A grammar that derives nothing says so, without the parser's state.
    answers(&server, &GRAMMAR_ENDPOINTS, &json!("root ::= root"), StatusCode::BAD_REQUEST, "allows no output");
    assert_serving(&server);
}
