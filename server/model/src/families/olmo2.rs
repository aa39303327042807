//! `olmo2`: OLMo 2 and OLMo 3 text models. No pre-norms: each block reads
//! the residual stream itself and RMS-norms its output before the residual
//! add (`post_attention_norm`, `post_ffw_norm`); Q and K are RMS-normed
//! over their whole projected vectors (all heads together) before NEOX
//! RoPE; the LM head is always its own `output.weight`.
//!
//! OLMo 3 files name a sliding window (`attention.sliding_window`), and
//! then by default three of every four layers are local
//! ([`sliding::windowed_layers`]). Its local layers rotate with the model's
//! base and no scaling, so a file whose RoPE is scaled (where the two would
//! differ) is refused for now.

use super::family::{Family, Outer};
use super::sliding;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeScalingType, RopeStyle, invalid};
use crate::layer::{Attention, LayerKind};
use crate::weights::{LoadError, tensor_problem};

pub(super) struct Olmo2;

impl Family for Olmo2 {
    fn name(&self) -> &'static str {
        "olmo2"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Neox)
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let window = sliding::window(file, "olmo2")?;
        let windowed = match window {
            Some(_) => sliding::windowed_layers(file, "olmo2", hp.n_layer, 4)?,
            None => vec![false; hp.n_layer],
        };
        let scaled = !matches!(hp.rope_scaling, RopeScalingType::None | RopeScalingType::Linear)
            || hp.rope_freq_scale != 1.0
            || hp.rope_attn_factor != 1.0;
        if let (Some(window), true) = (window, scaled) {
            let problem = "local layers of a model with scaled RoPE are not supported yet".into();
            return Err(invalid("olmo2.attention.sliding_window", window, problem).into());
        }
        Ok(windowed
            .into_iter()
            .map(|local| {
                let attention =
                    Attention { qk_norm_whole: true, window: window.filter(|_| local), ..Attention::full(false, true) };
                LayerKind { pre_norms: false, post_norms: true, ..LayerKind::plain(attention) }
            })
            .collect())
    }

    fn outer(&self, file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        match file.tensor("output.weight") {
            Some(_) => Ok(Outer::plain(hp)),
            None => Err(tensor_problem("output.weight", "missing (OLMo 2 never ties it to the embeddings)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::{GgufBuilder, TinyModel, Value};

    use super::Olmo2;
    use crate::families::family::Family;
    use crate::gguf::GgufFile;
    use crate::hparams::HParams;

    fn windows(builder: &GgufBuilder) -> Result<Vec<Option<usize>>, String> {
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        let hp = HParams::from_gguf(&file).map_err(|error| error.to_string())?;
        Olmo2.outer(&file, &hp).map_err(|error| error.to_string())?;
        let layers = Olmo2.layers(&file, &hp).map_err(|error| error.to_string())?;
        Ok(layers
            .iter()
            .map(|layer| {
                let attention = layer.mixer.attention().expect("attention");
                assert!(attention.qk_norm_whole && !layer.pre_norms && layer.post_norms);
                attention.window
            })
            .collect())
    }

    #[test]
    fn a_window_makes_three_of_four_layers_local() {
        let olmo2 = TinyModel { n_layer: 5, ..TinyModel::recipe("olmo2", 4) }.build();
        assert_eq!(windows(&olmo2), Ok(vec![None; 5]));
        let olmo3 = olmo2.meta("olmo2.attention.sliding_window", Value::U32(7));
        let (l, g) = (Some(7), None);
        assert_eq!(windows(&olmo3), Ok(vec![l, l, l, g, l]));
    }

    #[test]
    fn an_untied_head_is_required_and_local_layers_refuse_scaled_rope() {
        let olmo2 = TinyModel::recipe("olmo2", 4).build();
        let tied = olmo2.clone().without_tensor("output.weight");
        assert!(windows(&tied).expect_err("refused").starts_with("tensor \"output.weight\": missing"));
        let yarn = olmo2
            .meta("olmo2.attention.sliding_window", Value::U32(7))
            .meta("olmo2.rope.scaling.type", Value::Str("yarn".into()))
            .meta("olmo2.rope.scaling.factor", Value::F32(8.0));
        assert_eq!(
            windows(&yarn),
            Err("olmo2.attention.sliding_window = 7: local layers of a model with scaled RoPE are not supported yet"
                .into())
        );
    }
}
