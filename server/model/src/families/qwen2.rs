//! `qwen2`: Qwen2 and Qwen2.5 text models. NEOX RoPE, biases on the Q, K
//! and V projections.

use super::family::Uniform;
use crate::hparams::RopeStyle;
use crate::layer::{Attention, LayerKind};

pub(super) const QWEN2: Uniform =
    Uniform { name: "qwen2", rope: |_, _| Ok(RopeStyle::Neox), layer: LayerKind::plain(Attention::full(true, false)) };
