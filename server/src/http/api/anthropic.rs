//! Anthropic's Messages API as llama-server serves it: `/v1/messages` and
//! `/v1/messages/count_tokens`. A request is turned into the OpenAI chat
//! body llama-server would build from it (only the fields it carries over),
//! then runs through the chat template and the shared generation pipeline,
//! so a conversation gets the same tokens here as on `/v1/chat/completions`.
//!
//! Where llama-server is silently permissive (unknown block types dropped,
//! messages of the wrong shape passed on), sluice answers 400 naming the
//! field, or 501 for what it cannot do yet (images, tools, thinking
//! blocks in the input). A reply's reasoning (see [`crate::chat::reasoning`])
//! comes back as a `thinking` block before the text, as llama-server
//! returns it.

use std::sync::Arc;

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
use crate::http::generate::{Keep, blocking, collect, engine_gone, submit};
use crate::http::sse;
use crate::http::state::AppState;
use sluice_engine::request::{Completion, StopType, TokenEvent};

/// The limit when `max_tokens` is absent: Anthropic requires the field,
/// llama-server fills this in instead.
const DEFAULT_MAX_TOKENS: i64 = 4096;

/// Sampling fields llama-server passes on unchanged; every other field of
/// the request (native ones included) is ignored, as there.
const PASSED_ON: [&str; 4] = ["temperature", "top_p", "top_k", "stream"];

/// `POST /v1/messages`.
pub async fn messages(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let parsing = Arc::clone(&ready);
    let defaults = state.config().defaults.clone();
    let (plan, reasoning) = blocking(move || {
        let chat = to_chat(Fields(object(&body)?), true)?;
        ChatParse::plan(&parsing, &defaults, Fields(&chat))
    })
    .await?;
    // llama-server gives Anthropic messages its chat completion ids.
    let id = format!("chatcmpl-{}", random_id());
    let model = ready.model.name.clone();
    let jobs = submit(&ready.engine, &plan)?;
    if plan.generation.stream {
        let render = MessageStream::new(id, model, plan.prompt(0).len(), reasoning.splitter());
        return sse::respond(jobs, render, state.ping(), state.hold_notice()).await;
    }
    let outcome = collect(jobs, &Keep::new(&ready, &[])).await?.into_iter().next().ok_or_else(engine_gone)?;
    let Parts { reasoning, content: text } = reasoning.split(&outcome.content());
    // Empty blocks are left out, as in llama-server. A local model signs
    // nothing, so the signature Anthropic's clients expect is empty.
    let mut content = Vec::new();
    if !reasoning.is_empty() {
        content.push(json!({ "type": "thinking", "thinking": reasoning, "signature": "" }));
    }
    if !text.is_empty() {
        content.push(json!({ "type": "text", "text": text }));
    }
    let completion = &outcome.completion;
    let message = json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason(completion.stop_type),
        "stop_sequence": stop_sequence(completion),
        "usage": usage(completion, completion.tokens_predicted),
    });
    Ok(axum::Json(message).into_response())
}

/// `POST /v1/messages/count_tokens`: the templated prompt's length.
pub async fn count_tokens(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let thinking = state.config().defaults.reasoning;
    let input_tokens = blocking(move || {
        let chat = to_chat(Fields(object(&body)?), false)?;
        Ok(chat_tokens(&ready.template, ready.counter(), Fields(&chat), thinking)?.prompt.tokens.len())
    })
    .await?;
    Ok(axum::Json(json!({ "input_tokens": input_tokens })).into_response())
}

