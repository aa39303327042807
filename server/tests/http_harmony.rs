//! gpt-oss over the OpenAI API, served from its synthetic model
//! (`sluice_tests::models::tiny_family("gpt-oss")`, the published Harmony
//! template): `reasoning_effort` and tools reach the template, a required
//! call is held to Harmony's call syntax and comes back as `tool_calls`
//! (streamed and not, the same), and a conversation with earlier calls,
//! their reasoning and results renders as Harmony messages.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::Server;

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"location": {"type": "string", "maxLength": 12}},
                       "required": ["location"], "additionalProperties": false}}}])
}

fn ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, reply) = server.post(path, body);
    assert_eq!(status, StatusCode::OK, "{path}: {reply}\n{}", server.log());
    reply
}

#[test]
fn gpt_oss_reasons_and_calls_through_the_openai_api() {
    let path = std::env::temp_dir().join(format!("sluice-gpt-oss-{}.gguf", std::process::id()));
    std::fs::write(&path, sluice_tests::models::gpt_oss_for_chat().build()).expect("write the model");
    let server = Server::start_model(&path, &["-np", "1"], &[]);

    let user = json!({"role": "user", "content": "What is the weather in Paris?"});
    let rendered =
        ok(&server, "/apply-template", &json!({"messages": [user], "reasoning_effort": "high", "tools": tools()}));
    let prompt = rendered["prompt"].as_str().expect("a prompt");
    assert!(prompt.contains("Reasoning: high"), "{prompt}");
    assert!(prompt.contains("namespace functions {") && prompt.contains("type get_weather = "), "{prompt}");
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt}");

    let body = json!({"messages": [user], "tools": tools(), "tool_choice": "required", "max_tokens": 400,
                      "temperature": 0});
    let whole = ok(&server, "/v1/chat/completions", &body);
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{whole}");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments")).expect("JSON arguments");
    assert!(arguments["location"].is_string(), "{arguments}");
    assert!(choice["message"]["content"].is_null(), "{whole}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let stream = server.stream("/v1/chat/completions", &streamed);
    assert!(stream.done, "{}", stream.error);
    let deltas: Vec<&Value> = stream.events.iter().filter_map(|event| event["choices"][0].get("delta")).collect();
    let text = |key: &str| -> String { deltas.iter().filter_map(|delta| delta[key].as_str()).collect() };
    let fragments: String =
        deltas.iter().filter_map(|delta| delta["tool_calls"][0]["function"]["arguments"].as_str()).collect();
    assert_eq!(fragments, call["function"]["arguments"].as_str().expect("arguments"));
    assert_eq!(text("reasoning_content"), choice["message"]["reasoning_content"].as_str().unwrap_or_default());
    assert_eq!(text("content"), "");
    let last = stream.events.iter().rev().find(|event| !event["choices"][0]["finish_reason"].is_null());
    assert_eq!(last.map(|event| &event["choices"][0]["finish_reason"]), Some(&json!("tool_calls")));

    // The call, its reasoning and its result, as the next request sends them.
    let history = json!([
        user,
        {"role": "assistant", "reasoning_content": "Need the weather tool.", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\":\"clear\"}"},
    ]);
    let rendered = ok(&server, "/apply-template", &json!({"messages": history, "tools": tools()}));
    let prompt = rendered["prompt"].as_str().expect("a prompt");
    for part in [
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Paris\"}<|call|>",
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"sky\\\":\\\"clear\\\"}\"<|end|>",
    ] {
        assert!(prompt.contains(part), "{part} not in {prompt}");
    }
    drop(server);
    std::fs::remove_file(&path).expect("clean up");
}
