//! Rotary position embedding with NEOX pairing, plus the multi-section
//! variants of Qwen2-VL (M-RoPE) and Qwen3-VL (interleaved M-RoPE).
//!
//! Rotary pair `j < n_rot / 2` of a head is (element `j`, element
//! `j + n_rot / 2`), or (`2j`, `2j + 1`) for [`RopeKind::Norm`]; it turns by
//! `pos * theta_j` with
//! `theta_j = freq_scale * base^(-2j / n_rot)`. Elements from `n_rot` on are
//! left alone. The multi-section kinds only change which component of a
//! four-part position drives each pair; the rates stay the same.
//!
//! The arithmetic is llama.cpp's, so that rotated q and k match its bits:
//! `base^(-2 / n_rot)` is an f32 `powf`; each position component starts as
//! an f32 and is multiplied by that ratio once per pair (not raised to a
//! power); the angle is `freq_scale` times it, with the f32 `cos`/`sin` of
//! the C library; and the rotation fuses one product of each output. Every
//! kind goes through these steps, so a multi-section kind fed equal
//! components reproduces NEOX bit for bit.

use super::OpsError;
use super::rope_scaling::{RopeScaling, Scaled};

/// How rotary pairs pick their position component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Every pair follows component 0; pair `j` is elements (`2j`, `2j + 1`)
    /// (llama's "normal" rope; its GGUF converter permutes Q and K for it).
    Norm,
    /// Every pair follows component 0.
    Neox,
    /// Qwen2-VL: with `S` the sum of `sections` (counted in pairs) and
    /// `k = j mod S`, the first `sections[0]` values of `k` follow component
    /// 0 (time), the next `sections[1]` component 1 (height), then
    /// `sections[2]` component 2 (width) and the rest component 3.
    MRope { sections: [u32; 4] },
    /// Qwen3-VL: the same `k`, but the first three components interleave:
    /// `k % 3 == 1 && k < 3 * sections[1]` → 1, else
    /// `k % 3 == 2 && k < 3 * sections[2]` → 2, else
    /// `k % 3 == 0 && k < 3 * sections[0]` → 0, else 3.
    IMRope { sections: [u32; 4] },
    /// A Qwen2-VL vision tower's 2-D rope (llama.cpp's "vision" mode):
    /// every element rotates (`n_rot = head_dim`, pairs `j` and
    /// `j + head_dim / 2`); the first half of the pairs follow component 0
    /// (the patch's row), the second half component 1 (its column), and
    /// each half's rate starts over at 1 and falls by `base^(-4 / n_rot)`
    /// per pair (the rate of a rope over half the head).
    Vision,
}

/// A token's position as (time, height, width, extra); see [`Rope::text_pos`].
pub type RopePos = [u32; 4];

/// Precomputed rates for one model's rotary embedding.
#[derive(Clone, Debug)]
pub struct Rope {
    head_dim: usize,
    /// `base^(-2 / n_rot)`: each pair's rate is the previous pair's times it.
    ratio: f32,
    freq_scale: f32,
    /// Per rotary pair: the position component that drives it.
    component: Vec<u8>,
    /// Per rotary pair: its component's rate starts over at 1 here
    /// ([`RopeKind::Vision`]'s sections).
    restart: Vec<bool>,
    /// Pairs are adjacent elements ([`RopeKind::Norm`]).
    adjacent: bool,
    base: f32,
    /// Frequency factors, YaRN and the magnitude factor.
    scaled: Scaled,
}

/// Cosine and sine of every pair's angle at one position. Fill it with
/// [`Rope::angles`] once per token and apply it to that token's q and k in
/// every layer; reusing it across tokens avoids reallocation.
#[derive(Clone, Debug, Default)]
pub struct RopeAngles {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeAngles {
    /// Each pair's cosine, then each pair's sine.
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }
}

impl Rope {
    /// Checks the model's rope parameters and precomputes the rates.
    pub fn new(head_dim: usize, n_rot: usize, base: f32, freq_scale: f32, kind: RopeKind) -> Result<Self, OpsError> {
        let bad = |why: String| Err(OpsError::Rope(why));
        if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > head_dim {
            return bad(format!("n_rot {n_rot} must be even, positive and at most head_dim {head_dim}"));
        }
        if !(base.is_finite() && base > 0.0 && freq_scale.is_finite() && freq_scale > 0.0) {
            return bad(format!("base {base} and freq_scale {freq_scale} must be finite and positive"));
        }
        if let RopeKind::MRope { sections } | RopeKind::IMRope { sections } = kind
            && sections.iter().all(|&s| s == 0)
        {
            return bad("multi-section rope needs a non-empty section".into());
        }
        let pairs = n_rot / 2;
        let vision = kind == RopeKind::Vision;
        if vision && (n_rot != head_dim || !pairs.is_multiple_of(2)) {
            return bad(format!("vision rope rotates whole heads of a multiple of 4, not {n_rot} of {head_dim}"));
        }
        // llama.cpp's vision mode is a rope over half the head run twice.
        let rate_dims = if vision { pairs } else { n_rot };
        let ratio = base.powf(-2.0 / rate_dims as f32);
        let component =
            (0..pairs).map(|j| if vision { u8::from(j >= pairs / 2) } else { component(kind, j) }).collect();
        let restart = (0..pairs).map(|j| vision && j % (pairs / 2) == 0).collect();
        Ok(Self {
            head_dim,
            ratio,
            freq_scale,
            component,
            restart,
            adjacent: kind == RopeKind::Norm,
            base,
            scaled: Scaled::none(),
        })
    }

