//! `qwen2vl`: Qwen2-VL's text model. Qwen2's layers with M-RoPE: four
//! position components (temporal, height, width, extra) over contiguous
//! sections of the rotated pairs (`rope.dimension_sections`).

use super::family::Uniform;
use super::qwen2;
use crate::hparams::{RopeStyle, sections};

pub(super) const QWEN2VL: Uniform = Uniform {
    name: "qwen2vl",
    rope: |file, n_rot| Ok(RopeStyle::MRope(sections(file, "qwen2vl.rope.dimension_sections", n_rot)?)),
    layer: qwen2::QWEN2.layer,
};
