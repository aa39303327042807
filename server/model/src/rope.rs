//! A model's rotary embedding as its file describes it: the family's style
//! and rates from the hyper-parameters, stretched as `rope.scaling.*` and
//! Llama 3's `rope_freqs.weight` say, the way llama.cpp applies them.

use sluice_kernels::ops::{self, Rope, RopeScaling, Yarn};

use super::gguf::GgufFile;
use super::hparams::{HParams, RopeScalingType, RopeStyle};
use super::layer::{LayerKind, Mixer};
use super::weights::{LoadError, host_vector, tensor_problem};

/// The rope of a model with hyper-parameters `hp` read from `file`.
pub(crate) fn model_rope(file: &GgufFile, hp: &HParams) -> Result<Rope, LoadError> {
    scaled_rope(file, hp, hp.rope_base, hp.rope_freq_scale)
}

/// The rope of the layers that declare one of their own (Gemma's local
/// layers), which must be one rope: a pass prepares the angles of at most
/// two. The file's scaling applies to it as to the model's.
pub(crate) fn local_rope(file: &GgufFile, kinds: &[LayerKind], hp: &HParams) -> Result<Option<Rope>, LoadError> {
    let mut own = kinds.iter().filter_map(|kind| match kind.mixer {
        Mixer::Attention(attention) => attention.own_rope,
    });
    let Some(rope) = own.next() else { return Ok(None) };
    if let Some(other) = own.find(|other| *other != rope) {
        return Err(tensor_problem("rope", &format!("local layers with RoPEs {rope:?} and {other:?}")));
    }
    scaled_rope(file, hp, rope.base, rope.freq_scale).map(Some)
}

fn scaled_rope(file: &GgufFile, hp: &HParams, base: f32, freq_scale: f32) -> Result<Rope, LoadError> {
    let rope = Rope::new(hp.head_dim, hp.n_rot, base, freq_scale, rope_kind(hp.rope))
        .map_err(|error| tensor_problem("rope", &error.to_string()))?;
    let name = "rope_freqs.weight";
    let freq_factors = match file.tensor(name) {
        Some(_) => host_vector(file, name, hp.n_rot / 2)?,
        None => Vec::new(),
    };
    let yarn = match hp.rope_scaling {
        RopeScalingType::None | RopeScalingType::Linear => None,
        RopeScalingType::Yarn => Some(Yarn {
            n_ctx_orig: hp.n_ctx_orig as u32,
            beta_fast: hp.yarn.beta_fast,
            beta_slow: hp.yarn.beta_slow,
            log_multiplier: hp.yarn.log_multiplier,
        }),
        // Its factors depend on the served context, which the model does
        // not know when it loads.
        RopeScalingType::LongRope => {
            return Err(tensor_problem("rope_factors_long.weight", "LongRoPE scaling is not supported yet"));
        }
    };
    let scaling = RopeScaling { freq_factors, yarn, attn_factor: hp.rope_attn_factor };
    rope.scaled(&scaling).map_err(|error| tensor_problem(name, &error.to_string()))
}

fn rope_kind(style: RopeStyle) -> ops::RopeKind {
    match style {
        RopeStyle::Norm => ops::RopeKind::Norm,
        RopeStyle::Neox => ops::RopeKind::Neox,
        RopeStyle::MRope(sections) => ops::RopeKind::MRope { sections },
        RopeStyle::IMRope(sections) => ops::RopeKind::IMRope { sections },
    }
}

#[cfg(test)]
mod tests {
    use sluice_kernels::ops::{Rope, RopeAngles, RopeKind, RopeScaling, Yarn};
    use sluice_tests::gguf_writer::{GgufBuilder, Tensor, TinyModel, Value};

    use super::model_rope;
    use crate::gguf::GgufFile;
    use crate::hparams::HParams;

    /// A tiny llama: heads of 16, so 8 rotary pairs.
    fn llama() -> GgufBuilder {
        TinyModel::recipe("llama", 3).build()
    }

    fn rope_of(builder: &GgufBuilder) -> Result<Rope, String> {
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        let hp = HParams::from_gguf(&file).map_err(|error| error.to_string())?;
        model_rope(&file, &hp).map_err(|error| error.to_string())
    }

    fn angles(rope: &Rope) -> Vec<Vec<f32>> {
        let mut angles = RopeAngles::default();
        [1, 5, 300, 4000]
            .map(|p| {
                rope.angles(Rope::text_pos(p), &mut angles);
                let (cos, sin) = angles.tables();
                [cos, sin].concat()
            })
            .to_vec()
    }

    fn expected(freq_scale: f32, scaling: &RopeScaling) -> Vec<Vec<f32>> {
        let rope = Rope::new(16, 16, 10_000.0, freq_scale, RopeKind::Norm).and_then(|rope| rope.scaled(scaling));
        angles(&rope.expect("valid"))
    }

    #[test]
    fn llama3_frequency_factors_divide_each_pair_s_angle() {
        let factors: Vec<f32> = (0..8).map(|j| 1.0 + j as f32).collect();
        let file = llama().tensor(Tensor::f32("rope_freqs.weight", &[8], &factors));
        let want = expected(1.0, &RopeScaling { freq_factors: factors, ..RopeScaling::default() });
        assert_eq!(angles(&rope_of(&file).expect("loads")), want);
        assert_ne!(want, expected(1.0, &RopeScaling::default()));
        let wrong = llama().tensor(Tensor::f32("rope_freqs.weight", &[6], &[1.0; 6]));
        assert_eq!(rope_of(&wrong).expect_err("refused"), "tensor \"rope_freqs.weight\": shape [6], expected [8]");
    }

    #[test]
    fn the_scaling_type_picks_linear_yarn_or_none() {
        let with = |kind: &str| {
            llama()
                .meta("llama.rope.scaling.type", Value::Str(kind.into()))
                .meta("llama.rope.scaling.factor", Value::F32(4.0))
                .meta("llama.rope.scaling.original_context_length", Value::U32(128))
                .meta("llama.rope.scaling.attn_factor", Value::F32(1.5))
        };
        let linear = RopeScaling { attn_factor: 1.5, ..RopeScaling::default() };
        assert_eq!(angles(&rope_of(&with("linear")).expect("loads")), expected(0.25, &linear));
        assert_eq!(angles(&rope_of(&with("none")).expect("loads")), expected(1.0, &linear));
        let yarn = Yarn { n_ctx_orig: 128, beta_fast: 32.0, beta_slow: 1.0, log_multiplier: 0.0 };
        let want = expected(0.25, &RopeScaling { yarn: Some(yarn), ..linear.clone() });
        assert_eq!(angles(&rope_of(&with("yarn")).expect("loads")), want);
        assert_ne!(want, expected(0.25, &linear));
        assert_eq!(
            rope_of(&with("ntk")).expect_err("refused"),
            "llama.rope.scaling.type = ntk: must be none, linear, yarn or longrope"
        );
        assert!(rope_of(&with("longrope")).expect_err("refused").contains("LongRoPE scaling is not supported yet"));
    }
}
