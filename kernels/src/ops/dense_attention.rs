//! Attention in f32 among rows that all see each other (an encoder's
//! bidirectional attention over an image's patches), as two products: the
//! scores of a few queries against every key at once, a softmax per query,
//! then those weights against every value.
//!
//! The decoder's kernel (`attention`) walks the keys one position at a
//! time with an online softmax, as llama.cpp's does; here every key is
//! visible to every query, so the scores can be computed as a tile of
//! queries times the transposed keys, which keeps the vector units busy
//! instead of waiting on one reduction per score. Nothing depends on
//! which queries share a call: each query's output is the same bits alone
//! or in any group.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::simd::{LANES, Simd, dispatch, exp};
use super::{HeadShape, OpsError};
use crate::pool::ThreadPool;

/// Keys whose scores one pass of a query tile computes: four vectors.
const KEY_TILE: usize = 4 * LANES;
/// Rows of the transposed V dotted with a query tile's weights at once.
const V_TILE: usize = 4;

/// One head's keys and values over a sequence, laid out for
/// [`attend_dense`]: keys transposed (one row per dimension, the
/// positions along it) and values transposed likewise, both zero-padded
/// to whole key tiles.
#[derive(Debug, Default)]
struct DenseHead {
    kt: Vec<f32>,
    vt: Vec<f32>,
    n: usize,
    padded: usize,
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
        let padded = n.next_multiple_of(KEY_TILE);
        let mut kt = vec![0.0; head_dim * padded];
        let mut vt = vec![0.0; head_dim.next_multiple_of(V_TILE) * padded];
        for i in 0..n {
            for (d, (&k, &v)) in key(i)[..head_dim].iter().zip(&value(i)[..head_dim]).enumerate() {
                kt[d * padded + i] = k;
                vt[d * padded + i] = v;
            }
        }
        DenseHead { kt, vt, n, padded, head_dim }
    }
}

/// `out` (rows × head_dim) = softmax(scale · q kᵀ) v for the `q` rows
/// (rows × head_dim) against every position of `head`. `scores` is grown
/// to a few rows of the sequence's length; reuse it to stay
/// allocation-free. Panics if `q` or `out` is not a whole number of rows
/// of the head's width.
fn attend_dense(head: &DenseHead, q: &[f32], scale: f32, out: &mut [f32], scores: &mut Vec<f32>) {
    let d = head.head_dim;
    assert!(d > 0 && q.len().is_multiple_of(d) && out.len() == q.len(), "q and out: whole rows of {d}");
    if head.n == 0 {
        out.fill(0.0);
        return;
    }
    dispatch!(s => at_level(s, head, q, scale, out, scores));
}

#[inline(always)]
fn at_level<S: Simd>(s: S, head: &DenseHead, q: &[f32], scale: f32, out: &mut [f32], scores: &mut Vec<f32>) {
    // Queries per tile: 4 × 4 accumulators fit beside their operands in
    // AVX-512's 32 registers (the level that steps four heads' V sums side
    // by side); AVX2's 16, two per vector, hold 2 × 4.
    if S::V_HEADS >= 4 {
        rows_in_tiles::<S, 4>(s, head, q, scale, out, scores)
    } else {
        rows_in_tiles::<S, 2>(s, head, q, scale, out, scores)
    }
}

#[inline(always)]
fn rows_in_tiles<S: Simd, const R: usize>(
    s: S,
    head: &DenseHead,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let (d, padded) = (head.head_dim, head.padded);
    scores.clear();
    scores.resize(R * padded, 0.0);
    for (q, out) in q.chunks(R * d).zip(out.chunks_mut(R * d)) {
        let rows = q.len() / d;
        let query = |r: usize| &q[r.min(rows - 1) * d..][..d];
        score_tile::<S, R>(s, head, std::array::from_fn(query), scale, scores);
        let mut sums = [0.0f32; R];
        for (r, sum) in sums.iter_mut().enumerate() {
            *sum = softmax_row(s, &mut scores[r * padded..(r + 1) * padded], head.n);
        }
        weigh_tile::<S, R>(s, head, scores, &sums, &mut out[..rows * d]);
    }
}

