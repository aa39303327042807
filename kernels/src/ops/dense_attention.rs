//! Attention in f32 among rows that all see each other (an encoder's
//! bidirectional attention over an image's patches), as two matrix
//! products on the [`crate::gemm`] kernels: the head's keys times a block
//! of queries (the scores, transposed: a row per key), a softmax down each
//! query's column, then the weights times the head's values.
//!
//! The decoder's kernel (`attention`) walks the keys one position at a
//! time with an online softmax, as llama.cpp's does; here every key is
//! visible to every query, so a head's keys and values are packed once into
//! the layouts the register tiles stream, and every block of queries reuses
//! them. Scores come out a row per key, which is the layout the second
//! product reads its left-hand rows in, so nothing is transposed per block,
//! and the softmax runs down whole vectors of queries. Each score is an
//! in-order chain over the head's dimensions, each sum and output an
//! in-order chain over the keys, so nothing depends on the SIMD level or on
//! which queries share a call: each query's output is the same bits alone
//! or in any group.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::simd::{LANES, Simd, dispatch, exp};
use super::{HeadShape, OpsError};
use crate::gemm::{Grouped, Kernel, Lhs, Packed, multiply};
use crate::pool::ThreadPool;

/// One head's keys and values over a sequence, packed for
/// [`attend_dense`].
struct DenseHead {
    kernel: Kernel,
    /// `n` rows of `head_dim`.
    keys: Grouped,
    /// `n` × `head_dim`: a row per position.
    values: Packed,
    n: usize,
    head_dim: usize,
}

impl DenseHead {
    /// Position `i`'s key and value are `key(i)` and `value(i)`, each
    /// `head_dim` long, for `i` in `0..n`.
    fn new<'a>(
        n: usize,
        head_dim: usize,
        key: impl Fn(usize) -> &'a [f32],
        value: impl Fn(usize) -> &'a [f32],
    ) -> Self {
        let kernel = Kernel::current();
        DenseHead {
            kernel,
            keys: Grouped::new(kernel, n, head_dim, key),
            values: Packed::from_rows(kernel, n, head_dim, value),
            n,
            head_dim,
        }
    }
}

/// One thread's buffers for [`attend_dense`], kept across its pieces.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    sums: Vec<f32>,
}

/// `out` (rows × head_dim) = softmax(scale · q kᵀ) v for the queries
/// `query(r)` (each head_dim long) against every position of `head`.
/// Panics if `out` is not a whole number of rows of the head's width.
fn attend_dense<'a>(
    head: &DenseHead,
    query: impl Fn(usize) -> &'a [f32],
    scale: f32,
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let d = head.head_dim;
    assert!(d > 0 && out.len().is_multiple_of(d), "out: whole rows of {d}");
    if head.n == 0 {
        out.fill(0.0);
        return;
    }
    let (rows, n, kernel) = (out.len() / d, head.n, head.kernel);
    // A row per key with a column per query, wide enough for whole groups
    // of the second product's rows and whole vectors of the softmax. The
    // columns past `rows` hold whatever an earlier call left: the rows of
    // output they make are dropped.
    let ld = rows.next_multiple_of(kernel.rows()).next_multiple_of(LANES);
    let Scratch { scores, sums } = scratch;
    scores.resize(n * ld, 0.0);
    let queries = Packed::from_columns(kernel, d, rows, query);
    multiply(&head.keys.lhs(), &queries, scores, ld);
    sums.resize(ld, 0.0);
    softmax_columns(scores, ld, scale, sums);
    multiply(&Lhs::transposed(kernel, scores, rows, n, ld), &head.values, out, d);
    for (row, &sum) in out.chunks_exact_mut(d).zip(sums.iter()) {
        row.iter_mut().for_each(|value| *value /= sum);
    }
}

/// Turns each column of `scores` (rows of `ld`, a multiple of the vector
/// width) into unnormalised weights e^(scale · x − max), the max and the
/// sum taken down the column, the sums into `sums`.
fn softmax_columns(scores: &mut [f32], ld: usize, scale: f32, sums: &mut [f32]) {
    dispatch!(s => softmax_at(s, scores, ld, scale, sums))
}

