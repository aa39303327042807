//! `qwen3moe`: Qwen3 mixture-of-experts text models (Qwen3-30B-A3B,
//! Qwen3-235B-A22B, Qwen3-Coder). Qwen3's attention (NEOX RoPE, Q/K norms)
//! and a feed-forward of experts: a softmax over the router's scores, the
//! `expert_used_count` most probable experts, their probabilities
//! renormalized to sum to one.

use super::experts::{Layout, Moe};
use crate::hparams::RopeStyle;
use crate::layer::Attention;

pub(super) const QWEN3MOE: Moe = Moe {
    name: "qwen3moe",
    rope: |_, _| Ok(RopeStyle::Neox),
    attention: Attention::full(false, true),
    layout: Layout { normalized: true, ..Layout::PLAIN },
};
