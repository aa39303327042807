//! `qwen3`: Qwen3 dense text models. NEOX RoPE, an RMSNorm on every Q and
//! K head before rotation, no biases.

use super::family::Uniform;
use crate::hparams::RopeStyle;
use crate::layer::{Attention, LayerKind};

pub(super) const QWEN3: Uniform =
    Uniform { name: "qwen3", rope: |_, _| Ok(RopeStyle::Neox), layer: LayerKind::plain(Attention::full(false, true)) };