#[inline(always)]
fn softmax_at<S: Simd>(s: S, scores: &mut [f32], ld: usize, scale: f32, sums: &mut [f32]) {
    let scale = s.splat(scale);
    for (c, sums) in sums[..ld].as_chunks_mut::<LANES>().0.iter_mut().enumerate() {
        let mut max = s.splat(f32::NEG_INFINITY);
        for row in scores.chunks_exact_mut(ld) {
            let x = &mut row[c * LANES..].as_chunks_mut::<LANES>().0[0];
            let scaled = s.mul(s.load(x), scale);
            s.store(scaled, x);
            max = s.max(max, scaled);
        }
        let mut sum = s.splat(0.0);
        for row in scores.chunks_exact_mut(ld) {
            let x = &mut row[c * LANES..].as_chunks_mut::<LANES>().0[0];
            let e = exp(s, s.sub(s.load(x), max));
            sum = s.add(sum, e);
            s.store(e, x);
        }
        s.store(sum, sums);
    }
}

/// Queries per piece of work in [`attend_within`]: enough to reuse a
/// head's keys and values from cache many times, few enough that a small
/// window still splits between threads, and whole tiles of every kernel's
/// (4, 6 or 12 rows; 16 or 32 columns).
const QUERY_BLOCK: usize = 96;

/// Bidirectional attention of the rows of `q`, `k` and `v` (row `i` of
/// each belongs to sequence `seq[i]`): each row sees every row of its own
/// sequence and no other, into `out` (the shape of `q`). The threads of
/// `pool` take pieces of (sequence, head, block of queries); a row's
/// output is the same bits however the pieces fall.
#[allow(clippy::too_many_arguments)]
pub fn attend_within(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seq: &[usize],
    shape: HeadShape,
    scale: f32,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), OpsError> {
    let (n, q_len, kv_len, d) = (seq.len(), shape.q_len(), shape.kv_len(), shape.head_dim());
    if q.len() != n * q_len || out.len() != q.len() || k.len() != n * kv_len || v.len() != k.len() {
        return Err(OpsError::Attention(format!(
            "{n} rows need q and out of {n} × {q_len} and k and v of {n} × {kv_len}; got q {}, out {}, k {}, v {}",
            q.len(),
            out.len(),
            k.len(),
            v.len()
        )));
    }
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (row, &s) in seq.iter().enumerate() {
        if members.len() <= s {
            members.resize_with(s + 1, Vec::new);
        }
        members[s].push(row);
    }
    members.retain(|rows| !rows.is_empty());
    let n_kv_head = shape.n_kv_head();
    let group = shape.n_head() / n_kv_head;
    let heads: Vec<OnceLock<DenseHead>> = (0..members.len() * n_kv_head).map(|_| OnceLock::new()).collect();
    in_parallel(pool, heads.len(), |_: &mut (), index| {
        let (rows, at) = (&members[index / n_kv_head], (index % n_kv_head) * d);
        let offset = |i: usize| rows[i] * kv_len + at;
        let head = DenseHead::new(rows.len(), d, |i| &k[offset(i)..][..d], |i| &v[offset(i)..][..d]);
        assert!(heads[index].set(head).is_ok(), "each head is built once");
    });
    // (sequence, query head, first member) of each piece, and its output.
    let pieces: Vec<(usize, usize, usize)> = (0..members.len())
        .flat_map(|s| {
            let starts = (0..members[s].len()).step_by(QUERY_BLOCK);
            (0..shape.n_head()).flat_map(move |h| starts.clone().map(move |start| (s, h, start)))
        })
        .collect();
    let results: Vec<Mutex<Vec<f32>>> = pieces.iter().map(|_| Mutex::default()).collect();
    in_parallel(pool, pieces.len(), |scratch: &mut Scratch, index| {
        let (s, h, start) = pieces[index];
        let rows = &members[s][start..(start + QUERY_BLOCK).min(members[s].len())];
        let head = heads[s * n_kv_head + h / group].get().expect("every head is built before the pieces run");
        let mut attended = vec![0.0; rows.len() * d];
        attend_dense(head, |r| &q[rows[r] * q_len + h * d..][..d], scale, &mut attended, scratch);
        *results[index].lock().expect("a piece's result is written once") = attended;
    });
    for (&(s, h, start), result) in pieces.iter().zip(results) {
        let result = result.into_inner().expect("every piece ran");
        for (&row, values) in members[s][start..].iter().zip(result.chunks_exact(d)) {
            out[row * q_len + h * d..][..d].copy_from_slice(values);
        }
    }
    Ok(())
}

