//! `qwen2`: Qwen2 and Qwen2.5 text models. NEOX RoPE, biases on the Q, K
//! and V projections.

use super::{Family, uniform};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle};
use crate::layer::{Attention, Ffn, LayerKind, Mixer};
use crate::weights::LoadError;

/// Every Qwen2 layer (Qwen2-VL's text layers too).
pub(super) const LAYER: LayerKind =
    LayerKind { mixer: Mixer::Attention(Attention { qkv_bias: true, qk_norm: false }), ffn: Ffn::SwiGlu };

pub(super) struct Qwen2;

impl Family for Qwen2 {
    fn name(&self) -> &'static str {
        "qwen2"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Neox)
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok(uniform(hp, LAYER))
    }
}