/// The OpenAI chat body of an Anthropic request. `generating` is false for
/// `count_tokens`, which reads only what shapes the prompt.
fn to_chat(request: Fields<'_>, generating: bool) -> Result<Map<String, Value>, ApiError> {
    let mut messages = Vec::new();
    if let Some(system) = request.get("system") {
        messages.push(json!({ "role": "system", "content": system_text(system)? }));
    }
    let list = request.get("messages").ok_or_else(|| ApiError::invalid("'messages' is required"))?;
    let list = list.as_array().ok_or_else(|| wrong("messages", "an array of messages"))?;
    for (index, message) in list.iter().enumerate() {
        messages.extend(to_chat_message(index, message)?);
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    // Tool definitions would be rendered into the prompt, so they matter to
    // the count as much as to generation.
    match request.get("tools") {
        None => {}
        Some(Value::Array(tools)) if tools.is_empty() => {}
        Some(Value::Array(_)) => return Err(ApiError::unsupported("`tools`")),
        Some(_) => return Err(wrong("tools", "an array of tools").into()),
    }
    if let Some(kwargs) = request.get("chat_template_kwargs") {
        chat.insert("chat_template_kwargs".into(), kwargs.clone());
    }
    if !generating {
        return Ok(chat);
    }
    // Without tools, "auto" and "none" ask for nothing; forcing a tool call
    // cannot be honoured.
    if let Some(choice) = request.get("tool_choice") {
        let kind = choice.get("type").and_then(Value::as_str).ok_or_else(|| wrong("tool_choice.type", "a string"))?;
        if !matches!(kind, "auto" | "none") {
            return Err(ApiError::unsupported(&format!("`tool_choice` of type {kind:?}")));
        }
    }
    // Whether the model thinks is the template's and the model's doing;
    // what it thinks comes back as a thinking block. sluice has no
    // reasoning budget, so `budget_tokens` does not cut thinking short
    // (llama-server's does).
    if let Some(thinking) = request.get("thinking") {
        let kind = thinking.get("type").and_then(Value::as_str).ok_or_else(|| wrong("thinking.type", "a string"))?;
        if !matches!(kind, "enabled" | "adaptive" | "disabled") {
            return Err(wrong("thinking.type", "\"enabled\", \"adaptive\" or \"disabled\"").into());
        }
    }
    // The chat fields would accept -1 (no limit); Anthropic's limit is a
    // count.
    let max_tokens = match request.int("max_tokens")? {
        None => DEFAULT_MAX_TOKENS,
        Some(limit) if limit < 0 => {
            return Err(ApiError::invalid(format!("`max_tokens` must be 0 or more, not {limit}")));
        }
        Some(limit) => limit,
    };
    chat.insert("max_tokens".into(), json!(max_tokens));
    if let Some(stops) = request.get("stop_sequences") {
        if !stops.as_array().is_some_and(|stops| stops.iter().all(Value::is_string)) {
            return Err(wrong("stop_sequences", "an array of strings").into());
        }
        chat.insert("stop".into(), stops.clone());
    }
    for key in PASSED_ON {
        if let Some(value) = request.get(key) {
            chat.insert(key.into(), value.clone());
        }
    }
    Ok(chat)
}

/// `system`: a string, or text blocks joined with nothing between them (as
/// llama-server joins them).
fn system_text(system: &Value) -> Result<String, ApiError> {
    match system {
        Value::String(text) => Ok(steady_billing_header(text)),
        Value::Array(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(index, block)| text_of(&format!("system[{index}]"), block).map(steady_billing_header))
            .collect(),
        _ => Err(wrong("system", "a string or an array of text blocks").into()),
    }
}

/// One message as a chat message; `None` for one that adds nothing to the
/// prompt (an assistant turn without content, or no blocks), which
/// llama-server drops.
fn to_chat_message(index: usize, message: &Value) -> Result<Option<Value>, ApiError> {
    let at = format!("messages[{index}]");
    let object = message.as_object().ok_or_else(|| wrong(&at, "an object"))?;
    let role = match object.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant")) => role,
        Some(role) => {
            return Err(ApiError::invalid(format!("`{at}.role` must be \"user\" or \"assistant\", not {role:?}")));
        }
        None => return Err(ApiError::invalid(format!("`{at}.role` must be \"user\" or \"assistant\""))),
    };
    match object.get("content") {
        None | Some(Value::Null) if role == "assistant" => Ok(None),
        None | Some(Value::Null) => Err(ApiError::invalid(format!("`{at}.content` is required"))),
        Some(Value::String(text)) => Ok(Some(json!({ "role": role, "content": text }))),
        Some(Value::Array(blocks)) => {
            let parts = blocks
                .iter()
                .enumerate()
                .map(|(block, value)| {
                    text_of(&format!("{at}.content[{block}]"), value)
                        .map(|text| json!({ "type": "text", "text": text }))
                })
                .collect::<Result<Vec<_>, _>>()?;
            // The chat pipeline joins the parts as it does OpenAI's.
            Ok((!parts.is_empty()).then(|| json!({ "role": role, "content": parts })))
        }
        Some(_) => Err(wrong(&format!("{at}.content"), "a string or an array of content blocks").into()),
    }
}

