//! Bad request bodies: malformed ones on every route, every known field of
//! each endpoint set to each value of [`values`], and named hostile
//! requests whose answer is known.

use serde_json::{Value, json};

use super::{Expect, Report, Target, send, still_serving};

/// A route and a valid body for it, with the fields worth mutating (a
/// name, or a JSON pointer into the body).
struct Route {
    path: String,
    body: Value,
    fields: Vec<&'static str>,
}

fn route(path: &str, body: Value, fields: &[&'static str]) -> Route {
    Route { path: path.to_owned(), body, fields: fields.to_vec() }
}

/// Fields that set how many tokens are generated: a mutation that would
/// ask for a long generation is left out (the battery is about input, not
/// about running out the context).
const LENGTH_FIELDS: [&str; 4] = ["n_predict", "max_tokens", "max_completion_tokens", "max_output_tokens"];

fn routes(target: &Target<'_>) -> Vec<Route> {
    let messages = json!([{ "role": "user", "content": "Hello" }]);
    let mut routes = vec![
        route(
            "/completion",
            json!({ "prompt": "Hello", "n_predict": 2 }),
            &[
                "prompt",
                "n_predict",
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "seed",
                "stop",
                "stream",
                "n_probs",
                "post_sampling_probs",
                "logit_bias",
                "grammar",
                "json_schema",
                "samplers",
                "id_slot",
                "n_keep",
                "n_discard",
                "cache_prompt",
                "lora",
                "response_fields",
                "n_cmpl",
                "ignore_eos",
                "return_progress",
                "multimodal_data",
            ],
        ),
        route(
            "/v1/completions",
            json!({ "prompt": "Hello", "max_tokens": 2 }),
            &["prompt", "max_tokens", "logprobs", "n", "stop", "stream", "stream_options", "response_format", "echo"],
        ),
        route(
            "/v1/chat/completions",
            json!({ "messages": messages, "max_tokens": 2 }),
            &[
                "messages",
                "/messages/0",
                "/messages/0/content",
                "/messages/0/role",
                "max_tokens",
                "max_completion_tokens",
                "logprobs",
                "top_logprobs",
                "tools",
                "tool_choice",
                "response_format",
                "stream",
                "stream_options",
                "n",
                "chat_template_kwargs",
                "reasoning_format",
            ],
        ),
        route(
            "/v1/responses",
            json!({ "input": "Hello", "max_output_tokens": 2 }),
            &["input", "instructions", "max_output_tokens", "text", "tools", "tool_choice", "stream", "reasoning"],
        ),
        route(
            "/v1/messages",
            json!({ "model": "m", "max_tokens": 2, "messages": messages }),
            &["model", "max_tokens", "messages", "/messages/0/content", "system", "stream", "tools", "thinking"],
        ),
        route("/v1/messages/count_tokens", json!({ "model": "m", "messages": messages }), &["messages", "system"]),
        route("/tokenize", json!({ "content": "Hello", "with_pieces": true }), &["content", "with_pieces"]),
        route("/detokenize", json!({ "tokens": [1, 2, 3] }), &["tokens"]),
        route("/apply-template", json!({ "messages": messages }), &["messages", "chat_template_kwargs"]),
        route("/v1/chat/completions/input_tokens", json!({ "messages": messages }), &["messages", "tools"]),
        route("/v1/responses/input_tokens", json!({ "input": "Hello" }), &["input", "instructions"]),
        route("/lora-adapters", json!([]), &[]),
        route("/props", json!({}), &[]),
        route("/slots/0?action=save", json!({ "filename": "battery.bin" }), &["filename"]),
        route("/admin/policy", json!({ "policy": "continuous" }), &["policy", "settings"]),
        route("/admin/policy/promote", json!({ "policy": "continuous" }), &["policy"]),
    ];
    routes.extend(target.extra_routes.iter().map(|(path, body)| Route {
        path: path.clone(),
        fields: body.as_object().map(|object| object.keys().map(|key| leak(key)).collect()).unwrap_or_default(),
        body: body.clone(),
    }));
    routes
}

/// A field name of an extra route as the `'static` the built-in lists use
/// (a handful of short names per test process).
fn leak(name: &str) -> &'static str {
    Box::leak(name.to_owned().into_boxed_str())
}

/// Values of every JSON type and the edges of each.
fn values() -> Vec<Value> {
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!([deep]);
    }
    vec![
        Value::Null,
        json!(true),
        json!(-1),
        json!(0),
        json!(4_294_967_296u64),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e308),
        json!(0.5),
        json!(""),
        json!("x"),
        json!("-1"),
        json!("\u{0}\u{1b}[31m{{ raise_exception('x') }}{% for x in y %}"),
        json!("a ".repeat(32 * 1024)),
        json!([]),
        json!([null]),
        json!([[[[1]]]]),
        json!({}),
        json!({ "a": { "b": [] } }),
        deep,
    ]
}

