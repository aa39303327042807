//! Attention's tests: against an f64 reference, and bit for bit across
//! row grouping, head splits, paging, hidden cells and SIMD levels, for
//! every pair of K and V storage types.

use super::*;
use crate::cpu::same_on_every_level;
use crate::ops::KvType;
use crate::ops::kv::KvArena;
use crate::ops::noise;
use crate::quant::dequantize_row;

/// K and V storage types.
type Types = (KvType, KvType);

const F16: Types = (KvType::F16, KvType::F16);

/// Every pair of storage types whose blocks heads of `head_dim` fill.
fn types_for(head_dim: usize) -> impl Iterator<Item = Types> {
    let fits = move |kv_type: &KvType| head_dim.is_multiple_of(kv_type.block_values());
    KvType::ALL.into_iter().filter(fits).flat_map(move |k| KvType::ALL.into_iter().filter(fits).map(move |v| (k, v)))
}

/// A layer's cache holding `k` and `v` (positions × kv_len) in blocks of
/// `block_tokens`, laid out in reverse physical order after one spare
/// block, every unused value NaN so that reading one shows.
struct Cache {
    k: KvArena,
    v: KvArena,
    blocks: Vec<u32>,
    block_tokens: usize,
}

impl Cache {
    fn new(k: &[f32], v: &[f32], kv_len: usize, block_tokens: usize) -> Self {
        Self::typed(k, v, kv_len, block_tokens, F16)
    }

    fn typed(k: &[f32], v: &[f32], kv_len: usize, block_tokens: usize, (k_type, v_type): Types) -> Self {
        let n_blocks = (k.len() / kv_len).div_ceil(block_tokens);
        let arena = (n_blocks + 1) * block_tokens * kv_len;
        let blocks = (1..=n_blocks as u32).rev().collect();
        let (k_arena, v_arena) = (KvArena::nan(k_type, arena), KvArena::nan(v_type, arena));
        let mut cache = Self { k: k_arena, v: v_arena, blocks, block_tokens };
        for (pos, (k, v)) in k.chunks(kv_len).zip(v.chunks(kv_len)).enumerate() {
            let at = cache.pages().row_offset(pos, kv_len).unwrap();
            cache.k.write(at, k);
            cache.v.write(at, v);
        }
        cache
    }

    fn pages(&self) -> PageTable<'_> {
        PageTable { blocks: &self.blocks, block_tokens: self.block_tokens }
    }

    fn kv(&self) -> KvPages<'_> {
        KvPages { k: self.k.rows(), v: self.v.rows(), pages: self.pages(), hidden: &[] }
    }

    fn attend(&self, q: &[f32], n_visible: usize, shape: HeadShape) -> Vec<f32> {
        let mut out = vec![f32::NAN; shape.q_len()];
        let scale = 1.0 / (shape.head_dim() as f32).sqrt();
        attend(q, self.kv(), n_visible, shape, scale, &mut out, &mut Vec::new()).unwrap();
        out
    }
}

/// `values` as a cache of `kv_type` holds them: rounded to f16, or
/// quantized to Q8_0 and dequantized by the scalar reference.
fn stored(values: &[f32], kv_type: KvType) -> Vec<f32> {
    let mut arena = KvArena::zeros(kv_type, values.len());
    arena.write(0, values);
    let mut out = vec![0.0; values.len()];
    dequantize_row(kv_type.dtype(), arena.bytes(), &mut out).unwrap();
    out
}