/// The text of a `text` block; any other block type is refused by name.
fn text_of<'a>(at: &str, block: &'a Value) -> Result<&'a str, ApiError> {
    let object = block.as_object().ok_or_else(|| wrong(at, "a content block object"))?;
    let kind = object.get("type").and_then(Value::as_str).ok_or_else(|| wrong(&format!("{at}.type"), "a string"))?;
    match kind {
        "text" => {}
        // Blocks the Messages API defines that sluice cannot read yet.
        "image"
        | "document"
        | "tool_use"
        | "tool_result"
        | "thinking"
        | "redacted_thinking"
        | "search_result"
        | "server_tool_use"
        | "web_search_tool_result"
        | "container_upload" => {
            return Err(ApiError::unsupported(&format!("`{at}` of type {kind:?}")));
        }
        _ => return Err(ApiError::invalid(format!("`{at}.type` must be a content block type, not {kind:?}"))),
    }
    object
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| wrong(&format!("{at}.text"), "a string"))
        .map_err(ApiError::from)
}

/// Claude Code opens its system prompt with `x-anthropic-billing-header:
/// …; cch=XXXXX;…`, whose five-character stamp changes on every request and
/// so defeats prefix caching. As llama-server does, the stamp is replaced by
/// `fffff`; any other text is left as it is.
fn steady_billing_header(text: &str) -> String {
    const PREFIX: &str = "x-anthropic-billing-header:";
    const STAMP: usize = 5;
    let mut text = text.to_owned();
    if !text.starts_with(PREFIX) {
        return text;
    }
    let Some(at) = text[PREFIX.len()..].find("cch=").map(|at| PREFIX.len() + at + "cch=".len()) else {
        return text;
    };
    let stamp = text.as_bytes().get(at..at + STAMP);
    let closed = text.as_bytes().get(at + STAMP) == Some(&b';');
    if closed && stamp.is_some_and(|stamp| stamp.is_ascii()) {
        text.replace_range(at..at + STAMP, &"f".repeat(STAMP));
    }
    text
}

/// A stop word or the end of generation is a natural end of the turn; the
/// word itself goes in `stop_sequence` (llama-server never answers
/// "stop_sequence" here).
fn stop_reason(stop: StopType) -> &'static str {
    match stop {
        StopType::Eos | StopType::Word => "end_turn",
        StopType::Limit | StopType::None => "max_tokens",
    }
}

fn stop_sequence(completion: &Completion) -> Value {
    if completion.stopping_word.is_empty() { Value::Null } else { Value::String(completion.stopping_word.clone()) }
}

/// `input_tokens` counts only the prompt tokens not read from the cache.
fn usage(completion: &Completion, output_tokens: usize) -> Value {
    json!({
        "cache_read_input_tokens": completion.tokens_cached,
        "input_tokens": completion.tokens_evaluated.saturating_sub(completion.tokens_cached),
        "output_tokens": output_tokens,
    })
}

/// A message stream: `message_start`; a thinking block at index 0
/// (`content_block_start`, `thinking_delta`s) when the reply reasons; a
/// text block after it (`content_block_start`, `text_delta`s) when there is
/// text; at the end the thinking block's empty `signature_delta`, each
/// block's `content_block_stop`, `message_delta`, `message_stop`. As in
/// llama-server, blocks are closed only at the end. Each payload's `type`
/// is its event name.
struct MessageStream {
    id: String,
    model: String,
    prompt_len: usize,
    splitter: Splitter,
    started: bool,
    thinking: bool,
    text_open: bool,
}

impl MessageStream {
    fn new(id: String, model: String, prompt_len: usize, splitter: Splitter) -> Self {
        MessageStream { id, model, prompt_len, splitter, started: false, thinking: false, text_open: false }
    }

    /// The text block follows the thinking block, if any.
    fn text_index(&self) -> usize {
        usize::from(self.thinking)
    }

    /// `message_start`, once. Its usage is what is known when it is sent.
    fn start(&mut self, usage: Value, events: &mut Vec<Value>) {
        if self.started {
            return;
        }
        self.started = true;
        events.push(json!({
            "type": "message_start",
            "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": self.model,
                "stop_reason": null,
                "stop_sequence": null,
                "usage": usage,
            },
        }));
    }

    fn parts(&mut self, parts: &Parts, events: &mut Vec<Value>) {
        if !parts.reasoning.is_empty() {
            if !self.thinking {
                self.thinking = true;
                events.push(json!({
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": { "type": "thinking", "thinking": "" },
                }));
            }
            events.push(json!({
                "type": "content_block_delta",
                "index": 0,
                "delta": { "type": "thinking_delta", "thinking": parts.reasoning },
            }));
        }
        if parts.content.is_empty() {
            return;
        }
        if !self.text_open {
            self.text_open = true;
            events.push(json!({
                "type": "content_block_start",
                "index": self.text_index(),
                "content_block": { "type": "text", "text": "" },
            }));
        }
        events.push(json!({
            "type": "content_block_delta",
            "index": self.text_index(),
            "delta": { "type": "text_delta", "text": parts.content },
        }));
    }
}

