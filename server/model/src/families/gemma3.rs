//! `gemma3`: Gemma 3 text models (a file's text path; a vision tower
//! comes as a separate projector file). NEOX RoPE; per-head Q/K norms; Q
//! scaled after RoPE instead of the scores; every block's output RMS-normed
//! before its residual add; a GELU-gated MLP; token embeddings times
//! `√n_embd`; tied embeddings unless the file has `output.weight`.
//!
//! Local layers attend through a sliding window
//! (`attention.sliding_window`; absent or 0: none, every layer global) and
//! rotate with `rope.freq_base_swa` (default 10000) and no frequency
//! scaling; by default five of every six layers are local
//! ([`sliding::windowed_layers`]). Global layers use the model's RoPE.
//! `final_logit_softcapping`, when present and non-zero, caps the logits.

use super::family::{Family, Outer};
use super::sliding;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, invalid};
use crate::layer::{Attention, Ffn, LayerKind, OwnRope};
use crate::weights::LoadError;

pub(super) struct Gemma3;

/// The local layers' RoPE base when the file names none (llama.cpp's).
const LOCAL_ROPE_BASE: f32 = 10000.0;

impl Family for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Neox)
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let window = sliding::window(file, "gemma3")?;
        let windowed = match window {
            Some(_) => sliding::windowed_layers(file, "gemma3", hp.n_layer, 6)?,
            None => vec![false; hp.n_layer],
        };
        let local_base = local_rope_base(file, "gemma3", LOCAL_ROPE_BASE)?;
        let q_scale = gemma_q_scale(hp, 62);
        Ok(windowed
            .into_iter()
            .map(|local| {
                let attention = Attention {
                    q_scale: Some(q_scale),
                    window: window.filter(|_| local),
                    own_rope: local.then(|| own_rope(hp, local_base, 1.0)).flatten(),
                    ..Attention::full(false, true)
                };
                LayerKind { ffn: Ffn::GeGlu, post_norms: true, ..LayerKind::plain(attention) }
            })
            .collect())
    }

    fn outer(&self, file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        let logit_softcap = softcap(file, "gemma3.final_logit_softcapping", None)?;
        Ok(Outer { embed_scale: Some(embedding_scale(hp)), logit_softcap, ..Outer::plain(hp) })
    }
}

/// Gemma's Q scale: `1/√(n_embd / n_head)` (integer division) for the
/// 27B model, which llama.cpp recognises by its `layers_27b` layers, else
/// `1/√head_dim`.
pub(super) fn gemma_q_scale(hp: &HParams, layers_27b: usize) -> f32 {
    let dim = if hp.n_layer == layers_27b { hp.n_embd / hp.n_head } else { hp.head_dim };
    1.0 / (dim as f32).sqrt()
}

/// `<arch>.rope.freq_base_swa`, `default` when absent.
pub(super) fn local_rope_base(file: &GgufFile, arch: &str, default: f32) -> Result<f32, HParamsError> {
    let key = format!("{arch}.rope.freq_base_swa");
    match file.opt_f32(&key)?.unwrap_or(default) {
        base if base > 1.0 && base.is_finite() => Ok(base),
        base => Err(invalid(&key, base, "must be a finite number > 1".into())),
    }
}

/// A local layer's RoPE where it differs from the model's.
pub(super) fn own_rope(hp: &HParams, base: f32, freq_scale: f32) -> Option<OwnRope> {
    (base != hp.rope_base || freq_scale != hp.rope_freq_scale).then_some(OwnRope { base, freq_scale })
}

/// Gemma's embedding scale, `√n_embd`.
pub(super) fn embedding_scale(hp: &HParams) -> f32 {
    (hp.n_embd as f32).sqrt()
}

/// A soft-cap key: `default` when absent, none when 0; a cap must be
/// finite and positive.
pub(super) fn softcap(file: &GgufFile, key: &str, default: Option<f32>) -> Result<Option<f32>, HParamsError> {
    match file.opt_f32(key)? {
        None => Ok(default),
        Some(0.0) => Ok(None),
        Some(cap) if cap > 0.0 && cap.is_finite() => Ok(Some(cap)),
        Some(cap) => Err(invalid(key, cap, "must be a finite number ≥ 0".into())),
    }
}