/// Attention in f64 over K and V as stored.
fn reference(q: &[f32], k: &[f32], v: &[f32], n_visible: usize, shape: HeadShape) -> Vec<f64> {
    let (hd, kv_len) = (shape.head_dim(), shape.kv_len());
    let group = shape.n_head() / shape.n_kv_head();
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = Vec::new();
    for h in 0..shape.n_head() {
        let q = &q[h * hd..][..hd];
        let at = |rows: &[f32], i: usize| -> Vec<f64> {
            rows[i * kv_len + h / group * hd..][..hd].iter().map(|&x| f64::from(x)).collect()
        };
        let scores: Vec<f64> =
            (0..n_visible).map(|i| at(k, i).iter().zip(q).map(|(k, &q)| k * q as f64).sum::<f64>() * scale).collect();
        let max = scores.iter().copied().fold(f64::MIN, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut o = vec![0.0; hd];
        for (i, w) in weights.iter().enumerate() {
            for (o, v) in o.iter_mut().zip(at(v, i)) {
                *o += w / total * v;
            }
        }
        out.extend(o);
    }
    out
}

const SHAPES: [(usize, usize, usize); 4] = [(9, 3, 64), (4, 4, 80), (8, 2, 24), (2, 1, 128)];

/// Each shape with each pair of storage types its heads fit.
fn shapes_and_types() -> impl Iterator<Item = ((usize, usize, usize), Types)> {
    SHAPES.into_iter().flat_map(|shape| types_for(shape.2).map(move |types| (shape, types)))
}

#[test]
fn rows_stepped_together_give_the_bits_of_one_at_a_time() {
    for ((n_head, n_kv_head, head_dim), types) in shapes_and_types() {
        let shape = HeadShape::new(n_head, n_kv_head, head_dim).unwrap();
        let n = 40;
        let (k, v) = (noise(n * shape.kv_len(), 8, 1.0), noise(n * shape.kv_len(), 9, 1.0));
        let cache = Cache::typed(&k, &v, shape.kv_len(), 8, types);
        // Causal rows (each sees one more position), a repeated count
        // and a row that sees fewer than the one before it.
        let visible = [33, 34, 35, 35, 3];
        let q = noise(visible.len() * shape.q_len(), 10, 2.0);
        let got = same_on_every_level(|| {
            let mut out = vec![f32::NAN; q.len()];
            attend_heads(&q, cache.kv(), &visible, shape, 0..n_kv_head, 0.125, &mut out, &mut Vec::new()).unwrap();
            out
        });
        for (r, &n_visible) in visible.iter().enumerate() {
            let mut want = vec![f32::NAN; shape.q_len()];
            let q = &q[r * shape.q_len()..(r + 1) * shape.q_len()];
            attend(q, cache.kv(), n_visible, shape, 0.125, &mut want, &mut Vec::new()).unwrap();
            assert_eq!(got[r * shape.q_len()..(r + 1) * shape.q_len()], want, "{shape:?} {types:?} row {r}");
        }
        let mut out = vec![0.0; q.len()];
        assert!(attend_heads(&q, cache.kv(), &[], shape, 0..n_kv_head, 1.0, &mut [], &mut Vec::new()).is_err());
        let zero = [33, 0, 35, 35, 3];
        assert!(attend_heads(&q, cache.kv(), &zero, shape, 0..n_kv_head, 1.0, &mut out, &mut Vec::new()).is_err());
    }
}

#[test]
fn any_split_of_the_heads_gives_the_bits_of_all_at_once() {
    for ((n_head, n_kv_head, head_dim), types) in shapes_and_types() {
        let shape = HeadShape::new(n_head, n_kv_head, head_dim).unwrap();
        let n = 37;
        let q = noise(shape.q_len(), 5, 2.0);
        let (k, v) = (noise(n * shape.kv_len(), 6, 1.0), noise(n * shape.kv_len(), 7, 1.0));
        let cache = Cache::typed(&k, &v, shape.kv_len(), 8, types);
        let per_kv_head = shape.q_len() / n_kv_head;
        for first in 0..n_kv_head {
            for end in first + 1..=n_kv_head {
                let part = first * per_kv_head..end * per_kv_head;
                let got = same_on_every_level(|| {
                    let mut out = vec![f32::NAN; part.len()];
                    attend_heads(
                        &q[part.clone()],
                        cache.kv(),
                        &[n],
                        shape,
                        first..end,
                        0.125,
                        &mut out,
                        &mut Vec::new(),
                    )
                    .unwrap();
                    out
                });
                let mut want = vec![f32::NAN; shape.q_len()];
                attend(&q, cache.kv(), n, shape, 0.125, &mut want, &mut Vec::new()).unwrap();
                assert_eq!(got, want[part.clone()], "{shape:?} {types:?} heads {first}..{end}");
            }
        }
        let mut out = vec![0.0; per_kv_head];
        #[allow(clippy::reversed_empty_ranges)]
        for bad in [0..0, 1..0, n_kv_head..n_kv_head + 1] {
            assert!(
                attend_heads(&q[..per_kv_head], cache.kv(), &[n], shape, bad.clone(), 1.0, &mut out, &mut Vec::new())
                    .is_err(),
                "{bad:?}"
            );
        }
    }
}

#[test]
fn matches_f64_on_every_level() {
    for ((n_head, n_kv_head, head_dim), types) in shapes_and_types() {
        let shape = HeadShape::new(n_head, n_kv_head, head_dim).unwrap();
        for n_visible in [1, 2, 17, 100] {
            let seed = (n_head * 1000 + n_visible) as u64;
            let q = noise(shape.q_len(), seed, 2.0);
            let k = noise(n_visible * shape.kv_len(), seed + 1, 2.0);
            let v = noise(n_visible * shape.kv_len(), seed + 2, 1.0);
            let cache = Cache::typed(&k, &v, shape.kv_len(), 16, types);
            let got = same_on_every_level(|| cache.attend(&q, n_visible, shape));
            // The kernel rounds q to f16 (so does the reference here)
            // and keeps the weighted sum of V in f16: each position adds
            // at most half an f16 ulp of the running sum (|v| ≤ 1). The
            // reference reads K and V as the cache stores them.
            let q16: Vec<f32> = q.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            let want = reference(&q16, &stored(&k, types.0), &stored(&v, types.1), n_visible, shape);
            let tolerance = 2e-3 * (n_visible as f64).sqrt();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((*g as f64 - w).abs() < tolerance, "{shape:?} {types:?} n={n_visible} [{i}]: {g} vs {w}");
            }
        }
    }
}

