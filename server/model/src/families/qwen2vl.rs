//! `qwen2vl`: Qwen2-VL's text model. Qwen2's layers with M-RoPE: four
//! position components (temporal, height, width, extra) over contiguous
//! sections of the rotated pairs (`rope.dimension_sections`).

use super::{Family, qwen2, uniform};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, sections};
use crate::layer::LayerKind;
use crate::weights::LoadError;

pub(super) struct Qwen2Vl;

impl Family for Qwen2Vl {
    fn name(&self) -> &'static str {
        "qwen2vl"
    }

    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::MRope(sections(file, "qwen2vl.rope.dimension_sections", n_rot)?))
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok(uniform(hp, qwen2::LAYER))
    }
}
