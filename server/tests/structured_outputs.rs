//! Structured outputs over HTTP on the default model: every output of a
//! JSON schema parses and validates (checked by the `jsonschema` crate, not
//! by the grammar that produced it), and is the same token for token
//! streamed or not, alone or four at once, cached or not, with or without a
//! self-draft; GBNF outputs are accepted by checkers of their languages
//! written here; bad grammars are 400s naming the position.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::Server;
use sluice_tests::models::default_model;

/// Schemas covering what users ask of structured outputs. Strings carry
/// length bounds (or patterns) so that a small model always finishes
/// within the token limit.
fn schemas() -> Vec<(&'static str, Value)> {
    let point = json!({"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                       "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"],
                       "additionalProperties": false});
    vec![
        (
            "person",
            json!({"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"],
            "additionalProperties": false}),
        ),
        (
            "optional fields",
            json!({"type": "object", "properties": {"done": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 10}}, "required": ["done"], "additionalProperties": false}),
        ),
        (
            "array of bounded integers",
            json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "minItems": 1, "maxItems": 5}),
        ),
        ("array of objects", json!({"type": "array", "items": point, "minItems": 1, "maxItems": 3})),
        ("enum", json!({"enum": ["red", "green", "blue"]})),
        (
            "const",
            json!({"type": "object", "properties": {"version": {"const": 2}, "ok": {"type": "boolean"}},
            "required": ["version", "ok"], "additionalProperties": false}),
        ),
        ("pattern", json!({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"})),
        ("date format", json!({"type": "string", "format": "date"})),
        ("uuid format", json!({"type": "string", "format": "uuid"})),
        ("string lengths", json!({"type": "string", "minLength": 5, "maxLength": 12})),
        ("exclusive integer bounds", json!({"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20})),
        (
            "number bounds",
            json!({"type": "object", "properties": {"score": {"type": "number", "minimum": -1.5,
            "maximum": 2.5}}, "required": ["score"], "additionalProperties": false, "x-guidance": {"whitespace_pattern": ""}}),
        ),
        (
            "anyOf",
            json!({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
            {"type": "string", "maxLength": 5}]}),
        ),
        (
            "oneOf",
            json!({"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}},
             "required": ["kind", "r"], "additionalProperties": false},
            {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}},
             "required": ["kind", "side"], "additionalProperties": false}]}),
        ),
        (
            "$ref",
            json!({"$defs": {"point": point}, "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
            "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"], "additionalProperties": false}),
        ),
        (
            "many properties",
            json!({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
            "c": {"enum": [1, 2, 3]}, "d": {"type": "string", "maxLength": 4}, "e": {"type": "integer", "minimum": 0, "maximum": 5}},
            "required": ["a", "c"], "additionalProperties": false}),
        ),
        (
            "nested objects",
            json!({"type": "object", "properties": {"outer": {"type": "object", "properties": {
            "inner": {"type": "object", "properties": {"leaf": {"type": "boolean"}}, "required": ["leaf"],
            "additionalProperties": false}}, "required": ["inner"], "additionalProperties": false}},
            "required": ["outer"], "additionalProperties": false}),
        ),
        (
            "array of short strings",
            json!({"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 8},
            "maxItems": 4}),
        ),
        ("type union", json!({"type": ["boolean", "null"]})),
        (
            "tags and count",
            json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
            "maxItems": 3}, "count": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["tags", "count"],
            "additionalProperties": false}),
        ),
        (
            "nested arrays",
            json!({"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
            "minItems": 1, "maxItems": 3}),
        ),
    ]
}

const N_PREDICT: u32 = 160;

fn body(name: &str, schema: &Value, temperature: f64, seed: u64) -> Value {
    json!({ "prompt": format!("Answer in JSON ({name}):"), "json_schema": schema, "n_predict": N_PREDICT,
            "temperature": temperature, "seed": seed, "return_tokens": true })
}

/// (text, tokens, stop type) of one request, streamed or not.
fn run(server: &Server, body: &Value, stream: bool) -> (String, Value, String) {
    if !stream {
        let (status, answer) = server.post("/completion", body);
        assert_eq!(status, StatusCode::OK, "{answer}\n{}", server.log());
        return (
            answer["content"].as_str().unwrap_or_default().to_owned(),
            answer["tokens"].clone(),
            answer["stop_type"].as_str().unwrap_or_default().to_owned(),
        );
    }
    let mut body = body.clone();
    body["stream"] = json!(true);
    let stream = server.stream("/completion", &body);
    let text: String = stream.events.iter().filter_map(|e| e["content"].as_str()).collect();
    let tokens = stream
        .events
        .iter()
        .filter(|e| e["stop"] == false)
        .flat_map(|e| e["tokens"].as_array().cloned().unwrap_or_default())
        .collect();
    let stop = stream.events.last().and_then(|e| e["stop_type"].as_str()).unwrap_or_default().to_owned();
    (text, Value::Array(tokens), stop)
}

