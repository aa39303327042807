//! `qwen2moe`: Qwen1.5-MoE and Qwen2-57B-A14B. Qwen2's attention (NEOX
//! RoPE, Q/K/V biases) and a feed-forward of experts whose chosen
//! probabilities are used as they are (not renormalized), plus a shared
//! expert on every row scaled by the sigmoid of its own gate.

use super::experts::{Layout, Moe};
use crate::hparams::RopeStyle;
use crate::layer::Attention;

pub(super) const QWEN2MOE: Moe = Moe {
    name: "qwen2moe",
    rope: |_, _| Ok(RopeStyle::Neox),
    attention: Attention::full(true, false),
    layout: Layout { shared: true, ..Layout::PLAIN },
};