#[test]
fn paging_does_not_change_a_bit() {
    let shape = HeadShape::new(9, 3, 64).unwrap();
    let n = 50;
    let q = noise(shape.q_len(), 7, 3.0);
    let k = noise(n * shape.kv_len(), 8, 3.0);
    let v = noise(n * shape.kv_len(), 9, 1.0);
    for types in types_for(shape.head_dim()) {
        let whole = Cache::typed(&k, &v, shape.kv_len(), n, types).attend(&q, n, shape);
        for block_tokens in [1, 7, 16] {
            let cache = Cache::typed(&k, &v, shape.kv_len(), block_tokens, types);
            let got = same_on_every_level(|| cache.attend(&q, n, shape));
            assert_eq!(got, whole, "{types:?} block_tokens {block_tokens}");
        }
        // A prefix attends the same whether later positions exist yet.
        let prefix = 33;
        let (k_prefix, v_prefix) = (&k[..prefix * shape.kv_len()], &v[..prefix * shape.kv_len()]);
        let short = Cache::typed(k_prefix, v_prefix, shape.kv_len(), 7, types);
        let long = Cache::typed(&k, &v, shape.kv_len(), 7, types);
        assert_eq!(short.attend(&q, prefix, shape), long.attend(&q, prefix, shape), "{types:?}");
    }
}

#[test]
fn q8_0_holding_f16_values_attends_to_the_bits_of_f16() {
    // Multiples of 1/128 up to 127/128, each block of 32 holding ±127/128:
    // its scale is 1/128 exactly and its quants the numerators, so Q8_0
    // stores these values exactly, as f16 does.
    let shape = HeadShape::new(9, 3, 64).unwrap();
    let n = 41;
    let exact = |seed: u64| -> Vec<f32> {
        let mut values: Vec<f32> = noise(n * shape.kv_len(), seed, 127.0).iter().map(|x| x.round() / 128.0).collect();
        values.iter_mut().step_by(32).for_each(|x| *x = 127.0 / 128.0);
        values
    };
    let (k, v) = (exact(21), exact(22));
    let q = noise(3 * shape.q_len(), 23, 2.0);
    let visible = [39, 40, 41];
    let attend_all = |types: Types| {
        let cache = Cache::typed(&k, &v, shape.kv_len(), 16, types);
        same_on_every_level(|| {
            let mut out = vec![f32::NAN; q.len()];
            attend_heads(&q, cache.kv(), &visible, shape, 0..3, 0.125, &mut out, &mut Vec::new()).unwrap();
            out
        })
    };
    let want = attend_all(F16);
    for types in types_for(shape.head_dim()) {
        assert_eq!(attend_all(types), want, "{types:?}");
    }
}

