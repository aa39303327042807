//! Low-rank deltas (LoRA adapters): `out += scale · B·(A·x)` for one
//! activation row, with `A` of `rank × n_in` and `B` of `n_out × rank`.
//!
//! Both factors are kept in f32 (an adapter is small next to its base
//! weights), `B` transposed so that the second product runs along the
//! output row 16 lanes at a time. Every dot product — `A·x` per rank, `B·t`
//! per output — sums as llama.cpp's CPU backend sums an F32 adapter's
//! products for a batch of one token (its vector dot product, AVX-512): four
//! 16-lane accumulators of fused multiply-adds over whole blocks of 64,
//! then the rest one product at a time. The order is fixed by the shapes
//! alone, so a row's delta is the same bits whatever else is in the batch,
//! on every instruction set. (llama.cpp takes its tinyBLAS kernels for
//! batches of several tokens, another order: prompt rows agree with it to
//! rounding, not to the bit.)

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
            let scale = s.splat(scale);
            let (chunks, tail) = out.as_chunks_mut::<LANES>();
            for (index, out) in chunks.iter_mut().enumerate() {
                let at = index * LANES;
                let sum = up(s, t, self.b_t.chunks_exact(self.n_out).map(|b| s.load(&b[at..].as_chunks().0[0])));
                s.store(s.add(s.load(out), s.mul(sum, scale)), out);
            }
            if !tail.is_empty() {
                let at = chunks.len() * LANES;
                let sum = up(s, t, self.b_t.chunks_exact(self.n_out).map(|b| s.load(&padded(&b[at..], 0.0))));
                let mut last = padded(tail, 0.0);
                s.store(s.add(s.load(&last), s.mul(sum, scale)), &mut last);
                tail.copy_from_slice(&last[..tail.len()]);
            }
        })
    }
}

/// Ranks of `A·x` computed side by side, `x` loaded once for all of them.
const GROUP: usize = 2;

/// The products a vector dot product sums as four 16-lane accumulators.
const BLOCK: usize = 4 * LANES;

/// Products past the last whole [`BLOCK`] added one at a time, rounded,
/// before the last `n mod 8` are fused one at a time.
const ROUNDED: usize = 8;

/// `t[r] = a_r · x` for the (up to [`GROUP`]) rows `a_r` of `a`, each as
/// llama.cpp's vector dot product takes it (`ggml_vec_dot_f32`, AVX-512, as
/// GCC compiles it): chunk `c` of 16 fused into accumulator `c mod 4` over
/// the whole [`BLOCK`]s, accumulators 0 + 2 and 1 + 3, then their sum, then
/// the lanes in the module's tree; then the rest one product at a time.
#[inline(always)]
fn dots<S: Simd>(s: S, a: &[f32], x: &[f32], t: &mut [f32]) {
    let n = x.len();
    let whole = n - n % BLOCK;
    let mut acc = [[s.splat(0.0); 4]; GROUP];
    for (block, x) in x[..whole].chunks_exact(BLOCK).enumerate() {
        for (j, x) in x.as_chunks::<LANES>().0.iter().enumerate() {
            let x = s.load(x);
            for (r, acc) in acc.iter_mut().enumerate().take(t.len()) {
                let a = &a[r * n + block * BLOCK + j * LANES..];
                acc[j] = s.mul_add(s.load(&a.as_chunks::<LANES>().0[0]), x, acc[j]);
            }
        }
    }
    for (r, (t, acc)) in t.iter_mut().zip(acc).enumerate() {
        let sum = s.reduce_sum(s.add(s.add(acc[0], acc[2]), s.add(acc[1], acc[3])));
        *t = rest(sum, &a[r * n + whole..(r + 1) * n], &x[whole..]);
    }
}

/// The products of `a` and `b` (shorter than a [`BLOCK`]) added to `sum`:
/// rounded and added while at least [`ROUNDED`] are left of a multiple of
/// eight, the last `len mod 8` fused.
#[inline(always)]
fn rest(mut sum: f32, a: &[f32], b: &[f32]) -> f32 {
    let rounded = a.len() - a.len() % ROUNDED;
    for (&a, &b) in a[..rounded].iter().zip(&b[..rounded]) {
        sum += a * b;
    }
    for (&a, &b) in a[rounded..].iter().zip(&b[rounded..]) {
        sum = a.mul_add(b, sum);
    }
    sum
}

