//! Emission: sampling a slot's next token from its held logits, the stop
//! rules (end of generation, stop words, limits, the context), and draft
//! verification, which emits each draft the target's own sampler picks.

use std::time::Instant;

use super::constraint::ConstraintEnd;
use super::kv::BlockManager;
use super::metrics::Metrics;
use super::policy::{EndReason, Phase};
use super::request::{Completion, EngineError, Event, StopType, Timings, TokenEvent, TokenProbs};
use super::sampling::{TokenProb, token_prob, top_probs};
use super::shift;
use super::slot::{Active, trace_phase};
use super::text::Appended;
use sluice_model::tokenizer::Tokenizer;

/// How a request ends: the reason the policy hears, and what the client
/// gets (nothing when it is gone).
pub(super) struct Ending {
    pub reason: EndReason,
    pub event: Option<Event>,
}

/// What emitting a sampled token did.
pub(super) enum Emitted {
    /// The token was emitted and the request goes on.
    Continue,
    /// The sampler picked another token than the draft offered; nothing was
    /// emitted and the sampler is as it was.
    Rejected,
    /// The request ends.
    Ended(Ending),
    /// The token was emitted but the slot's context is full: the slot must
    /// shift (see `super::shift`) before the token runs.
    Shift,
}

/// What emission needs from the engine.
pub(super) struct Emitter<'a> {
    pub tokenizer: &'a Tokenizer,
    pub metrics: &'a Metrics,
    pub blocks: &'a mut BlockManager,
    /// Each slot's context.
    pub ctx: usize,
    /// Shift a full context instead of ending the request.
    pub context_shift: bool,
    /// For the phase log.
    pub step: u64,
}