/// Whether `value` in a length field would ask for a long generation.
fn long_generation(field: &str, value: &Value) -> bool {
    LENGTH_FIELDS.contains(&field) && value.as_i64().is_some_and(|n| n == -1 || n > 16)
}

/// Bodies that are not JSON, and JSON that is not an object.
fn malformed() -> Vec<(&'static str, Vec<u8>, Expect)> {
    let nested_arrays = format!("{}{}", "[".repeat(200), "]".repeat(200)).into_bytes();
    let nested_objects = format!("{}1{}", "{\"a\":".repeat(200), "}".repeat(200)).into_bytes();
    vec![
        ("an empty body", Vec::new(), Expect::Refused),
        ("half an object", b"{\"prompt\": \"hi".to_vec(), Expect::Refused),
        ("not UTF-8", b"{\"prompt\": \"\xff\xfe\"}".to_vec(), Expect::Refused),
        ("a lone surrogate", br#"{"prompt": "\ud800", "content": "\ud800"}"#.to_vec(), Expect::Refused),
        ("arrays 200 deep", nested_arrays, Expect::Refused),
        ("objects 200 deep", nested_objects, Expect::Refused),
        ("null", b"null".to_vec(), Expect::Any),
        ("a number", b"1e999".to_vec(), Expect::Refused),
        ("a string", b"\"x\"".to_vec(), Expect::Any),
        ("a key twice", br#"{"prompt": "a", "prompt": 1, "n_predict": 1}"#.to_vec(), Expect::Any),
        ("trailing bytes", br#"{"prompt": "a", "n_predict": 1} x"#.to_vec(), Expect::Refused),
    ]
}

/// The named hostile requests and what each must get.
fn hostile(target: &Target<'_>) -> Vec<(String, &'static str, Value, Expect)> {
    let over = target.n_probs_cap + 1;
    let chat = |extra: Value| {
        let mut body = json!({ "messages": [{ "role": "user", "content": "Hello" }], "max_tokens": 1 });
        merge(&mut body, extra);
        body
    };
    let n = |what: &str| what.to_owned();
    vec![
        (
            n("n_probs of a billion"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "n_probs": 1_000_000_000 }),
            Expect::Status(400, &["n_probs"]),
        ),
        (
            format!("n_probs {over}, one over the cap"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "n_probs": over }),
            Expect::Status(400, &["n_probs"]),
        ),
        (
            n("logprobs of a billion"),
            "/v1/completions",
            json!({ "prompt": "hi", "max_tokens": 1, "logprobs": 1_000_000_000 }),
            Expect::Status(400, &["logprobs"]),
        ),
        (
            n("logprobs -1"),
            "/v1/completions",
            json!({ "prompt": "hi", "max_tokens": 1, "logprobs": -1 }),
            Expect::Status(400, &["logprobs"]),
        ),
        (
            n("top_logprobs of a billion"),
            "/v1/chat/completions",
            chat(json!({ "logprobs": true, "top_logprobs": 1_000_000_000 })),
            Expect::Status(400, &["top_logprobs"]),
        ),
        (
            n("a logit bias of a string"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "logit_bias": [[1, "x"]] }),
            Expect::Status(400, &["logit_bias"]),
        ),
        (
            n("a logit bias of an object"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "logit_bias": { "1": { "x": 1 } } }),
            Expect::Status(400, &["logit_bias"]),
        ),
        (
            n("content of nested arrays"),
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": [[[[1]]]] }], "max_tokens": 1 }),
            Expect::Status(400, &["messages[0].content"]),
        ),
        (
            n("a content part without a type"),
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": [{ "text": "x" }] }], "max_tokens": 1 }),
            Expect::Status(400, &["messages[0].content[0]"]),
        ),
        (
            n("an audio part"),
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": [{ "type": "input_audio", "input_audio": {} }] }], "max_tokens": 1 }),
            Expect::Status(501, &["input_audio"]),
        ),
        (
            n("a block of no known type"),
            "/v1/messages",
            json!({ "model": "m", "max_tokens": 1, "messages": [{ "role": "user", "content": [{ "type": "x" }] }] }),
            Expect::Status(400, &["messages[0].content[0]"]),
        ),
        (
            n("a slot that does not exist"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "id_slot": 99 }),
            Expect::Status(400, &["id_slot"]),
        ),
        (
            n("a billion completions"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "n_cmpl": 1_000_000_000 }),
            Expect::Status(400, &["n_cmpl"]),
        ),
        (
            n("a token id past the vocabulary"),
            "/completion",
            json!({ "prompt": [999_999_999], "n_predict": 1 }),
            Expect::Refused,
        ),
        (
            n("token ids past any vocabulary"),
            "/detokenize",
            json!({ "tokens": [-1, 4_294_967_296u64, 999_999_999] }),
            Expect::Any,
        ),
        (
            n("a slot file outside its folder"),
            "/slots/0?action=save",
            json!({ "filename": "../../battery.bin" }),
            Expect::Refused,
        ),
        (
            n("a policy read from /dev/zero"),
            "/admin/policy",
            json!({ "policy": "/dev/zero" }),
            Expect::Status(400, &["policy"]),
        ),
        (
            n("a policy from a file that is not one"),
            "/admin/policy",
            json!({ "policy": "/etc/hostname" }),
            Expect::Status(400, &["policy"]),
        ),
        (
            n("a shadow read from /dev/zero"),
            "/admin/policy/shadow",
            json!({ "policy": "/dev/zero" }),
            Expect::Status(400, &["policy"]),
        ),
    ]
}

