//! The native completion endpoint, `/completion` (alias `/completions`),
//! with llama-server's request fields and response shapes.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::generate::{
    Outcome, Plan, StreamProgress, attach_progress, blocking, collect, probs_json, submit, timings_json,
};
use super::params::{self, Fields, JsonBody, object, settings_json};
use super::{AppState, Ready, prompt, sse};
use crate::engine::request::{Completion, Progress, TokenEvent};

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
    let jobs = submit(&ready.engine, &plan)?;
    if plan.generation.stream {
        let render = NativeStream::new(ready, plan);
        return sse::respond(jobs, render, state.ping(), state.hold_notice()).await;
    }
    let outcomes = collect(jobs).await?;
    let mut results: Vec<Value> = outcomes.iter().map(|outcome| final_json(&ready, &plan, outcome, false)).collect();
    if !plan.generation.response_fields.is_empty() {
        results = results.iter().map(|result| project(result, &plan.generation.response_fields)).collect();
    }
    // One prompt and one completion answer with an object, more with an
    // array ordered by index.
    Ok(match <[Value; 1]>::try_from(results) {
        Ok([single]) => axum::Json(single).into_response(),
        Err(results) => axum::Json(Value::Array(results)).into_response(),
    })
}

/// The native final object. In a stream, `content` is only the held-back
/// tail and `tokens` and `completion_probabilities` are left out (they
/// were streamed).
pub(super) fn final_json(ready: &Ready, plan: &Plan, outcome: &Outcome, streamed: bool) -> Value {
    let completion = &outcome.completion;
    let content = if streamed { completion.text.clone() } else { outcome.content() };
    let tokens = if plan.generation.return_tokens && !streamed { outcome.token_ids() } else { Vec::new() };
    let mut result = json!({
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
    });
    if plan.generation.request.n_probs > 0
        && !streamed
        && let Some(object) = result.as_object_mut()
    {
        let n = plan.generation.request.n_probs;
        let probs: Vec<Value> =
            outcome.probs(&ready.tokenizer).into_iter().map(|probs| probs_json(&ready.tokenizer, probs, n)).collect();
        object.insert("completion_probabilities".into(), Value::Array(probs));
    }
    result
}

/// `response_fields`: keep only the listed paths (`a/b` reads nested keys),
/// each under its full path, as llama-server does.
fn project(result: &Value, paths: &[String]) -> Value {
    let mut projected = Map::new();
    for path in paths {
        let found = path.split('/').try_fold(result, |value, key| value.get(key));
        if let Some(value) = found {
            projected.insert(path.clone(), value.clone());
        }
    }
    Value::Object(projected)
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
        let outcome = Outcome { index, tokens: Vec::new(), completion: completion.clone() };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_fields_keep_full_paths() {
        let result = json!({"content": "x", "generation_settings": {"n_predict": 8}, "prompt": "p"});
        let projected =
            project(&result, &["content".into(), "generation_settings/n_predict".into(), "absent/x".into()]);
        assert_eq!(projected, json!({"content": "x", "generation_settings/n_predict": 8}));
    }
}
