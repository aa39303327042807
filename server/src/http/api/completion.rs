//! The native completion endpoint, `/completion` (alias `/completions`),
//! with llama-server's request fields and response shapes.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use crate::chat::fields::{Fields, object};
use crate::chat::prompt;
use crate::http::error::ApiError;
use crate::http::extract::JsonBody;
use crate::http::generate::{
    Keep, Outcome, Plan, StreamProgress, attach_progress, blocking, collect, submit, timings_json,
};
use crate::http::params::{self, settings_json};
use crate::http::probs::probs_json;
use crate::http::spliced::Spliced;
use crate::http::sse;
use crate::http::state::{AppState, Ready};
use sluice_engine::request::{Completion, Progress, TokenEvent};

/// `POST /completion`.
pub async fn completion(State(state): State<AppState>, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let parsing = Arc::clone(&ready);
    let defaults = state.config().defaults.clone();
    let plan = blocking(move || {
        let fields = Fields(object(&body)?);
        let limits = parsing.limits(&defaults);
        let generation = params::generation(fields, &limits)?;
        let value = fields.get("prompt").ok_or_else(|| ApiError::invalid("\"prompt\" must be provided"))?;
        let prompts = prompt::prompts(value, parsing.reader())?;
        Ok(Plan { generation, prompts })
    })
    .await?;
    let plan = Arc::new(plan);
    let n_probs = plan.generation.request.n_probs;
    let listings: &[usize] = if plan.generation.stream || n_probs == 0 { &[] } else { &[n_probs] };
    let keep = Keep::new(&ready, listings);
    keep.check(&plan)?;
    let jobs = submit(&ready.engine, &plan)?;
    if plan.generation.stream {
        let render = NativeStream::new(Arc::clone(&ready), plan);
        return sse::respond(jobs, render, state.ping(), state.hold_notice()).await;
    }
    let outcomes = collect(jobs, &keep).await?;
    let mut results: Vec<Spliced<'_>> =
        outcomes.iter().map(|outcome| final_answer(&ready, &plan, &keep, outcome)).collect();
    if !plan.generation.response_fields.is_empty() {
        results = results.iter().map(|result| result.project(&plan.generation.response_fields)).collect();
    }
    // One prompt and one completion answer with an object, more with an
    // array ordered by index.
    let answer = if results.len() == 1 { results.remove(0) } else { Spliced::array(results) };
    Ok(answer.into_response())
}

/// The native final object of a completion that was not streamed, with its
/// probabilities when asked for.
pub(super) fn final_answer<'a>(ready: &Ready, plan: &Plan, keep: &Keep<'_>, outcome: &'a Outcome) -> Spliced<'a> {
    let n_probs = plan.generation.request.n_probs;
    let mut answer = Spliced::new(final_json(ready, plan, outcome, false));
    if n_probs > 0 {
        answer.list(&["completion_probabilities"], keep.probs(outcome, n_probs));
    }
    answer
}

/// The native final object but for its probabilities. In a stream,
/// `content` is only the held-back tail and `tokens` is left out (they
/// were streamed).
pub(super) fn final_json(ready: &Ready, plan: &Plan, outcome: &Outcome, streamed: bool) -> Value {
    let completion = &outcome.completion;
    let content = if streamed { completion.text.clone() } else { outcome.content() };
    let tokens = if plan.generation.return_tokens && !streamed { outcome.token_ids() } else { &[] };
    json!({
        "index": outcome.index,
        "content": content,
        "tokens": tokens,
        "id_slot": completion.id_slot,
        "stop": true,
        "model": ready.model.name,
        "tokens_predicted": completion.tokens_predicted,
        "tokens_evaluated": completion.tokens_evaluated,
        "generation_settings": settings_json(&plan.generation),
        "prompt": ready.tokenizer.decode(plan.prompt(outcome.index)),
        "has_new_line": outcome.content().contains('\n'),
        "truncated": completion.truncated,
        "stop_type": completion.stop_type.as_str(),
        "stopping_word": completion.stopping_word,
        "tokens_cached": completion.tokens_cached,
        "timings": timings_json(&completion.timings),
    })
}

/// The native stream: one chunk per token, then the final object.
struct NativeStream {
    ready: Arc<Ready>,
    plan: Arc<Plan>,
    progress: Vec<StreamProgress>,
}

impl NativeStream {
    fn new(ready: Arc<Ready>, plan: Arc<Plan>) -> Self {
        let progress = vec![StreamProgress::default(); plan.outputs()];
        NativeStream { ready, plan, progress }
    }
}

impl sse::Render for NativeStream {
    fn started(&mut self, index: usize, id_slot: u32) {
        if let Some(progress) = self.progress.get_mut(index) {
            progress.start(id_slot);
        }
    }

    fn token(&mut self, index: usize, token: &TokenEvent) -> Vec<Value> {
        let prompt_len = self.plan.prompt(index).len();
        let Some(progress) = self.progress.get_mut(index) else { return Vec::new() };
        progress.token(&token.text);
        let mut chunk = json!({
            "index": index,
            "content": token.text,
            "tokens": [token.token],
            "stop": false,
            "id_slot": progress.id_slot.map_or(-1, i64::from),
            "tokens_predicted": progress.predicted,
            "tokens_evaluated": prompt_len,
        });
        let Some(object) = chunk.as_object_mut() else { return vec![chunk] };
        if let Some(probs) = &token.probs {
            let n = self.plan.generation.request.n_probs;
            object.insert("completion_probabilities".into(), json!([probs_json(&self.ready.tokenizer, probs, n)]));
        }
        if self.plan.generation.timings_per_token {
            object.insert("timings".into(), timings_json(&progress.timings(prompt_len)));
        }
        vec![chunk]
    }

    fn progress(&mut self, index: usize, progress: &Progress) -> Vec<Value> {
        let id_slot = self.progress.get(index).and_then(|stream| stream.id_slot);
        let mut chunk = json!({
            "index": index,
            "content": "",
            "tokens": [],
            "stop": false,
            "id_slot": id_slot.map_or(-1, i64::from),
            "tokens_predicted": 0,
            "tokens_evaluated": progress.total,
        });
        if let Some(fields) = chunk.as_object_mut() {
            attach_progress(fields, progress, self.plan.generation.timings_per_token);
        }
        vec![chunk]
    }

    fn done(&mut self, index: usize, completion: &Completion) -> Vec<Value> {
        let outcome = Outcome::finished(index, completion.clone());
        let mut result = final_json(&self.ready, &self.plan, &outcome, true);
        if let (Some(progress), Some(object)) = (self.progress.get(index), result.as_object_mut()) {
            let has_new_line = progress.new_line || completion.text.contains('\n');
            object.insert("has_new_line".into(), json!(has_new_line));
        }
        vec![result]
    }

    fn finish(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn done_marker(&self) -> bool {
        false
    }
}
