//! Kernels over one activation row: normalisation, softmax, activations,
//! residual add and the f32 → f16 conversion that writes the KV cache.

use super::simd::{LANES, Reduce, Simd, dispatch, exp, padded, reduce, update};
use half::f16;

fn assert_same_len(what: &str, a: usize, b: usize) {
    assert!(a == b, "{what}: slice lengths differ ({a} vs {b})");
}

/// `out = x / sqrt(mean(x²) + eps) * weight`, the mean taken over the row.
///
/// The scale is computed as llama.cpp computes it (see `rms_scale`), then
/// `x * scale` is multiplied by `weight`.
///
/// # Panics
/// If `weight` or `out` is not as long as `x`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert_same_len("rms_norm weight", x.len(), weight.len());
    assert_same_len("rms_norm out", x.len(), out.len());
    dispatch!(s => {
        let scale = rms_scale(s, x, eps);
        update(s, out, [x, weight], #[inline(always)] |_, [x, w]| s.mul(s.mul(x, scale), w));
    })
}

/// [`rms_norm`] with `x` as its own output (per-head q/k norms).
///
/// # Panics
/// If `weight` is not as long as `x`.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    assert_same_len("rms_norm_in_place weight", x.len(), weight.len());
    dispatch!(s => {
        let scale = rms_scale(s, x, eps);
        update(s, x, [weight], #[inline(always)] |x, [w]| s.mul(s.mul(x, scale), w));
    })
}

/// `1 / sqrt(mean(x²) + eps)`, splatted, in GGML's steps (so that the
/// normalized rows match llama.cpp's bit for bit): each square rounded to
/// f32 and summed in order in f64, the mean rounded to f32, the rest in f32.
#[inline(always)]
fn rms_scale<S: Simd>(s: S, x: &[f32], eps: f32) -> S::V {
    let sum_of_squares: f64 = x.iter().fold(0.0, |sum, &v| sum + f64::from(v * v));
    let mean = (sum_of_squares / x.len() as f64) as f32;
    s.splat(1.0 / (mean + eps).sqrt())
}

/// Replaces `x` by `softmax(x)`: `exp(x - max)` normalised by its sum, the
/// sum taken in the fixed 16-lane order and applied as a multiplication by
/// its reciprocal. An empty row is left alone.
pub fn softmax_in_place(x: &mut [f32]) {
    dispatch!(s => softmax(s, x))
}

#[inline(always)]
pub(crate) fn softmax<S: Simd>(s: S, x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = s.splat(reduce(s, x, Reduce::Max));
    update(
        s,
        x,
        [],
        #[inline(always)]
        |v, []| exp(s, s.sub(v, max)),
    );
    let inv = s.splat(1.0 / reduce(s, x, Reduce::Sum));
    update(
        s,
        x,
        [],
        #[inline(always)]
        |v, []| s.mul(v, inv),
    );
}

/// `x / (1 + e^-x)` per lane.
#[inline(always)]
fn silu_v<S: Simd>(s: S, x: S::V) -> S::V {
    s.div(x, s.add(s.splat(1.0), exp(s, s.sub(s.splat(0.0), x))))
}