#[test]
fn one_position_returns_its_value() {
    let shape = HeadShape::new(6, 2, 20).unwrap();
    let q = noise(shape.q_len(), 1, 1.0);
    let k = noise(shape.kv_len(), 2, 1.0);
    let v = noise(shape.kv_len(), 3, 1.0);
    let got = same_on_every_level(|| Cache::new(&k, &v, shape.kv_len(), 4).attend(&q, 1, shape));
    for h in 0..6 {
        let want: Vec<f32> = v[h / 3 * 20..][..20].iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        assert_eq!(&got[h * 20..][..20], &want[..], "head {h}");
    }
}

#[test]
fn query_heads_share_their_group_kv_head() {
    let shape = HeadShape::new(6, 3, 16).unwrap();
    let n = 5;
    let q = noise(shape.q_len(), 4, 1.0);
    let k = noise(n * shape.kv_len(), 5, 1.0);
    // Every position's V is constant per KV head, so each query head
    // must return its group's constant whatever its weights.
    let v: Vec<f32> = (0..n * shape.kv_len()).map(|i| (1 + i % 48 / 16) as f32).collect();
    let got = Cache::new(&k, &v, shape.kv_len(), 2).attend(&q, n, shape);
    for (h, head) in got.chunks(16).enumerate() {
        let want = (1 + h / 2) as f32;
        // The f16 running sum rounds each update.
        assert!(head.iter().all(|&x| (x - want).abs() < 2e-3 * want), "head {h}: {head:?}");
    }
}

#[test]
fn rejects_bad_inputs() {
    assert!(HeadShape::new(9, 2, 64).is_err());
    assert!(HeadShape::new(9, 0, 64).is_err());
    assert!(HeadShape::new(0, 1, 64).is_err());
    let shape = HeadShape::new(2, 1, 16).unwrap();
    let kv = noise(4 * shape.kv_len(), 1, 1.0);
    let cache = Cache::new(&kv, &kv, shape.kv_len(), 2);
    let q = vec![0.0; shape.q_len()];
    let mut out = vec![0.0; shape.q_len()];
    let run =
        |q: &[f32], kv: KvPages<'_>, n: usize, out: &mut [f32]| attend(q, kv, n, shape, 1.0, out, &mut Vec::new());
    assert!(run(&q, cache.kv(), 4, &mut out).is_ok());
    assert!(run(&q[1..], cache.kv(), 4, &mut out).is_err());
    assert!(run(&q, cache.kv(), 4, &mut out[1..]).is_err());
    assert!(run(&q, cache.kv(), 0, &mut out).is_err());
    assert!(run(&q, cache.kv(), 5, &mut out).is_err());
    let outside = [0, 9];
    let kv = KvPages { pages: PageTable { blocks: &outside, block_tokens: 2 }, ..cache.kv() };
    assert!(matches!(run(&q, kv, 3, &mut out), Err(OpsError::Attention(_))));
    let kv = KvPages { pages: PageTable { blocks: &outside, block_tokens: 0 }, ..cache.kv() };
    assert!(run(&q, kv, 1, &mut out).is_err());
    let KvRows::F16(values) = cache.v.rows() else { unreachable!("an f16 cache") };
    let kv = KvPages { v: KvRows::F16(&values[..10]), ..cache.kv() };
    assert!(run(&q, kv, 1, &mut out).is_err());
    // Q8_0 heads must be whole blocks.
    let shape = HeadShape::new(2, 1, 48).unwrap();
    let q8_0 = KvArena::zeros(KvType::Q8_0, 4 * 96);
    let f16_keys = Cache::new(&noise(96, 2, 1.0), &[0.0; 96], 48, 2);
    let kv = KvPages { v: q8_0.rows(), ..f16_keys.kv() };
    let mut out = vec![0.0; shape.q_len()];
    let error = attend(&noise(96, 3, 1.0), kv, 2, shape, 1.0, &mut out, &mut Vec::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid attention inputs: V as q8_0 is stored in blocks of 32 values, which heads of 48 do not fill"
    );
}

