//! `mistral3`: the text path of Mistral 3 / Ministral 3 files. Llama's
//! layers (adjacent-pair RoPE, optional `attn_output` and MLP biases,
//! `rope_freqs` factors), plus what its files carry beyond Llama's:
//! YaRN's correction bounds and magnitude multiplier
//! (`rope.scaling.yarn_beta_fast`, `yarn_beta_slow`,
//! `yarn_log_multiplier`, which llama.cpp reads only for this family), and
//! Llama 4's query temperature (`attention.temperature_scale`): after RoPE,
//! every query row is multiplied by `1 + scale · ln(⌊pos / n⌋ + 1)` with `n`
//! the original context (`rope.scaling.original_context_length`), so rows
//! within the trained context are unchanged.

use super::family::{Family, Outer};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, YarnBounds, invalid};
use crate::layer::{Attention, LayerKind};
use crate::weights::LoadError;

pub(super) struct Mistral3;

impl Family for Mistral3 {
    fn name(&self) -> &'static str {
        "mistral3"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Norm)
    }

    fn yarn(&self, file: &GgufFile) -> Result<YarnBounds, HParamsError> {
        let read = |suffix: &str, default: f32| -> Result<f32, HParamsError> {
            let key = format!("mistral3.rope.scaling.{suffix}");
            match file.opt_f32(&key)?.unwrap_or(default) {
                value if value.is_finite() && value >= 0.0 => Ok(value),
                value => Err(invalid(&key, value, "must be a finite number ≥ 0".into())),
            }
        };
        let default = YarnBounds::default();
        Ok(YarnBounds {
            beta_fast: read("yarn_beta_fast", default.beta_fast)?,
            beta_slow: read("yarn_beta_slow", default.beta_slow)?,
            log_multiplier: read("yarn_log_multiplier", default.log_multiplier)?,
        })
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok(vec![LayerKind::plain(Attention::full(false, false)); hp.n_layer])
    }

    fn outer(&self, file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        let key = "mistral3.attention.temperature_scale";
        let q_temperature = match file.opt_f32(key)? {
            None | Some(0.0) => None,
            Some(scale) if scale.is_finite() => Some(scale),
            Some(scale) => return Err(invalid(key, scale, "must be finite".into()).into()),
        };
        Ok(Outer { q_temperature, ..Outer::plain(hp) })
    }
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::{TinyModel, Value};

    use crate::gguf::GgufFile;
    use crate::hparams::{HParams, YarnBounds};

    fn hparams(arch: &'static str, extra: &[(&str, f32)]) -> Result<HParams, String> {
        let mut builder = TinyModel::recipe(arch, 5).build();
        for (suffix, value) in extra {
            builder = builder.meta(&format!("{arch}.{suffix}"), Value::F32(*value));
        }
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        HParams::from_gguf(&file).map_err(|error| error.to_string())
    }

    #[test]
    fn only_mistral3_reads_yarn_bounds_and_a_bad_one_is_named() {
        let keys = [
            ("rope.scaling.yarn_beta_fast", 4.0),
            ("rope.scaling.yarn_beta_slow", 0.5),
            ("rope.scaling.yarn_log_multiplier", 0.1),
        ];
        let read = hparams("mistral3", &keys).expect("loads").yarn;
        assert_eq!(read, YarnBounds { beta_fast: 4.0, beta_slow: 0.5, log_multiplier: 0.1 });
        assert_eq!(hparams("llama", &keys).expect("loads").yarn, YarnBounds::default());
        assert_eq!(
            hparams("mistral3", &[("rope.scaling.yarn_beta_slow", f32::NAN)]).expect_err("refused"),
            "mistral3.rope.scaling.yarn_beta_slow = NaN: must be a finite number ≥ 0"
        );
    }
}
