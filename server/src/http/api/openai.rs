//! OpenAI-compatible endpoints: `/v1/completions` and
//! `/v1/chat/completions` (alias `/chat/completions`). Requests take every
//! native field too; responses follow llama-server's OpenAI shapes (its
//! `logprobs` shape, `usage` with `prompt_tokens_details.cached_tokens`,
//! `timings`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use super::chat::ChatParse;
use super::completion;
use crate::chat::fields::{Fields, object};
use crate::chat::ids::random_id;
use crate::chat::reasoning::{Parts, Reasoning, Splitter};
use crate::chat::tools::{self, ChatTools, ToolFormat, ToolStream};
use crate::chat::{prompt, structured};
use crate::http::error::ApiError;
use crate::http::extract::JsonBody;
use crate::http::generate::{
    Keep, Outcome, Plan, StreamProgress, attach_progress, blocking, collect, finish_reason, submit, timings_json,
    usage_json,
};
use crate::http::params;
use crate::http::probs::probs_json;
use crate::http::spliced::{List, Spliced};
use crate::http::sse;
use crate::http::state::{AppState, Ready};
use sluice_engine::request::{Completion, Progress, TokenEvent, TokenProbs};

/// llama-server's default `top_logprobs` when chat asks for `logprobs`.
const DEFAULT_TOP_LOGPROBS: i64 = 20;

/// What every OpenAI object of one response shares.
struct Envelope {
    id: String,
    created: u64,
    model: String,
}

impl Envelope {
    /// `model` echoes the request's, as llama-server does.
    fn new(ready: &Ready, fields: Fields<'_>) -> Self {
        let model = fields.get("model").and_then(Value::as_str).map_or_else(|| ready.model.name.clone(), str::to_owned);
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
        Envelope { id: format!("chatcmpl-{}", random_id()), created, model }
    }

    fn object(&self, kind: &str, choices: Vec<Value>) -> Value {
        json!({
            "choices": choices,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "object": kind,
            "id": self.id,
        })
    }
}

/// llama-server's fingerprint is its build (`b<number>-<commit>`); sluice
/// reports its version in the same place.
fn system_fingerprint() -> String {
    format!("b{}-sluice", env!("CARGO_PKG_VERSION"))
}

fn insert(value: &mut Value, key: &str, item: Value) {
    if let Some(object) = value.as_object_mut() {
        object.insert(key.to_owned(), item);
    }
}

/// `logprobs` of a choice: llama-server's `{"content": [per-token objects]}`.
fn logprobs_json(ready: &Ready, probs: &[&TokenProbs], top_n: usize) -> Value {
    json!({ "content": probs.iter().map(|probs| probs_json(&ready.tokenizer, probs, top_n)).collect::<Vec<_>>() })
}

/// A request parsed into a plan, its envelope, and how many alternatives
/// each probability entry lists.
struct Parsed {
    plan: Plan,
    envelope: Envelope,
    top_n: usize,
    /// How the reply's tool calls are written, when it may make some.
    tool_format: Option<ToolFormat>,
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let parsing = Arc::clone(&ready);
    let defaults = state.config().defaults.clone();
    let parsed = blocking(move || {
        let fields = Fields(object(&body)?);
        let generation = params::generation(fields, &parsing.limits(&defaults))?;
        let value = fields.get("prompt").ok_or_else(|| ApiError::invalid("\"prompt\" must be provided"))?;
        let prompts = prompt::prompts(value, parsing.reader())?;
        let top_n = generation.request.n_probs;
        let envelope = Envelope::new(&parsing, fields);
        Ok(Parsed { plan: Plan { generation, prompts }, envelope, top_n, tool_format: None })
    })
    .await?;
    run(state, ready, parsed, Kind::Text).await
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let parsing = Arc::clone(&ready);
    let defaults = state.config().defaults.clone();
    let (parsed, reasoning) = blocking(move || {
        let fields = Fields(object(&body)?);
        let limits = parsing.limits(&defaults);
        let mut chat = ChatParse::new(&parsing, &defaults, fields)?;
        let generation = &mut chat.generation;
        let top_n = match (fields.bool("logprobs")?, fields.int("top_logprobs")?) {
            (Some(true), top) => {
                let top = params::probabilities("top_logprobs", top.unwrap_or(DEFAULT_TOP_LOGPROBS), &limits)?;
                // The engine reports probabilities only when asked for at
                // least one; the chosen token's logprob is wanted even with
                // no alternatives.
                generation.request.n_probs = top.max(1);
                top
            }
            (_, Some(_)) => return Err(ApiError::invalid("`top_logprobs` requires `logprobs` to be set to true")),
            _ => generation.request.n_probs,
        };
        let prompt = chat.prompt()?;
        let generation = &mut chat.generation;
        if let Some(source) = prompt.tools.as_ref().and_then(ChatTools::grammar) {
            if generation.request.grammar.is_some() {
                return Err(ApiError::invalid(
                    "`tools` cannot be combined with `response_format`, `json_schema` or `grammar`",
                ));
            }
            generation.request.grammar = Some(structured::compile("tools", &source, &parsing.grammars)?);
        }
        if prompt.opens_thinking && generation.request.grammar.is_some() {
            // The grammar would hold the reasoning to the format, and the
            // reply would land in `reasoning_content`.
            return Err(ApiError::invalid(
                "the chat template opens a thinking block, which a grammar, schema or tool call cannot follow; \
                 turn thinking off (`reasoning_effort: \"none\"` or `chat_template_kwargs: {\"enable_thinking\": false}`)",
            ));
        }
        let tool_format = prompt.tools.as_ref().map(|tools| tools.format);
        let (plan, reasoning) = chat.finish(prompt)?;
        Ok((Parsed { plan, envelope: Envelope::new(&parsing, fields), top_n, tool_format }, reasoning))
    })
    .await?;
    run(state, ready, parsed, Kind::Chat(reasoning)).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `text_completion` objects.
    Text,
    /// `chat.completion` objects, the reasoning split as the request asks.
    Chat(Reasoning),
}

