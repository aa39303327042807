//! `gpt-oss`: OpenAI's open-weight mixtures of experts (gpt-oss-20b and
//! -120b). NEOX RoPE (YaRN in the published files), Q/K/V and output
//! biases, a learned sink per query head, every layer of the default
//! pattern's even ones local (windows of `attention.sliding_window`, RoPE
//! base `rope.freq_base_swa` where the file sets one), and experts with
//! biases, chosen by their raw scores and weighed by a softmax over the
//! chosen, each a clamped SwiGLU. The feed-forward's pre-norm is the file's
//! `post_attention_norm`.

use super::experts::{Layout, experts};
use super::family::Family;
use super::gemma3::{local_rope_base, own_rope};
use super::sliding;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, invalid};
use crate::layer::{Attention, ExpertMlp, Ffn, Gating, LayerKind};
use crate::weights::LoadError;

pub(super) struct GptOss;

const NAME: &str = "gpt-oss";

const LAYOUT: Layout =
    Layout { gating: Gating::SoftmaxOfChosen, mlp: ExpertMlp::ClampedSwiGlu, biases: true, ..Layout::PLAIN };

impl Family for GptOss {
    fn name(&self) -> &'static str {
        NAME
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Neox)
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let window_key = format!("{NAME}.attention.sliding_window");
        let window = sliding::window(file, NAME)?
            .ok_or_else(|| invalid(&window_key, "absent", "a gpt-oss model has local layers".into()))?;
        let windowed = sliding::windowed_layers(file, NAME, hp.n_layer, 2)?;
        let count_key = format!("{NAME}.expert_count");
        let experts = experts(file, NAME, hp, LAYOUT)?
            .ok_or_else(|| invalid(&count_key, "absent", "a gpt-oss model has experts".into()))?;
        let local_rope = own_rope(hp, local_rope_base(file, NAME, hp.rope_base)?, hp.rope_freq_scale);
        let attention = Attention {
            // llama.cpp scales by the rotated width.
            score_scale: Some(1.0 / (hp.n_rot as f32).sqrt()),
            output_bias: true,
            sinks: true,
            ..Attention::full(true, false)
        };
        Ok(windowed
            .into_iter()
            .map(|local| {
                let attention = sliding::layer_attention(attention, local, window, local_rope);
                LayerKind {
                    ffn: Ffn::Experts(experts),
                    ffn_norm: "post_attention_norm.weight",
                    ..LayerKind::plain(attention)
                }
            })
            .collect())
    }
}
