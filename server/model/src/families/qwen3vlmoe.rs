//! `qwen3vlmoe`: Qwen3-VL-MoE's text model (Qwen3-VL-30B-A3B,
//! -235B-A22B). Qwen3-MoE's layers with interleaved M-RoPE: the position
//! components take turns over the rotated pairs. The DeepStack features an
//! image adds to the first layers' outputs are zero for text rows, so a
//! text prompt runs exactly these layers.

use super::experts::Moe;
use super::qwen3moe::QWEN3MOE;
use crate::hparams::{RopeStyle, sections};

pub(super) const QWEN3VLMOE: Moe = Moe {
    name: "qwen3vlmoe",
    rope: |file, n_rot| Ok(RopeStyle::IMRope(sections(file, "qwen3vlmoe.rope.dimension_sections", n_rot)?)),
    ..QWEN3MOE
};