fn validate(name: &str, schema: &Value, text: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|error| panic!("{name}: output is not JSON ({error}): {text:?}"));
    let validator = jsonschema::options().should_validate_formats(true).build(schema).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(&value).map(|error| error.to_string()).collect();
    assert!(errors.is_empty(), "{name}: {text} does not validate: {errors:?}");
}

type Outputs = BTreeMap<(usize, u64), (String, Value)>;

/// Each schema at temperature 0 and at 0.8 with a seed: valid output,
/// ended by the model (not the limit), the same streamed, and the same
/// again when asked a second time (the prompt then comes from the cache).
fn alone(server: &Server) -> Outputs {
    let mut outputs = BTreeMap::new();
    for (index, (name, schema)) in schemas().iter().enumerate() {
        for (temperature, seed) in [(0.0, 1), (0.8, 11 + index as u64)] {
            let body = body(name, schema, temperature, seed);
            let (text, tokens, stop) = run(server, &body, false);
            assert_eq!(stop, "eos", "{name} at {temperature}: the output did not end: {text:?}");
            validate(name, schema, &text);
            assert_eq!(run(server, &body, true), (text.clone(), tokens.clone(), stop.clone()), "{name}: streamed");
            assert_eq!(run(server, &body, false).1, tokens, "{name}: cached prompt");
            outputs.insert((index, seed), (text, tokens));
        }
    }
    outputs
}

#[test]
fn json_schemas_are_followed_and_batch_invariant() {
    let server = Server::start(&["-np", "4"]);
    let outputs = alone(&server);
    // Four at once, each schema beside others in the same steps.
    let schemas = schemas();
    let requests: Vec<(usize, u64, Value)> = outputs
        .keys()
        .map(|&(index, seed)| {
            let (name, schema) = &schemas[index];
            let temperature = if seed == 1 { 0.0 } else { 0.8 };
            (index, seed, body(name, schema, temperature, seed))
        })
        .collect();
    for group in requests.chunks(4) {
        std::thread::scope(|scope| {
            let runs: Vec<_> = group
                .iter()
                .enumerate()
                .map(|(n, (_, _, body))| {
                    let server = &server;
                    scope.spawn(move || run(server, body, n % 2 == 1))
                })
                .collect();
            for ((index, seed, _), handle) in group.iter().zip(runs) {
                let (text, tokens, _) = handle.join().expect("the request thread");
                assert_eq!((text, tokens), outputs[&(*index, *seed)], "{}: batched", schemas[*index].0);
            }
        });
    }
    drop(server);

    // A self-draft proposes tokens the grammar may forbid: the output stays
    // the same.
    let model = default_model();
    let model = model.to_str().expect("utf-8 path");
    let drafted = Server::start(&["-np", "2", "-md", model, "--spec-draft-p-min", "0", "--spec-draft-n-max", "4"]);
    for (&(index, seed), expected) in &outputs {
        let (name, schema) = &schemas[index];
        let temperature = if seed == 1 { 0.0 } else { 0.8 };
        let (text, tokens, _) = run(&drafted, &body(name, schema, temperature, seed), seed == 1);
        assert_eq!(&(text, tokens), expected, "{name}: with a draft");
    }
    // Drafts ran, and the grammar let some through.
    assert!(drafted.metric("llamacpp:spec_decode_num_accepted_tokens_total") > 0.0, "{}", drafted.log());
}

