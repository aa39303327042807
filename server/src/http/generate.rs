//! What the three completion endpoints share: submitting a request's
//! completions to the engine, collecting their results, and the JSON of
//! probabilities, timings and usage.

use futures_util::Stream;
use serde_json::{Map, Value, json};

use super::error::{ApiError, ErrorType};
use super::params::Generation;
use super::prompt::Prompt;
use crate::engine::EngineHandle;
use crate::engine::delivery::EventReceiver;
use crate::engine::request::{Completion, Event, Progress, RequestId, StopType, Timings, TokenEvent, TokenProbs};
use crate::engine::sampling::TokenProb;
use crate::model::tokenizer::Tokenizer;

/// Per-completion state of a stream: the slot, tokens so far, and the
/// clock readings `timings_per_token` reports.
#[derive(Default, Clone)]
pub struct StreamProgress {
    pub id_slot: Option<u32>,
    pub predicted: usize,
    pub new_line: bool,
    started: Option<std::time::Instant>,
    first_token: Option<std::time::Instant>,
}

impl StreamProgress {
    pub fn start(&mut self, id_slot: u32) {
        self.id_slot = Some(id_slot);
        self.started = Some(std::time::Instant::now());
    }

    pub fn token(&mut self, text: &str) {
        self.predicted += 1;
        self.new_line |= text.contains('\n');
        self.first_token.get_or_insert_with(std::time::Instant::now);
    }

    /// Timings so far: prompt time up to the first token, generation since.
    pub fn timings(&self, prompt_len: usize) -> Timings {
        let first_token = self.first_token.unwrap_or_else(std::time::Instant::now);
        Timings {
            prompt_n: prompt_len,
            prompt_ms: self.started.map_or(0.0, |started| first_token.duration_since(started).as_secs_f64() * 1e3),
            predicted_n: self.predicted,
            predicted_ms: first_token.elapsed().as_secs_f64() * 1e3,
            ..Timings::default()
        }
    }
}

/// A request ready to run: its generation fields and tokenized prompts.
/// Output `index` = prompt number × `n_cmpl` + completion number.
#[derive(Debug, Clone)]
pub struct Plan {
    pub generation: Generation,
    pub prompts: Vec<Prompt>,
}

impl Plan {
    pub fn outputs(&self) -> usize {
        self.prompts.len() * self.generation.n_cmpl
    }

    pub fn prompt(&self, index: usize) -> &[u32] {
        self.prompts.get(index / self.generation.n_cmpl.max(1)).map_or(&[], |prompt| prompt.tokens.as_slice())
    }
}

/// One completion in flight. Dropping it before it finished cancels it in
/// the engine (a client that went away frees its slot).
pub struct Submitted {
    pub index: usize,
    source: Source,
    finished: bool,
}

enum Source {
    Engine {
        id: RequestId,
        events: EventReceiver,
        engine: EngineHandle,
    },
    /// An empty prompt: llama-server answers at once with empty content.
    Empty(Option<Completion>),
}

impl Submitted {
    /// The next event; `None` once the completion is over.
    pub async fn next(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = match &mut self.source {
            Source::Engine { events, .. } => events.recv().await,
            Source::Empty(completion) => completion.take().map(Event::Done),
        };
        if matches!(event, None | Some(Event::Done(_) | Event::Failed(_))) {
            self.finished = true;
        }
        event
    }

    /// As a stream of `(index, event)`.
    pub fn into_stream(self) -> impl Stream<Item = (usize, Event)> + Send {
        futures_util::stream::unfold(self, |mut job| async move {
            let event = job.next().await?;
            Some(((job.index, event), job))
        })
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        if let Source::Engine { id, engine, .. } = &self.source
            && !self.finished
        {
            engine.cancel(*id);
        }
    }
}

/// Submit every completion of `plan`. If one is refused the ones already
/// queued are cancelled (dropped) and the refusal is the answer.
pub fn submit(engine: &EngineHandle, plan: &Plan) -> Result<Vec<Submitted>, ApiError> {
    // All of a request's completions enter the queue at once: more than it
    // holds can never fit, and retrying (a 503) would not help.
    let queue_limit = engine.config().queue_limit;
    if plan.outputs() > queue_limit {
        return Err(ApiError::invalid(format!(
            "the request asks for {} completions; the queue holds at most {queue_limit} (engine.queue_limit)",
            plan.outputs()
        )));
    }
    let mut jobs = Vec::with_capacity(plan.outputs());
    for index in 0..plan.outputs() {
        let prompt = plan.prompts.get(index / plan.generation.n_cmpl.max(1)).cloned().unwrap_or_default();
        let source = if prompt.tokens.is_empty() {
            Source::Empty(Some(empty_completion()))
        } else {
            let mut request = plan.generation.request.clone();
            request.prompt = prompt.tokens;
            request.images = prompt.images;
            let (id, events) = engine.submit(request)?;
            Source::Engine { id, events, engine: engine.clone() }
        };
        jobs.push(Submitted { index, source, finished: false });
    }
    Ok(jobs)
}