impl sse::Render for MessageStream {
    fn started(&mut self, _index: usize, _id_slot: u32) {}

    fn token(&mut self, _index: usize, token: &TokenEvent) -> Vec<Value> {
        let mut events = Vec::new();
        // The engine reports cache reuse only at the end, so the first
        // token counts the whole prompt as input.
        let usage = json!({ "cache_read_input_tokens": 0, "input_tokens": self.prompt_len, "output_tokens": 0 });
        self.start(usage, &mut events);
        let parts = self.splitter.push(&token.text);
        self.parts(&parts, &mut events);
        events
    }

    fn done(&mut self, _index: usize, completion: &Completion) -> Vec<Value> {
        let mut events = Vec::new();
        self.start(usage(completion, 0), &mut events);
        let mut parts = self.splitter.push(&completion.text);
        parts.append(self.splitter.finish());
        self.parts(&parts, &mut events);
        if self.thinking {
            events.push(json!({
                "type": "content_block_delta",
                "index": 0,
                "delta": { "type": "signature_delta", "signature": "" },
            }));
            events.push(json!({ "type": "content_block_stop", "index": 0 }));
        }
        if self.text_open {
            events.push(json!({ "type": "content_block_stop", "index": self.text_index() }));
        }
        events.push(json!({
            "type": "message_delta",
            "delta": { "stop_reason": stop_reason(completion.stop_type), "stop_sequence": stop_sequence(completion) },
            "usage": { "output_tokens": completion.tokens_predicted },
        }));
        events.push(json!({ "type": "message_stop" }));
        events
    }

    fn event_name(&self, payload: &Value) -> Option<String> {
        sse::type_name(payload)
    }

