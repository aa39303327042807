//! Attention of one query row over a paged KV cache of f16 values or Q8_0
//! blocks (see `kv`).
//!
//! A layer's K and V each live in an arena of physical blocks of
//! `block_tokens` rows; a row holds one position's `n_kv_head × head_dim`
//! values. A sequence's [`PageTable`] lists, in position order, the physical
//! blocks holding its positions, so writers and readers agree on where
//! position `p` lives through [`PageTable::row_offset`].

use std::ops::Range;

use half::f16;

use super::OpsError;
use super::kv::{KvElement, KvRows, head, q8_0_blocks};
use super::simd::{LANES, Simd, dispatch};

/// Where a sequence's positions live in a layer's K and V arenas.
#[derive(Clone, Copy, Debug)]
pub struct PageTable<'a> {
    /// `blocks[b]` is the physical block holding positions
    /// `b * block_tokens .. (b + 1) * block_tokens`.
    pub blocks: &'a [u32],
    pub block_tokens: usize,
}

impl PageTable<'_> {
    /// Index in a K or V arena of the first of position `pos`'s `row_len`
    /// values, or `None` when the table does not reach `pos` (or
    /// `block_tokens` is 0). The arena may still be too short for the row;
    /// slicing it checks that.
    pub fn row_offset(&self, pos: usize, row_len: usize) -> Option<usize> {
        let block = *self.blocks.get(pos.checked_div(self.block_tokens)?)? as usize;
        let row = block.checked_mul(self.block_tokens)?.checked_add(pos % self.block_tokens)?;
        row.checked_mul(row_len)
    }
}

/// One layer's KV cache as seen by one sequence.
#[derive(Clone, Copy, Debug)]
pub struct KvPages<'a> {
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    pub pages: PageTable<'a>,
    /// Positions the query does not see (sorted, disjoint ranges): cells a
    /// draft model holds nothing for, such as an image its target saw.
    pub hidden: &'a [Range<usize>],
}

impl KvPages<'_> {
    /// Calls `f(i, offset)` for positions `i` in `range` in order, `offset`
    /// being where the position's row starts in the arenas. Callers check
    /// the pages first (see [`attend`]) and mark `f` `#[inline(always)]`
    /// (see `simd::dispatch`).
    #[inline(always)]
    fn for_each_row(&self, range: Range<usize>, row_len: usize, f: impl FnMut(usize, usize)) {
        // The common case gets a visibility test that folds away; only DFlash
        // drafts hide cells.
        if self.hidden.is_empty() {
            return self.for_each_visible_row(range, row_len, |_| true, f);
        }
        let mut hidden = self.hidden.iter().peekable();
        let visible = |position: usize| {
            while hidden.next_if(|range| range.end <= position).is_some() {}
            hidden.peek().is_none_or(|range| range.start > position)
        };
        self.for_each_visible_row(range, row_len, visible, f)
    }

    #[inline(always)]
    fn for_each_visible_row(
        &self,
        range: Range<usize>,
        row_len: usize,
        mut visible: impl FnMut(usize) -> bool,
        mut f: impl FnMut(usize, usize),
    ) {
        let (from, n) = (range.start, range.end);
        let block_tokens = self.pages.block_tokens;
        let first_block = from / block_tokens;
        for (b, &block) in self.pages.blocks[first_block..n.div_ceil(block_tokens)].iter().enumerate() {
            let first = (first_block + b) * block_tokens;
            let start = block as usize * block_tokens * row_len;
            for r in from.saturating_sub(first)..block_tokens.min(n - first) {
                if visible(first + r) {
                    f(first + r, start + r * row_len);
                }
            }
        }
    }
}

/// Head geometry of an attention layer: query head `h` reads KV head
/// `h / (n_head / n_kv_head)` (grouped-query attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadShape {
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
}

impl HeadShape {
    /// Checks a model's head counts: all positive, `n_kv_head` dividing
    /// `n_head`.
    pub fn new(n_head: usize, n_kv_head: usize, head_dim: usize) -> Result<Self, OpsError> {
        if n_head == 0 || n_kv_head == 0 || head_dim == 0 || !n_head.is_multiple_of(n_kv_head) {
            return Err(OpsError::Heads(format!(
                "{n_head} query heads, {n_kv_head} KV heads of {head_dim}: need positive sizes \
                 and KV heads dividing query heads"
            )));
        }
        Ok(Self { n_head, n_kv_head, head_dim })
    }

