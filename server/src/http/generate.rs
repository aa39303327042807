//! What the three completion endpoints share: submitting a request's
//! completions to the engine, collecting their results, and the JSON of
//! probabilities, timings and usage.

use futures_util::{Stream, StreamExt};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::error::{ApiError, ErrorType};
use super::params::Generation;
use super::probs;
use super::state::Ready;
use crate::chat::media::Prompt;
use sluice_engine::EngineHandle;
use sluice_engine::delivery::EventReceiver;
use sluice_engine::request::{Completion, Event, Progress, RequestId, StopType, Timings, TokenEvent};
use sluice_model::tokenizer::Tokenizer;

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

/// What a non-streamed request keeps of its completions until it answers:
/// their text and token ids, and their probabilities as the JSON text the
/// answer will hold, once for each listing length it shows (`top_n`); and
/// the most it may keep (`server.limits.response_mib`).
pub struct Keep<'a> {
    tokenizer: &'a Tokenizer,
    top_n: Vec<usize>,
    n_ctx: usize,
    limit_bytes: usize,
}

/// The shortest a probability entry is written (`{"id":0,"token":"",
/// "bytes":[],"prob":1.0}`), for the least an answer must hold.
const LEAST_ENTRY_BYTES: usize = 41;

impl<'a> Keep<'a> {
    /// Probabilities listed with each of `top_n` alternatives (none when
    /// empty).
    pub fn new(ready: &'a Ready, top_n: &[usize]) -> Self {
        let mut listings = top_n.to_vec();
        listings.dedup();
        let limit_bytes = match ready.server_limits.response_mib {
            0 => usize::MAX,
            mib => mib.saturating_mul(1 << 20),
        };
        Keep { tokenizer: &ready.tokenizer, top_n: listings, n_ctx: ready.engine.config().ctx, limit_bytes }
    }

    /// Refuse at once a request certain to pass the limit: one that must
    /// generate its `n_predict` tokens or fill its context (end of
    /// generation banned, no stop words or grammar to end it sooner) and
    /// whose probabilities alone, written as tersely as they can be, would
    /// not fit.
    pub fn check(&self, plan: &Plan) -> Result<(), ApiError> {
        let request = &plan.generation.request;
        let certain = request.ignore_eos && request.stop.is_empty() && request.grammar.is_none();
        if !certain || request.n_probs == 0 {
            return Ok(());
        }
        let n_predict = request.n_predict.unwrap_or(usize::MAX);
        // After sampling, only one candidate may be left.
        let listed = if request.post_sampling_probs { 1 } else { request.n_probs };
        let per_token: usize = self.top_n.iter().map(|&top_n| (1 + top_n.min(listed)) * LEAST_ENTRY_BYTES).sum();
        // A request ends, at the latest, when its context is full.
        let tokens: usize = (0..plan.outputs())
            .map(|index| n_predict.min(self.n_ctx.saturating_sub(plan.prompt(index).len() + 1)))
            .sum();
        let least = tokens.saturating_mul(per_token);
        if least > self.limit_bytes {
            return Err(ApiError::invalid(format!(
                "the answer would hold at least {} MiB of probabilities, more than the {} MiB an answer that is \
                 not streamed may hold (server.limits.response_mib); stream it (`\"stream\": true`) or ask for \
                 fewer tokens or probabilities",
                least.div_ceil(1 << 20),
                self.limit_bytes >> 20
            )));
        }
        Ok(())
    }