/// `Σ_r t[r] · b_r` for 16 outputs at once, `b` yielding the outputs' `Bᵀ`
/// values rank by rank, each output's sum in the order of [`dots`] over the
/// rank (the whole [`BLOCK`]s in 4 × 16 lanes, the rest one at a time).
#[inline(always)]
fn up<S: Simd>(s: S, t: &[f32], b: impl Iterator<Item = S::V>) -> S::V {
    let whole = t.len() - t.len() % BLOCK;
    let rounded = t.len() - t.len() % ROUNDED;
    let mut terms = t.iter().zip(b).enumerate();
    let mut sum = s.splat(0.0);
    if whole > 0 {
        let mut lanes = [[s.splat(0.0); LANES]; 4];
        for (r, (&t, b)) in terms.by_ref().take(whole) {
            let lane = &mut lanes[r / LANES % 4][r % LANES];
            *lane = s.mul_add(s.splat(t), b, *lane);
        }
        sum = combine(s, &lanes);
    }
    for (r, (&t, b)) in terms {
        let t = s.splat(t);
        sum = if r < rounded { s.add(sum, s.mul(t, b)) } else { s.mul_add(t, b, sum) };
    }
    sum
}

/// The four accumulators of [`up`] summed as [`dots`] sums its own: 0 + 2
/// and 1 + 3, those two, then the lanes in the tree.
#[inline(always)]
fn combine<S: Simd>(s: S, lanes: &[[S::V; LANES]; 4]) -> S::V {
    let mut sums = [s.splat(0.0); LANES];
    for (l, sum) in sums.iter_mut().enumerate() {
        *sum = s.add(s.add(lanes[0][l], lanes[2][l]), s.add(lanes[1][l], lanes[3][l]));
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            sums[l] = s.add(sums[l], sums[l + width]);
        }
        width /= 2;
    }
    sums[0]
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

    /// A dot product as llama.cpp's `ggml_vec_dot_f32` takes it on AVX-512
    /// as GCC compiles it: element `i` of the whole blocks of 64 fused into
    /// lane `i mod 16` of accumulator `i / 16 mod 4`, accumulators (0 + 2) +
    /// (1 + 3), lanes halved 8, 4, 2, 1; then the rest added one at a time,
    /// products rounded except for the last `len mod 8`, which are fused.
    fn vec_dot(a: &[f32], b: &[f32]) -> f32 {
        let whole = a.len() - a.len() % 64;
        let mut acc = [[0.0f32; 16]; 4];
        for i in 0..whole {
            acc[i / 16 % 4][i % 16] = a[i].mul_add(b[i], acc[i / 16 % 4][i % 16]);
        }
        let mut lanes: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
        let mut width = 8;
        while width > 0 {
            for l in 0..width {
                lanes[l] += lanes[l + width];
            }
            width /= 2;
        }
        let rounded = a.len() - a.len() % 8;
        (whole..a.len()).fold(lanes[0], |sum, i| if i < rounded { sum + a[i] * b[i] } else { a[i].mul_add(b[i], sum) })
    }

    #[test]
    fn deltas_are_llama_cpps_single_token_arithmetic_to_the_bit() {
        // Whole blocks of 64; none and a rest of 5; a rank with a block and
        // a width with a rest of 8.
        for (rank, n_in, n_out) in [(8, 576, 192), (3, 37, 21), (70, 200, 40)] {
            let a = noise(rank * n_in, 5, 0.5);
            let b = noise(n_out * rank, 6, 0.5);
            let x = noise(n_in, 7, 1.0);
            let base = noise(n_out, 8, 1.0);
            let scale = 0.75;
            let t: Vec<f32> = a.chunks_exact(n_in).map(|row| vec_dot(row, &x)).collect();
            let want: Vec<u32> =
                b.chunks_exact(rank).zip(&base).map(|(row, y)| (y + vec_dot(row, &t) * scale).to_bits()).collect();
            let low_rank = LowRank::new(a, &b, rank, n_in, n_out).expect("valid factors");
            let got = same_on_every_level(|| {
                let mut out = base.clone();
                low_rank.add_to(&x, scale, &mut out, &mut Vec::new());
                out
            });
            assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "({rank}, {n_in}, {n_out})");
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