/// `x = x * sigmoid(x)` in place.
pub fn silu(x: &mut [f32]) {
    dispatch!(s => update(s, x, [], #[inline(always)] |v, []| silu_v(s, v)))
}

/// `out = silu(gate) * up`, the gated feed-forward activation.
///
/// # Panics
/// If `up` or `out` is not as long as `gate`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_same_len("swiglu up", gate.len(), up.len());
    assert_same_len("swiglu out", gate.len(), out.len());
    dispatch!(s => update(s, out, [gate, up], #[inline(always)] |_, [g, u]| s.mul(silu_v(s, g), u)))
}

/// `x *= σ(gate)` element-wise, the sigmoid as ggml's CPU backend takes it
/// (`1 / (1 + e^-g)` with the C library's `exp`): an attention output gate
/// (Qwen3.5).
///
/// # Panics
/// If `gate` is not as long as `x`.
pub fn sigmoid_gate(x: &mut [f32], gate: &[f32]) {
    assert_same_len("sigmoid_gate gate", x.len(), gate.len());
    x.iter_mut().zip(gate).for_each(|(x, &g)| *x *= 1.0 / (1.0 + (-g).exp()));
}

/// gpt-oss's clamp of its experts' gate (above) and up projection (on
/// both sides), and its sigmoid's slope (llama.cpp's constants).
const OAI_LIMIT: f32 = 7.0;
const OAI_ALPHA: f32 = 1.702;

/// gpt-oss's gated activation: with `g = min(gate, 7)` and
/// `u = clamp(up, -7, 7)`, `out = g · σ(1.702 g) · (u + 1)`.
///
/// # Panics
/// If `up` or `out` is not as long as `gate`.
pub fn swiglu_oai(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_same_len("swiglu_oai up", gate.len(), up.len());
    assert_same_len("swiglu_oai out", gate.len(), out.len());
    dispatch!(s => update(s, out, [gate, up], #[inline(always)] |_, [g, u]| {
        let (limit, one) = (s.splat(OAI_LIMIT), s.splat(1.0));
        let g = s.min(g, limit);
        let u = s.max(s.min(u, limit), s.splat(-OAI_LIMIT));
        let glu = s.div(g, s.add(one, exp(s, s.mul(s.splat(-OAI_ALPHA), g))));
        s.mul(glu, s.add(u, one))
    }))
}

/// `out = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias` (LayerNorm, a
/// vision tower's norm); the mean and variance are summed in f64, as GGML
/// sums them.
///
/// # Panics
/// If `weight`, `bias` or `out` is not as long as `x`.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    assert_same_len("layer_norm weight", x.len(), weight.len());
    assert_same_len("layer_norm bias", x.len(), bias.len());
    assert_same_len("layer_norm out", x.len(), out.len());
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
    let variance = (x.iter().map(|&v| f64::from((v - mean) * (v - mean))).sum::<f64>() / n) as f32;
    let scale = 1.0 / (variance + eps).sqrt();
    dispatch!(s => {
        let (mean, scale) = (s.splat(mean), s.splat(scale));
        update(s, out, [x, weight, bias], #[inline(always)] |_, [x, w, b]| s.add(s.mul(s.mul(s.sub(x, mean), scale), w), b));
    })
}

/// The GELU of a feed-forward layer or projector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    /// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    Tanh,
    /// `x · sigmoid(1.702 x)` (CLIP's "quick" GELU).
    Quick,
}

/// `x · sigmoid(z)` per lane.
#[inline(always)]
fn gated_v<S: Simd>(s: S, x: S::V, z: S::V) -> S::V {
    s.div(x, s.add(s.splat(1.0), exp(s, s.sub(s.splat(0.0), z))))
}

/// `x = gelu(x)` in place; [`Gelu::Tanh`] as `x · sigmoid(2a)` with `a`
/// the tanh's argument (the same function).
pub fn gelu(x: &mut [f32], kind: Gelu) {
    dispatch!(s => match kind {
        Gelu::Tanh => {
            let (k, c) = (s.splat(2.0 * (2.0 / std::f32::consts::PI).sqrt()), s.splat(0.044_715));
            update(s, x, [], #[inline(always)] |v, []| gated_v(s, v, s.mul(k, s.add(v, s.mul(c, s.mul(v, s.mul(v, v)))))))
        }
        Gelu::Quick => {
            let k = s.splat(1.702);
            update(s, x, [], #[inline(always)] |v, []| gated_v(s, v, s.mul(k, v)))
        }
    })
}

/// `out = gelu(gate) · up` with GELU's tanh form evaluated as llama.cpp's
/// CPU backend evaluates it for Gemma: a gate at or below -10 gives 0, one
/// at or above 10 passes through, and any other is rounded to f16 and
/// looked up in a table of the f32 formula's results rounded to f16. The
/// two roundings move values by up to 2⁻¹¹ of themselves, which a small
/// model's logits show; matching them keeps sluice's outputs comparable.
///
/// # Panics
/// If the slices differ in length.
pub fn geglu_f16(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_same_len("geglu up", gate.len(), up.len());
    assert_same_len("geglu out", gate.len(), out.len());
    let table = &*GELU_F16;
    for ((out, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *out = if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            f16::from_bits(table[usize::from(f16::from_f32(g).to_bits())]).to_f32() * u
        };
    }
}

/// GELU (tanh form, f32 arithmetic in llama.cpp's order) of every f16
/// value, rounded to f16: the table `geglu_f16` reads.
static GELU_F16: std::sync::LazyLock<Vec<u16>> = std::sync::LazyLock::new(|| {
    // The constants as llama.cpp's f32 literals round them.
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt() as f32;
    const COEF: f32 = 0.044_715;
    (0..=u16::MAX)
        .map(|bits| {
            let x = f16::from_bits(bits).to_f32();
            f16::from_f32(0.5 * x * (1.0 + (sqrt_2_over_pi * x * (1.0 + COEF * x * x)).tanh())).to_bits()
        })
        .collect()
});

/// `x *= factor` (an embedding scale, a pre-scaled query).
pub fn scale(x: &mut [f32], factor: f32) {
    dispatch!(s => {
        let factor = s.splat(factor);
        update(s, x, [], #[inline(always)] |v, []| s.mul(v, factor))
    })
}

/// `dst += src`, the residual connection.
///
/// # Panics
/// If the slices differ in length.
pub fn add_in_place(dst: &mut [f32], src: &[f32]) {
    assert_same_len("add_in_place", dst.len(), src.len());
    dispatch!(s => update(s, dst, [src], #[inline(always)] |d, [x]| s.add(d, x)))
}

/// Rounds `src` to f16 (nearest, ties to even; out-of-range values become
/// ±inf) into `dst`, as when writing K and V into the cache.
///
/// # Panics
/// If the slices differ in length.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    assert_same_len("f32_to_f16_row", src.len(), dst.len());
    dispatch!(s => {
        let (src, src_tail) = src.as_chunks::<LANES>();
        let (dst, dst_tail) = dst.as_chunks_mut::<LANES>();
        for (x, y) in src.iter().zip(dst) {
            s.store_f16(s.load(x), y);
        }
        if !src_tail.is_empty() {
            let mut y = [f16::ZERO; LANES];
            s.store_f16(s.load(&padded(src_tail, 0.0)), &mut y);
            dst_tail.copy_from_slice(&y[..dst_tail.len()]);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::same_on_every_level;
    use crate::ops::noise;

    const LENGTHS: [usize; 8] = [1, 5, 15, 16, 17, 64, 576, 1000];

    fn close(got: f32, want: f64, rel: f64) -> bool {
        (got as f64 - want).abs() <= rel * want.abs().max(1e-30)
    }

    #[test]
    fn rms_norm_matches_f64_and_every_level() {
        for (seed, &n) in LENGTHS.iter().enumerate() {
            let x = noise(n, seed as u64, 3.0);
            let w = noise(n, 100 + seed as u64, 1.5);
            let got = same_on_every_level(|| {
                let mut out = vec![f32::NAN; n];
                rms_norm(&x, &w, 1e-5, &mut out);
                out
            });
            let mut in_place = x.clone();
            rms_norm_in_place(&mut in_place, &w, 1e-5);
            assert_eq!(in_place, got);
            let mean = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let scale = 1.0 / (mean + 1e-5).sqrt();
            for i in 0..n {
                let want = x[i] as f64 * scale * w[i] as f64;
                assert!(close(got[i], want, 1e-5), "n={n} i={i}: {} vs {want}", got[i]);
            }
        }
    }

    #[test]
    fn layer_norm_matches_f64_and_every_level() {
        for (seed, &n) in LENGTHS.iter().enumerate() {
            let x: Vec<f32> = noise(n, seed as u64, 3.0).iter().map(|v| v + 1.5).collect();
            let (w, b) = (noise(n, 100 + seed as u64, 1.5), noise(n, 200 + seed as u64, 0.5));
            let got = same_on_every_level(|| {
                let mut out = vec![f32::NAN; n];
                layer_norm(&x, &w, &b, 1e-6, &mut out);
                out
            });
            let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = x.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
            for i in 0..n {
                let want = (f64::from(x[i]) - mean) / (var + 1e-6).sqrt() * f64::from(w[i]) + f64::from(b[i]);
                assert!(
                    (f64::from(got[i]) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "n={n} i={i}: {} vs {want}",
                    got[i]
                );
            }
        }
    }

    #[test]
    fn swiglu_oai_clamps_and_matches_its_formula_on_every_level() {
        let gate: Vec<f32> = noise(1000, 5, 12.0);
        let up: Vec<f32> = noise(1000, 6, 12.0);
        let got = same_on_every_level(|| {
            let mut out = vec![f32::NAN; gate.len()];
            swiglu_oai(&gate, &up, &mut out);
            out
        });
        for ((&g, &u), &y) in gate.iter().zip(&up).zip(&got) {
            let (g, u) = (f64::from(g).min(7.0), f64::from(u).clamp(-7.0, 7.0));
            let want = g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
            assert!((f64::from(y) - want).abs() <= 2e-6 * (1.0 + want.abs()), "{g}, {u}: {y}, not {want}");
        }
        let mut out = [0.0; 2];
        swiglu_oai(&[100.0, -100.0], &[100.0, -100.0], &mut out);
        // Clamped to 7 and 7, and to -100 (whose sigmoid is 0) and -7.
        assert!((out[0] - 7.0 / (1.0 + (-1.702f32 * 7.0).exp()) * 8.0).abs() < 1e-5, "{out:?}");
        assert_eq!(out[1], 0.0);
    }

    #[test]
    fn gelus_match_their_formulas_on_every_level() {
        let x: Vec<f32> = noise(1000, 4, 12.0);
        for kind in [Gelu::Tanh, Gelu::Quick] {
            let got = same_on_every_level(|| {
                let mut y = x.clone();
                gelu(&mut y, kind);
                y
            });
            for (&x, &y) in x.iter().zip(&got) {
                let v = f64::from(x);
                let want = match kind {
                    Gelu::Tanh => {
                        0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
                    }
                    Gelu::Quick => v / (1.0 + (-1.702 * v).exp()),
                };
                assert!((f64::from(y) - want).abs() <= 2e-6 * (1.0 + want.abs()), "{kind:?}({x}) = {y}, not {want}");
            }
        }
    }

    #[test]
    fn geglu_rounds_gelu_through_f16_and_passes_the_tails() {
        let gate = [-12.0, -10.0, -1.0, 0.0, 0.3, 1.5, 9.99, 10.0, 25.0];
        let up = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 2.0];
        let mut out = [f32::NAN; 9];
        geglu_f16(&gate, &up, &mut out);
        let tanh_gelu =
            |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
        for (i, (&g, &u)) in gate.iter().zip(&up).enumerate() {
            let want = match g {
                g if g <= -10.0 => 0.0,
                g if g >= 10.0 => g * u,
                // f16 input, f16 output: within two f16 half-ulps of the formula.
                g => (tanh_gelu(f64::from(f16::from_f32(g).to_f32())) as f32) * u,
            };
            assert!((out[i] - want).abs() <= want.abs() * 1e-3 + 1e-6, "gelu({g}) · {u} = {}, not {want}", out[i]);
            if g > -10.0 && g < 10.0 {
                let gelu = out[i] / u;
                assert_eq!(f16::from_f32(gelu).to_f32(), gelu, "gelu({g}) is an f16 value");
            }
        }
        assert_eq!(out[2], f16::from_f32(-0.158_808).to_f32(), "gelu(-1) rounded to f16");
    }

    #[test]
    fn scale_multiplies_on_every_level() {
        let x: Vec<f32> = noise(100, 5, 3.0);
        let got = same_on_every_level(|| {
            let mut y = x.clone();
            scale(&mut y, 8.0f32.sqrt());
            y
        });
        assert!(got.iter().zip(&x).all(|(&y, &x)| y == x * 8.0f32.sqrt()));
    }

    #[test]
    fn softmax_matches_f64_and_every_level() {
        for (seed, &n) in LENGTHS.iter().enumerate() {
            let x = noise(n, seed as u64, 20.0);
            let got = same_on_every_level(|| {
                let mut y = x.clone();
                softmax_in_place(&mut y);
                y
            });
            let max = x.iter().copied().fold(f32::MIN, f32::max) as f64;
            let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
            for i in 0..n {
                let want = (x[i] as f64 - max).exp() / sum;
                assert!((got[i] as f64 - want).abs() <= 1e-6 * want.max(1e-6), "n={n} i={i}");
            }
        }
        let mut empty: [f32; 0] = [];
        softmax_in_place(&mut empty);
    }

    #[test]
    fn softmax_gives_zero_to_minus_infinity() {
        let got = same_on_every_level(|| {
            let mut y = vec![0.0, f32::NEG_INFINITY, 0.0, -200.0];
            softmax_in_place(&mut y);
            y
        });
        assert_eq!(got, [0.5, 0.0, 0.5, 0.0]);
    }

    #[test]
    fn silu_and_swiglu_match_f64_and_every_level() {
        for (seed, &n) in LENGTHS.iter().enumerate() {
            let mut g = noise(n, seed as u64, 12.0);
            g[0] = -100.0;
            let u = noise(n, 50 + seed as u64, 2.0);
            let silu_f64 = |x: f32| x as f64 / (1.0 + (-(x as f64)).exp());
            let got = same_on_every_level(|| {
                let mut y = g.clone();
                silu(&mut y);
                y
            });
            let gated = same_on_every_level(|| {
                let mut out = vec![f32::NAN; n];
                swiglu(&g, &u, &mut out);
                out
            });
            for i in 0..n {
                assert!(close(got[i], silu_f64(g[i]), 1e-6), "n={n} i={i}");
                assert!(close(gated[i], silu_f64(g[i]) * u[i] as f64, 1e-6), "n={n} i={i}");
            }
        }
    }

    #[test]
    fn silu_saturates() {
        let got = same_on_every_level(|| {
            let mut y = vec![-1000.0, 1000.0, 0.0, f32::INFINITY];
            silu(&mut y);
            y
        });
        assert_eq!(got, [-0.0, 1000.0, 0.0, f32::INFINITY]);
    }

    #[test]
    fn add_in_place_adds() {
        for &n in &LENGTHS {
            let a = noise(n, 1, 1.0);
            let b = noise(n, 2, 1.0);
            let got = same_on_every_level(|| {
                let mut y = a.clone();
                add_in_place(&mut y, &b);
                y
            });
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn f16_rows_round_like_half() {
        let mut x = noise(1000, 9, 70_000.0);
        x.extend([0.0, -0.0, 1e-7, -6e-8, 65504.0, 65520.0, -1e9, f32::INFINITY, 2.0f32.powi(-24)]);
        for n in [x.len(), 17, 16, 3] {
            let got = same_on_every_level(|| {
                let mut y = vec![f16::NAN; n];
                f32_to_f16_row(&x[..n], &mut y);
                y.iter().map(|v| v.to_f32()).collect()
            });
            for (g, &v) in got.iter().zip(&x[..n]) {
                assert_eq!(g.to_bits(), f16::from_f32(v).to_f32().to_bits(), "{v}");
            }
        }
        let got = same_on_every_level(|| {
            let mut y = [f16::ZERO];
            f32_to_f16_row(&[f32::NAN], &mut y);
            vec![y[0].is_nan() as u8 as f32]
        });
        assert_eq!(got, [1.0]);
    }

    #[test]
    #[should_panic(expected = "rms_norm out")]
    fn rms_norm_rejects_short_out() {
        rms_norm(&[1.0; 4], &[1.0; 4], 1e-5, &mut [0.0; 3]);
    }
}
