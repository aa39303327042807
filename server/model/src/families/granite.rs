//! `granite`: IBM Granite dense text models (3.x). Llama's layers with
//! four multipliers from the file: token embeddings times
//! `embedding_scale`, each block's output times `residual_scale` before its
//! residual add, scores scaled by `attention.scale` instead of
//! `1/√head_dim`, and logits divided by `logit_scale` (required; llama.cpp
//! multiplies by its f32 reciprocal). The optional three mean "unused" when
//! absent or 0. `rope.scaling.finetuned` (default true) false: no layer
//! applies RoPE.
//!
//! Biases on the attention output or the feed-forward, which llama.cpp
//! would apply, are refused: no block adds them yet.

use super::family::{Family, Outer};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, invalid};
use crate::layer::{Attention, LayerKind};
use crate::weights::{LoadError, tensor_problem};

pub(super) struct Granite;

impl Family for Granite {
    fn name(&self) -> &'static str {
        "granite"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Norm)
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        for layer in 0..hp.n_layer {
            for suffix in ["attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"] {
                let name = format!("blk.{layer}.{suffix}");
                if file.tensor(&name).is_some() {
                    return Err(tensor_problem(&name, "output and feed-forward biases are not supported"));
                }
            }
        }
        let attention = Attention {
            rotary: file.opt_bool("granite.rope.scaling.finetuned")?.unwrap_or(true),
            score_scale: multiplier(file, "granite.attention.scale")?,
            ..Attention::full(false, false)
        };
        let residual_scale = multiplier(file, "granite.residual_scale")?;
        Ok(vec![LayerKind { residual_scale, ..LayerKind::plain(attention) }; hp.n_layer])
    }

    fn outer(&self, file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        let key = "granite.logit_scale";
        let logit_scale = match file.f32(key)? {
            scale if scale > 0.0 && scale.is_finite() => scale,
            scale => return Err(invalid(key, scale, "must be a finite number > 0".into()).into()),
        };
        let embed_scale = multiplier(file, "granite.embedding_scale")?;
        Ok(Outer { embed_scale, logit_scale: Some(1.0 / logit_scale), ..Outer::plain(hp) })
    }
}

/// An optional multiplier: none when absent or 0, else finite and positive.
fn multiplier(file: &GgufFile, key: &str) -> Result<Option<f32>, HParamsError> {
    match file.opt_f32(key)? {
        None | Some(0.0) => Ok(None),
        Some(factor) if factor > 0.0 && factor.is_finite() => Ok(Some(factor)),
        Some(factor) => Err(invalid(key, factor, "must be a finite number ≥ 0".into())),
    }
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::{GgufBuilder, Tensor, TinyModel, Value};

    use super::Granite;
    use crate::families::family::Family;
    use crate::gguf::GgufFile;
    use crate::hparams::HParams;

    /// The layers and outer parts `builder`'s file declares, or why not.
    fn declared(builder: &GgufBuilder) -> Result<(super::LayerKind, super::Outer), String> {
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        let hp = HParams::from_gguf(&file).map_err(|error| error.to_string())?;
        let layers = Granite.layers(&file, &hp).map_err(|error| error.to_string())?;
        let outer = Granite.outer(&file, &hp).map_err(|error| error.to_string())?;
        Ok((layers[1], outer))
    }

    #[test]
    fn the_multipliers_are_read_and_zero_means_unused() {
        let granite = TinyModel::recipe("granite", 3)
            .build()
            .meta("granite.embedding_scale", Value::F32(12.0))
            .meta("granite.residual_scale", Value::F32(0.22))
            .meta("granite.attention.scale", Value::F32(0.0))
            .meta("granite.logit_scale", Value::F32(16.0));
        let (layer, outer) = declared(&granite).expect("declared");
        let attention = layer.mixer.attention().expect("attention");
        assert_eq!((layer.residual_scale, attention.score_scale, attention.rotary), (Some(0.22), None, true));
        assert_eq!((outer.embed_scale, outer.logit_scale), (Some(12.0), Some(1.0 / 16.0)));
        let unrotated = granite.meta("granite.rope.scaling.finetuned", Value::Bool(false));
        let (layer, _) = declared(&unrotated).expect("declared");
        let attention = layer.mixer.attention().expect("attention");
        assert!(!attention.rotary);
    }

    #[test]
    fn bad_multipliers_and_biases_are_refused_naming_them() {
        let granite = TinyModel::recipe("granite", 3).build();
        let missing = declared(&granite.clone().without_meta("granite.logit_scale")).expect_err("refused");
        assert!(missing.contains("granite.logit_scale"), "{missing}");
        for (key, value) in [
            ("granite.logit_scale", 0.0),
            ("granite.logit_scale", -2.0),
            ("granite.logit_scale", f32::NAN),
            ("granite.residual_scale", -0.5),
            ("granite.embedding_scale", f32::INFINITY),
            ("granite.attention.scale", f32::NAN),
        ] {
            let error = declared(&granite.clone().meta(key, Value::F32(value))).expect_err("refused");
            assert!(error.starts_with(&format!("{key} = ")), "{key} {value}: {error}");
        }
        let biased = granite.tensor(Tensor::f32("blk.1.ffn_down.bias", &[64], &[0.0; 64]));
        assert_eq!(
            declared(&biased).expect_err("refused"),
            "tensor \"blk.1.ffn_down.bias\": output and feed-forward biases are not supported"
        );
    }
}
