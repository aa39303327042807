//! The HTTP API: llama-server's endpoints, fields, response shapes, SSE
//! framing and errors, on axum. One module per API family:
//!
//! * [`completion`]: `/completion` (native); [`openai`]: `/v1/completions`,
//!   `/v1/chat/completions`; [`anthropic`]: `/v1/messages`; [`responses`]:
//!   `/v1/responses` and the `input_tokens` counts; all on [`generate`]
//!   (engine submission, results, shared JSON), [`params`] (request fields),
//!   [`prompt`], [`reasoning`] (chat replies' thinking split out) and
//!   [`sse`] (streams).
//! * [`tokenize`]: `/tokenize`, `/detokenize`, `/apply-template`.
//! * [`info`]: `/health`, `/props`, `/v1/models`, `/slots`, `/metrics`;
//!   [`slot_files`]: `/slots/{id}?action=save|restore|erase`.
//! * [`admin`]: `/admin/policy`, policy (re)loading; shadow policies.
//! * [`lora`]: `/lora-adapters` and the adapters of a request.
//! * [`vertex`]: Vertex AI's prediction route (`AIP_MODE=PREDICTION`).
//! * [`auth`], [`error`]; [`server`]: listening, loading the model, signals.
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
