//! `qwen3vl`: Qwen3-VL's text model. Qwen3's layers with interleaved
//! M-RoPE: the position components take turns over the rotated pairs.

use super::family::Uniform;
use super::qwen3;
use crate::hparams::{RopeStyle, sections};

pub(super) const QWEN3VL: Uniform = Uniform {
    name: "qwen3vl",
    rope: |file, n_rot| Ok(RopeStyle::IMRope(sections(file, "qwen3vl.rope.dimension_sections", n_rot)?)),
    layer: qwen3::QWEN3.layer,
};
