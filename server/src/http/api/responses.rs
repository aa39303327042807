//! OpenAI's Responses API (`/v1/responses`, alias `/responses`) and the
//! prompt-counting endpoints (`/v1/chat/completions/input_tokens`,
//! `/v1/responses/input_tokens` and their aliases without `/v1`), as
//! llama-server b11434 has them.
//!
//! Like llama-server, a Responses request is rewritten into a chat
//! completion request (`input` and `instructions` become `messages`,
//! `max_output_tokens` becomes `max_tokens`, every other field passes
//! through), so the prompt, the sampling fields and the engine work are the
//! chat endpoint's ([`super::chat::ChatParse`], [`crate::http::generate`]); only the answer's shape is this module's, with a
//! reply's reasoning (see [`crate::chat::reasoning`]) as a `reasoning` item before
//! the message. Server-side state (`previous_response_id`, `conversation`),
//! tools, reasoning items in the input, structured outputs and non-text input
//! are refused rather than ignored.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::chat::ChatParse;
use crate::chat::fields::{Fields, object, wrong};
use crate::chat::ids::random_id;
use crate::chat::messages::chat_tokens;
use crate::chat::reasoning::{Parts, Splitter};
use crate::http::error::ApiError;
use crate::http::extract::JsonBody;
use crate::http::generate::{
    Keep, StreamProgress, attach_progress, blocking, collect, engine_gone, submit, timings_json,
};
use crate::http::sse;
use crate::http::state::AppState;
use sluice_engine::request::{Completion, Progress, TokenEvent};

/// `POST /v1/responses`.
pub async fn responses(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let parsing = Arc::clone(&ready);
    let defaults = state.config().defaults.clone();
    let (plan, reasoning) = blocking(move || {
        let request = object(&body)?;
        // A response has one output; the chat pipeline would happily make
        // several, and there is nowhere to put them.
        for key in ["n", "n_cmpl"] {
            if let Some(n) = Fields(request).int(key)?
                && n != 1
            {
                return Err(ApiError::invalid(format!("`{key}` must be 1 (a response has one output), not {n}")));
            }
        }
        let chat = to_chat(request)?;
        ChatParse::plan(&parsing, &defaults, Fields(&chat))
    })
    .await?;
    let ids = Ids::new();
    // In single-model mode llama-server reports the loaded model, whatever
    // the request named.
    let model = ready.model.name.clone();
    let jobs = submit(&ready.engine, &plan)?;
    if plan.generation.stream {
        let render = ResponsesStream {
            ids,
            model,
            opened: false,
            splitter: reasoning.splitter(),
            reasoning: None,
            text: None,
            timings_per_token: plan.generation.timings_per_token,
            progress: StreamProgress::default(),
            prompt_len: plan.prompt(0).len(),
        };
        return sse::respond(jobs, render, state.ping(), state.hold_notice()).await;
    }
    let outcome = collect(jobs, &Keep::new(&ready, &[])).await?.into_iter().next().ok_or_else(engine_gone)?;
    let parts = reasoning.split(&outcome.content());
    let now = unix_now();
    Ok(Json(json!({
        "id": ids.response,
        "object": "response",
        "created_at": now,
        "completed_at": now,
        "status": "completed",
        "model": model,
        "output": output(&ids, &parts, Some("completed")),
        "usage": usage(&outcome.completion),
    }))
    .into_response())
}

/// `POST /v1/chat/completions/input_tokens`: the prompt length of a chat
/// request.
pub async fn chat_input_tokens(state: State<AppState>, body: JsonBody) -> Result<Json<Value>, ApiError> {
    count(state, body, false).await
}

/// `POST /v1/responses/input_tokens`: the prompt length of a Responses
/// request.
pub async fn responses_input_tokens(state: State<AppState>, body: JsonBody) -> Result<Json<Value>, ApiError> {
    count(state, body, true).await
}