    /// The probabilities of `outcome` listed with `top_n` alternatives, less
    /// the tokens of a matched stop word (as llama-server trims them: as
    /// many as the stop word has tokens). Empty unless `top_n` is one of
    /// this keep's listings.
    pub fn probs<'o>(&self, outcome: &'o Outcome, top_n: usize) -> &'o [Box<RawValue>] {
        let listing = self.top_n.iter().position(|&kept| kept == top_n);
        let probs = listing.and_then(|listing| outcome.probs.get(listing)).map_or(&[][..], Vec::as_slice);
        if outcome.completion.stop_type != StopType::Word {
            return probs;
        }
        let stop_tokens = self.tokenizer.encode(&outcome.completion.stopping_word, false, false).len();
        &probs[..probs.len().saturating_sub(stop_tokens)]
    }

    /// Keep one token of `outcome`; the bytes that took.
    fn token(&self, outcome: &mut Outcome, token: TokenEvent) -> usize {
        let mut held = std::mem::size_of::<u32>() + token.text.len();
        outcome.tokens.push(token.token);
        outcome.text.push_str(&token.text);
        if let Some(probs) = &token.probs {
            outcome.probs.resize_with(self.top_n.len(), Vec::new);
            for (&top_n, listing) in self.top_n.iter().zip(&mut outcome.probs) {
                let entry = probs::Entry { tokenizer: self.tokenizer, probs, top_n }.to_raw();
                held += entry.get().len() + std::mem::size_of_val(&entry);
                listing.push(entry);
            }
        }
        held
    }

    fn passed(&self) -> ApiError {
        ApiError::invalid(format!(
            "the answer passed {} MiB, the most an answer that is not streamed may hold \
             (server.limits.response_mib); stream it (`\"stream\": true`) or ask for fewer tokens or probabilities",
            self.limit_bytes >> 20
        ))
    }
}

/// A finished completion.
#[derive(Debug)]
pub struct Outcome {
    pub index: usize,
    tokens: Vec<u32>,
    /// The generated tokens' text.
    text: String,
    /// Each token's probabilities as JSON text, one list per listing of the
    /// [`Keep`] that collected it.
    probs: Vec<Vec<Box<RawValue>>>,
    pub completion: Completion,
}

impl Outcome {
    /// An outcome with nothing kept but how it ended (a stream's final
    /// object: its tokens went out as they came).
    pub fn finished(index: usize, completion: Completion) -> Self {
        Outcome { index, tokens: Vec::new(), text: String::new(), probs: Vec::new(), completion }
    }

    /// The generated text: every token's text, then the held-back tail.
    pub fn content(&self) -> String {
        let mut content = self.text.clone();
        content.push_str(&self.completion.text);
        content
    }

    pub fn token_ids(&self) -> &[u32] {
        &self.tokens
    }
}

/// Wait for every completion, all at once (the engine runs them together,
/// and one read after another would leave the later ones' events unread
/// against their stream windows). The first failure is the answer, and so
/// is passing the keep's limit; either cancels the rest.
pub async fn collect(jobs: Vec<Submitted>, keep: &Keep<'_>) -> Result<Vec<Outcome>, ApiError> {
    let mut outcomes: Vec<(Outcome, bool)> =
        jobs.iter().map(|job| (Outcome::finished(job.index, empty_completion()), false)).collect();
    let mut events = futures_util::stream::select_all(jobs.into_iter().map(|job| job.into_stream().boxed()));
    let mut held = 0usize;
    while let Some((index, event)) = events.next().await {
        let Some((outcome, done)) = outcomes.get_mut(index) else { continue };
        match event {
            Event::Started { .. } | Event::Progress(_) => {}
            Event::Token(token) => {
                held = held.saturating_add(keep.token(outcome, token));
                if held > keep.limit_bytes {
                    return Err(keep.passed());
                }
            }
            Event::Done(completion) => {
                outcome.completion = completion;
                *done = true;
            }
            Event::Failed(error) => return Err(error.into()),
        }
    }
    // Every stream ends after its completion's last event; one that ended
    // without it was dropped by a stopping engine.
    outcomes.into_iter().map(|(outcome, done)| if done { Ok(outcome) } else { Err(engine_gone()) }).collect()
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
        let outcome = Outcome { tokens: vec![1], text: "Hi".into(), ..Outcome::finished(0, completion) };
        assert_eq!(outcome.content(), "Hi!");
        assert_eq!(outcome.token_ids(), [1]);
    }
}