#[test]
fn hidden_positions_are_as_if_they_were_not_there() {
    let shape = HeadShape::new(4, 2, 32).unwrap();
    let n = 23;
    let q = noise(shape.q_len(), 11, 1.0);
    let k = noise(n * shape.kv_len(), 12, 1.0);
    let v = noise(n * shape.kv_len(), 13, 1.0);
    let hidden = [3..9, 12..13, 20..22];
    let kept: Vec<usize> = (0..n).filter(|p| !hidden.iter().any(|range| range.contains(p))).collect();
    let rows = |values: &[f32]| -> Vec<f32> {
        kept.iter().flat_map(|&p| values[p * shape.kv_len()..(p + 1) * shape.kv_len()].to_vec()).collect()
    };
    for types in types_for(shape.head_dim()) {
        same_on_every_level(|| {
            let full = Cache::typed(&k, &v, shape.kv_len(), 4, types);
            let mut with_holes = vec![f32::NAN; shape.q_len()];
            let scale = 1.0 / (shape.head_dim() as f32).sqrt();
            let kv = KvPages { hidden: &hidden, ..full.kv() };
            attend(&q, kv, n, shape, scale, &mut with_holes, &mut Vec::new()).unwrap();
            let compact = Cache::typed(&rows(&k), &rows(&v), shape.kv_len(), 4, types);
            assert_eq!(with_holes, compact.attend(&q, kept.len(), shape), "{types:?}");
            with_holes
        });
    }
    let cache = Cache::new(&k, &v, shape.kv_len(), 4);
    let mut out = vec![0.0; shape.q_len()];
    let (empty, everything) = (4..4, 0..23);
    for bad in [&[5..9, 3..4][..], std::slice::from_ref(&empty), std::slice::from_ref(&everything)] {
        let kv = KvPages { hidden: bad, ..cache.kv() };
        assert!(attend(&q, kv, n, shape, 1.0, &mut out, &mut Vec::new()).is_err(), "{bad:?}");
    }
}

#[test]
fn row_offsets_follow_the_table() {
    let pages = PageTable { blocks: &[3, 0, 5], block_tokens: 4 };
    assert_eq!(pages.row_offset(0, 10), Some(120));
    assert_eq!(pages.row_offset(5, 10), Some(10));
    assert_eq!(pages.row_offset(11, 10), Some(230));
    assert_eq!(pages.row_offset(12, 10), None);
    assert_eq!(PageTable { blocks: &[0], block_tokens: 0 }.row_offset(0, 10), None);
}

