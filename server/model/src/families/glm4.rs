//! `glm4`: GLM-4-0414 text models. Adjacent-pair RoPE over the first
//! `rope.dimension_count` elements of each head (the rest pass unrotated);
//! Q/K/V biases where the file has them; every block's output RMS-normed
//! before its residual add; gate and up fused in `ffn_up`; tied embeddings
//! unless the file has `output.weight`. The trailing
//! `nextn_predict_layers` layers (multi-token prediction) are not run.

use super::family::Uniform;
use crate::gguf::GgufFile;
use crate::hparams::{HParamsError, RopeStyle, invalid};
use crate::layer::{Attention, LayerKind};

pub(super) const GLM4: Uniform = Uniform {
    name: "glm4",
    rope: text_rope,
    layer: LayerKind { post_norms: true, ..LayerKind::plain(Attention::full(false, false)) },
};

/// GLM-4V's files name M-RoPE sections; its vision path is not run.
fn text_rope(file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
    let key = "glm4.rope.dimension_sections";
    match file.get(key) {
        Some(_) => Err(invalid(key, "present", "M-RoPE (GLM-4V) is not supported".into())),
        None => Ok(RopeStyle::Norm),
    }
}