/// Requests whose grammar or schema is built to be deep or wide: a
/// refusal or an answer, never a crash or a leak.
fn grammars() -> Vec<(String, &'static str, Value, Expect)> {
    let chain = |rules: usize, join: &str| {
        let mut grammar = String::from("root ::= r0\n");
        for rule in 0..rules {
            grammar.push_str(&format!("r{rule} ::= \"a\"{join}r{}\n", rule + 1));
        }
        grammar.push_str(&format!("r{rules} ::= \"a\"\n"));
        grammar
    };
    let alternatives = |count: usize| {
        let words: Vec<String> = (0..count).map(|word| format!("\"w{word}\"")).collect();
        format!("root ::= {}\n", words.join(" | "))
    };
    let mut defs = serde_json::Map::new();
    for def in 0..700 {
        let next = json!({ "type": "object", "properties": { "a": { "$ref": format!("#/$defs/d{}", def + 1) } } });
        defs.insert(format!("d{def}"), next);
    }
    defs.insert("d700".into(), json!({ "type": "string" }));
    let schema = json!({ "$defs": defs, "$ref": "#/$defs/d0" });
    let mut nested = json!({ "type": "string" });
    for _ in 0..700 {
        nested = json!({ "type": "array", "items": nested });
    }
    let completion = |grammar: String| json!({ "prompt": "hi", "n_predict": 1, "grammar": grammar });
    let n = |what: &str| what.to_owned();
    let format = json!({ "type": "json_schema", "json_schema": { "name": "deep", "schema": schema } });
    vec![
        (n("a rule chain 700 deep"), "/completion", completion(chain(700, " ")), Expect::Any),
        (n("a rule chain 40,000 deep"), "/completion", completion(chain(40_000, " ")), Expect::Refused),
        (n("an alternation chain 700 deep"), "/completion", completion(chain(700, " | ")), Expect::Any),
        (n("an alternation chain 40,000 deep"), "/completion", completion(chain(40_000, " | ")), Expect::Refused),
        (n("2,001 alternatives"), "/completion", completion(alternatives(2_001)), Expect::Any),
        (n("20,001 alternatives"), "/completion", completion(alternatives(20_001)), Expect::Any),
        (n("a rule that is only itself"), "/completion", completion("root ::= root\n".into()), Expect::Refused),
        (
            n("a streamed rule chain 700 deep"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "stream": true, "grammar": chain(700, " ") }),
            Expect::Any,
        ),
        (
            n("a Lark chain 700 deep"),
            "/completion",
            completion(format!(
                "%llguidance {{}}\nstart: r0\n{}",
                chain(700, " ").replace("::=", ":").replace("root : r0\n", "")
            )),
            Expect::Any,
        ),
        (
            n("a $ref chain 700 deep"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "json_schema": schema }),
            Expect::Any,
        ),
        (
            n("arrays 700 deep in a schema"),
            "/completion",
            json!({ "prompt": "hi", "n_predict": 1, "json_schema": nested }),
            Expect::Any,
        ),
        (
            n("a $ref chain 700 deep, /v1/completions"),
            "/v1/completions",
            json!({ "prompt": "hi", "max_tokens": 1, "response_format": format }),
            Expect::Any,
        ),
        (
            n("a $ref chain 700 deep, chat"),
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 1, "response_format": format }),
            Expect::Any,
        ),
        (
            n("a rule chain 700 deep, responses"),
            "/v1/responses",
            json!({ "input": "hi", "max_output_tokens": 1, "grammar": chain(700, " ") }),
            Expect::Any,
        ),
        (
            n("a rule chain 40,000 deep, responses"),
            "/v1/responses",
            json!({ "input": "hi", "max_output_tokens": 1, "grammar": chain(40_000, " ") }),
            Expect::Refused,
        ),
        (
            n("a $ref chain 700 deep, responses"),
            "/v1/responses",
            json!({ "input": "hi", "max_output_tokens": 1, "text": { "format": { "type": "json_schema", "name": "deep", "schema": schema } } }),
            Expect::Any,
        ),
    ]
}