/// The templated prompt's tokens, counted as the completion endpoints
/// tokenize it (BOS where the vocabulary asks for it, specials parsed).
async fn count(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
    responses: bool,
) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let thinking = state.config().defaults.reasoning;
    blocking(move || {
        let request = object(&body)?;
        let converted;
        // A chat request's tools are rendered into its prompt and counted.
        let chat = if responses {
            converted = to_chat(request)?;
            &converted
        } else {
            request
        };
        let n_tokens = chat_tokens(&ready.template, ready.counter(), Fields(chat), thinking)?.prompt.tokens.len();
        Ok(Json(json!({ "object": "response.input_tokens", "input_tokens": n_tokens })))
    })
    .await
}

/// The chat completion request a Responses request stands for.
fn to_chat(request: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let fields = Fields(request);
    refuse_unsupported(fields)?;
    let input = fields.get("input").ok_or_else(|| ApiError::invalid("`input` is required"))?;
    let mut messages: Vec<Value> = Vec::new();
    if let Some(instructions) = fields.str("instructions")? {
        messages.push(json!({ "role": "system", "content": instructions }));
    }
    match input {
        Value::String(text) => messages.push(json!({ "role": "user", "content": text })),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                push_item(&mut messages, index, item)?;
            }
        }
        _ => return Err(wrong("input", "a string or an array of input items").into()),
    }
    if messages.is_empty() {
        return Err(ApiError::invalid("`input` must not be empty"));
    }
    let mut chat = request.clone();
    for key in ["input", "instructions", "max_output_tokens", "reasoning"] {
        chat.remove(key);
    }
    chat.insert("messages".into(), Value::Array(messages));
    // Only the effort has a chat counterpart, as in llama-server.
    if let Some(reasoning) = fields.get("reasoning") {
        let reasoning = reasoning.as_object().ok_or_else(|| wrong("reasoning", "an object"))?;
        if let Some(effort) = Fields(reasoning).get("effort") {
            if !effort.is_string() {
                return Err(wrong("reasoning.effort", "a string").into());
            }
            chat.insert("reasoning_effort".into(), effort.clone());
        }
    }
    // Checked here so that an error names the field the client sent.
    if let Some(max) = fields.int("max_output_tokens")? {
        if max < -1 {
            return Err(ApiError::invalid(format!("`max_output_tokens` must be -1 (no limit) or more, not {max}")));
        }
        chat.insert("max_tokens".into(), json!(max));
    }
    Ok(chat)
}

/// Responses fields whose meaning sluice does not have: answering without
/// them would answer another question.
fn refuse_unsupported(fields: Fields<'_>) -> Result<(), ApiError> {
    // llama-server refuses a non-empty id and ignores an empty one.
    if fields.str("previous_response_id")?.is_some_and(|id| !id.is_empty()) {
        return Err(ApiError::unsupported("`previous_response_id` (sluice keeps no responses)"));
    }
    for (key, what) in [
        ("conversation", "`conversation` (sluice keeps no conversations)"),
        ("prompt", "`prompt` (stored prompt templates)"),
    ] {
        if fields.get(key).is_some() {
            return Err(ApiError::unsupported(what));
        }
    }
    check_tools(fields)?;
    if let Some(text) = fields.get("text") {
        let text = text.as_object().ok_or_else(|| wrong("text", "an object"))?;
        if let Some(format) = Fields(text).get("format") {
            let kind = format.get("type").and_then(Value::as_str).unwrap_or("text");
            if kind != "text" {
                return Err(ApiError::unsupported(&format!("`text.format` of type {kind:?}")));
            }
        }
    }
    Ok(())
}

fn check_tools(fields: Fields<'_>) -> Result<(), ApiError> {
    match fields.get("tools") {
        None => Ok(()),
        Some(Value::Array(tools)) if tools.is_empty() => Ok(()),
        Some(Value::Array(_)) => Err(ApiError::unsupported("`tools`")),
        Some(_) => Err(wrong("tools", "an array of tools").into()),
    }
}

