//! The HTTP API: llama-server's endpoints, fields, response shapes, SSE
//! framing and errors, on axum. Only [`serve`] and [`server::Launch`] are
//! public; everything else is the crate's own.
//!
//! * [`server`]: listening, loading the model, signals; `listen` and
//!   `conn`: connections and their deadlines; `routes`: the route table
//!   and the layers every request passes (`auth`, `cors`, the loading
//!   gate, the body limit); `state`: what every handler shares.
//! * `api`: the API dialects (native completion, OpenAI, Anthropic,
//!   Responses, Vertex AI), on `params` (the generation fields),
//!   `generate` (engine submission, results, shared JSON), `probs`,
//!   `spliced` (answers written in place) and `sse` (streams); their
//!   chat input comes from `crate::chat`.
//! * `tokenize`: `/tokenize`, `/detokenize`, `/apply-template`.
//! * `info`: `/health`, `/props`, `/v1/models`, `/slots`, `/metrics`;
//!   `slot_files`: `/slots/{id}?action=save|restore|erase`.
//! * `admin`: `/admin/policy`, policy (re)loading, shadow policies, on
//!   `policies`.
//! * `lora`: `/lora-adapters`, on `adapters` (also a request's own).
//! * `bodies` and `extract`: request bodies, within their memory
//!   budget; `error`: every error answer.
//!
//! Until the model is loaded every path answers 503 "Loading model".

mod adapters;
mod admin;
mod api;
mod auth;
mod bodies;
mod conn;
mod cors;
mod error;
mod extract;
mod generate;
mod info;
mod listen;
mod lora;
mod params;
mod policies;
mod probs;
mod routes;
pub mod server;
mod slot_files;
mod spliced;
mod sse;
mod state;
mod tokenize;

pub use server::{StartError, serve};
