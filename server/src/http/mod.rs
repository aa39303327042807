//! The HTTP API: llama-server's endpoints, fields, response shapes, SSE
//! framing and errors, on axum.
//!
//! * [`server`]: listening, loading the model, signals; `listen` and
//!   `conn`: connections and their deadlines; [`routes`]: the route table
//!   and the layers every request passes ([`auth`], `cors`, the loading
//!   gate, the body limit); [`state`]: what every handler shares.
//! * [`api`]: the API dialects (native completion, OpenAI, Anthropic,
//!   Responses, Vertex AI), on [`params`] (the generation fields),
//!   [`generate`] (engine submission, results, shared JSON), [`probs`],
//!   [`spliced`] (answers written in place) and [`sse`] (streams); their
//!   chat input comes from `crate::chat`.
//! * [`tokenize`]: `/tokenize`, `/detokenize`, `/apply-template`.
//! * [`info`]: `/health`, `/props`, `/v1/models`, `/slots`, `/metrics`;
//!   [`slot_files`]: `/slots/{id}?action=save|restore|erase`.
//! * [`admin`]: `/admin/policy`, policy (re)loading, shadow policies, on
//!   [`policies`].
//! * [`lora`]: `/lora-adapters`, on [`adapters`] (also a request's own).
//! * `bodies` and [`extract`]: request bodies, within their memory
//!   budget; [`error`]: every error answer.
//!
//! Until the model is loaded every path answers 503 "Loading model".

pub mod adapters;
pub mod admin;
pub mod api;
pub mod auth;
mod bodies;
mod conn;
mod cors;
pub mod error;
pub mod extract;
pub mod generate;
pub mod info;
mod listen;
pub mod lora;
pub mod params;
pub mod policies;
pub mod probs;
pub mod routes;
pub mod server;
pub mod slot_files;
pub mod spliced;
pub mod sse;
pub mod state;
pub mod tokenize;

pub use server::{StartError, serve};
pub use state::{AppState, ModelInfo, Ready};
