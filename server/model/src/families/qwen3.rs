//! `qwen3`: Qwen3 dense text models. NEOX RoPE, an RMSNorm on every Q and
//! K head before rotation, no biases.

use super::{Family, uniform};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle};
use crate::layer::{Attention, Ffn, LayerKind, Mixer};
use crate::weights::LoadError;

/// Every Qwen3 layer (Qwen3-VL's text layers and DFlash drafts' too).
pub(super) const LAYER: LayerKind =
    LayerKind { mixer: Mixer::Attention(Attention { qkv_bias: false, qk_norm: true }), ffn: Ffn::SwiGlu };

pub(super) struct Qwen3;

impl Family for Qwen3 {
    fn name(&self) -> &'static str {
        "qwen3"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Neox)
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok(uniform(hp, LAYER))
    }
}
