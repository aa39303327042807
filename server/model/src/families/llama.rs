//! `llama`: Llama 2 and 3 and the many models converted to their layout.
//! RoPE rotates adjacent pairs (the converter permutes Q and K to match);
//! a file with Q/K/V biases has them applied.

use super::family::Uniform;
use crate::hparams::RopeStyle;
use crate::layer::{Attention, LayerKind};

pub(super) const LLAMA: Uniform =
    Uniform { name: "llama", rope: |_, _| Ok(RopeStyle::Norm), layer: LayerKind::plain(Attention::full(false, false)) };
