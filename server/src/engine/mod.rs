//! The engine: the step loop on its own thread (queue, slots, step, batch,
//! KV cache, sampling). Its seams come first; the loop follows with the model.

mod core;
mod handle;
pub mod kv;
pub mod metrics;
pub mod policy;
pub mod request;
pub mod sampling;
pub mod speculative;
pub mod text;
pub mod validate;

pub use handle::{EngineConfig, EngineHandle, FallbackPolicy, Health, Shared, SlotInfo, SubmitError};