#[test]
fn constrained_rows_leave_unconstrained_rows_untouched() {
    let server = Server::start(&["-np", "2"]);
    let free = json!({"prompt": "Once upon a time", "n_predict": 96, "temperature": 0.8, "seed": 5,
                      "ignore_eos": true, "return_tokens": true, "stream": true});
    let tokens = |reader: &mut sluice_tests::http::SseReader, tokens: &mut Vec<Value>| {
        let event: Value = serde_json::from_str(&reader.next_data().expect("an event")).expect("JSON");
        tokens.extend(event["tokens"].as_array().cloned().unwrap_or_default());
        event["stop"] == true
    };
    let mut alone = Vec::new();
    let mut reader = server.open_stream("/completion", &free);
    while !tokens(&mut reader, &mut alone) {}
    // The constrained request starts once the free one is decoding, and
    // ends while it still is: they shared steps.
    let (name, schema) = &schemas()[0];
    let mut beside = Vec::new();
    let mut reader = server.open_stream("/completion", &free);
    tokens(&mut reader, &mut beside);
    let (status, constrained) = server.post("/completion", &body(name, schema, 0.0, 1));
    assert_eq!(status, StatusCode::OK, "{constrained}");
    let (_, slots) = server.get("/slots");
    let busy = slots.as_array().map_or(0, |slots| slots.iter().filter(|slot| slot["is_processing"] == true).count());
    assert_eq!(busy, 1, "the free request ended before the constrained one: no shared step\n{slots}");
    while !tokens(&mut reader, &mut beside) {}
    assert_eq!(beside, alone, "the unconstrained request's tokens changed beside a constrained one");
    validate(name, schema, constrained["content"].as_str().unwrap_or_default());
}

#[test]
fn openai_response_format_is_followed() {
    let server = Server::start(&["-np", "1"]);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                        "country": {"type": "string", "maxLength": 20}}, "required": ["city", "country"],
                        "additionalProperties": false});
    let messages = json!([{"role": "user", "content": "Name a city and its country."}]);
    for format in [
        json!({"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": true}}),
        // llama-server's extension: json_object with the schema beside it.
        json!({"type": "json_object", "schema": schema}),
    ] {
        let body = json!({"messages": messages, "max_tokens": 120, "temperature": 0, "response_format": format});
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, StatusCode::OK, "{answer}");
        let content = answer["choices"][0]["message"]["content"].as_str().expect("content");
        validate("response_format", &schema, content);
        assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
    }
    // Plain json_object: any object. A model this small may nest objects
    // until the limit, so only a finished reply must parse; a cut one is
    // still the start of an object.
    let body = json!({"messages": messages, "max_tokens": 60, "temperature": 0,
                      "response_format": {"type": "json_object"}});
    let (status, answer) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, StatusCode::OK, "{answer}");
    let content = answer["choices"][0]["message"]["content"].as_str().expect("content");
    assert!(content.starts_with('{'), "{content:?}");
    if answer["choices"][0]["finish_reason"] == "stop" {
        validate("json_object", &json!({"type": "object"}), content);
    }
    let (status, answer) = server.post(
        "/v1/completions",
        &json!({"prompt": "JSON:", "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["yes", "no"]}}}}),
    );
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(matches!(answer["choices"][0]["text"].as_str(), Some("\"yes\"" | "\"no\"")), "{answer}");
}

/// An arithmetic expression over digits, + - * / and parentheses.
fn is_expression(text: &str) -> bool {
    /// Operands joined by any of `operators`, left to right.
    fn chain(s: &[u8], at: &mut usize, operators: &[u8], operand: fn(&[u8], &mut usize) -> bool) -> bool {
        if !operand(s, at) {
            return false;
        }
        while s.get(*at).is_some_and(|byte| operators.contains(byte)) {
            *at += 1;
            if !operand(s, at) {
                return false;
            }
        }
        true
    }
    fn expr(s: &[u8], at: &mut usize) -> bool {
        chain(s, at, b"+-", term)
    }
    fn term(s: &[u8], at: &mut usize) -> bool {
        chain(s, at, b"*/", factor)
    }
    fn factor(s: &[u8], at: &mut usize) -> bool {
        if s.get(*at) == Some(&b'(') {
            *at += 1;
            return expr(s, at) && s.get(*at) == Some(&b')') && {
                *at += 1;
                true
            };
        }
        let start = *at;
        while s.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        *at > start
    }
    let mut at = 0;
    expr(text.as_bytes(), &mut at) && at == text.len()
}

/// An independent check of a grammar's language.
type Language<'a> = dyn Fn(&str) -> bool + 'a;

#[test]
fn gbnf_grammars_are_followed() {
    let server = Server::start(&["-np", "2"]);
    // Bounded everywhere (depth and repetition), so that a small model
    // always finishes within the token limit.
    let arithmetic = "root ::= term ((\"+\" | \"-\") term){0,3}\nterm ::= factor ((\"*\" | \"/\") factor){0,2}\n\
                      factor ::= [0-9]{1,3} | \"(\" inner \")\"\ninner ::= [0-9]{1,3} ((\"+\" | \"-\") [0-9]{1,3}){1,2}\n";
    let json_grammar = r#"
root   ::= "{" ws ( pair ("," ws pair){0,3} )? "}"
pair   ::= string ":" ws value
value  ::= scalar | "[" ws ( scalar ("," ws scalar){0,3} )? "]" ws
scalar ::= string | number | ("true" | "false" | "null") ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) ){0,12} "\"" ws
number ::= "-"? ([0-9] | [1-9] [0-9]{1,3}) ("." [0-9]{1,3})? ws
ws     ::= | " " | "\n" [ \t]{0,8}
"#;
    let list = "root ::= item{2,4}\nitem ::= \"- \" [a-z]{1,10} \"\\n\"\n";
    let classes = "root ::= [A-Z] [^0-9\\n ]{2,5} \"-\" [0-9]{3} | \"#\" [a-fA-F0-9]{6}\n";
    let item = regex::Regex::new(r"^(- [a-z]{1,10}\n){2,4}$").expect("regex");
    let class = regex::Regex::new(r"^([A-Z][^0-9\n ]{2,5}-[0-9]{3}|#[a-fA-F0-9]{6})$").expect("regex");
    let cases: [(&str, &str, &Language<'_>); 4] = [
        ("arithmetic", arithmetic, &is_expression),
        ("json", json_grammar, &|text| serde_json::from_str::<Value>(text.trim_end()).is_ok_and(|v| v.is_object())),
        ("list", list, &|text| item.is_match(text)),
        ("classes", classes, &|text| class.is_match(text)),
    ];
    for (name, grammar, accepts) in cases {
        for (temperature, seed) in [(0.0, 1), (0.8, 2), (0.8, 3)] {
            let body = json!({"prompt": format!("Write {name}:"), "grammar": grammar, "n_predict": 120,
                              "temperature": temperature, "seed": seed});
            let (status, answer) = server.post("/completion", &body);
            assert_eq!(status, StatusCode::OK, "{name}: {answer}");
            let text = answer["content"].as_str().unwrap_or_default();
            assert_eq!(answer["stop_type"], "eos", "{name}: the output did not end: {text:?}");
            assert!(accepts(text), "{name} at {temperature}/{seed}: {text:?} is not in the language");
        }
    }
    // The same grammar through llguidance's own syntax.
    let lark = "%llguidance {}\nstart: \"#\" /[a-f0-9]{6}/\n";
    let (status, answer) =
        server.post("/completion", &json!({"prompt": "Color:", "grammar": lark, "n_predict": 20, "temperature": 0}));
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(regex::Regex::new("^#[a-f0-9]{6}$").expect("regex").is_match(answer["content"].as_str().unwrap_or("")));
}

