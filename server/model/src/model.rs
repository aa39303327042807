//! What the engine and the drafters hold of a loaded model, whatever its
//! family or backend.

use std::sync::Arc;

use sluice_kernels::backend::{BackendError, KvTypes};

use super::batch::{Context, ForwardError};
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::lora::AdapterInfo;
use super::vision;
use super::weights::LoadError;

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

    /// The longest window of the layers that attend through one: the cells
    /// each sequence needs of them. `None` when every layer sees the whole
    /// sequence.
    fn kv_window(&self) -> Option<usize> {
        None
    }

    /// Bytes of one sequence's recurrent state (every recurrent layer's),
    /// or `None` when no layer carries one: a context keeps a state per
    /// state slot its batches name (`Batch::states`), which cannot be
    /// rolled back to an earlier cell.
    fn recurrent_state_bytes(&self) -> Option<usize> {
        None
    }

    /// [`Model::context`] whose window layers (if any) keep their cells in
    /// a store of `window_blocks` blocks of their own, addressed by each
    /// batch's `window_tables` (see [`crate::window`]); a model without
    /// window layers ignores it.
    fn windowed_context(
        self: Arc<Self>,
        n_blocks: usize,
        _window_blocks: usize,
        block_tokens: usize,
        types: KvTypes,
    ) -> Result<Box<dyn Context>, BackendError> {
        self.context(n_blocks, block_tokens, types)
    }

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