async fn run(state: AppState, ready: Arc<Ready>, parsed: Parsed, kind: Kind) -> Result<Response, ApiError> {
    let Parsed { plan, envelope, top_n, tool_format } = parsed;
    let n_probs = plan.generation.request.n_probs;
    // `__verbose` lists the native answer's probabilities, with `n_probs`
    // alternatives.
    let listings: &[usize] = match (plan.generation.stream, n_probs, plan.generation.verbose) {
        (true, _, _) | (false, 0, _) => &[],
        (false, _, false) => &[top_n],
        (false, _, true) => &[top_n, n_probs],
    };
    let keep = Keep::new(&ready, listings);
    keep.check(&plan)?;
    let jobs = submit(&ready.engine, &plan)?;
    if plan.generation.stream {
        let outputs = plan.outputs();
        let splitters = match kind {
            Kind::Chat(reasoning) => vec![reasoning.splitter(); outputs],
            Kind::Text => Vec::new(),
        };
        let render = OpenAiStream {
            ready: Arc::clone(&ready),
            envelope,
            kind,
            top_n,
            include_usage: plan.generation.include_usage,
            role_sent: vec![false; outputs],
            splitters,
            tool_streams: tool_format.map(|format| (0..outputs).map(|_| ToolStream::new(format)).collect()),
            completions: Vec::with_capacity(outputs),
            progress: vec![StreamProgress::default(); outputs],
            plan: Arc::new(plan),
        };
        return sse::respond(jobs, render, state.ping(), state.hold_notice()).await;
    }
    let outcomes = collect(jobs, &keep).await?;
    let object_kind = match kind {
        Kind::Text => "text_completion",
        Kind::Chat(_) => "chat.completion",
    };
    let mut tree = envelope.object(object_kind, vec![Value::Null; outcomes.len()]);
    insert(&mut tree, "usage", usage_json(outcomes.iter().map(|outcome| &outcome.completion)));
    if let Some(first) = outcomes.first() {
        insert(&mut tree, "timings", timings_json(&first.completion.timings));
    }
    let mut answer = Spliced::new(tree);
    for (index, outcome) in outcomes.iter().enumerate() {
        answer.absorb(&["choices", &index.to_string()], choice(outcome, kind, keep.probs(outcome, top_n), tool_format));
    }
    if let Some(first) = outcomes.first().filter(|_| plan.generation.verbose) {
        answer.absorb(&["__verbose"], completion::final_answer(&ready, &plan, &keep, first));
    }
    Ok(answer.into_response())
}

