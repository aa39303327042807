//! Constrained decoding (structured outputs): a request's grammar — a JSON
//! schema, a GBNF grammar (translated by `gbnf`) or llguidance's own Lark
//! — compiled by the `llguidance` crate against the model's vocabulary, then
//! one token mask per step applied to that request's logits before its
//! sampler chain.
//!
//! The mask depends only on the tokens the request committed, so a
//! constrained row samples the same alone or batched, streamed or not; rows
//! without a grammar are never touched. After each committed token the next
//! mask is computed on a worker thread while the engine runs the forward
//! pass, and the engine only waits for it when it samples that row again.

mod gbnf;
mod vocabulary;

use std::sync::Arc;
use std::sync::mpsc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::SimpleVob;

pub use gbnf::GbnfError;

use crate::model::tokenizer::Tokenizer;

/// What a request asks its output to match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSource {
    /// A JSON schema (`json_schema`, `response_format`).
    JsonSchema(Value),
    /// llama.cpp's GBNF (`grammar`).
    Gbnf(String),
    /// llguidance's Lark syntax (`grammar` starting with `%llguidance`, and
    /// the tool-call grammars).
    Lark(String),
}

/// A grammar that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error(transparent)]
    Gbnf(#[from] GbnfError),
    /// llguidance's own message, which names the rule, keyword or position.
    #[error("{0}")]
    Compile(String),
    #[error("the vocabulary cannot be indexed for constrained decoding: {0}")]
    Vocabulary(String),
}

/// The grammar compiler of one model: its vocabulary indexed once at start.
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
}

impl Grammars {
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, GrammarError> {
        let env = vocabulary::environment(tokenizer).map_err(GrammarError::Vocabulary)?;
        let vocab = env.tok_trie().vocab_size();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|error| GrammarError::Vocabulary(error.to_string()))?;
        // llguidance logs grammar warnings to stderr by default; the error
        // that matters reaches the client.
        factory.quiet();
        Ok(Grammars { factory, vocab })
    }

    /// Compile `source`, and compute its first mask so the engine never
    /// waits for it.
    pub fn compile(&self, source: &GrammarSource) -> Result<Grammar, GrammarError> {
        let (kind, grammar) = match source {
            GrammarSource::JsonSchema(schema) => ("json_schema", TopLevelGrammar::from_json_schema(bounded(schema))),
            GrammarSource::Gbnf(text) => ("gbnf", TopLevelGrammar::from_lark(gbnf::to_lark(text)?)),
            GrammarSource::Lark(text) => ("lark", TopLevelGrammar::from_lark(text.clone())),
        };
        // A schema is client input: whatever llguidance does with it, the
        // answer is an error, never a panic on the handler's thread.
        let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let parser = self.factory.create_parser(grammar).map_err(|error| error.to_string())?;
            let mut matcher = Matcher::new(Ok(parser));
            let mask = matcher.compute_mask().map_err(|error| error.to_string())?;
            Ok::<_, String>((matcher, mask))
        }));
        let (matcher, mask) = match compiled {
            Ok(result) => result.map_err(GrammarError::Compile)?,
            Err(_) => return Err(GrammarError::Compile(format!("the {kind} grammar could not be compiled"))),
        };
        Ok(Grammar(Arc::new(Compiled { kind, matcher, mask, vocab: self.vocab })))
    }
}

const WHITESPACE: &str = "\\x20|\\x0A[\\x20\\x09]{0,20}";

/// Whitespace between JSON tokens as llama.cpp's schema grammars allow it —
/// one space, or a newline and up to 20 spaces or tabs — unless the schema
/// sets its own (`x-guidance`). llguidance's default allows any run of
/// whitespace, and a small model at a high temperature can then write
/// blanks until its token limit.
fn bounded(schema: &Value) -> Value {
    let mut schema = schema.clone();
    let options = match &mut schema {
        Value::Object(object) => object.entry("x-guidance").or_insert_with(|| Value::Object(Default::default())),
        // `true` (anything) is `{}` with the bound.
        Value::Bool(true) => return bounded(&serde_json::json!({})),
        _ => return schema,
    };
    if let Value::Object(options) = options {
        options.entry("whitespace_pattern").or_insert_with(|| Value::String(WHITESPACE.into()));
    }
    schema
}

/// A compiled grammar, shared by the copies of a request (`n` > 1).
#[derive(Clone)]
pub struct Grammar(Arc<Compiled>);

