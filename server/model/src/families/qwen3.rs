//! `qwen3`: Qwen3 dense text models. NEOX RoPE, an RMSNorm on every Q and
//! K head before rotation, no biases.

use super::family::Uniform;
use crate::hparams::RopeStyle;
use crate::layer::{Attention, Ffn, LayerKind, Mixer};

pub(super) const QWEN3: Uniform = Uniform {
    name: "qwen3",
    rope: |_, _| Ok(RopeStyle::Neox),
    layer: LayerKind { mixer: Mixer::Attention(Attention { qkv_bias: false, qk_norm: true }), ffn: Ffn::SwiGlu },
};
