//! `gemma2`: Gemma 2 text models. Gemma 3's layers without Q/K norms,
//! with soft-capped attention scores (`attn_logit_softcapping`, default
//! 50) and logits (`final_logit_softcapping`, default 30), the LM head
//! always the embedding table, and every layer of the default pattern's
//! even ones local: windows of `attention.sliding_window` (default 4096)
//! positions, RoPE base `rope.freq_base_swa` (default the model's) with
//! the model's frequency scaling.

use super::family::{Family, Outer};
use super::gemma3::{embedding_scale, gemma_q_scale, local_rope_base, own_rope, softcap};
use super::sliding;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle};
use crate::layer::{Attention, Ffn, LayerKind};
use crate::weights::LoadError;

pub(super) struct Gemma2;

impl Family for Gemma2 {
    fn name(&self) -> &'static str {
        "gemma2"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Neox)
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let window = sliding::window(file, "gemma2")?.unwrap_or(4096);
        let windowed = sliding::windowed_layers(file, "gemma2", hp.n_layer, 2)?;
        let local_rope = own_rope(hp, local_rope_base(file, "gemma2", hp.rope_base)?, hp.rope_freq_scale);
        let attention = Attention {
            q_scale: Some(gemma_q_scale(hp, 46)),
            softcap: softcap(file, "gemma2.attn_logit_softcapping", Some(50.0))?,
            ..Attention::full(false, false)
        };
        Ok(windowed
            .into_iter()
            .map(|local| {
                let attention = sliding::layer_attention(attention, local, window, local_rope);
                LayerKind { ffn: Ffn::GeGlu, post_norms: true, ..LayerKind::plain(attention) }
            })
            .collect())
    }

    fn outer(&self, file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        let logit_softcap = softcap(file, "gemma2.final_logit_softcapping", Some(30.0))?;
        Ok(Outer { embed_scale: Some(embedding_scale(hp)), logit_softcap, ..Outer::plain(hp) })
    }
}