    pub fn n_head(&self) -> usize {
        self.n_head
    }

    pub fn n_kv_head(&self) -> usize {
        self.n_kv_head
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Length of one token's q (and of attention's output).
    pub fn q_len(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Length of one position's row in the K or V cache.
    pub fn kv_len(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// How a query scores the positions it sees, and which of them it sees.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores<'a> {
    /// Multiplies `q · k`.
    pub scale: f32,
    /// Soft-capping (Gemma 2): each score becomes `cap · tanh(s / cap)`,
    /// computed as llama.cpp's flash attention does, with the scale divided
    /// by the cap once and the product fed to `tanh`.
    pub softcap: Option<f32>,
    /// Sliding-window attention: a row seeing positions `0..n` sees only
    /// the last `window` of them, its own included (llama.cpp hides
    /// position `p` from a query at `q` when `q - p >= window`).
    pub window: Option<usize>,
    /// Attention sinks (gpt-oss): one learned score per query head (all
    /// `n_head` of the layer), in the softmax's denominator as if a
    /// position with that score and a value of zeros were seen, applied
    /// after the positions as llama.cpp's flash attention applies them.
    pub sinks: Option<&'a [f32]>,
}

impl Scores<'_> {
    /// Plain scaled scores over every visible position.
    pub fn scaled(scale: f32) -> Self {
        Scores { scale, softcap: None, window: None, sinks: None }
    }

    /// The first position a row seeing `0..n_visible` attends to.
    pub fn first_seen(&self, n_visible: usize) -> usize {
        self.window.map_or(0, |window| n_visible.saturating_sub(window))
    }

    #[inline(always)]
    fn score(&self, dot: f32) -> f32 {
        match self.softcap {
            None => dot * self.scale,
            Some(cap) => cap * (dot * (self.scale / cap)).tanh(),
        }
    }
}

impl From<f32> for Scores<'_> {
    fn from(scale: f32) -> Self {
        Scores::scaled(scale)
    }
}

/// Attention of one token's `q` (`n_head × head_dim`) over positions
/// `0..n_visible` of `kv` (the last `window` of them, if `scores` has one),
/// written to `out` (same shape as `q`).
///
/// The arithmetic follows llama.cpp's CPU flash attention, whose outputs
/// sluice is checked against: q is rounded to f16; per query head, positions
/// are visited in order with a running maximum and sum (online softmax);
/// scores are `(q · k_i) * scale` with the dot product in GGML's order
/// (soft-capped if asked); positions outside the window are skipped, as
/// llama.cpp skips masked ones; the
/// weighted sum of V is rescaled when the maximum grows and kept
/// rounded to f16 after every position; the denominator is updated with a
/// fused multiply-add; the output is that sum times the denominator's
/// reciprocal. (Small models amplify even f16-level
/// differences in attention into visible log-probability changes, so
/// matching these roundings matters.) K or V stored as Q8_0 enter these
/// same steps as their exact values `d · q`. Nothing depends on how the
/// positions are split into blocks or on other rows, so the result for a
/// query is the same bits whatever the paging, batching or chunking.
///
/// `scratch` is grown to `2 × n_head × head_dim` floats (rounded up to
/// whole chunks) plus two per head; reuse it to stay allocation-free.
pub fn attend<'s>(
    q: &[f32],
    kv: KvPages<'_>,
    n_visible: usize,
    shape: HeadShape,
    scores: impl Into<Scores<'s>>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<(), OpsError> {
    attend_heads(q, kv, &[n_visible], shape, 0..shape.n_kv_head, scores, out, scratch)
}

