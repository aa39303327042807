//! `phi3`: Phi-3, Phi-3.5, Phi-4 and Phi-4-mini. NEOX RoPE, over part of
//! each head where `rope.dimension_count` says so (Phi-4-mini); Q scaled
//! by `1/√head_dim` after RoPE instead of the scores, as llama.cpp rounds;
//! Q|K|V fused in `attn_qkv` and gate|up in `ffn_up` (or separate
//! tensors); tied embeddings unless the file has `output.weight`.
//! LongRoPE models carry `rope_factors_long/short.weight`, picked by the
//! served context (`crate::rope`). Every layer attends to the whole
//! sequence: llama.cpp ignores the `attention.sliding_window` Phi-3 files
//! declare, and so does sluice.

use super::family::Family;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle};
use crate::layer::{Attention, LayerKind};
use crate::weights::LoadError;

pub(super) struct Phi3;

impl Family for Phi3 {
    fn name(&self) -> &'static str {
        "phi3"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Neox)
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let attention = Attention { q_scale: Some(1.0 / (hp.head_dim as f32).sqrt()), ..Attention::full(false, false) };
        Ok(vec![LayerKind::plain(attention); hp.n_layer])
    }
}