#[test]
fn a_window_gives_the_bits_of_a_cache_holding_only_its_positions() {
    for ((n_head, n_kv_head, head_dim), types) in shapes_and_types() {
        let shape = HeadShape::new(n_head, n_kv_head, head_dim).unwrap();
        let n = 40;
        let (k, v) = (noise(n * shape.kv_len(), 11, 1.0), noise(n * shape.kv_len(), 12, 1.0));
        let cache = Cache::typed(&k, &v, shape.kv_len(), 8, types);
        // Rows stepped together whose windows start in different blocks,
        // one shorter than the window.
        let visible = [33, 34, 35, 40, 3];
        let window = 5;
        let scores = Scores { window: Some(window), ..Scores::scaled(0.125) };
        let q = noise(visible.len() * shape.q_len(), 13, 2.0);
        let got = same_on_every_level(|| {
            let mut out = vec![f32::NAN; q.len()];
            attend_heads(&q, cache.kv(), &visible, shape, 0..n_kv_head, scores, &mut out, &mut Vec::new()).unwrap();
            out
        });
        for (r, &n_visible) in visible.iter().enumerate() {
            let first = n_visible.saturating_sub(window);
            let rows = first * shape.kv_len()..n_visible * shape.kv_len();
            let only = Cache::typed(&k[rows.clone()], &v[rows], shape.kv_len(), 3, types);
            let mut want = vec![f32::NAN; shape.q_len()];
            let q = &q[r * shape.q_len()..(r + 1) * shape.q_len()];
            attend(q, only.kv(), n_visible - first, shape, 0.125, &mut want, &mut Vec::new()).unwrap();
            assert_eq!(got[r * shape.q_len()..(r + 1) * shape.q_len()], want, "{shape:?} {types:?} row {r}");
        }
        let mut full = vec![f32::NAN; q.len()];
        attend_heads(&q, cache.kv(), &visible, shape, 0..n_kv_head, 0.125, &mut full, &mut Vec::new()).unwrap();
        assert_ne!(full[..shape.q_len()], got[..shape.q_len()], "the window changes what a long row sees");
        let none = Scores { window: Some(0), ..scores };
        assert!(attend_heads(&q, cache.kv(), &visible, shape, 0..n_kv_head, none, &mut full, &mut Vec::new()).is_err());
    }
}

#[test]
fn a_window_of_hidden_cells_is_refused() {
    let shape = HeadShape::new(2, 1, 32).unwrap();
    let (k, v) = (noise(10 * shape.kv_len(), 1, 1.0), noise(10 * shape.kv_len(), 2, 1.0));
    let cache = Cache::new(&k, &v, shape.kv_len(), 4);
    let hidden = [2..3, 6..9];
    let kv = KvPages { hidden: &hidden, ..cache.kv() };
    let scores = |window| Scores { window: Some(window), ..Scores::scaled(1.0) };
    let mut out = vec![0.0; shape.q_len()];
    let q = noise(shape.q_len(), 3, 1.0);
    let error = attend(&q, kv, 9, shape, scores(3), &mut out, &mut Vec::new()).unwrap_err();
    assert_eq!(error.to_string(), "invalid attention inputs: all 3 positions in 6..9 are hidden");
    assert!(attend(&q, kv, 9, shape, scores(4), &mut out, &mut Vec::new()).is_ok());
}

#[test]
fn soft_capped_scores_match_f64() {
    let shape = HeadShape::new(4, 2, 32).unwrap();
    let n = 20;
    let q = noise(shape.q_len(), 21, 4.0);
    let (k, v) = (noise(n * shape.kv_len(), 22, 4.0), noise(n * shape.kv_len(), 23, 1.0));
    let cache = Cache::new(&k, &v, shape.kv_len(), 8);
    let (scale, cap) = (0.25f32, 2.0f32);
    let scores = Scores { softcap: Some(cap), ..Scores::scaled(scale) };
    let got = same_on_every_level(|| {
        let mut out = vec![f32::NAN; shape.q_len()];
        attend(&q, cache.kv(), n, shape, scores, &mut out, &mut Vec::new()).unwrap();
        out
    });
    let (cap64, scale64) = (f64::from(cap), f64::from(scale));
    let want = in_f64(&q, (&k, &v), n, shape, |dot| cap64 * (dot * scale64 / cap64).tanh(), None);
    close_to(&got, &want, shape);
    // Uncapped, these scores (|q·k| up to ~30) weigh positions differently.
    let mut plain = vec![0.0; shape.q_len()];
    attend(&q, cache.kv(), n, shape, scale, &mut plain, &mut Vec::new()).unwrap();
    assert!(plain.iter().zip(&got).any(|(a, b)| (a - b).abs() > 0.05));
}