    /// This rope with `scaling` applied to every pair's angle.
    pub fn scaled(mut self, scaling: &RopeScaling) -> Result<Self, OpsError> {
        self.scaled = Scaled::new(scaling, 2 * self.component.len(), self.base, self.freq_scale)?;
        Ok(self)
    }

    /// The position of a text token, `[p, p, p, 0]`: what every kind expects
    /// when there is no image grid.
    pub fn text_pos(p: u32) -> RopePos {
        [p, p, p, 0]
    }

    /// Pairs are adjacent elements (else a head's first and second halves).
    pub fn adjacent(&self) -> bool {
        self.adjacent
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Fills `out` with the cosine and sine of each pair's angle at `pos`.
    pub fn angles(&self, pos: RopePos, out: &mut RopeAngles) {
        out.cos.clear();
        out.sin.clear();
        let mut theta = pos.map(|p| p as f32);
        for (j, (&c, &restart)) in self.component.iter().zip(&self.restart).enumerate() {
            if restart {
                theta[usize::from(c)] = pos[usize::from(c)] as f32;
            }
            let (cos, sin) = self.scaled.cos_sin(j, theta[usize::from(c)], self.freq_scale);
            out.cos.push(cos);
            out.sin.push(sin);
            theta = theta.map(|t| t * self.ratio);
        }
    }

    /// Rotates every head of `x` (`n_heads × head_dim`, one token's q or k)
    /// in place by `angles`.
    ///
    /// # Panics
    /// If `angles` was not filled by this `Rope` or `x` is not a whole
    /// number of heads.
    pub fn apply(&self, angles: &RopeAngles, x: &mut [f32]) {
        let pairs = self.component.len();
        assert!(angles.cos.len() == pairs, "rope angles are for {} pairs, not {pairs}", angles.cos.len());
        assert!(
            x.len().is_multiple_of(self.head_dim),
            "rope input of {} is not a multiple of head_dim {}",
            x.len(),
            self.head_dim
        );
        for head in x.chunks_exact_mut(self.head_dim) {
            if self.adjacent {
                for ((pair, &cos), &sin) in head[..2 * pairs].chunks_exact_mut(2).zip(&angles.cos).zip(&angles.sin) {
                    [pair[0], pair[1]] = rotate(pair[0], pair[1], cos, sin);
                }
                continue;
            }
            let (first, second) = head[..2 * pairs].split_at_mut(pairs);
            for (((a, b), &cos), &sin) in first.iter_mut().zip(second).zip(&angles.cos).zip(&angles.sin) {
                [*a, *b] = rotate(*a, *b, cos, sin);
            }
        }
    }
}

/// The position component that drives pair `j`.
/// `(x0·cos − x1·sin, x0·sin + x1·cos)`, fusing the products of `x0` (the
/// contraction llama.cpp's compiled rotation performs).
#[inline(always)]
fn rotate(x0: f32, x1: f32, cos: f32, sin: f32) -> [f32; 2] {
    [x0.mul_add(cos, -(x1 * sin)), x0.mul_add(sin, x1 * cos)]
}

fn component(kind: RopeKind, j: usize) -> u8 {
    let (sections, interleaved) = match kind {
        RopeKind::Norm | RopeKind::Neox | RopeKind::Vision => return 0,
        RopeKind::MRope { sections } => (sections.map(u64::from), false),
        RopeKind::IMRope { sections } => (sections.map(u64::from), true),
    };
    let k = j as u64 % sections.iter().sum::<u64>();
    if interleaved {
        return match k % 3 {
            1 if k < 3 * sections[1] => 1,
            2 if k < 3 * sections[2] => 2,
            0 if k < 3 * sections[0] => 0,
            _ => 3,
        };
    }
    let mut end = 0;
    for (c, s) in sections[..3].iter().enumerate() {
        end += s;
        if k < end {
            return c as u8;
        }
    }
    3
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::noise;

    const POSITIONS: [u32; 9] = [0, 1, 2, 7, 63, 500, 4095, 32_767, 100_003];

    fn rotate(rope: &Rope, pos: RopePos, x: &[f32]) -> Vec<f32> {
        let mut angles = RopeAngles::default();
        rope.angles(pos, &mut angles);
        let mut y = x.to_vec();
        rope.apply(&angles, &mut y);
        y
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn neox_matches_f64_and_leaves_the_rest() {
        for (head_dim, n_rot, base, freq_scale) in
            [(64, 64, 10_000.0, 1.0), (64, 32, 10_000.0, 1.0), (128, 128, 1e6, 0.25), (80, 40, 500_000.0, 1.0)]
        {
            let rope = Rope::new(head_dim, n_rot, base, freq_scale, RopeKind::Neox).unwrap();
            let x = noise(3 * head_dim, n_rot as u64, 2.0);
            for p in POSITIONS {
                let y = rotate(&rope, Rope::text_pos(p), &x);
                for (h, (xh, yh)) in x.chunks(head_dim).zip(y.chunks(head_dim)).enumerate() {
                    let half = n_rot / 2;
                    for j in 0..half {
                        let theta = freq_scale as f64 * (base as f64).powf(-2.0 * j as f64 / n_rot as f64);
                        let angle = p as f64 * theta;
                        let (x0, x1) = (xh[j] as f64, xh[j + half] as f64);
                        let want = [x0 * angle.cos() - x1 * angle.sin(), x0 * angle.sin() + x1 * angle.cos()];
                        // Each of the j multiplications that step the rate
                        // and the f32 powf, product and scale may be half an
                        // ulp off: the angle is within (j + 4) ulp of itself.
                        let tol = (x0.abs() + x1.abs()) * (angle * (j + 4) as f64 * 1.2e-7 + 1e-6);
                        for (got, want) in [yh[j], yh[j + half]].into_iter().zip(want) {
                            assert!((got as f64 - want).abs() <= tol, "head {h} pair {j} p {p}: {got} vs {want}");
                        }
                    }
                    assert_eq!(bits(&xh[n_rot..]), bits(&yh[n_rot..]), "dims past n_rot moved");
                }
            }
        }
    }

    #[test]
    fn norm_rotates_adjacent_pairs() {
        for n_rot in [32, 64] {
            let rope = Rope::new(64, n_rot, 10_000.0, 1.0, RopeKind::Norm).unwrap();
            let x = noise(2 * 64, n_rot as u64, 2.0);
            for p in POSITIONS {
                let y = rotate(&rope, Rope::text_pos(p), &x);
                for (xh, yh) in x.chunks(64).zip(y.chunks(64)) {
                    for j in 0..n_rot / 2 {
                        let angle = p as f64 * 10_000f64.powf(-2.0 * j as f64 / n_rot as f64);
                        let (x0, x1) = (xh[2 * j] as f64, xh[2 * j + 1] as f64);
                        let want = [x0 * angle.cos() - x1 * angle.sin(), x0 * angle.sin() + x1 * angle.cos()];
                        let tol = (x0.abs() + x1.abs()) * (angle * (j + 4) as f64 * 1.2e-7 + 1e-6);
                        for (got, want) in [yh[2 * j], yh[2 * j + 1]].into_iter().zip(want) {
                            assert!((got as f64 - want).abs() <= tol, "pair {j} p {p}: {got} vs {want}");
                        }
                    }
                    assert_eq!(bits(&xh[n_rot..]), bits(&yh[n_rot..]), "dims past n_rot moved");
                }
            }
        }
    }

    #[test]
    fn mrope_with_equal_components_is_neox() {
        let neox = Rope::new(128, 128, 1e6, 1.0, RopeKind::Neox).unwrap();
        for sections in [[64, 0, 0, 0], [16, 24, 24, 0]] {
            let mrope = Rope::new(128, 128, 1e6, 1.0, RopeKind::MRope { sections }).unwrap();
            for (i, p) in POSITIONS.into_iter().chain(1000..1200).enumerate() {
                let x = noise(2 * 128, i as u64, 4.0);
                let want = rotate(&neox, Rope::text_pos(p), &x);
                assert_eq!(bits(&rotate(&mrope, [p, p, p, 0], &x)), bits(&want), "{sections:?} p {p}");
            }
        }
    }

    #[test]
    fn imrope_is_not_neox() {
        let neox = Rope::new(64, 64, 10_000.0, 1.0, RopeKind::Neox).unwrap();
        let imrope = Rope::new(64, 64, 10_000.0, 1.0, RopeKind::IMRope { sections: [32, 0, 0, 0] }).unwrap();
        let x = noise(64, 3, 1.0);
        let p = 10;
        assert_ne!(bits(&rotate(&imrope, Rope::text_pos(p), &x)), bits(&rotate(&neox, Rope::text_pos(p), &x)));
    }

    #[test]
    fn sections_pick_components() {
        let pick = |kind| (0..10).map(|j| component(kind, j)).collect::<Vec<_>>();
        let sections = [2, 1, 1, 1];
        assert_eq!(pick(RopeKind::Neox), [0; 10]);
        assert_eq!(pick(RopeKind::MRope { sections }), [0, 0, 1, 2, 3, 0, 0, 1, 2, 3]);
        assert_eq!(pick(RopeKind::IMRope { sections }), [0, 1, 2, 0, 3, 0, 1, 2, 0, 3]);
        // Qwen3-VL's layout: t h w t h w … until h and w run out.
        let qwen3 = RopeKind::IMRope { sections: [24, 20, 20, 0] };
        assert_eq!(pick(qwen3), [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        assert_eq!((58..66).map(|j| component(qwen3, j)).collect::<Vec<_>>(), [1, 2, 0, 3, 3, 0, 0, 1]);
    }

    #[test]
    fn each_component_drives_its_pairs() {
        let rope = Rope::new(16, 16, 100.0, 1.0, RopeKind::MRope { sections: [1, 2, 3, 2] }).unwrap();
        let mut angles = RopeAngles::default();
        rope.angles([0, 0, 0, 0], &mut angles);
        assert!(angles.sin.iter().all(|&s| s == 0.0));
        rope.angles([0, 5, 0, 0], &mut angles);
        let moved: Vec<bool> = angles.sin.iter().map(|&s| s != 0.0).collect();
        assert_eq!(moved, [false, true, true, false, false, false, false, false]);
    }

    #[test]
    fn vision_rotates_rows_then_columns_at_restarting_rates() {
        let (head_dim, base) = (16, 10_000.0f64);
        let rope = Rope::new(head_dim, head_dim, base as f32, 1.0, RopeKind::Vision).unwrap();
        let x = noise(2 * head_dim, 9, 2.0);
        for (row, col) in [(0, 0), (3, 0), (0, 5), (7, 11), (40, 2)] {
            let y = rotate(&rope, [row, col, row, col], &x);
            for (xh, yh) in x.chunks(head_dim).zip(y.chunks(head_dim)) {
                let half = head_dim / 2;
                for j in 0..half {
                    // Rows drive pairs 0..4, columns 4..8, each at
                    // base^(-4k / head_dim) from k = 0.
                    let (p, k) = if j < half / 2 { (row, j) } else { (col, j - half / 2) };
                    let angle = f64::from(p) * base.powf(-4.0 * k as f64 / head_dim as f64);
                    let (x0, x1) = (f64::from(xh[j]), f64::from(xh[j + half]));
                    let want = [x0 * angle.cos() - x1 * angle.sin(), x0 * angle.sin() + x1 * angle.cos()];
                    let tol = (x0.abs() + x1.abs()) * (angle * (k + 4) as f64 * 1.2e-7 + 1e-6);
                    for (got, want) in [yh[j], yh[j + half]].into_iter().zip(want) {
                        assert!((f64::from(got) - want).abs() <= tol, "({row}, {col}) pair {j}: {got} vs {want}");
                    }
                }
            }
        }
        assert!(matches!(Rope::new(16, 8, 1e4, 1.0, RopeKind::Vision), Err(OpsError::Rope(_))));
        assert!(matches!(Rope::new(6, 6, 1e4, 1.0, RopeKind::Vision), Err(OpsError::Rope(_))));
    }

    #[test]
    fn rejects_bad_configs() {
        let sections = [0; 4];
        for (head_dim, n_rot, base, scale, kind) in [
            (64, 0, 1e4, 1.0, RopeKind::Neox),
            (64, 33, 1e4, 1.0, RopeKind::Neox),
            (64, 66, 1e4, 1.0, RopeKind::Neox),
            (64, 64, 0.0, 1.0, RopeKind::Neox),
            (64, 64, f32::NAN, 1.0, RopeKind::Neox),
            (64, 64, 1e4, -1.0, RopeKind::Neox),
            (64, 64, 1e4, 1.0, RopeKind::MRope { sections }),
            (64, 64, 1e4, 1.0, RopeKind::IMRope { sections }),
        ] {
            assert!(matches!(Rope::new(head_dim, n_rot, base, scale, kind), Err(OpsError::Rope(_))));
        }
    }

    #[test]
    #[should_panic(expected = "not a multiple of head_dim")]
    fn apply_rejects_partial_heads() {
        let rope = Rope::new(8, 8, 1e4, 1.0, RopeKind::Neox).unwrap();
        let mut angles = RopeAngles::default();
        rope.angles(Rope::text_pos(1), &mut angles);
        rope.apply(&angles, &mut [0.0; 12]);
    }
}