    /// llama-server sends the bare error object as an `error` event.
    fn failure(&self, error: &ApiError) -> (Option<String>, Value) {
        (Some("error".to_owned()), error.body()["error"].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::reasoning::Reasoning;
    use crate::config::ReasoningFormat;
    use crate::http::error::ErrorType;

    fn chat(request: Value) -> Result<Value, ApiError> {
        let object = request.as_object().cloned().unwrap_or_default();
        to_chat(Fields(&object), true).map(Value::Object)
    }

    #[test]
    fn requests_become_llama_server_chat_bodies() {
        let converted = chat(json!({
            "model": "ignored", "max_tokens": 8, "metadata": {"user_id": "u"}, "n_predict": 99, "seed": 5,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant"},
                {"role": "assistant", "content": []},
                {"role": "user", "content": "c"},
            ],
            "stop_sequences": ["\n"], "temperature": 0, "top_k": 1, "stream": true,
        }))
        .expect("valid");
        assert_eq!(
            converted,
            json!({
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"role": "user", "content": "c"},
                ],
                "max_tokens": 8, "stop": ["\n"], "temperature": 0, "top_k": 1, "stream": true,
            })
        );
        let defaulted = chat(json!({"messages": [{"role": "user", "content": "x"}]})).expect("valid");
        assert_eq!(defaulted["max_tokens"], DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn refusals_name_the_field() {
        let refused = |request: Value| chat(request).expect_err("refused");
        let user = json!([{"role": "user", "content": "x"}]);
        let error = refused(json!({"messages": [{"role": "system", "content": "x"}]}));
        assert!(error.message.contains("messages[0].role"), "{}", error.message);
        let error = refused(json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}));
        assert_eq!(error.kind, ErrorType::NotSupported);
        assert!(error.message.contains("messages[0].content[0]") && error.message.contains("image"));
        let error = refused(json!({"messages": [{"role": "user", "content": [{"type": "imgae", "source": {}}]}]}));
        assert_eq!(error.kind, ErrorType::InvalidRequest, "a type no API has is a mistake: {}", error.message);
        assert!(error.message.contains("messages[0].content[0].type"), "{}", error.message);
        let error = refused(json!({"messages": user, "max_tokens": -1}));
        assert!(error.message.contains("max_tokens"), "{}", error.message);
        let error = refused(json!({"messages": user, "thinking": {"type": "sometimes"}}));
        assert!(error.message.contains("thinking.type"), "{}", error.message);
        for kind in ["enabled", "adaptive", "disabled"] {
            assert!(chat(json!({"messages": user, "thinking": {"type": kind, "budget_tokens": 10}})).is_ok(), "{kind}");
        }
        let error = refused(json!({"messages": user, "tool_choice": {"type": "any"}}));
        assert!(error.message.contains("tool_choice"), "{}", error.message);
        assert!(chat(json!({"messages": user, "tool_choice": {"type": "auto"}, "tools": []})).is_ok());
    }

    fn stream() -> MessageStream {
        let plain = Reasoning::new(Fields(&Map::new()), ReasoningFormat::Deepseek, true, false).expect("valid");
        MessageStream::new("chatcmpl-x".into(), "m".into(), 9, plain.splitter())
    }

    fn names(events: &[Value]) -> Vec<&str> {
        events.iter().filter_map(|event| event["type"].as_str()).collect()
    }

    fn completion(stop_type: StopType, stopping_word: &str, text: &str) -> Completion {
        Completion {
            stop_type,
            stopping_word: stopping_word.into(),
            text: text.into(),
            truncated: false,
            tokens_predicted: 2,
            tokens_evaluated: 9,
            tokens_cached: 4,
            id_slot: 0,
            timings: Default::default(),
        }
    }

    #[test]
    fn streams_open_the_text_block_at_the_first_text() {
        use sse::Render;
        let mut render = stream();
        let held = render.token(0, &TokenEvent { token: 1, text: String::new(), probs: None });
        assert_eq!(names(&held), ["message_start"]);
        assert_eq!(held[0]["message"]["usage"]["input_tokens"], 9);
        let text = render.token(0, &TokenEvent { token: 2, text: "Hi".into(), probs: None });
        assert_eq!(names(&text), ["content_block_start", "content_block_delta"]);
        let end = render.done(0, &completion(StopType::Word, "END", "!"));
        assert_eq!(names(&end), ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]);
        assert_eq!(end[0]["delta"], json!({"type": "text_delta", "text": "!"}));
        assert_eq!(end[2]["delta"], json!({"stop_reason": "end_turn", "stop_sequence": "END"}));
        assert_eq!(end[2]["usage"], json!({"output_tokens": 2}));

        // The end of generation first: the opening usage is the final one.
        let mut render = stream();
        let end = render.done(0, &completion(StopType::Eos, "", ""));
        assert_eq!(names(&end), ["message_start", "message_delta", "message_stop"]);
        assert_eq!(
            end[0]["message"]["usage"],
            json!({"cache_read_input_tokens": 4, "input_tokens": 5, "output_tokens": 0})
        );
        let (name, payload) = render.failure(&ApiError::invalid("bad"));
        assert_eq!(name.as_deref(), Some("error"));
        assert_eq!(payload, json!({"code": 400, "message": "bad", "type": "invalid_request_error"}));
    }

    #[test]
    fn reasoning_streams_as_a_thinking_block_before_the_text() {
        use sse::Render;
        let mut render = stream();
        let token = |text: &str| TokenEvent { token: 1, text: text.into(), probs: None };
        let opening = render.token(0, &token("<think>Hm"));
        assert_eq!(names(&opening), ["message_start", "content_block_start", "content_block_delta"]);
        assert_eq!(opening[1]["content_block"], json!({"type": "thinking", "thinking": ""}));
        assert_eq!(opening[2]["delta"], json!({"type": "thinking_delta", "thinking": "Hm"}));
        let answer = render.token(0, &token("m.</think>\n\nYes"));
        assert_eq!(names(&answer), ["content_block_delta", "content_block_start", "content_block_delta"]);
        assert_eq!((&answer[0]["index"], &answer[1]["index"], &answer[2]["index"]), (&json!(0), &json!(1), &json!(1)));
        assert_eq!(answer[2]["delta"], json!({"type": "text_delta", "text": "Yes"}));
        let end = render.done(0, &completion(StopType::Eos, "", ""));
        assert_eq!(
            names(&end),
            ["content_block_delta", "content_block_stop", "content_block_stop", "message_delta", "message_stop"]
        );
        assert_eq!(
            end[0],
            json!({"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "signature_delta", "signature": ""}})
        );
        assert_eq!((&end[1]["index"], &end[2]["index"]), (&json!(0), &json!(1)));
    }

    #[test]
    fn the_billing_stamp_is_steadied() {
        let header = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude Code.";
        assert_eq!(
            steady_billing_header(header),
            "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are Claude Code."
        );
        for unchanged in [
            "You are helpful. cch=a5145;",
            "x-anthropic-billing-header: cch=a51;",
            "x-anthropic-billing-header: cch=ééé;",
        ] {
            assert_eq!(steady_billing_header(unchanged), unchanged);
        }
    }
}