#[test]
fn bad_grammars_and_schemas_are_400s_naming_the_problem() {
    let server = Server::start(&["-np", "1"]);
    let refused = |body: Value| {
        let (status, answer) = server.post(
            "/completion",
            &json!({"prompt": "x", "n_predict": 4})
                .as_object()
                .map(|base| {
                    let mut merged = base.clone();
                    merged.extend(body.as_object().cloned().unwrap_or_default());
                    Value::Object(merged)
                })
                .unwrap_or_default(),
        );
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        answer["error"]["message"].as_str().unwrap_or_default().to_owned()
    };
    let message = refused(json!({"grammar": "root ::= \"a\" | b\n"}));
    assert!(message.contains("`grammar`") && message.contains("undefined rule 'b'"), "{message}");
    let message = refused(json!({"grammar": "root ::= [a-z\n"}));
    assert!(message.contains("line 1"), "{message}");
    let message = refused(json!({"grammar": "item ::= \"a\"\n"}));
    assert!(message.contains("root"), "{message}");
    let message = refused(json!({"grammar": "root ::= \"a\"", "json_schema": {"type": "string"}}));
    assert!(message.contains("not both"), "{message}");
    let message = refused(json!({"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}));
    assert!(message.contains("`json_schema`") && message.contains("missing"), "{message}");
    let message = refused(json!({"grammar": "%llguidance {}\nstart: undefined_rule\n"}));
    assert!(message.contains("undefined_rule"), "{message}");
    // The server goes on serving.
    let (status, _) = server.post("/completion", &json!({"prompt": "x", "n_predict": 2}));
    assert_eq!(status, StatusCode::OK);
}