/// [`attend`] for the query heads of KV heads `kv_heads` only, of one or
/// more query rows of a sequence at once: row `r` sees positions
/// `0..n_visible[r]`, and `q` and `out` hold, row after row, just those
/// heads (`kv_heads.len() × group × head_dim` values per row).
///
/// Heads and rows never interact: every (row, head) pair takes exactly the
/// steps it takes alone, so splitting a token's heads between threads or
/// grouping rows gives the bits of one row at a time. Grouping pays
/// because the pairs' online-softmax chains are independent and overlap in
/// the pipeline, and each K/V position is fetched once for all of them.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads<'s>(
    q: &[f32],
    kv: KvPages<'_>,
    n_visible: &[usize],
    shape: HeadShape,
    kv_heads: Range<usize>,
    scores: impl Into<Scores<'s>>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<(), OpsError> {
    let scale = scores.into();
    check(q, &kv, n_visible, shape, &kv_heads, scale, out).map_err(OpsError::Attention)?;
    use KvRows::{F16, Q8_0};
    // One kernel per pair of storage types.
    match (kv.k, kv.v) {
        (F16(k), F16(v)) => attend_in((k, v), q, kv, n_visible, shape, kv_heads, scale, out, scratch),
        (F16(k), Q8_0(v)) => attend_in((k, q8_0_blocks(v)), q, kv, n_visible, shape, kv_heads, scale, out, scratch),
        (Q8_0(k), F16(v)) => attend_in((q8_0_blocks(k), v), q, kv, n_visible, shape, kv_heads, scale, out, scratch),
        (Q8_0(k), Q8_0(v)) => {
            attend_in((q8_0_blocks(k), q8_0_blocks(v)), q, kv, n_visible, shape, kv_heads, scale, out, scratch)
        }
    }
    Ok(())
}

/// [`attend_heads`], its inputs checked, over K and V stored as `K` and `V`.
#[allow(clippy::too_many_arguments)]
fn attend_in<K: KvElement, V: KvElement>(
    arenas: (&[K], &[V]),
    q: &[f32],
    kv: KvPages<'_>,
    n_visible: &[usize],
    shape: HeadShape,
    kv_heads: Range<usize>,
    scale: Scores<'_>,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let HeadShape { n_head, n_kv_head, head_dim } = shape;
    let group = n_head / n_kv_head;
    // From here on, heads are counted within the selection, row after row.
    let (first_kv_head, n_kv_head) = (kv_heads.start, kv_heads.len());
    let row_heads = n_kv_head * group;
    let n_rows = n_visible.len();
    let n_head = n_rows * row_heads;
    let most_visible = n_visible.iter().copied().max().unwrap_or(0);
    let first_seen = n_visible.iter().map(|&n| scale.first_seen(n)).min().unwrap_or(0);
    let kv_len = shape.kv_len();
    let chunks = head_dim.div_ceil(LANES);
    let padded_len = n_head * chunks * LANES;
    scratch.clear();
    let keys_len = POSITION_BLOCK * chunks * LANES;
    scratch.resize(2 * padded_len + keys_len + (2 + POSITION_BLOCK) * n_head, 0.0);
    let (q_pad, rest) = scratch.split_at_mut(padded_len);
    let (acc, rest) = rest.split_at_mut(padded_len);
    let (keys, rest) = rest.split_at_mut(keys_len);
    // Per query head: the running maximum and sum of the online softmax,
    // and the scores of the block of positions being visited.
    let (maxima, rest) = rest.split_at_mut(n_head);
    let (sums, scores) = rest.split_at_mut(n_head);
    maxima.fill(f32::NEG_INFINITY);
    // q rounded to f16 and zero-padded to whole chunks (see the doc above).
    let (q_pad, _) = q_pad.as_chunks_mut::<LANES>();
    for (q, q_pad) in q.chunks_exact(head_dim).zip(q_pad.chunks_exact_mut(chunks)) {
        for (dst, &value) in q_pad.as_flattened_mut().iter_mut().zip(q) {
            *dst = f16::from_f32(value).to_f32();
        }
    }
    let q_pad = &*q_pad;
    let (acc, _) = acc.as_chunks_mut::<LANES>();
    let (keys, _) = keys.as_chunks_mut::<LANES>();
    dispatch!(s => {
        for kv_head in 0..n_kv_head {
            let kv_at = (first_kv_head + kv_head) * head_dim;
            let mut state =
                HeadState { acc: &mut *acc, maxima: &mut *maxima, sums: &mut *sums, scores: &mut *scores, keys: &mut *keys };
            let mut block = Block { positions: [(0, 0); POSITION_BLOCK], len: 0 };
            kv.for_each_row(first_seen..most_visible, kv_len, #[inline(always)] |position, at| {
                block.positions[block.len] = (position, at + kv_at);
                block.len += 1;
                if block.len == POSITION_BLOCK {
                    step_block(s, &block, arenas, q_pad, &mut state, n_visible, kv_head, group, head_dim, scale);
                    block.len = 0;
                }
            });
            step_block(s, &block, arenas, q_pad, &mut state, n_visible, kv_head, group, head_dim, scale);
        }
        for (h, ((acc, &max), &sum)) in acc.chunks_exact(chunks).zip(&*maxima).zip(&*sums).enumerate() {
            // The sink of head `h % row_heads` of the selection.
            let sink = scale.sinks.and_then(|sinks| sinks.get(first_kv_head * group + h % row_heads));
            let (rescale, sum) = with_sink(max, sum, sink.copied());
            let (rescale, inv) = (s.splat(rescale), s.splat(1.0 / sum));
            let out = &mut out[h * head_dim..(h + 1) * head_dim];
            for (c, acc) in acc.iter().enumerate() {
                store_chunk(s, s.mul(s.mul(s.load(acc), rescale), inv), out, c);
            }
        }
    });
}

