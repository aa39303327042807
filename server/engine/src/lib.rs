//! The engine: the step loop on its own thread (queue, slots, step, batch,
//! KV cache, sampling), the policy supervisor, and draft decoding. It
//! computes through [`sluice_model::Model`] and takes decisions from any
//! [`policy::SchedulingPolicy`]; it knows neither devices nor plugins.
//!
//! What the layers above use: [`EngineHandle::start`] with an
//! [`EngineConfig`], a model and a policy, then `submit` a
//! [`request::GenerationRequest`] and read its events
//! ([`delivery::EventReceiver`]); the policy seam ([`policy`]) and the
//! [`supervisor`]'s fault rules; [`sampling`], [`constraint`] (grammars
//! over a vocabulary) and [`speculative`] (drafters); [`trace`],
//! [`shadow`], [`step_cost`], [`metrics`] and [`slot_store`] for what the
//! server shows and saves. With feature `testing`, `constraint::testing` and
//! `step_cost::testing` hold helpers for the tests of the crates above.
//!
//! Files: `handle` (the public face) and `core` (the loop) share only
//! `state`; `supervisor` gets each step's decision; `batch` assembles the
//! pass, `emit` samples, stops and verifies drafts, `shift` makes room in a
//! full context, `drafting` talks to the drafter; `slot_store` saves and
//! restores slots' caches; `delivery` carries each request's events and
//! keeps the queue's count; `adapters` numbers LoRA configurations and
//! keys their KV; `shadow` runs candidate policies beside the active one,
//! `trace` records the steps, and `step_cost` fits what a step costs to the
//! steps run (every view carries the fit).

pub mod adapters;
mod batch;
pub mod constraint;
mod core;
pub mod delivery;
mod drafting;
mod emit;
mod handle;
pub mod kv;
pub mod metrics;
mod pinning;
pub mod policy;
pub mod request;
pub mod sampling;
pub mod shadow;
mod shift;
mod slot;
pub mod slot_store;
pub mod speculative;
mod state;
mod state_cache;
pub mod step_cost;
pub mod supervisor;
pub mod text;
pub mod trace;

pub use handle::{EngineHandle, EngineStartError, SubmitError};
pub use state::{EngineConfig, Promoted, Shared, SlotInfo};
pub use supervisor::{FallbackPolicy, FaultAction, FaultEvent, FaultRules, Health, OnFault};