/// Item types that carry tool calls, tool results or reasoning, none of
/// which sluice can feed back to a model yet.
fn is_tool_or_reasoning(kind: &str) -> bool {
    matches!(kind, "reasoning" | "item_reference")
        || kind.ends_with("_call")
        || kind.ends_with("_call_output")
        || kind.starts_with("mcp_")
}

/// Append input item `index` as a chat message. An assistant item after an
/// assistant message extends it, as llama-server merges them.
fn push_item(messages: &mut Vec<Value>, index: usize, item: &Value) -> Result<(), ApiError> {
    let item = item.as_object().ok_or_else(|| ApiError::invalid(format!("`input[{index}]` must be an object")))?;
    let item = Fields(item);
    let kind = item
        .get("type")
        .map(|kind| kind.as_str().ok_or_else(|| ApiError::invalid(format!("`input[{index}].type` must be a string"))));
    match kind.transpose()? {
        None | Some("message") => {}
        Some(kind) if is_tool_or_reasoning(kind) => {
            return Err(ApiError::unsupported(&format!("`input[{index}]` of type {kind:?}")));
        }
        Some(kind) => {
            return Err(ApiError::invalid(format!(
                "`input[{index}].type` must be \"message\" (or absent), not {kind:?}"
            )));
        }
    }
    let role = match item.get("role") {
        Some(Value::String(role)) => role.as_str(),
        _ => return Err(ApiError::invalid(format!("`input[{index}].role` must be a string"))),
    };
    if !matches!(role, "user" | "assistant" | "system" | "developer") {
        return Err(ApiError::invalid(format!(
            "`input[{index}].role` must be \"user\", \"assistant\", \"system\" or \"developer\", not {role:?}"
        )));
    }
    let parts = content_parts(index, item.get("content"))?;
    if role == "assistant"
        && let Some(last) = messages.last_mut()
        && last["role"] == "assistant"
        && let Some(content) = last.get_mut("content").and_then(Value::as_array_mut)
    {
        content.extend(parts);
        return Ok(());
    }
    messages.push(json!({ "role": role, "content": parts }));
    Ok(())
}

/// A message's content as chat text parts (which the chat prompt joins).
fn content_parts(index: usize, content: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let parts = match content {
        Some(Value::String(text)) => return Ok(vec![json!({ "type": "text", "text": text })]),
        Some(Value::Array(parts)) => parts,
        _ => return Err(wrong(&format!("input[{index}].content"), "a string or an array of content parts").into()),
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (number, part) in parts.iter().enumerate() {
        let at = format!("input[{index}].content[{number}]");
        let part = part.as_object().ok_or_else(|| wrong(&at, "an object"))?;
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text") => match part.get("text") {
                Some(Value::String(text)) => texts.push(json!({ "type": "text", "text": text })),
                _ => return Err(wrong(&format!("{at}.text"), "a string").into()),
            },
            Some(kind @ ("input_image" | "input_file" | "input_audio" | "refusal")) => {
                return Err(ApiError::unsupported(&format!("`{at}` of type {kind:?}")));
            }
            _ => return Err(wrong(&format!("{at}.type"), "\"input_text\" or \"output_text\"").into()),
        }
    }
    Ok(texts)
}

/// The ids of one response, its reasoning item and its message.
struct Ids {
    response: String,
    reasoning: String,
    message: String,
}