/// A head's softmax denominator with its sink, and the factor of its
/// weighted sum: the sink is one more score whose value is zeros, taken
/// after the positions (llama.cpp's step, `S = S·ms + vs`, fused).
#[inline(always)]
fn with_sink(max: f32, sum: f32, sink: Option<f32>) -> (f32, f32) {
    match sink {
        None => (1.0, sum),
        Some(sink) if sink > max => {
            let rescale = (max - sink).exp();
            (rescale, sum.mul_add(rescale, 1.0))
        }
        Some(sink) => (1.0, sum.mul_add(1.0, (sink - max).exp())),
    }
}

/// Positions visited at a time: their scores, which do not depend on each
/// other, are computed first; then each query head takes its sequential
/// online-softmax steps over them, its weighted sum of V held in registers.
const POSITION_BLOCK: usize = LANES;

/// Up to [`POSITION_BLOCK`] visible positions in order, each with where
/// its K/V head's values start in the arenas.
struct Block {
    positions: [(usize, usize); POSITION_BLOCK],
    len: usize,
}

/// The online-softmax state of the query heads of one piece of attention.
struct HeadState<'a> {
    acc: &'a mut [[f32; LANES]],
    maxima: &'a mut [f32],
    sums: &'a mut [f32],
    /// [`POSITION_BLOCK`] scores per query head.
    scores: &'a mut [f32],
    /// The block's keys of the KV head, widened: a position's chunks after
    /// another's. Every query head of the group, in every row, reads them,
    /// so they are widened once per block rather than once per head and row.
    keys: &'a mut [[f32; LANES]],
}