/// A choice of an answer that was not streamed, with `probs` (none when
/// empty) as its `logprobs`.
fn choice<'a>(outcome: &Outcome, kind: Kind, probs: List<'a>, tool_format: Option<ToolFormat>) -> Spliced<'a> {
    let mut reason = finish_reason(outcome.completion.stop_type);
    let logprobs = if probs.is_empty() { Value::Null } else { json!({ "content": null }) };
    let mut choice = match kind {
        Kind::Text => Spliced::new(
            json!({ "text": outcome.content(), "index": outcome.index, "logprobs": logprobs, "finish_reason": reason }),
        ),
        Kind::Chat(split) => {
            let Parts { reasoning, content } = split.split(&outcome.content());
            let (content, calls) = match tool_format {
                Some(format) => tools::reply(format, &content),
                None => (Value::String(content), None),
            };
            let mut message = json!({ "role": "assistant", "content": content });
            if let Some(calls) = calls {
                insert(&mut message, "tool_calls", calls);
                reason = tools::finish_reason(reason);
            }
            // As llama-server, only a reply that reasoned has the field.
            if !reasoning.is_empty() {
                insert(&mut message, "reasoning_content", Value::String(reasoning));
            }
            let mut choice = json!({ "finish_reason": reason, "index": outcome.index, "message": message });
            if !probs.is_empty() {
                insert(&mut choice, "logprobs", logprobs);
            }
            Spliced::new(choice)
        }
    };
    if !probs.is_empty() {
        choice.list(&["logprobs", "content"], probs);
    }
    choice
}

/// OpenAI streams: `text_completion` or `chat.completion.chunk` chunks,
/// then `[DONE]`.
struct OpenAiStream {
    ready: Arc<Ready>,
    envelope: Envelope,
    kind: Kind,
    top_n: usize,
    include_usage: bool,
    role_sent: Vec<bool>,
    /// Each chat choice's reasoning splitter (none for text completions).
    splitters: Vec<Splitter>,
    /// Each chat choice's tool-call parser, when the reply may call tools.
    tool_streams: Option<Vec<ToolStream>>,
    completions: Vec<Completion>,
    /// For `timings_per_token`.
    progress: Vec<StreamProgress>,
    plan: Arc<Plan>,
}

impl OpenAiStream {
    fn chunk(&self, choices: Vec<Value>) -> Value {
        let kind = match self.kind {
            Kind::Text => "text_completion",
            Kind::Chat(_) => "chat.completion.chunk",
        };
        self.envelope.object(kind, choices)
    }

    /// Chat streams open each choice with the assistant role.
    fn role(&mut self, index: usize) -> Option<Value> {
        let sent = self.role_sent.get_mut(index)?;
        if self.kind == Kind::Text || *sent {
            return None;
        }
        *sent = true;
        Some(self.chunk(vec![json!({
            "finish_reason": null,
            "index": index,
            "delta": { "role": "assistant", "content": null },
        })]))
    }

    fn text_choice(&self, index: usize, text: &str, probs: Option<&TokenProbs>, reason: Option<&str>) -> Value {
        let logprobs = probs.map_or(Value::Null, |probs| logprobs_json(&self.ready, &[probs], self.top_n));
        json!({ "text": text, "index": index, "logprobs": logprobs, "finish_reason": reason })
    }

    /// The chat deltas of some reply text: reasoning and content each in
    /// its own chunk, as llama-server sends them, the token's logprobs
    /// with the last. A token whose text is all held back (a partial tag
    /// or stop word) still carries its logprobs, in an empty content delta.
    fn chat_choices(&mut self, index: usize, parts: &Parts, probs: Option<&TokenProbs>, end: bool) -> Vec<Value> {
        let mut deltas = Vec::new();
        if !parts.reasoning.is_empty() {
            deltas.push(json!({ "reasoning_content": parts.reasoning }));
        }
        match self.tool_streams.as_mut().and_then(|streams| streams.get_mut(index)) {
            Some(stream) => deltas.extend(stream.push(&parts.content, end)),
            None if !parts.content.is_empty() => deltas.push(json!({ "content": parts.content })),
            None => {}
        }
        if deltas.is_empty() && probs.is_some() {
            deltas.push(json!({ "content": "" }));
        }
        let last = deltas.len().saturating_sub(1);
        deltas
            .into_iter()
            .enumerate()
            .map(|(n, delta)| {
                let mut choice = json!({ "finish_reason": null, "index": index, "delta": delta });
                if let Some(probs) = probs.filter(|_| n == last) {
                    insert(&mut choice, "logprobs", logprobs_json(&self.ready, &[probs], self.top_n));
                }
                choice
            })
            .collect()
    }