fn empty_completion() -> Completion {
    Completion {
        stop_type: StopType::None,
        stopping_word: String::new(),
        text: String::new(),
        truncated: false,
        tokens_predicted: 0,
        tokens_evaluated: 0,
        tokens_cached: 0,
        id_slot: 0,
        timings: Timings::default(),
    }
}

/// A finished completion.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub index: usize,
    pub tokens: Vec<TokenEvent>,
    pub completion: Completion,
}

impl Outcome {
    /// The generated text: every token's text, then the held-back tail.
    pub fn content(&self) -> String {
        let mut content: String = self.tokens.iter().map(|token| token.text.as_str()).collect();
        content.push_str(&self.completion.text);
        content
    }

    pub fn token_ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|token| token.token).collect()
    }

    /// Per-token probabilities, less the tokens of a matched stop word (as
    /// llama-server trims them: as many as the stop word has tokens).
    pub fn probs(&self, tokenizer: &Tokenizer) -> Vec<&TokenProbs> {
        let mut probs: Vec<&TokenProbs> = self.tokens.iter().filter_map(|token| token.probs.as_ref()).collect();
        if self.completion.stop_type == StopType::Word {
            let stop_tokens = tokenizer.encode(&self.completion.stopping_word, false, false).len();
            probs.truncate(probs.len().saturating_sub(stop_tokens));
        }
        probs
    }
}

/// Wait for every completion; the first failure is the answer.
pub async fn collect(jobs: Vec<Submitted>) -> Result<Vec<Outcome>, ApiError> {
    let mut outcomes = Vec::with_capacity(jobs.len());
    for mut job in jobs {
        let mut tokens = Vec::new();
        loop {
            match job.next().await {
                Some(Event::Started { .. } | Event::Progress(_)) => {}
                Some(Event::Token(token)) => tokens.push(token),
                Some(Event::Done(completion)) => {
                    outcomes.push(Outcome { index: job.index, tokens, completion });
                    break;
                }
                Some(Event::Failed(error)) => return Err(error.into()),
                None => return Err(engine_gone()),
            }
        }
    }
    Ok(outcomes)
}

/// The engine dropped a request without an answer (it is shutting down).
pub fn engine_gone() -> ApiError {
    ApiError::new(ErrorType::Unavailable, "the engine stopped before the request finished")
}

/// Run blocking work (tokenizing, templating) off the async workers.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| ApiError::new(ErrorType::Server, format!("request handling failed: {error}")))?
}

/// A token's text for probability entries: its bytes up to the last whole
/// UTF-8 character (llama-server trims partial characters the same way).
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id).to_vec();
    let valid = match std::str::from_utf8(&bytes) {
        Ok(text) => text.len(),
        Err(error) => error.valid_up_to(),
    };
    (String::from_utf8_lossy(&bytes[..valid]).into_owned(), bytes)
}

/// ln(p), with ln(0) written as -FLT_MAX as llama-server does (JSON has no
/// infinity).
fn logprob(prob: f32) -> f64 {
    if prob > 0.0 { f64::from(prob.ln()) } else { -f64::from(f32::MAX) }
}

fn prob_entry(tokenizer: &Tokenizer, prob: &TokenProb, post_sampling: bool) -> Map<String, Value> {
    let (text, bytes) = token_text(tokenizer, prob.token);
    let mut entry = Map::new();
    entry.insert("id".into(), json!(prob.token));
    entry.insert("token".into(), json!(text));
    entry.insert("bytes".into(), json!(bytes));
    if post_sampling {
        entry.insert("prob".into(), json!(prob.prob));
    } else {
        entry.insert("logprob".into(), json!(logprob(prob.prob)));
    }
    entry
}

