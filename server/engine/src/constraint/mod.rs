//! Constrained decoding (structured outputs): a request's grammar — a JSON
//! schema, a GBNF grammar (translated by `gbnf`) or llguidance's own Lark
//! — compiled by the `llguidance` crate against the model's vocabulary, then
//! one token mask per step applied to that request's logits before its
//! sampler chain.
//!
//! The mask depends only on the tokens the request committed, so a
//! constrained row samples the same alone or batched, streamed or not; rows
//! without a grammar are never touched. After each committed token the
//! matcher takes it and computes the next mask on a grammar thread while
//! the engine runs the forward pass, and the engine only waits for it when
//! it samples that row again.
//!
//! A grammar is checked against `limits` before llguidance sees it, and
//! everything llguidance does runs on `workers`' threads, whose stacks
//! hold what those limits allow. What llguidance says about a grammar
//! reaches the client as its first line only: the rest is a dump of the
//! parser's state, a panic's backtrace or the grammar itself, which go to
//! the log.

mod gbnf;
pub mod limits;
mod vocabulary;
mod workers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::SimpleVob;

pub use gbnf::GbnfError;
pub use limits::LimitError;
pub use workers::STACK;
use workers::Workers;

use sluice_model::tokenizer::Tokenizer;

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
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The first line of llguidance's message, which names the rule,
    /// keyword or position.
    #[error("{0}")]
    Compile(String),
    /// The compiler failed in a way that says nothing about the grammar
    /// (a panic); the detail is logged under `id`.
    #[error("the grammar compiler failed (error id {id}; the detail is in the server log)")]
    Internal { id: String },
    #[error("the vocabulary cannot be indexed for constrained decoding: {0}")]
    Vocabulary(String),
    /// The grammar threads could not be started.
    #[error("{0}")]
    Threads(String),
}

/// The grammar compiler of one model: its vocabulary indexed once at start.
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
    workers: Arc<Workers>,
}

impl Grammars {
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, GrammarError> {
        Self::with_stack(tokenizer, STACK)
    }

    /// [`Grammars::new`] with grammar threads of `stack` bytes (the fuzz
    /// target runs on the least the limits need, so that an overflow
    /// shows).
    pub fn with_stack(tokenizer: &Tokenizer, stack: usize) -> Result<Self, GrammarError> {
        let env = vocabulary::environment(tokenizer).map_err(GrammarError::Vocabulary)?;
        let vocab = env.tok_trie().vocab_size();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|error| GrammarError::Vocabulary(error.to_string()))?;
        // llguidance logs grammar warnings to stderr by default; the error
        // that matters reaches the client.
        factory.quiet();
        let limits = factory.limits_mut();
        limits.max_grammar_size = limits::MAX_SYMBOLS;
        // The parser's state and the whole grammar after each message:
        // costly to write for a large grammar, and not for the client.
        limits.verbose_errors = false;
        let workers = Workers::new(stack).map_err(GrammarError::Threads)?;
        Ok(Grammars { factory, vocab, workers: Arc::new(workers) })
    }

    /// Compile `source`, and compute its first mask so the engine never
    /// waits for it. Runs on a compile thread: the caller waits.
    pub fn compile(&self, source: &GrammarSource) -> Result<Grammar, GrammarError> {
        self.workers.compile.install(|| self.compile_here(source))
    }

    fn compile_here(&self, source: &GrammarSource) -> Result<Grammar, GrammarError> {
        let (kind, grammar) = match source {
            GrammarSource::JsonSchema(schema) => {
                limits::schema(schema)?;
                ("json_schema", TopLevelGrammar::from_json_schema(bounded(schema)))
            }
            GrammarSource::Gbnf(text) => {
                let lark = gbnf::to_lark(text)?;
                limits::lark(&lark)?;
                ("gbnf", TopLevelGrammar::from_lark(lark))
            }
            GrammarSource::Lark(text) => {
                limits::lark(text)?;
                ("lark", TopLevelGrammar::from_lark(text.clone()))
            }
        };
        // llguidance catches its own panics and returns them as messages;
        // this catches the rest.
        let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let parser = self.factory.create_parser(grammar).map_err(|error| error.to_string())?;
            let mut matcher = Matcher::new(Ok(parser));
            match matcher.compute_mask().map_err(|error| error.to_string()) {
                Ok(mask) => Ok(Some((matcher, mask))),
                Err(detail) if allows_nothing(&detail) => Ok(None),
                Err(detail) => Err(detail),
            }
        }));
        let (matcher, mask) = match compiled {
            Ok(Ok(Some(compiled))) => compiled,
            Ok(Ok(None)) => {
                return Err(GrammarError::Compile(
                    "the grammar allows no output at all: its start derives no text (as `root ::= root` does)".into(),
                ));
            }
            Ok(Err(detail)) => {
                return Err(match client_message(&detail) {
                    Some(message) => {
                        tracing::debug!(kind, %detail, "grammar refused");
                        GrammarError::Compile(message)
                    }
                    None => GrammarError::Internal { id: logged(kind, &detail) },
                });
            }
            Err(_) => {
                return Err(GrammarError::Internal { id: logged(kind, "a panic outside llguidance's own catch") });
            }
        };
        let workers = Arc::clone(&self.workers);
        Ok(Grammar(Arc::new(Compiled { kind, matcher, mask, vocab: self.vocab, workers })))
    }
}