    fn split(&mut self, index: usize, text: &str, end: bool) -> Parts {
        let Some(splitter) = self.splitters.get_mut(index) else { return Parts::default() };
        let mut parts = splitter.push(text);
        if end {
            parts.append(splitter.finish());
        }
        parts
    }

    /// The chunks that end choice `index`: held-back text, the finish
    /// reason, usage and timings.
    fn final_chunks(&mut self, index: usize, completion: &Completion) -> Vec<Value> {
        self.completions.push(completion.clone());
        let reason = finish_reason(completion.stop_type);
        let mut chunks: Vec<Value> = self.role(index).into_iter().collect();
        match self.kind {
            Kind::Text => {
                let mut last = self.chunk(vec![self.text_choice(index, &completion.text, None, Some(reason))]);
                insert(&mut last, "usage", usage_json([completion]));
                insert(&mut last, "timings", timings_json(&completion.timings));
                chunks.push(last);
            }
            Kind::Chat(_) => {
                let parts = self.split(index, &completion.text, true);
                for choice in self.chat_choices(index, &parts, None, true) {
                    chunks.push(self.chunk(vec![choice]));
                }
                let called =
                    self.tool_streams.as_ref().and_then(|streams| streams.get(index)).is_some_and(ToolStream::called);
                let reason = if called { tools::finish_reason(reason) } else { reason };
                let mut last = self.chunk(vec![json!({ "finish_reason": reason, "index": index, "delta": {} })]);
                if !self.include_usage {
                    insert(&mut last, "timings", timings_json(&completion.timings));
                }
                chunks.push(last);
            }
        }
        chunks
    }
}

impl sse::Render for OpenAiStream {
    fn started(&mut self, index: usize, id_slot: u32) {
        if let Some(progress) = self.progress.get_mut(index) {
            progress.start(id_slot);
        }
    }

    /// As llama-server sends it: an empty text choice, or in chat an
    /// assistant-role delta (the first token's chunk repeats the role).
    fn progress(&mut self, index: usize, progress: &Progress) -> Vec<Value> {
        let choice = match self.kind {
            Kind::Text => self.text_choice(index, "", None, None),
            Kind::Chat(_) => {
                json!({ "finish_reason": null, "index": index, "delta": { "role": "assistant", "content": null } })
            }
        };
        let mut chunk = self.chunk(vec![choice]);
        if let Some(fields) = chunk.as_object_mut() {
            attach_progress(fields, progress, self.plan.generation.timings_per_token);
        }
        vec![chunk]
    }

    fn token(&mut self, index: usize, token: &TokenEvent) -> Vec<Value> {
        if let Some(progress) = self.progress.get_mut(index) {
            progress.token(&token.text);
        }
        let mut chunks: Vec<Value> = self.role(index).into_iter().collect();
        let choices = match self.kind {
            Kind::Text => vec![self.text_choice(index, &token.text, token.probs.as_ref(), None)],
            Kind::Chat(_) => {
                let parts = self.split(index, &token.text, false);
                self.chat_choices(index, &parts, token.probs.as_ref(), false)
            }
        };
        let count = choices.len();
        for (n, choice) in choices.into_iter().enumerate() {
            let mut chunk = self.chunk(vec![choice]);
            if n + 1 == count
                && self.plan.generation.timings_per_token
                && let Some(progress) = self.progress.get(index)
            {
                insert(&mut chunk, "timings", timings_json(&progress.timings(self.plan.prompt(index).len())));
            }
            chunks.push(chunk);
        }
        chunks
    }

    fn done(&mut self, index: usize, completion: &Completion) -> Vec<Value> {
        let chunks = self.final_chunks(index, completion);
        if !self.plan.generation.verbose {
            return chunks;
        }
        // llama-server puts the native response on the first of them.
        let outcome = Outcome::finished(index, completion.clone());
        let verbose = completion::final_json(&self.ready, &self.plan, &outcome, true);
        let mut chunks = chunks;
        if let Some(first) = chunks.first_mut() {
            insert(first, "__verbose", verbose);
        }
        chunks
    }

    fn finish(&mut self) -> Vec<Value> {
        if self.kind == Kind::Text || !self.include_usage {
            return Vec::new();
        }
        let mut usage = self.chunk(Vec::new());
        insert(&mut usage, "usage", usage_json(&self.completions));
        if let Some(first) = self.completions.first() {
            insert(&mut usage, "timings", timings_json(&first.timings));
        }
        vec![usage]
    }

    fn done_marker(&self) -> bool {
        true
    }
}