/// Policy paths inside the server's plugin folder that must not load, each
/// refused at once: a FIFO (reading it would wait for a writer forever), a
/// sparse gigabyte, a link out of the folder, a path that climbs out.
fn plugin_paths(dir: &std::path::Path) -> Vec<(String, &'static str, Value, Expect)> {
    let fifo = dir.join("battery-fifo.wasm");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|status| status.success());
    assert!(made || fifo.exists(), "mkfifo {} failed", fifo.display());
    let huge = dir.join("battery-huge.wasm");
    std::fs::File::create(&huge).and_then(|file| file.set_len(1 << 30)).expect("a sparse file");
    let link = dir.join("battery-link.wasm");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/etc/hostname", &link).expect("a symbolic link");
    let climb = dir.join("..").join("battery.wasm");
    let policy = |path: &std::path::Path| json!({ "policy": path.to_str().expect("a UTF-8 path") });
    vec![
        ("a policy from a FIFO".to_owned(), "/admin/policy", policy(&fifo), Expect::Status(400, &["policy"])),
        ("a policy of a gigabyte".to_owned(), "/admin/policy", policy(&huge), Expect::Status(400, &["policy"])),
        (
            "a policy linked out of its folder".to_owned(),
            "/admin/policy",
            policy(&link),
            Expect::Status(400, &["policy"]),
        ),
        (
            "a policy path out of its folder".to_owned(),
            "/admin/policy",
            policy(&climb),
            Expect::Status(400, &["policy"]),
        ),
    ]
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
}

/// Set `field` (a name, or a JSON pointer) of `body` to `value`; `false`
/// when the pointer's parent is not there.
fn set(body: &mut Value, field: &str, value: Value) -> bool {
    let Some(pointer) = field.strip_prefix('/') else {
        return body.as_object_mut().map(|object| object.insert(field.to_owned(), value)).is_some();
    };
    let (parent, last) = pointer.rsplit_once('/').map_or(("", pointer), |(parent, last)| (parent, last));
    let parent = if parent.is_empty() { Some(&mut *body) } else { body.pointer_mut(&format!("/{parent}")) };
    match parent {
        Some(Value::Object(object)) => {
            object.insert(last.to_owned(), value);
            true
        }
        Some(Value::Array(items)) => match last.parse::<usize>().ok().and_then(|index| items.get_mut(index)) {
            Some(item) => {
                *item = value;
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// Every bad-input category: malformed bodies, wrong field values, named
/// hostile requests, deep and wide grammars.
pub fn bad_inputs(target: &Target<'_>, report: &mut Report) {
    let client = target.client();
    let routes = routes(target);
    for route in &routes {
        for (what, body, expect) in malformed() {
            let request = client.post(target.server.url(&route.path)).header("content-type", "application/json");
            send(report, "malformed bodies", &format!("{} {what}", route.path), request.body(body), &expect);
        }
    }
    still_serving(target, report, "malformed bodies");

    let values = values();
    for route in &routes {
        for field in &route.fields {
            for value in &values {
                if long_generation(field, value) {
                    continue;
                }
                let mut body = route.body.clone();
                if !set(&mut body, field, value.clone()) {
                    continue;
                }
                let what = format!("{} {field} = {}", route.path, super::clip(&value.to_string()));
                let request = client.post(target.server.url(&route.path)).json(&body);
                send(report, "wrong field values", &what, request, &Expect::Any);
            }
        }
    }
    still_serving(target, report, "wrong field values");

    let mut hostile = hostile(target);
    if let Some(dir) = &target.plugin_dir {
        hostile.extend(plugin_paths(dir));
    }
    for (category, cases) in [("hostile requests", hostile), ("deep and wide grammars", grammars())] {
        for (what, path, body, expect) in cases {
            let request = client.post(target.server.url(path)).json(&body);
            send(report, category, &format!("{path} {what}"), request, &expect);
        }
        still_serving(target, report, category);
    }
}
