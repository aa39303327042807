//! `qwen3vl`: Qwen3-VL's text model. Qwen3's layers with interleaved
//! M-RoPE: the position components take turns over the rotated pairs.

use super::{Family, qwen3, uniform};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, sections};
use crate::layer::LayerKind;
use crate::weights::LoadError;

pub(super) struct Qwen3Vl;

impl Family for Qwen3Vl {
    fn name(&self) -> &'static str {
        "qwen3vl"
    }

    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::IMRope(sections(file, "qwen3vl.rope.dimension_sections", n_rot)?))
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok(uniform(hp, qwen3::LAYER))
    }
}