/// The query heads of KV head `kv_head` (in every row that sees them) over
/// the positions of `block`. Each head takes exactly the steps it takes
/// visiting the positions one at a time; only the interleaving of
/// independent work differs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step_block<S: Simd, K: KvElement, V: KvElement>(
    s: S,
    block: &Block,
    (k, v): (&[K], &[V]),
    q_pad: &[[f32; LANES]],
    state: &mut HeadState<'_>,
    n_visible: &[usize],
    kv_head: usize,
    group: usize,
    head_dim: usize,
    scale: Scores<'_>,
) {
    let chunks = head_dim.div_ceil(LANES);
    let row_heads = state.maxima.len() / n_visible.len();
    let positions = &block.positions[..block.len];
    // The indices in the block of the positions each row sees (a run:
    // they are in order).
    let seen = |visible: usize| {
        let first = scale.first_seen(visible);
        let skipped = positions.iter().take_while(|(position, _)| *position < first).count();
        let end = positions.iter().take_while(|(position, _)| *position < visible).count();
        skipped..end.max(skipped)
    };
    let heads = |row: usize| row * row_heads + kv_head * group..row * row_heads + (kv_head + 1) * group;
    for (keys, &(_, at)) in state.keys.chunks_exact_mut(chunks).zip(positions) {
        let key = head(k, at, head_dim);
        for (c, chunk) in keys.iter_mut().enumerate() {
            s.store(K::load_chunk(s, key, c), chunk);
        }
    }
    let keys = &*state.keys;
    for (row, &visible) in n_visible.iter().enumerate() {
        let seen = seen(visible);
        for h in heads(row) {
            let q = &q_pad[h * chunks..(h + 1) * chunks];
            let scores = &mut state.scores.as_chunks_mut::<POSITION_BLOCK>().0[h];
            let mut lanes = [s.splat(0.0); POSITION_BLOCK];
            for (lanes, key) in lanes.iter_mut().zip(keys[seen.start * chunks..seen.end * chunks].chunks_exact(chunks))
            {
                *lanes = score_lanes(s, q, key);
            }
            let mut sums = [0.0; POSITION_BLOCK];
            s.store(s.reduce_sums(&lanes), &mut sums);
            for (score, &sum) in scores.iter_mut().zip(&sums).take(seen.len()) {
                *score = scale.score(sum);
            }
        }
    }
    for (row, &visible) in n_visible.iter().enumerate() {
        let seen = &positions[seen(visible)];
        let n = seen.len();
        let heads = heads(row);
        // The row's heads S::V_HEADS at a time: their weighted V sums are
        // stepped side by side.
        const { assert!(S::V_HEADS <= MAX_V_HEADS) };
        for batch in (heads.start..heads.end).step_by(S::V_HEADS) {
            let batch = batch..(batch + S::V_HEADS).min(heads.end);
            let mut steps = [Steps { weights: [0.0; POSITION_BLOCK], rescales: [None; POSITION_BLOCK] }; MAX_V_HEADS];
            for (h, steps) in batch.clone().zip(&mut steps) {
                online_softmax(
                    &state.scores[h * POSITION_BLOCK..][..n],
                    &mut state.maxima[h],
                    &mut state.sums[h],
                    steps,
                );
            }
            let acc = &mut state.acc[batch.start * chunks..batch.end * chunks];
            match batch.len() {
                4 => weigh_heads::<S, V, 4>(s, seen, &steps, v, head_dim, acc),
                3 => weigh_heads::<S, V, 3>(s, seen, &steps, v, head_dim, acc),
                2 => weigh_heads::<S, V, 2>(s, seen, &steps, v, head_dim, acc),
                _ => weigh_heads::<S, V, 1>(s, seen, &steps, v, head_dim, acc),
            }
        }
    }
}

/// One query head's running maximum and sum over its scores of a block,
/// position by position, noting each position's weight and rescaling of
/// what came before.
#[inline(always)]
fn online_softmax(scores: &[f32], m: &mut f32, sum: &mut f32, steps: &mut Steps) {
    for ((&score, weight), rescale) in scores.iter().zip(&mut steps.weights).zip(&mut steps.rescales) {
        if score > *m {
            let old_scale = (*m - score).exp();
            *m = score;
            (*weight, *rescale) = (1.0, Some(old_scale));
        } else {
            *weight = (score - *m).exp();
        }
        // Fused, as llama.cpp's compiled `S = S*ms + vs` is.
        *sum = sum.mul_add(rescale.unwrap_or(1.0), *weight);
    }
}

/// The weighted V sums of `H` query heads (`acc`: one head's chunks after
/// another) over the positions of a block, [`Simd::V_CHUNKS`] chunks at a
/// time.
#[inline(always)]
fn weigh_heads<S: Simd, V: KvElement, const H: usize>(
    s: S,
    positions: &[(usize, usize)],
    steps: &[Steps; MAX_V_HEADS],
    v: &[V],
    head_dim: usize,
    acc: &mut [[f32; LANES]],
) {
    const { assert!(S::V_CHUNKS <= MAX_V_CHUNKS) };
    let chunks = head_dim.div_ceil(LANES);
    for first in (0..chunks).step_by(S::V_CHUNKS) {
        match (chunks - first).min(S::V_CHUNKS) {
            1 => weigh_v::<S, V, 1, H>(s, positions, steps, v, head_dim, first, acc),
            2 => weigh_v::<S, V, 2, H>(s, positions, steps, v, head_dim, first, acc),
            3 => weigh_v::<S, V, 3, H>(s, positions, steps, v, head_dim, first, acc),
            _ => weigh_v::<S, V, 4, H>(s, positions, steps, v, head_dim, first, acc),
        }
    }
}

/// The most query heads whose V sums are stepped side by side, and the
/// most chunks of each.
const MAX_V_HEADS: usize = 4;
const MAX_V_CHUNKS: usize = 4;