impl Ids {
    fn new() -> Self {
        Ids {
            response: format!("resp_{}", random_id()),
            reasoning: format!("rs_{}", random_id()),
            message: format!("msg_{}", random_id()),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

fn text_part(text: &str) -> Value {
    json!({ "type": "output_text", "annotations": [], "logprobs": [], "text": text })
}

fn message(ids: &Ids, status: &str, content: Vec<Value>) -> Value {
    json!({ "type": "message", "id": ids.message, "status": status, "role": "assistant", "content": content })
}

/// A reasoning item; `content` is empty while it streams. llama-server
/// gives it a `status` only when it opens and in whole responses.
fn reasoning_item(ids: &Ids, content: Vec<Value>, status: Option<&str>) -> Value {
    let mut item =
        json!({ "id": ids.reasoning, "summary": [], "type": "reasoning", "content": content, "encrypted_content": "" });
    if let (Some(status), Some(item)) = (status, item.as_object_mut()) {
        item.insert("status".into(), json!(status));
    }
    item
}

fn reasoning_text(text: &str) -> Value {
    json!({ "text": text, "type": "reasoning_text" })
}

/// The `output` list: the reasoning item (with `reasoning_status`), then
/// the message, each left out when empty (as llama-server leaves them out).
fn output(ids: &Ids, parts: &Parts, reasoning_status: Option<&str>) -> Vec<Value> {
    let mut output = Vec::new();
    if !parts.reasoning.is_empty() {
        output.push(reasoning_item(ids, vec![reasoning_text(&parts.reasoning)], reasoning_status));
    }
    if !parts.content.is_empty() {
        output.push(message(ids, "completed", vec![text_part(&parts.content)]));
    }
    output
}

fn usage(completion: &Completion) -> Value {
    let (input, output) = (completion.tokens_evaluated, completion.tokens_predicted);
    json!({
        "input_tokens": input,
        "output_tokens": output,
        "total_tokens": input + output,
        "input_tokens_details": { "cached_tokens": completion.tokens_cached },
    })
}

/// An event payload: its `type`, then `fields`.
fn event(kind: &str, fields: Value) -> Value {
    let mut event = Map::new();
    event.insert("type".into(), json!(kind));
    if let Value::Object(fields) = fields {
        event.extend(fields);
    }
    Value::Object(event)
}

/// llama-server's Responses stream: `response.created` and
/// `response.in_progress` with the first token; when the reply reasons,
/// `response.output_item.added` (the reasoning item) then one
/// `response.reasoning_text.delta` per piece of reasoning;
/// `response.output_item.added` and `response.content_part.added` before
/// the first text, then one `response.output_text.delta` per piece of
/// text; at the end `response.output_item.done` for the reasoning (when
/// there is some), `response.output_text.done`, `response.content_part.done`,
/// `response.output_item.done` (these three only when there is text) and
/// `response.completed`. No `[DONE]`.
struct ResponsesStream {
    ids: Ids,
    model: String,
    opened: bool,
    splitter: Splitter,
    /// The reasoning so far, once its item is open.
    reasoning: Option<String>,
    /// The text so far, once the message item is open.
    text: Option<String>,
    timings_per_token: bool,
    progress: StreamProgress,
    prompt_len: usize,
}

impl ResponsesStream {
    fn summary(&self, status: &str) -> Value {
        json!({ "id": self.ids.response, "object": "response", "status": status })
    }

    /// llama-server opens with the first token; a stream that ends before
    /// any token is opened at its end, so every stream has the same frame.
    fn open(&mut self) -> Vec<Value> {
        if std::mem::replace(&mut self.opened, true) {
            return Vec::new();
        }
        vec![
            event("response.created", json!({ "response": self.summary("in_progress") })),
            event("response.in_progress", json!({ "response": self.summary("in_progress") })),
        ]
    }

    fn delta(&mut self, parts: &Parts, events: &mut Vec<Value>) {
        if !parts.reasoning.is_empty() {
            let reasoning = match &mut self.reasoning {
                Some(reasoning) => reasoning,
                None => {
                    let item = reasoning_item(&self.ids, vec![], Some("in_progress"));
                    events.push(event("response.output_item.added", json!({ "item": item })));
                    self.reasoning.insert(String::new())
                }
            };
            reasoning.push_str(&parts.reasoning);
            events.push(event(
                "response.reasoning_text.delta",
                json!({ "delta": parts.reasoning, "item_id": self.ids.reasoning }),
            ));
        }
        if parts.content.is_empty() {
            return;
        }
        let text = match &mut self.text {
            Some(text) => text,
            None => {
                events.push(event(
                    "response.output_item.added",
                    json!({ "item": message(&self.ids, "in_progress", vec![]) }),
                ));
                events.push(event(
                    "response.content_part.added",
                    json!({ "item_id": self.ids.message, "part": { "type": "output_text", "text": "" } }),
                ));
                self.text.insert(String::new())
            }
        };
        text.push_str(&parts.content);
        events
            .push(event("response.output_text.delta", json!({ "item_id": self.ids.message, "delta": parts.content })));
    }
}

impl sse::Render for ResponsesStream {
    fn started(&mut self, _index: usize, id_slot: u32) {
        self.progress.start(id_slot);
    }

    /// On a `response.in_progress` event (the stream's opening pair's
    /// second, the first time), as llama-server sends it.
    fn progress(&mut self, _index: usize, progress: &Progress) -> Vec<Value> {
        let mut events = self.open();
        if events.is_empty() {
            events.push(event("response.in_progress", json!({ "response": self.summary("in_progress") })));
        }
        if let Some(last) = events.last_mut().and_then(Value::as_object_mut) {
            attach_progress(last, progress, self.timings_per_token);
        }
        events
    }

    fn token(&mut self, _index: usize, token: &TokenEvent) -> Vec<Value> {
        self.progress.token(&token.text);
        let mut events = self.open();
        let parts = self.splitter.push(&token.text);
        self.delta(&parts, &mut events);
        if self.timings_per_token
            && let Some(last) = events.last_mut().and_then(Value::as_object_mut)
        {
            last.insert("timings".into(), timings_json(&self.progress.timings(self.prompt_len)));
        }
        events
    }

    fn done(&mut self, _index: usize, completion: &Completion) -> Vec<Value> {
        let mut events = self.open();
        // The held-back tail (a partial stop word that never completed),
        // and what the splitter held.
        let mut parts = self.splitter.push(&completion.text);
        parts.append(self.splitter.finish());
        self.delta(&parts, &mut events);
        let whole = Parts {
            reasoning: self.reasoning.clone().unwrap_or_default(),
            content: self.text.clone().unwrap_or_default(),
        };
        let output = output(&self.ids, &whole, None);
        if let Some(item) = output.first().filter(|_| !whole.reasoning.is_empty()) {
            events.push(event("response.output_item.done", json!({ "item": item })));
        }
        if !whole.content.is_empty() {
            let part = text_part(&whole.content);
            let item_id = &self.ids.message;
            events.push(event("response.output_text.done", json!({ "item_id": item_id, "text": whole.content })));
            events.push(event("response.content_part.done", json!({ "item_id": item_id, "part": part })));
            events.push(event(
                "response.output_item.done",
                json!({ "item": message(&self.ids, "completed", vec![part]) }),
            ));
        }
        let response = json!({
            "id": self.ids.response,
            "object": "response",
            "created_at": unix_now(),
            "status": "completed",
            "model": self.model,
            "output": output,
            "usage": usage(completion),
        });
        events.push(event(
            "response.completed",
            json!({ "response": response, "timings": timings_json(&completion.timings) }),
        ));
        events
    }

    fn event_name(&self, payload: &Value) -> Option<String> {
        sse::type_name(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::reasoning::Reasoning;
    use crate::http::error::ErrorType;

    fn chat(request: Value) -> Result<Map<String, Value>, ApiError> {
        to_chat(request.as_object().expect("an object"))
    }

    #[test]
    fn input_becomes_messages() {
        let converted = chat(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "d"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "u"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
                {"role": "assistant", "content": "b"},
            ],
            "max_output_tokens": 5,
            "temperature": 0,
        }))
        .expect("valid");
        let text = |text: &str| json!([{"type": "text", "text": text}]);
        assert_eq!(
            converted["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": text("d")},
                {"role": "user", "content": text("u")},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ])
        );
        assert_eq!((converted["max_tokens"].clone(), converted["temperature"].clone()), (json!(5), json!(0)));
        assert!(!converted.contains_key("input") && !converted.contains_key("max_output_tokens"));
        let plain = chat(json!({"input": "hi"})).expect("valid");
        assert_eq!(plain["messages"], json!([{"role": "user", "content": "hi"}]));
    }

