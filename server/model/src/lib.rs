//! sluice's models: the GGUF reader, hyper-parameters, tokenizers, chat
//! templates, the model families and their forward passes, computed through
//! a [`Backend`](sluice_kernels::backend::Backend), and vision towers.
//!
//! The engine and the drafters see a model only through [`Model`] and its
//! [`Context`]s, which name no device: the backend a model was loaded on
//! (the server's start-up picks it) does the arithmetic.
//!
//! What the layers above use:
//! - loading: [`Transformer::load`] (or `from_file`, `with_adapters`) gives a
//!   [`Model`]; [`LoadError`] says why not;
//! - running: [`Model::context`] → [`Context::forward`] over a
//!   [`batch::Batch`] (built by [`batch::Layout`] or
//!   [`batch::forward_in_parts`]), giving a [`ForwardOutput`] or a
//!   [`ForwardError`]; [`session::Session`] runs one sequence for the CLI;
//! - reading files: [`gguf::GgufFile`], [`hparams::HParams`],
//!   [`dflash::DflashParams`];
//! - text: [`tokenizer::Tokenizer`] and [`chat_template::ChatTemplate`];
//! - images: [`vision`] (preprocessing and the [`vision::Encoder`] seam).
//!
//! Inside, a family is one file in `families/` declaring its layers'
//! kinds (`layer.rs`), composed from the shared blocks of `blocks/`
//! (docs/architecture.md, "Model families and layers").

pub mod batch;
mod blocks;
pub mod chat_template;
pub mod dflash;
mod families;
mod forward;
pub mod gguf;
pub mod hparams;
mod layer;
mod lora;
pub mod session;
pub mod tokenizer;
mod transformer;
pub mod vision;
mod weights;

use std::sync::Arc;

use sluice_kernels::backend::{BackendError, KvBlockFormat, KvTypes};

pub use batch::{ForwardError, ForwardOutput};
pub use lora::AdapterInfo;
pub use transformer::Transformer;
pub use weights::LoadError;

use batch::Batch;
use gguf::GgufFile;
use hparams::HParams;

/// A loaded model on its backend.
pub trait Model: Send + Sync {
    fn hparams(&self) -> &HParams;

    /// The GGUF file it was loaded from (metadata for tokenizers, templates).
    fn file(&self) -> &GgufFile;

    /// The backend it computes on, for the log.
    fn describe(&self) -> String;

    /// Its LoRA adapters, by id.
    fn adapters(&self) -> Vec<&AdapterInfo>;

    /// A context for running sequences: a KV store of `n_blocks` blocks of
    /// `block_tokens` cells holding keys and values as `types` says, and
    /// the buffers of a pass.
    fn context(
        self: Arc<Self>,
        n_blocks: usize,
        block_tokens: usize,
        types: KvTypes,
    ) -> Result<Box<dyn Context>, BackendError>;

    /// Another model (a draft) loaded onto the same backend and threads; a
    /// DFlash draft without an embedding table or LM head of its own uses
    /// this model's.
    fn load_sibling(&self, file: GgufFile) -> Result<Arc<dyn Model>, LoadError>;

    /// A vision tower (projector file) on the same backend and threads,
    /// its output as wide as this model's embeddings.
    fn load_projector(&self, file: &GgufFile) -> Result<Arc<dyn vision::Encoder>, LoadError>;

    /// A DFlash draft's fused context features for `n` rows of
    /// concatenated target taps.
    fn fuse(&self, taps: &[f32], n: usize) -> Result<Vec<f32>, ForwardError>;
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

    /// How [`Context::read_block`] lays out a block.
    fn block_format(&self) -> KvBlockFormat;

    /// A KV block's raw bytes, every layer (a saved slot).
    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError>;

    /// Put back bytes [`Context::read_block`] gave, into any block.
    fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), BackendError>;
}
