//! `llama`: Llama 2 and 3 and the many models converted to their layout.
//! RoPE rotates adjacent pairs (the converter permutes Q and K to match);
//! a file with Q/K/V biases has them applied.

use super::{Family, uniform};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle};
use crate::layer::{Attention, Ffn, LayerKind, Mixer};
use crate::weights::LoadError;

pub(super) struct Llama;

impl Family for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Norm)
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let attention = Attention { qkv_bias: false, qk_norm: false };
        Ok(uniform(hp, LayerKind { mixer: Mixer::Attention(attention), ffn: Ffn::SwiGlu }))
    }
}