    #[test]
    fn errors_name_the_field() {
        let refused = |request: Value| chat(request).expect_err("refused");
        assert!(refused(json!({})).message.contains("`input`"));
        assert!(refused(json!({"input": 3})).message.contains("`input`"));
        assert!(refused(json!({"input": []})).message.contains("`input`"));
        assert!(refused(json!({"input": ["x"]})).message.contains("`input[0]`"));
        assert!(refused(json!({"input": [{"role": "robot", "content": "x"}]})).message.contains("input[0].role"));
        let bad_part = refused(json!({"input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}));
        assert!(bad_part.message.contains("input[0].content[0].type"), "{}", bad_part.message);
        let image =
            refused(json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}));
        assert_eq!(image.kind, ErrorType::NotSupported);
        let call =
            refused(json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}));
        assert_eq!(call.kind, ErrorType::NotSupported);
        for (field, value) in [
            ("previous_response_id", json!("resp_1")),
            ("tools", json!([{"type": "function", "name": "f"}])),
            ("text", json!({"format": {"type": "json_schema"}})),
        ] {
            let error = refused(json!({"input": "x", field: value}));
            assert_eq!(error.kind, ErrorType::NotSupported, "{field}");
            assert!(error.message.contains(field), "{}", error.message);
        }
        assert!(refused(json!({"input": "x", "max_output_tokens": -2})).message.contains("`max_output_tokens`"));
        assert!(refused(json!({"input": "x", "reasoning": "low"})).message.contains("`reasoning`"));
        assert!(refused(json!({"input": "x", "reasoning": {"effort": 3}})).message.contains("`reasoning.effort`"));
        let effort = chat(json!({"input": "x", "reasoning": {"effort": "low", "summary": "auto"}})).expect("valid");
        assert_eq!((effort.get("reasoning_effort"), effort.get("reasoning")), (Some(&json!("low")), None));
        assert!(chat(json!({"input": "x", "previous_response_id": ""})).is_ok());
    }

    #[test]
    fn streams_give_the_reasoning_item_before_the_message() {
        use sse::Render;
        let split = Reasoning::new(Fields(&Map::new()), crate::config::ReasoningFormat::Auto, true, false);
        let mut render = ResponsesStream {
            ids: Ids::new(),
            model: "m".into(),
            opened: false,
            splitter: split.expect("valid").splitter(),
            reasoning: None,
            text: None,
            timings_per_token: false,
            progress: StreamProgress::default(),
            prompt_len: 3,
        };
        let mut events = Vec::new();
        for text in ["<think>a", "b</think>\n", "Hi"] {
            events.extend(render.token(0, &TokenEvent { token: 1, text: text.into(), probs: None }));
        }
        let completion = Completion {
            stop_type: sluice_engine::request::StopType::Eos,
            stopping_word: String::new(),
            text: String::new(),
            truncated: false,
            tokens_predicted: 3,
            tokens_evaluated: 3,
            tokens_cached: 0,
            id_slot: 0,
            timings: Default::default(),
        };
        events.extend(render.done(0, &completion));
        let names: Vec<&str> = events.iter().filter_map(|event| event["type"].as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_item.done",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(
            (&events[2]["item"]["type"], &events[2]["item"]["status"]),
            (&json!("reasoning"), &json!("in_progress"))
        );
        assert_eq!((&events[3]["delta"], &events[4]["delta"]), (&json!("a"), &json!("b")));
        let reasoning = json!({"id": render.ids.reasoning, "summary": [], "type": "reasoning", "encrypted_content": "",
                               "content": [{"type": "reasoning_text", "text": "ab"}]});
        assert_eq!(events[8]["item"], reasoning);
        let output = &events[12]["response"]["output"];
        assert_eq!((&output[0], &output[1]["content"][0]["text"]), (&reasoning, &json!("Hi")));
    }
}