#[test]
fn sinks_weigh_in_as_a_score_whose_values_are_zeros() {
    let shape = HeadShape::new(8, 2, 32).unwrap();
    let n = 20;
    let q = noise(shape.q_len(), 31, 2.0);
    let (k, v) = (noise(n * shape.kv_len(), 32, 2.0), noise(n * shape.kv_len(), 33, 1.0));
    let cache = Cache::new(&k, &v, shape.kv_len(), 8);
    let scale = 0.25f32;
    // Below, near and far above the heads' scores, and one that weighs nothing.
    let sinks = [-3.0, 0.5, 2.0, 30.0, f32::NEG_INFINITY, 1.0, -0.5, 6.0];
    let scores = Scores { sinks: Some(&sinks), ..Scores::scaled(scale) };
    let got = same_on_every_level(|| {
        let mut out = vec![f32::NAN; shape.q_len()];
        attend(&q, cache.kv(), n, shape, scores, &mut out, &mut Vec::new()).unwrap();
        out
    });
    let want = in_f64(&q, (&k, &v), n, shape, |dot| dot * f64::from(scale), Some(&sinks));
    close_to(&got, &want, shape);
    let hd = shape.head_dim();
    // A sink far above every score leaves almost nothing of the values.
    assert!(got[3 * hd..4 * hd].iter().all(|x| x.abs() < 1e-6));
    // A sink of -inf is no sink; a selection of KV heads reads its own heads' sinks.
    let mut plain = vec![0.0; shape.q_len()];
    attend(&q, cache.kv(), n, shape, scale, &mut plain, &mut Vec::new()).unwrap();
    assert_eq!(got[4 * hd..5 * hd], plain[4 * hd..5 * hd]);
    let mut second = vec![0.0; shape.q_len() / 2];
    attend_heads(&q[shape.q_len() / 2..], cache.kv(), &[n], shape, 1..2, scores, &mut second, &mut Vec::new()).unwrap();
    assert_eq!(second, got[shape.q_len() / 2..]);
    let short = Scores { sinks: Some(&sinks[..4]), ..scores };
    let error = attend(&q, cache.kv(), n, shape, short, &mut plain, &mut Vec::new()).unwrap_err();
    assert_eq!(error.to_string(), "invalid attention inputs: 4 attention sinks for 8 query heads");
}

/// One query row's attention over positions `0..n` of `k` and `v` (rows
/// of `kv_len`, stored as f16), in f64 from q rounded to f16: `score` of
/// each dot product, with a sink score per head where given.
fn in_f64(
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    n: usize,
    shape: HeadShape,
    score: impl Fn(f64) -> f64,
    sinks: Option<&[f32]>,
) -> Vec<f64> {
    let (hd, group) = (shape.head_dim(), shape.n_head() / shape.n_kv_head());
    let (k16, v16) = (stored(k, KvType::F16), stored(v, KvType::F16));
    let mut out = Vec::with_capacity(shape.q_len());
    for h in 0..shape.n_head() {
        let q: Vec<f64> = q[h * hd..][..hd].iter().map(|&x| f64::from(f16::from_f32(x).to_f32())).collect();
        let at = |rows: &[f32], i: usize| rows[i * shape.kv_len() + h / group * hd..][..hd].to_vec();
        let scores: Vec<f64> =
            (0..n).map(|i| score(at(&k16, i).iter().zip(&q).map(|(&k, q)| f64::from(k) * q).sum())).collect();
        let sink = sinks.map_or(f64::NEG_INFINITY, |sinks| f64::from(sinks[h]));
        let max = scores.iter().copied().fold(sink, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum::<f64>() + (sink - max).exp();
        out.extend(
            (0..hd)
                .map(|d| weights.iter().enumerate().map(|(i, w)| w / total * f64::from(at(&v16, i)[d])).sum::<f64>()),
        );
    }
    out
}

/// Every value of `got` within 0.01 of `want`.
fn close_to(got: &[f32], want: &[f64], shape: HeadShape) {
    for (i, (&got, &want)) in got.iter().zip(want).enumerate() {
        let (h, d) = (i / shape.head_dim(), i % shape.head_dim());
        assert!((f64::from(got) - want).abs() < 1e-2, "head {h} [{d}]: {got} vs {want}");
    }
}
