//! A model's rotary embedding as its file describes it: the family's style
//! and rates from the hyper-parameters, stretched as `rope.scaling.*` and
//! Llama 3's `rope_freqs.weight` say, the way llama.cpp applies them.

use sluice_kernels::ops::{self, Rope, RopeScaling, Yarn};

use super::gguf::GgufFile;
use super::hparams::{HParams, RopeScalingType, RopeStyle};
use super::layer::{LayerKind, Mixer};
use super::weights::{LoadError, host_vector, tensor_problem};

/// The rope of a model with hyper-parameters `hp` read from `file`, for
/// sequences of up to `n_ctx_seq` positions (which picks LongRoPE's
/// factors).
pub(crate) fn model_rope(file: &GgufFile, hp: &HParams, n_ctx_seq: usize) -> Result<Rope, LoadError> {
    let factors = match longrope_factors(file, hp, n_ctx_seq)? {
        Some(factors) => factors,
        None => (LLAMA3_FACTORS, llama3_factors(file, hp)?),
    };
    scaled_rope(hp, hp.rope_base, hp.rope_freq_scale, factors)
}

/// Llama 3's frequency factors, which llama.cpp prefers to LongRoPE's.
const LLAMA3_FACTORS: &str = "rope_freqs.weight";
const LONG_FACTORS: &str = "rope_factors_long.weight";
const SHORT_FACTORS: &str = "rope_factors_short.weight";

/// LongRoPE's frequency factors and their tensor, as llama.cpp picks them:
/// the long ones when a sequence may hold more than the original context
/// (`rope.scaling.original_context_length`), else the short ones; none
/// when the file has neither (or has Llama 3's, which win) or lacks the
/// one picked. `n_ctx_seq` is the context one sequence is configured for,
/// not its current length: the angles never change while the model
/// serves.
fn longrope_factors(
    file: &GgufFile,
    hp: &HParams,
    n_ctx_seq: usize,
) -> Result<Option<(&'static str, Vec<f32>)>, LoadError> {
    if file.tensor(LLAMA3_FACTORS).is_some() {
        return Ok(None);
    }
    // Both are checked, so that a file is refused whatever it serves.
    let read = |name: &'static str| match file.tensor(name) {
        Some(_) => host_vector(file, name, hp.n_rot / 2).map(|factors| Some((name, factors))),
        None => Ok(None),
    };
    let (long, short) = (read(LONG_FACTORS)?, read(SHORT_FACTORS)?);
    Ok(if n_ctx_seq > hp.n_ctx_orig { long } else { short })
}

fn llama3_factors(file: &GgufFile, hp: &HParams) -> Result<Vec<f32>, LoadError> {
    match file.tensor(LLAMA3_FACTORS) {
        Some(_) => host_vector(file, LLAMA3_FACTORS, hp.n_rot / 2),
        None => Ok(Vec::new()),
    }
}

/// The rope of the layers that declare one of their own (Gemma's local
/// layers), which must be one rope: a pass prepares the angles of at most
/// two. The file's scaling applies to it as to the model's.
pub(crate) fn local_rope(file: &GgufFile, kinds: &[LayerKind], hp: &HParams) -> Result<Option<Rope>, LoadError> {
    let mut own = kinds.iter().filter_map(|kind| match kind.mixer {
        Mixer::Attention(attention) => attention.own_rope,
        Mixer::DeltaNet(_) => None,
    });
    let Some(rope) = own.next() else { return Ok(None) };
    if let Some(other) = own.find(|other| *other != rope) {
        return Err(tensor_problem("rope", &format!("local layers with RoPEs {rope:?} and {other:?}")));
    }
    scaled_rope(hp, rope.base, rope.freq_scale, (LLAMA3_FACTORS, llama3_factors(file, hp)?)).map(Some)
}

/// The rope of `base` and `freq_scale`, stretched as the file's
/// `rope.scaling.*` says, each pair's angle divided by its factor in the
/// tensor named first of `factors` (its values second; none: all 1).
fn scaled_rope(hp: &HParams, base: f32, freq_scale: f32, factors: (&str, Vec<f32>)) -> Result<Rope, LoadError> {
    let rope = Rope::new(hp.head_dim, hp.n_rot, base, freq_scale, rope_kind(hp.rope))
        .map_err(|error| tensor_problem("rope", &error.to_string()))?;
    let yarn = match hp.rope_scaling {
        // LongRoPE's factors are frequency factors, its magnitude
        // `rope.scaling.attn_factor`, as with linear scaling.
        RopeScalingType::None | RopeScalingType::Linear | RopeScalingType::LongRope => None,
        RopeScalingType::Yarn => Some(Yarn {
            n_ctx_orig: hp.n_ctx_orig as u32,
            beta_fast: hp.yarn.beta_fast,
            beta_slow: hp.yarn.beta_slow,
            log_multiplier: hp.yarn.log_multiplier,
        }),
    };
    let (name, freq_factors) = factors;
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
        rope_for(builder, 512)
    }

    fn rope_for(builder: &GgufBuilder, n_ctx_seq: usize) -> Result<Rope, String> {
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        let hp = HParams::from_gguf(&file).map_err(|error| error.to_string())?;
        model_rope(&file, &hp, n_ctx_seq).map_err(|error| error.to_string())
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
        // Without factor tensors LongRoPE is its factor and magnitude alone.
        assert_eq!(angles(&rope_of(&with("longrope")).expect("loads")), expected(0.25, &linear));
    }

    /// LongRoPE's long factors serve sequences configured past the original
    /// context, the short ones the rest; Llama 3's factors win over both.
    #[test]
    fn longrope_picks_its_factors_by_the_configured_sequence_context() {
        let short: Vec<f32> = (0..8).map(|j| 1.0 + j as f32 / 8.0).collect();
        let long: Vec<f32> = (0..8).map(|j| 2.0 + j as f32).collect();
        let file = llama()
            .meta("llama.rope.scaling.original_context_length", Value::U32(128))
            .meta("llama.rope.scaling.attn_factor", Value::F32(1.25))
            .tensor(Tensor::f32("rope_factors_short.weight", &[8], &short))
            .tensor(Tensor::f32("rope_factors_long.weight", &[8], &long));
        let with = |freq_factors: &[f32]| {
            expected(1.0, &RopeScaling { freq_factors: freq_factors.to_vec(), attn_factor: 1.25, yarn: None })
        };
        assert_eq!(angles(&rope_for(&file, 128).expect("loads")), with(&short));
        assert_eq!(angles(&rope_for(&file, 129).expect("loads")), with(&long));
        assert_ne!(with(&short), with(&long));
        let llama3 = file.clone().tensor(Tensor::f32("rope_freqs.weight", &[8], &[3.0; 8]));
        assert_eq!(angles(&rope_for(&llama3, 4096).expect("loads")), with(&[3.0; 8]));
        let only_short = file.clone().without_tensor("rope_factors_long.weight");
        assert_eq!(angles(&rope_for(&only_short, 4096).expect("loads")), with(&[]));
        let wrong = file.tensor(Tensor::f32("rope_factors_long.weight", &[6], &[1.0; 6]));
        for n_ctx_seq in [128, 4096] {
            assert_eq!(
                rope_for(&wrong, n_ctx_seq).expect_err("refused"),
                "tensor \"rope_factors_long.weight\": shape [6], expected [8]"
            );
        }
    }
}
