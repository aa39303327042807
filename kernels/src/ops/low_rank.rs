//! Low-rank deltas (LoRA adapters): `out += scale · B·(A·x)` for one
//! activation row, with `A` of `rank × n_in` and `B` of `n_out × rank`.
//!
//! Both factors are kept in f32 (an adapter is small next to its base
//! weights), `B` transposed so that the second product runs along the
//! output row 16 lanes at a time. Every sum has one order fixed by the
//! shapes alone — `A·x` as the module's 16-lane reduction, `B·t` adding
//! the rank's terms in rank order per output — so a row's delta is the
//! same bits whatever else is in the batch, on every instruction set.

use super::OpsError;
use super::simd::{LANES, Simd, dispatch, padded};

/// One adapter's factors for one weight matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct LowRank {
    /// `rank` rows of `n_in`.
    a: Vec<f32>,
    /// `B` transposed: `rank` rows of `n_out`.
    b_t: Vec<f32>,
    rank: usize,
    n_in: usize,
    n_out: usize,
}

impl LowRank {
    /// The factors as GGUF adapters store them: `a` holds `rank` rows of
    /// `n_in` (`lora_a`, shape `[n_in, rank]`), `b` holds `n_out` rows of
    /// `rank` (`lora_b`, shape `[rank, n_out]`).
    pub fn new(a: Vec<f32>, b: &[f32], rank: usize, n_in: usize, n_out: usize) -> Result<Self, OpsError> {
        let fits = |len: usize, rows: usize, cols: usize| rows.checked_mul(cols) == Some(len);
        if rank == 0 || !fits(a.len(), rank, n_in) || !fits(b.len(), n_out, rank) {
            return Err(OpsError::LowRank(format!(
                "{} and {} values for factors of rank {rank} from {n_in} to {n_out}",
                a.len(),
                b.len()
            )));
        }
        let mut b_t = vec![0.0; b.len()];
        for (o, row) in b.chunks_exact(rank).enumerate() {
            for (r, &value) in row.iter().enumerate() {
                b_t[r * n_out + o] = value;
            }
        }
        Ok(LowRank { a, b_t, rank, n_in, n_out })
    }

