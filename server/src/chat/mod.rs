//! What a request's chat input becomes before any engine sees it, the same
//! for every API dialect and independent of the transport: the body's
//! fields read with errors that name them, the conversation rendered by
//! the chat template, the prompt tokenized (images included), the tools a
//! reply may call and how its calls are written and parsed, its reasoning
//! split from its answer, and its structured-output grammar.
//!
//! * [`fields`]: typed access to a JSON body's fields; [`error`]: what can
//!   go wrong, by kind, for the transport to answer.
//! * [`messages`]: the conversation rendered and tokenized, on [`prompt`]
//!   (`prompt` fields, the tokenizer's [`tokenizing`] gate) and [`media`]
//!   (images).
//! * [`tools`]: tool definitions, the tool-call formats, parsing calls out
//!   of replies (streamed or not); [`reasoning`]: think blocks split off
//!   (and [`harmony`]: gpt-oss's channels);
//!   [`structured`]: `grammar`, `json_schema`, `response_format`.
//! * [`ids`]: random ids of responses and calls.

pub mod error;
pub mod fields;
pub mod harmony;
pub mod ids;
pub mod media;
pub mod messages;
pub mod prompt;
pub mod reasoning;
pub mod structured;
pub mod tokenizing;
pub mod tools;

pub use error::Error;
