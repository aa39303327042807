//! How a model stretches its rotary embedding past the context it was
//! trained on, computed as llama.cpp computes it so rotated q and k keep its
//! bits:
//!
//! - per-pair frequency factors (Llama 3's baked `rope_freqs`, LongRoPE's
//!   short and long factors) divide pair `j`'s angle before anything else;
//! - linear scaling is the rope's `freq_scale`;
//! - YaRN blends, per pair, the scaled ("interpolated") angle with the
//!   unscaled ("extrapolated") one by a ramp between two correction pairs,
//!   and scales cosine and sine by a magnitude factor;
//! - `attn_factor` multiplies every cosine and sine (the YaRN magnitude
//!   correction, LongRoPE's converter-written factor).
//!
//! The steps and their f32 rounding follow ggml's CPU rope: the ramp uses
//! the pair index, the YaRN magnitude term `1 + 0.1 ln(1 / freq_scale)` is
//! applied inside the rope and pre-cancelled in the attention factor as
//! llama.cpp's context does. ggml's CPU backend is compiled with fused
//! multiply-add contraction, which fuses that term and the blend of the two
//! angles; the attention factor (computed outside it) is not fused.

use super::OpsError;

/// Rope scaling beyond `freq_scale`; [`RopeScaling::default`] is none.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// Divisor of each rotary pair's angle (one per pair), or empty.
    pub freq_factors: Vec<f32>,
    pub yarn: Option<Yarn>,
    /// The file's `rope.scaling.attn_factor` (1 when absent): multiplies
    /// every cosine and sine.
    pub attn_factor: f32,
}

impl Default for RopeScaling {
    fn default() -> Self {
        RopeScaling { freq_factors: Vec::new(), yarn: None, attn_factor: 1.0 }
    }
}

/// YaRN's parameters, as the file (or llama.cpp's defaults) give them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// The context the model was trained on before scaling
    /// (`rope.scaling.original_context_length`).
    pub n_ctx_orig: u32,
    /// Rotations over the original context above which a pair keeps its
    /// unscaled angle (llama.cpp's default 32).
    pub beta_fast: f32,
    /// Rotations below which a pair is fully scaled (default 1).
    pub beta_slow: f32,
    /// `rope.scaling.yarn_log_multiplier` (0 when absent): the magnitude
    /// factor becomes `(1 + 0.1 ln s) / (1 + 0.1 m ln s)` for scale `s`.
    pub log_multiplier: f32,
}

/// What [`Rope`](super::Rope) applies per pair, derived once from a
/// [`RopeScaling`] and the rope's own parameters.
#[derive(Clone, Debug)]
pub(super) struct Scaled {
    freq_factors: Vec<f32>,
    /// YaRN's first and last correction pairs.
    ramp: Option<[f32; 2]>,
    /// Multiplies each cosine and sine.
    mscale: f32,
}

impl Scaled {
    /// No scaling: dividing by no factor and multiplying by 1 are exact, so
    /// unscaled angles are the plain rope's.
    pub(super) fn none() -> Self {
        Scaled { freq_factors: Vec::new(), ramp: None, mscale: 1.0 }
    }

    pub(super) fn new(scaling: &RopeScaling, n_rot: usize, base: f32, freq_scale: f32) -> Result<Self, OpsError> {
        let bad = |why: String| Err(OpsError::Rope(why));
        let pairs = n_rot / 2;
        if !scaling.freq_factors.is_empty() && scaling.freq_factors.len() != pairs {
            return bad(format!("{} frequency factors for {pairs} rotary pairs", scaling.freq_factors.len()));
        }
        if let Some(factor) = scaling.freq_factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
            return bad(format!("frequency factor {factor} must be finite and positive"));
        }
        if !(scaling.attn_factor.is_finite() && scaling.attn_factor > 0.0) {
            return bad(format!("attention factor {} must be finite and positive", scaling.attn_factor));
        }
        let mut mscale = scaling.attn_factor;
        let ramp = match scaling.yarn {
            None => None,
            Some(yarn) => {
                let fine = |v: f32| v.is_finite() && v > 0.0;
                if yarn.n_ctx_orig == 0
                    || !fine(yarn.beta_fast)
                    || !fine(yarn.beta_slow)
                    || !yarn.log_multiplier.is_finite()
                {
                    return bad(format!("YaRN parameters {yarn:?} must be positive"));
                }
                // The context's factor, which pre-cancels the magnitude term
                // the rope multiplies in (below); both roundings are kept.
                mscale = yarn_attn_factor(1.0 / freq_scale, yarn.log_multiplier) * scaling.attn_factor;
                mscale *= 0.1f32.mul_add((1.0 / freq_scale).ln(), 1.0);
                Some(corr_dims(n_rot, yarn, base))
            }
        };
        Ok(Scaled { freq_factors: scaling.freq_factors.clone(), ramp, mscale })
    }

    /// Cosine and sine of pair `j` at unscaled angle `theta`.
    #[inline]
    pub(super) fn cos_sin(&self, j: usize, theta: f32, freq_scale: f32) -> (f32, f32) {
        let extrapolated = match self.freq_factors.get(j) {
            Some(factor) => theta / factor,
            None => theta,
        };
        let interpolated = freq_scale * extrapolated;
        let angle = match self.ramp {
            None => interpolated,
            Some([low, high]) => {
                let y = ((j as f32) - low) / (high - low).max(0.001);
                let mix = 1.0 - y.clamp(0.0, 1.0);
                interpolated.mul_add(1.0 - mix, extrapolated * mix)
            }
        };
        (angle.cos() * self.mscale, angle.sin() * self.mscale)
    }
}

/// `1 + 0.1 m ln s` for `s > 1`, else 1.
fn magnitude(scale: f32, m: f32) -> f32 {
    if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 }
}

/// The attention factor llama.cpp's context hands the rope for YaRN scale
/// `factor`: the magnitude correction divided by the term the rope itself
/// multiplies in.
fn yarn_attn_factor(factor: f32, log_multiplier: f32) -> f32 {
    let wanted = if log_multiplier != 0.0 {
        magnitude(factor, 1.0) / magnitude(factor, log_multiplier)
    } else {
        magnitude(factor, 1.0)
    };
    wanted * (1.0 / (1.0 + 0.1 * factor.ln()))
}

/// The pairs where YaRN's ramp starts and ends: the pair that turns
/// `beta` times over the original context, for `beta_fast` (floored, at
/// least 0) and `beta_slow` (ceiled, at most `n_rot - 1`).
fn corr_dims(n_rot: usize, yarn: Yarn, base: f32) -> [f32; 2] {
    let dim = |beta: f32| {
        let turns = yarn.n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI);
        n_rot as f32 * turns.ln() / (2.0 * base.ln())
    };
    [dim(yarn.beta_fast).floor().max(0.0), dim(yarn.beta_slow).ceil().min(n_rot as f32 - 1.0)]
}
