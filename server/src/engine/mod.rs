//! The engine: the step loop on its own thread (queue, slots, step, batch,
//! KV cache, sampling). Its seams come first; the loop follows with the model.

pub mod policy;
