//! The API dialects, each a file: [`completion`] (llama-server's native
//! `/completion`), [`openai`] (`/v1/completions`, `/v1/chat/completions`),
//! [`anthropic`] (`/v1/messages`), [`responses`] (`/v1/responses` and the
//! `input_tokens` counts) and [`vertex`] (Vertex AI's prediction route,
//! which hands each instance to the others). The chat dialects read their
//! bodies through one pipeline, [`chat`], on the transport-independent
//! `crate::chat`.

pub mod anthropic;
pub mod chat;
pub mod completion;
pub mod openai;
pub mod responses;
pub mod vertex;