/// One query head's online-softmax steps over a block's positions.
#[derive(Clone, Copy)]
struct Steps {
    weights: [f32; POSITION_BLOCK],
    /// The factor of the sum so far where the position raised the maximum.
    rescales: [Option<f32>; POSITION_BLOCK],
}

/// The weighted sums of V for chunks `first..first + W` of `H` query
/// heads, kept in registers over the block: a new maximum rescales a
/// head's sum (rounded to f16) before the fused multiply-add of the
/// position's V (rounded again), as llama.cpp's two f16 vector steps do.
/// Every chunk of every head takes the same steps in the same order
/// whatever `W` and `H` are. Each chunk's chain (multiply-add, f16
/// rounding, widening) is as long as the positions: one at a time left
/// the core waiting on its latency, so chunks and heads are stepped side
/// by side, the heads sharing each position's V loads.
#[inline(always)]
fn weigh_v<S: Simd, V: KvElement, const W: usize, const H: usize>(
    s: S,
    positions: &[(usize, usize)],
    steps: &[Steps; MAX_V_HEADS],
    v: &[V],
    head_dim: usize,
    first: usize,
    acc: &mut [[f32; LANES]],
) {
    let per_head = head_dim.div_ceil(LANES);
    // Flat arrays and index loops of constant length, which the compiler
    // unrolls into registers (nested arrays of vectors went to the stack).
    const { assert!(W <= MAX_V_CHUNKS && H <= MAX_V_HEADS) };
    let mut sums = [s.splat(0.0); MAX_V_CHUNKS * MAX_V_HEADS];
    for k in 0..W * H {
        sums[k] = s.load(&acc[k / W * per_head + first + k % W]);
    }
    for (p, &(_, at)) in positions.iter().enumerate() {
        let row = head(v, at, head_dim);
        let mut values = [s.splat(0.0); MAX_V_CHUNKS];
        for (j, value) in values.iter_mut().take(W).enumerate() {
            *value = V::load_chunk(s, row, first + j);
        }
        let steps = &steps[..H];
        if steps.iter().any(|steps| steps.rescales[p].is_some()) {
            for (h, steps) in steps.iter().enumerate() {
                if let Some(old_scale) = steps.rescales[p] {
                    let old_scale = s.splat(old_scale);
                    for sum in &mut sums[h * W..(h + 1) * W] {
                        *sum = s.round_f16(s.mul(*sum, old_scale));
                    }
                }
            }
        }
        let mut weights = [s.splat(0.0); MAX_V_HEADS];
        for (weight, steps) in weights.iter_mut().zip(steps) {
            *weight = s.splat(steps.weights[p]);
        }
        for k in 0..W * H {
            sums[k] = s.round_f16(s.mul_add(values[k % W], weights[k / W], sums[k]));
        }
    }
    for k in 0..W * H {
        s.store(sums[k], &mut acc[k / W * per_head + first + k % W]);
    }
}

/// `q · k` with four accumulators over 64-element groups, fused
/// multiply-adds, then (a0 + a2) + (a1 + a3), whose lanes the tree of
/// [`Simd::reduce_sum`] adds: the order of GGML's f16 dot product with
/// 16-lane vectors.
#[inline(always)]
fn score_lanes<S: Simd>(s: S, q: &[[f32; LANES]], k: &[[f32; LANES]]) -> S::V {
    let mut dot = [s.splat(0.0); 4];
    // Whole groups of four chunks with a fixed accumulator each, so that
    // the accumulators stay in registers.
    let (groups, rest) = q.as_chunks::<4>();
    for (g, group) in groups.iter().enumerate() {
        for (j, (q, dot)) in group.iter().zip(&mut dot).enumerate() {
            *dot = s.mul_add(s.load(q), s.load(&k[4 * g + j]), *dot);
        }
    }
    for (j, (q, dot)) in rest.iter().zip(&mut dot).enumerate() {
        *dot = s.mul_add(s.load(q), s.load(&k[4 * groups.len() + j]), *dot);
    }
    s.add(s.add(dot[0], dot[2]), s.add(dot[1], dot[3]))
}