/// `f(state, i)` for `i` in `0..n`, the threads of `pool` claiming
/// indices until none are left, each with its own `state`.
fn in_parallel<T: Default>(pool: &ThreadPool, n: usize, f: impl Fn(&mut T, usize) + Sync) {
    let next = AtomicUsize::new(0);
    pool.run(|_, _| {
        let mut state = T::default();
        while let Some(index) = Some(next.fetch_add(1, Ordering::Relaxed)).filter(|&i| i < n) {
            f(&mut state, index);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::same_on_every_level;
    use crate::ops::noise;

    /// Plain attention in f64: softmax over the row's sequence, then the
    /// weighted sum of V.
    fn reference(q: &[f32], k: &[f32], v: &[f32], seq: &[usize], shape: HeadShape, scale: f32) -> Vec<f32> {
        let (q_len, kv_len, d) = (shape.q_len(), shape.kv_len(), shape.head_dim());
        let group = shape.n_head() / shape.n_kv_head();
        let mut out = vec![0.0; q.len()];
        for (i, &s) in seq.iter().enumerate() {
            for h in 0..shape.n_head() {
                let qi = &q[i * q_len + h * d..][..d];
                let at = |x: &[f32], j: usize| x[j * kv_len + (h / group) * d..][..d].to_vec();
                let keys: Vec<usize> = (0..seq.len()).filter(|&j| seq[j] == s).collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| at(k, j).iter().zip(qi).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64)
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for c in 0..d {
                    let value: f64 = keys.iter().zip(&weights).map(|(&j, w)| w * at(v, j)[c] as f64).sum();
                    out[i * q_len + h * d + c] = (value / sum) as f32;
                }
            }
        }
        out
    }

    fn run(q: &[f32], k: &[f32], v: &[f32], seq: &[usize], shape: HeadShape, threads: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; q.len()];
        attend_within(q, k, v, seq, shape, 0.3, &mut out, &ThreadPool::new(threads)).unwrap();
        out
    }

    #[test]
    fn matches_plain_attention_on_every_level_and_thread_count() {
        // Two interleaved sequences (windows) of 110 and 55 rows: one more
        // than a query block, one less, neither whole tiles; grouped heads
        // of 20 (not a whole vector).
        let shape = HeadShape::new(4, 2, 20).unwrap();
        let seq: Vec<usize> = (0..165).map(|i| usize::from(i % 3 == 1)).collect();
        let n = seq.len();
        let (q, k, v) =
            (noise(n * shape.q_len(), 1, 2.0), noise(n * shape.kv_len(), 2, 2.0), noise(n * shape.kv_len(), 3, 1.0));
        let got = same_on_every_level(|| run(&q, &k, &v, &seq, shape, 1));
        assert_eq!(got, run(&q, &k, &v, &seq, shape, 3), "thread count changed a bit");
        let want = reference(&q, &k, &v, &seq, shape, 0.3);
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "worst difference {worst}");
    }

    #[test]
    fn a_row_gets_the_same_bits_alone_as_among_others() {
        let shape = HeadShape::new(2, 2, 16).unwrap();
        let n = 40;
        let (q, k, v) =
            (noise(n * shape.q_len(), 4, 1.0), noise(n * shape.kv_len(), 5, 1.0), noise(n * shape.kv_len(), 6, 1.0));
        let all = run(&q, &k, &v, &vec![0; n], shape, 2);
        // Row 17 alone in its query block: the same keys, only its own query.
        let head = |h: usize| {
            let offset = |i: usize| i * shape.kv_len() + h * 16;
            DenseHead::new(n, 16, |i| &k[offset(i)..][..16], |i| &v[offset(i)..][..16])
        };
        for h in 0..2 {
            let mut alone = vec![0.0; 16];
            attend_dense(&head(h), |_| &q[17 * 32 + h * 16..][..16], 0.3, &mut alone, &mut Scratch::default());
            assert_eq!(alone, all[17 * 32 + h * 16..][..16]);
        }
    }

    #[test]
    fn mismatched_lengths_are_refused() {
        let shape = HeadShape::new(2, 1, 8).unwrap();
        let mut out = vec![0.0; 16];
        let refused = attend_within(&[0.0; 16], &[0.0; 8], &[0.0; 16], &[0], shape, 1.0, &mut out, &ThreadPool::new(1));
        assert!(refused.is_err());
    }
}