/// Whether llguidance's message `detail` says that no token at all can
/// follow (it is the stop reason alone): not a failure of the parser but
/// the end of what the grammar allows.
fn allows_nothing(detail: &str) -> bool {
    detail.lines().next() == Some(StopReason::NoExtensionBias.to_string().as_str())
}

/// What of llguidance's message `detail` a client may see: its first line
/// (the rest is the parser's state, the grammar or a backtrace), or
/// nothing when it is a panic, which says nothing about the grammar.
fn client_message(detail: &str) -> Option<String> {
    const LONGEST: usize = 300;
    let first = detail.lines().next().unwrap_or_default().trim();
    if first.is_empty() || first.starts_with("panic") || first.contains("panicked") {
        return None;
    }
    Some(match first.char_indices().nth(LONGEST) {
        Some((at, _)) => format!("{}…", &first[..at]),
        None => first.to_owned(),
    })
}

/// Log a failure that the client is told only by id; the id.
fn logged(kind: &str, detail: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = format!("grammar-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    tracing::warn!(%id, kind, %detail, "grammar work failed");
    id
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
    workers: Arc<Workers>,
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
            kind: compiled.kind,
            state: State::Ready(Box::new(compiled.matcher.clone()), Ok(compiled.mask.clone())),
            vocab: compiled.vocab,
            workers: Arc::clone(&compiled.workers),
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
    kind: &'static str,
    state: State,
    vocab: usize,
    workers: Arc<Workers>,
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

    /// Start advancing past a sampled token and computing the next mask,
    /// on a grammar thread; a failure shows when the mask is next wanted.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintEnd> {
        if let (_, Err(error)) = self.ready()? {
            return Err(ConstraintEnd::Failed(error.clone()));
        }
        let State::Ready(mut matcher, _) = std::mem::replace(&mut self.state, State::Failed(String::new())) else {
            return Err(ConstraintEnd::Failed("the matcher was not ready".into()));
        };
        let (send, receive) = mpsc::sync_channel(1);
        let (kind, vocab) = (self.kind, self.vocab);
        self.workers.steps.spawn(move || {
            // A panic on a pool thread would abort the process; llguidance
            // catches its own, this is insurance for the rest.
            let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                matcher.consume_token(token)?;
                matcher.compute_mask_or_eos()
            }));
            let mask = match step.map(|mask| mask.map_err(|error| error.to_string())) {
                Ok(Ok(mask)) => Ok(mask),
                // A dead end: an empty mask ends the row as exhausted.
                Ok(Err(detail)) if allows_nothing(&detail) => Ok(SimpleVob::alloc(vocab)),
                Ok(Err(detail)) => Err(step_failure(kind, &detail)),
                Err(_) => Err(step_failure(kind, "panic outside llguidance's own catch")),
            };
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
        let steps = Arc::clone(&self.workers);
        match self.ready() {
            Ok((matcher, _)) => steps.steps.install(|| matcher.validate_tokens(&drafts[..known]).unwrap_or(0)),
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

/// What the client is told of a failed step: the first line of
/// llguidance's message (a limit of its parser, usually) and an id under
/// which the whole message is logged.
fn step_failure(kind: &str, detail: &str) -> String {
    let id = logged(kind, detail);
    match client_message(detail) {
        Some(message) => format!("{message} (error id {id})"),
        None => format!("the grammar's next-token mask could not be computed (error id {id})"),
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