/// Stores chunk `c` of a head's row, dropping lanes past its end.
#[inline(always)]
fn store_chunk<S: Simd>(s: S, v: S::V, row: &mut [f32], c: usize) {
    let (chunks, tail) = row.as_chunks_mut::<LANES>();
    if let Some(chunk) = chunks.get_mut(c) {
        s.store(v, chunk);
    } else if c == chunks.len() && !tail.is_empty() {
        let mut chunk = [0.0; LANES];
        s.store(v, &mut chunk);
        let n = tail.len();
        tail.copy_from_slice(&chunk[..n]);
    }
}

fn check(
    q: &[f32],
    kv: &KvPages<'_>,
    n_visible: &[usize],
    shape: HeadShape,
    kv_heads: &Range<usize>,
    scores: Scores<'_>,
    out: &[f32],
) -> Result<(), String> {
    if kv_heads.start >= kv_heads.end || kv_heads.end > shape.n_kv_head {
        return Err(format!("KV heads {kv_heads:?} of {}", shape.n_kv_head));
    }
    let q_len = n_visible.len() * kv_heads.len() * (shape.n_head / shape.n_kv_head) * shape.head_dim;
    if q.len() != q_len || out.len() != q_len {
        return Err(format!("q has {} and out {} values, the rows' heads need {q_len}", q.len(), out.len()));
    }
    // Heads are read in whole blocks.
    for (name, rows) in [("K", kv.k), ("V", kv.v)] {
        let kv_type = rows.kv_type();
        if !shape.head_dim.is_multiple_of(kv_type.block_values()) {
            return Err(format!(
                "{name} as {kv_type} is stored in blocks of {} values, which heads of {} do not fill",
                kv_type.block_values(),
                shape.head_dim
            ));
        }
    }
    let Some(&most) = n_visible.iter().max() else {
        return Err("no query rows".into());
    };
    if scores.window == Some(0) {
        return Err("a window of no positions".into());
    }
    if !scores.softcap.is_none_or(|cap| cap > 0.0 && cap.is_finite()) {
        return Err(format!("soft-cap {:?} must be finite and positive", scores.softcap));
    }
    if let Some(sinks) = scores.sinks
        && sinks.len() != shape.n_head
    {
        return Err(format!("{} attention sinks for {} query heads", sinks.len(), shape.n_head));
    }
    let sorted = kv.hidden.windows(2).all(|pair| pair[0].end <= pair[1].start);
    if !sorted || kv.hidden.iter().any(|range| range.start >= range.end) {
        return Err(format!("hidden positions {:?} are not sorted, disjoint, non-empty ranges", kv.hidden));
    }
    n_visible.iter().try_for_each(|&n| check_seen(kv, n, scores))?;
    // The row seeing the most decides which blocks must exist.
    check_blocks(kv, most, shape)
}

/// Whether a row seeing `0..n_visible` (its window of them) sees at least
/// one position.
fn check_seen(kv: &KvPages<'_>, n_visible: usize, scores: Scores<'_>) -> Result<(), String> {
    if n_visible == 0 {
        return Err("no visible positions".into());
    }
    let first = scores.first_seen(n_visible);
    let hidden: usize =
        kv.hidden.iter().map(|range| range.end.min(n_visible).saturating_sub(range.start.max(first))).sum();
    if hidden >= n_visible - first {
        return Err(format!("all {} positions in {first}..{n_visible} are hidden", n_visible - first));
    }
    Ok(())
}

fn check_blocks(kv: &KvPages<'_>, n_visible: usize, shape: HeadShape) -> Result<(), String> {
    let PageTable { blocks, block_tokens } = kv.pages;
    let n_blocks = n_visible.div_ceil(block_tokens.max(1));
    if block_tokens == 0 || blocks.len() < n_blocks {
        return Err(format!("{} blocks of {block_tokens} positions do not cover {n_visible} positions", blocks.len()));
    }
    let block_len = block_tokens.saturating_mul(shape.kv_len());
    let arena = kv.k.values().min(kv.v.values());
    if let Some(b) = blocks[..n_blocks].iter().find(|&&b| {
        (b as usize).checked_add(1).and_then(|end| end.checked_mul(block_len)).is_none_or(|end| end > arena)
    }) {
        return Err(format!("block {b} lies outside the K/V arenas ({} and {} values)", kv.k.values(), kv.v.values()));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