/// `scores[r][j] = scale · (q[r] · k_j)` for every padded position `j`.
#[inline(always)]
fn score_tile<S: Simd, const R: usize>(s: S, head: &DenseHead, q: [&[f32]; R], scale: f32, scores: &mut [f32]) {
    let padded = head.padded;
    let scale = s.splat(scale);
    for tile in (0..padded).step_by(KEY_TILE) {
        let mut acc = [[s.splat(0.0); 4]; R];
        for (dim, keys) in head.kt.chunks_exact(padded).enumerate() {
            let keys = &keys[tile..tile + KEY_TILE];
            let k: [S::V; 4] = std::array::from_fn(|c| s.load(chunk(keys, c)));
            for r in 0..R {
                let qv = s.splat(q[r][dim]);
                for c in 0..4 {
                    acc[r][c] = s.mul_add(qv, k[c], acc[r][c]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut scores[r * padded + tile..][..KEY_TILE];
            for (c, &v) in acc.iter().enumerate() {
                s.store(s.mul(v, scale), chunk_mut(row, c));
            }
        }
    }
}

/// Turns a row of scores into unnormalised weights e^(x − max) (the
/// padding past `n` into zeros) and returns their sum.
#[inline(always)]
fn softmax_row<S: Simd>(s: S, row: &mut [f32], n: usize) -> f32 {
    row[n..].fill(f32::NEG_INFINITY);
    let (chunks, _) = row.as_chunks_mut::<LANES>();
    let mut max = s.splat(f32::NEG_INFINITY);
    for c in chunks.iter() {
        max = s.max(max, s.load(c));
    }
    let max = s.splat(s.reduce_max(max));
    let mut sum = s.splat(0.0);
    for c in chunks.iter_mut() {
        let e = exp(s, s.sub(s.load(c), max));
        sum = s.add(sum, e);
        s.store(e, c);
    }
    s.reduce_sum(sum)
}

/// `out[r][dim] = (Σ_j weights[r][j] · v_j[dim]) / sums[r]` for the tile's
/// `out.len() / head_dim` rows.
#[inline(always)]
fn weigh_tile<S: Simd, const R: usize>(s: S, head: &DenseHead, weights: &[f32], sums: &[f32; R], out: &mut [f32]) {
    let (d, padded) = (head.head_dim, head.padded);
    let rows = out.len() / d;
    for dims in (0..d).step_by(V_TILE) {
        let mut acc = [[s.splat(0.0); V_TILE]; R];
        for c in 0..padded / LANES {
            let v: [S::V; V_TILE] = std::array::from_fn(|t| s.load(chunk(&head.vt[(dims + t) * padded..], c)));
            for r in 0..R {
                let w = s.load(chunk(&weights[r * padded..], c));
                for t in 0..V_TILE {
                    acc[r][t] = s.mul_add(w, v[t], acc[r][t]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (t, &v) in acc.iter().enumerate().take(d - dims) {
                out[r * d + dims + t] = s.reduce_sum(v) / sums[r];
            }
        }
    }
}

#[inline(always)]
fn chunk(x: &[f32], c: usize) -> &[f32; LANES] {
    &x[c * LANES..].as_chunks::<LANES>().0[0]
}

#[inline(always)]
fn chunk_mut(x: &mut [f32], c: usize) -> &mut [f32; LANES] {
    &mut x[c * LANES..].as_chunks_mut::<LANES>().0[0]
}

/// Queries per piece of work in [`attend_within`]: enough to reuse a
/// head's keys from cache many times, few enough that a small window still
/// splits between threads.
const QUERY_BLOCK: usize = 32;

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
    in_parallel(pool, heads.len(), |index| {
        let (rows, at) = (&members[index / n_kv_head], (index % n_kv_head) * d);
        let offset = |i: usize| rows[i] * kv_len + at;
        let head = DenseHead::new(rows.len(), d, |i| &k[offset(i)..][..d], |i| &v[offset(i)..][..d]);
        let _ = heads[index].set(head);
    });
    // (sequence, query head, first member) of each piece, and its output.
    let pieces: Vec<(usize, usize, usize)> = (0..members.len())
        .flat_map(|s| {
            let starts = (0..members[s].len()).step_by(QUERY_BLOCK);
            (0..shape.n_head()).flat_map(move |h| starts.clone().map(move |start| (s, h, start)))
        })
        .collect();
    let results: Vec<Mutex<Vec<f32>>> = pieces.iter().map(|_| Mutex::default()).collect();
    in_parallel(pool, pieces.len(), |index| {
        let (s, h, start) = pieces[index];
        let rows = &members[s][start..(start + QUERY_BLOCK).min(members[s].len())];
        let Some(head) = heads[s * n_kv_head + h / group].get() else { return };
        let queries: Vec<f32> = rows.iter().flat_map(|&row| &q[row * q_len + h * d..][..d]).copied().collect();
        let mut attended = vec![0.0; queries.len()];
        attend_dense(head, &queries, scale, &mut attended, &mut Vec::new());
        if let Ok(mut result) = results[index].lock() {
            *result = attended;
        }
    });
    for (&(s, h, start), result) in pieces.iter().zip(results) {
        let result = result.into_inner().unwrap_or_default();
        for (&row, values) in members[s][start..].iter().zip(result.chunks_exact(d)) {
            out[row * q_len + h * d..][..d].copy_from_slice(values);
        }
    }
    Ok(())
}

/// `f(i)` for `i` in `0..n`, the threads of `pool` claiming indices until
/// none are left.
fn in_parallel(pool: &ThreadPool, n: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    pool.run(|_, _| {
        while let Some(index) = Some(next.fetch_add(1, Ordering::Relaxed)).filter(|&i| i < n) {
            f(index);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::noise;
    use crate::ops::simd::same_on_every_level;

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
        // Two interleaved sequences (windows) of 71 and 36 rows: neither a
        // whole key tile nor a whole query block; grouped heads of 20
        // (not a whole vector).
        let shape = HeadShape::new(4, 2, 20).unwrap();
        let seq: Vec<usize> = (0..107).map(|i| usize::from(i % 3 == 1)).collect();
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
            attend_dense(&head(h), &q[17 * 32 + h * 16..][..16], 0.3, &mut alone, &mut Vec::new());
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