impl Emitter<'_> {
    /// Sample from the held logits and emit the token; with `draft`, only
    /// if the sampler picks that token (otherwise the sampler is restored,
    /// so the next step samples the same logits with the same random state,
    /// exactly as plain decoding would).
    pub fn emit(&mut self, slot: usize, active: &mut Active, draft: Option<u32>) -> Emitted {
        if active.request.n_predict == Some(0) {
            // n_predict 0 evaluates the prompt only.
            return Emitted::Ended(done(slot, active, StopType::Limit, String::new(), false));
        }
        active.decode_started.get_or_insert_with(Instant::now);
        if let Some(constraint) = active.constraint.as_mut() {
            // A grammar that is complete allows only end-of-generation,
            // which `ignore_eos` bans: the output is finished all the same.
            let masked = match active.request.ignore_eos.then(|| constraint.is_finished()) {
                Some(Ok(true)) => Err(ConstraintEnd::Exhausted),
                Some(Err(error)) => Err(error),
                Some(Ok(false)) | None => constraint.apply(&mut active.held_logits),
            };
            match masked {
                Ok(()) => {}
                Err(ConstraintEnd::Exhausted) => {
                    return Emitted::Ended(done(slot, active, StopType::Eos, String::new(), false));
                }
                Err(error @ ConstraintEnd::Failed(_)) => {
                    let event = Event::Failed(EngineError::Internal(error.to_string()));
                    return Emitted::Ended(Ending { reason: EndReason::Failed, event: Some(event) });
                }
            }
        }
        let n_probs = active.request.n_probs;
        let mut post = Vec::new();
        let pre = (n_probs > 0 && !active.request.post_sampling_probs).then(|| top_probs(&active.held_logits, n_probs));
        let post_request = (n_probs > 0 && active.request.post_sampling_probs).then_some((n_probs, &mut post));
        let before = draft.map(|_| active.sampler.checkpoint());
        let sampled = active.sampler.sample(&active.held_logits, post_request);
        let token = sampled.token;
        if let Some(before) = before {
            if draft != Some(token) {
                active.sampler.restore(before);
                return Emitted::Rejected;
            }
            active.draft_accepted += 1;
        }
        active.sampler.accept(token);
        active.generated += 1;
        let end_of_generation = !active.request.ignore_eos && self.tokenizer.is_end_of_generation(token);
        if let Some(constraint) = active.constraint.as_mut().filter(|_| !end_of_generation) {
            // The mask allowed the token, so the matcher takes it; the next
            // mask is computed while the forward pass runs.
            if let Err(error) = constraint.commit(token) {
                let event = Event::Failed(EngineError::Internal(error.to_string()));
                return Emitted::Ended(Ending { reason: EndReason::Failed, event: Some(event) });
            }
        }
        if active.phase != Phase::Decoding {
            trace_phase(self.step, slot, active.id, "decoding");
            active.phase = Phase::Decoding;
        }
        Metrics::add(&self.metrics.tokens_predicted_total, 1);
        let probs = if let Some(top) = pre {
            Some(TokenProbs {
                chosen: TokenProb { token, prob: token_prob(&active.held_logits, token) },
                top,
                post_sampling: false,
            })
        } else if n_probs > 0 {
            Some(TokenProbs { chosen: sampled, top: post, post_sampling: true })
        } else {
            None
        };

        if end_of_generation {
            // The end-of-generation token is reported like any other (no
            // text; in `tokens` and the probabilities), as llama-server does.
            if !active.send(Event::Token(TokenEvent { token, text: String::new(), probs })) {
                return Emitted::Ended(Ending { reason: EndReason::Cancelled, event: None });
            }
            return Emitted::Ended(done(slot, active, StopType::Eos, String::new(), false));
        }
        let (text, stop_word) = match active.text.push(self.tokenizer.render_bytes(token, false)) {
            Appended::Text(text) => (text, None),
            Appended::Stop { text, word } => (text, Some(word)),
        };
        if !active.send(Event::Token(TokenEvent { token, text, probs })) {
            return Emitted::Ended(Ending { reason: EndReason::Cancelled, event: None });
        }
        if let Some(word) = stop_word {
            return Emitted::Ended(done(slot, active, StopType::Word, word, false));
        }
        // As in llama-server, a context is full when the token just sampled
        // would take its last cell, and that is checked before the limit.
        let full = active.cells + 1 >= self.ctx;
        let shift = full && self.context_shift && shift::shiftable(active);
        if full && !shift {
            return Emitted::Ended(done(slot, active, StopType::Limit, String::new(), true));
        }
        if active.request.n_predict.is_some_and(|limit| active.generated >= limit) {
            return Emitted::Ended(done(slot, active, StopType::Limit, String::new(), false));
        }
        active.tokens.push(token);
        if shift {
            return Emitted::Shift;
        }
        if let Err(error) = self.blocks.reserve(&mut active.blocks, active.cells + 1) {
            let event = Event::Failed(EngineError::ResourceExhausted(error.to_string()));
            return Emitted::Ended(Ending { reason: EndReason::Failed, event: Some(event) });
        }
        Emitted::Continue
    }

    /// Emit the drafts the target's sampler agrees with, from `logits`
    /// (after the sampled token, then after each draft, `n_vocab` each).
    /// Leaves the held logits after the last accepted token. `Continue`
    /// unless the request ended or must shift.
    pub fn verify(&mut self, slot: usize, active: &mut Active, drafts: &[u32], logits: &[f32]) -> Emitted {
        if drafts.is_empty() {
            return Emitted::Continue;
        }
        let n_vocab = active.held_logits.len();
        Metrics::add(&self.metrics.drafts_total, 1);
        Metrics::add(&self.metrics.draft_tokens_total, drafts.len() as u64);
        active.draft_n += drafts.len();
        for (index, &draft) in drafts.iter().enumerate() {
            let generated = active.generated;
            match self.emit(slot, active, Some(draft)) {
                Emitted::Continue => {
                    self.metrics.count_accepted_at(index);
                    active.cells += 1;
                    active.held_logits.copy_from_slice(&logits[(index + 1) * n_vocab..(index + 2) * n_vocab]);
                }
                Emitted::Rejected => break,
                ended @ (Emitted::Ended(_) | Emitted::Shift) => {
                    // A constrained row can end before it samples the draft.
                    if active.generated > generated {
                        self.metrics.count_accepted_at(index);
                    }
                    return ended;
                }
            }
        }
        Emitted::Continue
    }
}

/// The request ends because its context is full.
pub(super) fn truncated(slot: usize, active: &mut Active) -> Ending {
    done(slot, active, StopType::Limit, String::new(), true)
}

/// The request completed: its final event.
fn done(slot: usize, active: &mut Active, stop_type: StopType, stopping_word: String, truncated: bool) -> Ending {
    let text = active.text.finish();
    let predicted_ms = active.decode_started.map_or(0.0, |started| started.elapsed().as_secs_f64() * 1e3);
    let completion = Completion {
        stop_type,
        stopping_word,
        text,
        truncated: truncated || active.truncated,
        tokens_predicted: active.generated,
        tokens_evaluated: active.n_prompt,
        tokens_cached: active.cached,
        id_slot: slot as u32,
        timings: Timings {
            cache_n: active.cached,
            prompt_n: active.n_prompt - active.cached,
            prompt_ms: active.prompt_ms,
            predicted_n: active.generated,
            predicted_ms,
            draft_n: active.draft_n,
            draft_n_accepted: active.draft_accepted,
        },
    };
    Ending { reason: EndReason::Completed, event: Some(Event::Done(completion)) }
}