struct Compiled {
    kind: &'static str,
    matcher: Matcher,
    mask: SimpleVob,
    vocab: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Grammar").field(&self.0.kind).finish()
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Grammar {
    /// A fresh matcher at the grammar's start, for one sequence.
    pub fn start(&self) -> Constraint {
        let compiled = &*self.0;
        Constraint {
            state: State::Ready(Box::new(compiled.matcher.clone()), Ok(compiled.mask.clone())),
            vocab: compiled.vocab,
        }
    }
}

/// Why a constrained row cannot go on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConstraintEnd {
    /// The grammar is complete and end-of-generation is not allowed
    /// (`ignore_eos`), or nothing at all is allowed.
    #[error("the grammar allows no further token")]
    Exhausted,
    #[error("constrained decoding failed: {0}")]
    Failed(String),
}

/// One sequence's matcher: the mask for its next token, or that mask being
/// computed on a worker.
pub struct Constraint {
    state: State,
    vocab: usize,
}

type Computed = (Box<Matcher>, Result<SimpleVob, String>);

enum State {
    Ready(Box<Matcher>, Result<SimpleVob, String>),
    Computing(mpsc::Receiver<Computed>),
    Failed(String),
}

impl Constraint {
    /// Ban every token the grammar does not allow next (`logits` may be
    /// longer than the vocabulary: the padding is banned too).
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), ConstraintEnd> {
        let (_, mask) = self.ready()?;
        let mask = mask.as_ref().map_err(|error| ConstraintEnd::Failed(error.clone()))?;
        if mask.is_zero() {
            return Err(ConstraintEnd::Exhausted);
        }
        mask.iter_unset_entries(|token| {
            if let Some(logit) = logits.get_mut(token) {
                *logit = f32::NEG_INFINITY;
            }
        });
        if let Some(padding) = logits.get_mut(self.vocab..) {
            padding.fill(f32::NEG_INFINITY);
        }
        Ok(())
    }

    /// Advance past a sampled token and start computing the next mask.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintEnd> {
        let (matcher, _) = self.ready()?;
        if let Err(error) = matcher.consume_token(token) {
            let message = error.to_string();
            self.state = State::Failed(message.clone());
            return Err(ConstraintEnd::Failed(message));
        }
        let State::Ready(mut matcher, _) = std::mem::replace(&mut self.state, State::Failed(String::new())) else {
            return Err(ConstraintEnd::Failed("the matcher was not ready".into()));
        };
        let (send, receive) = mpsc::sync_channel(1);
        rayon::spawn(move || {
            // A panic on a rayon worker would abort the process; llguidance
            // catches its own, this is insurance for the rest.
            let mask = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| matcher.compute_mask_or_eos()))
                .map_err(|_| "the mask computation panicked".to_owned())
                .and_then(|mask| mask.map_err(|error| error.to_string()));
            // The sequence may have ended meanwhile; then nobody listens.
            let _ = send.send((matcher, mask));
        });
        self.state = State::Computing(receive);
        Ok(())
    }

    /// How many of `drafts` (in order) the grammar allows.
    pub fn allowed_prefix(&mut self, drafts: &[u32]) -> usize {
        // llguidance fails the whole matcher on an id outside the
        // vocabulary (a drafter over padded logits can propose one): such a
        // draft ends there without asking.
        let known = drafts.iter().position(|&token| token as usize >= self.vocab).unwrap_or(drafts.len());
        match self.ready() {
            Ok((matcher, _)) => matcher.validate_tokens(&drafts[..known]).unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// Whether the grammar is complete: nothing but end-of-generation may
    /// follow.
    pub fn is_finished(&mut self) -> Result<bool, ConstraintEnd> {
        self.ready().map(|(matcher, _)| matcher.is_stopped())
    }

    fn ready(&mut self) -> Result<(&mut Box<Matcher>, &Result<SimpleVob, String>), ConstraintEnd> {
        if let State::Computing(receive) = &self.state {
            self.state = match receive.recv() {
                Ok((matcher, mask)) => State::Ready(matcher, mask),
                Err(_) => State::Failed("the mask worker stopped".into()),
            };
        }
        match &mut self.state {
            State::Ready(matcher, mask) => Ok((matcher, mask)),
            State::Failed(error) => Err(ConstraintEnd::Failed(error.clone())),
            State::Computing(_) => Err(ConstraintEnd::Failed("the mask was not received".into())),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