/// One generated token's probabilities in llama-server's format:
/// `{id, token, bytes, logprob, top_logprobs}`, or `prob`/`top_probs` after
/// sampling. At most `top_n` alternatives are listed.
pub fn probs_json(tokenizer: &Tokenizer, probs: &TokenProbs, top_n: usize) -> Value {
    let post = probs.post_sampling;
    let mut entry = prob_entry(tokenizer, &probs.chosen, post);
    let top: Vec<Value> =
        probs.top.iter().take(top_n).map(|prob| Value::Object(prob_entry(tokenizer, prob, post))).collect();
    entry.insert(if post { "top_probs" } else { "top_logprobs" }.into(), Value::Array(top));
    Value::Object(entry)
}

/// What a progress chunk carries, into `chunk`: llama-server's
/// `prompt_progress` object and, with `timings_per_token`, the timings of
/// the prompt so far.
pub fn attach_progress(chunk: &mut Map<String, Value>, progress: &Progress, timings_per_token: bool) {
    let fields = json!({
        "total": progress.total,
        "cache": progress.cache,
        "processed": progress.processed,
        "time_ms": progress.time_ms,
    });
    chunk.insert("prompt_progress".into(), fields);
    if timings_per_token {
        let timings = Timings {
            cache_n: progress.cache,
            prompt_n: progress.processed.saturating_sub(progress.cache),
            prompt_ms: progress.time_ms as f64,
            ..Timings::default()
        };
        chunk.insert("timings".into(), timings_json(&timings));
    }
}

/// The `timings` object. Generation rates leave out the first token, which
/// comes from the prompt's last batch (llama-server's rule).
pub fn timings_json(timings: &Timings) -> Value {
    let rate = |n: usize, ms: f64| if n > 0 && ms > 0.0 { (ms / n as f64, 1e3 * n as f64 / ms) } else { (0.0, 0.0) };
    let (prompt_per_token_ms, prompt_per_second) = rate(timings.prompt_n, timings.prompt_ms);
    let (predicted_per_token_ms, predicted_per_second) =
        rate(timings.predicted_n.saturating_sub(1), timings.predicted_ms);
    json!({
        "cache_n": timings.cache_n,
        "prompt_n": timings.prompt_n,
        "prompt_ms": timings.prompt_ms,
        "prompt_per_token_ms": prompt_per_token_ms,
        "prompt_per_second": prompt_per_second,
        "predicted_n": timings.predicted_n,
        "predicted_ms": timings.predicted_ms,
        "predicted_per_token_ms": predicted_per_token_ms,
        "predicted_per_second": predicted_per_second,
        "draft_n": timings.draft_n,
        "draft_n_accepted": timings.draft_n_accepted,
    })
}

/// OpenAI `usage` over some completions.
pub fn usage_json<'a>(completions: impl IntoIterator<Item = &'a Completion>) -> Value {
    let (mut prompt, mut generated, mut cached) = (0, 0, 0);
    for completion in completions {
        prompt += completion.tokens_evaluated;
        generated += completion.tokens_predicted;
        cached += completion.tokens_cached;
    }
    json!({
        "completion_tokens": generated,
        "prompt_tokens": prompt,
        "total_tokens": prompt + generated,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

/// OpenAI's `finish_reason` for a stop type.
pub fn finish_reason(stop_type: StopType) -> &'static str {
    match stop_type {
        StopType::Eos | StopType::Word => "stop",
        StopType::Limit | StopType::None => "length",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_leave_the_first_token_out_of_rates() {
        let timings =
            Timings { prompt_n: 10, prompt_ms: 20.0, predicted_n: 5, predicted_ms: 40.0, ..Timings::default() };
        let json = timings_json(&timings);
        assert_eq!(json["prompt_per_token_ms"], 2.0);
        assert_eq!(json["predicted_per_token_ms"], 10.0);
        assert_eq!(json["predicted_per_second"], 100.0);
        let none = timings_json(&Timings::default());
        assert_eq!(none["predicted_per_second"], 0.0);
    }

    #[test]
    fn the_held_back_tail_counts_as_content() {
        let completion = Completion { text: "!".into(), ..empty_completion() };
        let outcome =
            Outcome { index: 0, tokens: vec![TokenEvent { token: 1, text: "Hi".into(), probs: None }], completion };
        assert_eq!(outcome.content(), "Hi!");
        assert_eq!(outcome.token_ids(), vec![1]);
    }

    #[test]
    fn zero_probability_is_minus_flt_max() {
        assert_eq!(logprob(0.0), -f64::from(f32::MAX));
        assert_eq!(logprob(1.0), 0.0);
    }
}
