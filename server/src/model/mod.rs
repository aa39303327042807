//! Models: the GGUF reader, hyper-parameters, tokenizers, chat templates and
//! the architectures' forward passes, computed through a
//! [`Backend`](sluice_kernels::backend::Backend).
//!
//! The engine and the drafters see a model only through [`Model`] and its
//! [`Context`]s, which name no device: the backend a model was loaded on
//! (see `startup`) does the arithmetic.

pub mod batch;
pub mod chat_template;
pub mod dflash;
mod forward;
pub mod gguf;
pub mod hparams;
pub mod session;
pub mod tokenizer;
pub mod transformer;

use std::sync::Arc;

pub use forward::{ForwardError, ForwardOutput};
pub use transformer::{LoadError, Transformer};

use batch::Batch;
use gguf::GgufFile;
use hparams::HParams;

/// A loaded model on its backend.
pub trait Model: Send + Sync {
    fn hparams(&self) -> &HParams;

    /// The GGUF file it was loaded from (metadata for tokenizers, templates).
    fn file(&self) -> &GgufFile;

    /// The backend it computes on, for the log.
    fn backend(&self) -> String;

    /// A context for running sequences: a KV store of `n_blocks` blocks of
    /// `block_tokens` cells, and the buffers of a pass.
    fn context(self: Arc<Self>, n_blocks: usize, block_tokens: usize) -> Box<dyn Context>;

    /// Another model (a draft) loaded onto the same backend and threads.
    fn load_sibling(&self, file: GgufFile) -> Result<Arc<dyn Model>, LoadError>;

    /// Write token `token`'s embedding row into `dst` (n_embd); `false` if
    /// the model has no embeddings or the token is out of range.
    fn embed(&self, token: u32, dst: &mut [f32]) -> bool;

    /// Whether the model has its own LM head.
    fn has_lm_head(&self) -> bool;

    /// Logits of `m` final-normed hidden rows (n_embd each) through this
    /// model's LM head; empty if it has none.
    fn lm_head(&self, hidden: &[f32], m: usize) -> Vec<f32>;

    /// A DFlash draft's fused context features for `n` rows of
    /// concatenated target taps; `None` for other models.
    fn fuse(&self, taps: &[f32], n: usize) -> Option<Vec<f32>>;
}

/// A model's KV store and working buffers.
pub trait Context: Send {
    /// Run the rows of `batch`, writing their K/V into this context.
    fn forward(&mut self, batch: &Batch) -> Result<ForwardOutput, ForwardError>;

    /// DFlash context injection: write K/V for rows of fused features (in
    /// embedding row i for row i) without running attention or the
    /// feed-forward.
    fn inject(&mut self, batch: &Batch) -> Result<(), ForwardError>;

    /// Copy a KV block (copy-on-write of a shared partial block).
    fn copy_block(&mut self, from: u32, to: u32);
}