    /// `a` as given, and B transposed: `rank` rows of `n_out`.
    pub fn factors(&self) -> (&[f32], &[f32]) {
        (&self.a, &self.b_t)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn n_in(&self) -> usize {
        self.n_in
    }

    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// `out += (B·(A·x)) · scale` (the product rounded before the scale, as
    /// llama.cpp scales it). `t` is scratch, grown to `rank`.
    ///
    /// Several independent sums run side by side (four ranks of `A·x`, four
    /// output chunks of `B·t`) so that no sum waits on the one before; each
    /// sum's own order is the same as if it ran alone.
    ///
    /// # Panics
    /// If `x` is not `n_in` long or `out` not `n_out`.
    pub fn add_to(&self, x: &[f32], scale: f32, out: &mut [f32], t: &mut Vec<f32>) {
        assert!(x.len() == self.n_in && out.len() == self.n_out, "low-rank delta of the wrong width");
        t.clear();
        t.resize(self.rank, 0.0);
        dispatch!(s => {
            for (t, a) in t.chunks_mut(GROUP).zip(self.a.chunks(GROUP * self.n_in)) {
                dots(s, a, x, t);
            }
            let (chunks, tail) = out.as_chunks_mut::<LANES>();
            for (group, outs) in chunks.chunks_mut(GROUP).enumerate() {
                let mut sums = [s.splat(0.0); GROUP];
                for (&t, b) in t.iter().zip(self.b_t.chunks_exact(self.n_out)) {
                    let (t, b) = (s.splat(t), &b.as_chunks::<LANES>().0[group * GROUP..]);
                    for (sum, b) in sums.iter_mut().zip(b).take(outs.len()) {
                        *sum = s.add(*sum, s.mul(t, s.load(b)));
                    }
                }
                for (out, sum) in outs.iter_mut().zip(sums) {
                    s.store(s.add(s.load(out), s.mul(sum, s.splat(scale))), out);
                }
            }
            if !tail.is_empty() {
                let at = chunks.len() * LANES;
                let mut sum = s.splat(0.0);
                for (&t, b) in t.iter().zip(self.b_t.chunks_exact(self.n_out)) {
                    sum = s.add(sum, s.mul(s.splat(t), s.load(&padded(&b[at..], 0.0))));
                }
                let mut last = padded(tail, 0.0);
                s.store(s.add(s.load(&last), s.mul(sum, s.splat(scale))), &mut last);
                tail.copy_from_slice(&last[..tail.len()]);
            }
        })
    }
}

/// Sums computed side by side.
const GROUP: usize = 4;

/// `t[r] = a_r · x` for the (up to [`GROUP`]) rows `a_r` of `a`, each in
/// the module's fixed 16-lane order (products rounded, then summed in
/// chunk order; no fused multiply-add), `x` loaded once for all of them.
#[inline(always)]
fn dots<S: Simd>(s: S, a: &[f32], x: &[f32], t: &mut [f32]) {
    let n = x.len();
    let mut acc = [s.splat(0.0); GROUP];
    let (chunks, tail) = x.as_chunks::<LANES>();
    for (index, x) in chunks.iter().enumerate() {
        let x = s.load(x);
        for (r, acc) in acc.iter_mut().enumerate().take(t.len()) {
            let a = &a[r * n + index * LANES..];
            *acc = s.add(*acc, s.mul(s.load(&a.as_chunks::<LANES>().0[0]), x));
        }
    }
    if !tail.is_empty() {
        let x = s.load(&padded(tail, 0.0));
        for (r, acc) in acc.iter_mut().enumerate().take(t.len()) {
            let a = &a[r * n + chunks.len() * LANES..(r + 1) * n];
            *acc = s.add(*acc, s.mul(s.load(&padded(a, 0.0)), x));
        }
    }
    for (t, acc) in t.iter_mut().zip(acc) {
        *t = s.reduce_sum(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::same_on_every_level;
    use crate::ops::noise;

    /// `x + scale · B·(A·x)` in f64, the reference.
    fn reference(a: &[f32], b: &[f32], rank: usize, x: &[f32], base: &[f32], scale: f32) -> Vec<f64> {
        let t: Vec<f64> = a
            .chunks_exact(x.len())
            .map(|row| row.iter().zip(x).map(|(&a, &x)| f64::from(a) * f64::from(x)).sum())
            .collect();
        b.chunks_exact(rank)
            .zip(base)
            .map(|(row, &y)| {
                f64::from(y) + f64::from(scale) * row.iter().zip(&t).map(|(&b, t)| f64::from(b) * t).sum::<f64>()
            })
            .collect()
    }

    #[test]
    fn deltas_match_the_reference_on_every_level() {
        // Widths that are and are not whole chunks.
        for (rank, n_in, n_out) in [(8, 64, 48), (3, 37, 21), (16, 576, 192)] {
            let a = noise(rank * n_in, 1, 0.5);
            let b = noise(n_out * rank, 2, 0.5);
            let x = noise(n_in, 3, 1.0);
            let base = noise(n_out, 4, 1.0);
            let low_rank = LowRank::new(a.clone(), &b, rank, n_in, n_out).expect("valid factors");
            let got = same_on_every_level(|| {
                let mut out = base.clone();
                low_rank.add_to(&x, 0.75, &mut out, &mut Vec::new());
                out
            });
            for (got, want) in got.iter().zip(reference(&a, &b, rank, &x, &base, 0.75)) {
                assert!((f64::from(*got) - want).abs() < 1e-4, "{got} vs {want} ({rank}, {n_in}, {n_out})");
            }
        }
    }

    #[test]
    fn factors_must_fit_their_shapes() {
        assert!(LowRank::new(vec![0.0; 8], &[0.0; 8], 2, 4, 4).is_ok());
        assert!(LowRank::new(vec![0.0; 7], &[0.0; 8], 2, 4, 4).is_err());
        assert!(LowRank::new(vec![0.0; 8], &[0.0; 9], 2, 4, 4).is_err());
        assert!(LowRank::new(Vec::new(), &[], 0, 4, 4).is_err(), "rank 0");
    }
}
