//! The CPU backend: host memory, the SIMD kernels of this crate and a fixed
//! thread pool. Weights are computed on where the model file maps them.
//!
//! Batch invariance: every operation computes each row with the same
//! per-row kernels in the same order whatever else is in the buffer, and
//! the pool's work split never changes a row's arithmetic, so a row's
//! results are the same bits alone or batched, for any thread count.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::api::{MatmulGroup, scale_each_row};
use super::{
    Backend, BackendError, Embed, KvBlockFormat, KvShape, LowRankSource, LowRankTerm, MatrixSource, PassLayout,
    PassRow, SharedBytes,
};
use crate::cpu::Family;
use crate::gemm;
use crate::matmul::{Group, QuantMatrix, grouped_matmuls, share};
use crate::ops::{self, Gelu, HeadShape, KvArena, KvPages, LowRank, PageTable, Rope, RopeAngles, Scores};
use crate::pool::ThreadPool;

/// A Gated DeltaNet layer's value heads, a share per thread.
struct PoolHeads<'a>(&'a ThreadPool);

impl ops::SplitHeads for PoolHeads<'_> {
    fn split(&self, heads: &mut [ops::DeltaHead<'_>], work: &(dyn Fn(&mut [ops::DeltaHead<'_>]) + Sync)) {
        self.0.split_mut(heads, 1, |_, part| work(part));
    }
}
use crate::quant::PackedRows;

/// Host memory and `n` threads.
pub struct CpuBackend {
    pool: ThreadPool,
    /// One attention scratch buffer per pool thread.
    attention_scratch: Vec<Mutex<Vec<f32>>>,
}

impl CpuBackend {
    /// A backend computing on `threads` threads (at least one).
    pub fn new(threads: usize) -> Self {
        let pool = ThreadPool::new(threads.max(1));
        let attention_scratch = (0..pool.n_threads()).map(|_| Mutex::default()).collect();
        CpuBackend { pool, attention_scratch }
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// `f(start, piece)` over `out` cut into one piece per thread, each
    /// starting at a multiple of `unit` values (a row, or whole vectors for
    /// element-wise steps, so that no value changes its place in a vector).
    /// Below [`PARALLEL_VALUES`] the caller's thread does it all: waking
    /// the pool costs more than a decoding step's rows.
    fn split(&self, out: &mut [f32], unit: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
        if out.len() < PARALLEL_VALUES || unit == 0 {
            f(0, out);
        } else {
            self.pool.split_mut(out, unit, f);
        }
    }

    /// `out = glu(gate, up)` for an element-wise gated activation.
    fn glu(&self, glu: fn(&[f32], &[f32], &mut [f32]), gate: &[f32], up: &[f32], out: &mut Vec<f32>) {
        resize(out, gate.len());
        self.split(out, VECTOR_UNIT, |start, out| {
            let values = start..start + out.len();
            glu(&gate[values.clone()], &up[values], out);
        });
    }
}

/// Values from which the per-row steps (norms, RoPE, SwiGLU, adds) run on
/// every thread: eight rows of a 4096-wide model.
const PARALLEL_VALUES: usize = 32 * 1024;

/// Element-wise steps split at whole vectors of the row kernels.
const VECTOR_UNIT: usize = 64;

/// A weight matrix where the model file maps it, with its rows packed for
/// the kernels where they have a packed layout.
pub struct CpuMatrix {
    bytes: SharedBytes,
    /// The shape, checked against the bytes once.
    dtype: crate::quant::DType,
    n_out: usize,
    n_in: usize,
    packed: Option<PackedRows>,
}

impl CpuMatrix {
    fn view(&self) -> QuantMatrix<'_> {
        let view = QuantMatrix::checked_at_load(self.dtype, self.bytes.as_slice(), self.n_out, self.n_in);
        // `packed` came from this view's bytes, so the check cannot fail.
        self.packed.as_ref().and_then(|packed| view.with_packed(packed).ok()).unwrap_or(view)
    }
}

/// Per layer, a pool of fixed-size blocks of keys and values, each stored
/// as the shape's types say (f16 values or Q8_0 blocks).
pub struct CpuKv {
    shape: KvShape,
    /// Bytes of one block of a layer's keys, and of its values.
    block_bytes: (usize, usize),
    /// Per layer: (keys, values), each `n_blocks × block_tokens × kv_dim`
    /// values.
    layers: Vec<(KvArena, KvArena)>,
}

impl CpuKv {
    /// The bytes of block `block` in each layer's keys and in its values,
    /// or why there is no such block.
    fn block_range(&self, block: u32) -> Result<(Range<usize>, Range<usize>), BackendError> {
        let block = block as usize;
        if block >= self.shape.n_blocks {
            return Err(BackendError::Input(format!("KV block {block} of a store of {}", self.shape.n_blocks)));
        }
        let (k, v) = self.block_bytes;
        Ok((block * k..(block + 1) * k, block * v..(block + 1) * v))
    }
}

/// A pass's layout in host memory, its buffers kept from pass to pass.
#[derive(Default)]
pub struct CpuPass {
    angles: Vec<RopeAngles>,
    rows: Vec<PassRow>,
    /// Per sequence: its blocks and hidden cells.
    blocks: Vec<Vec<u32>>,
    hidden: Vec<Vec<Range<usize>>>,
}

impl Backend for CpuBackend {
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
    type Rows = Vec<f32>;
    type Pass = CpuPass;
    type Kv = CpuKv;
    type LowRank = LowRank;

    /// Names the level of the quantized products, which take most of the
    /// time, and that of the f32 kernels where it differs (AVX-512F
    /// without VNNI).
    fn describe(&self) -> String {
        let (quant, float) = (Family::Quant.level(), Family::Ops.level());
        let float = if float == quant { String::new() } else { format!(", f32 {}", float.name()) };
        format!("cpu ({}{float}, {} threads)", quant.name(), self.threads())
    }

    fn matrix(&self, source: MatrixSource) -> Result<CpuMatrix, BackendError> {
        let MatrixSource { dtype, bytes, n_out, n_in } = source;
        let packed = QuantMatrix::new(dtype, bytes.as_slice(), n_out, n_in)?.pack(&self.pool);
        Ok(CpuMatrix { bytes, dtype, n_out, n_in, packed })
    }

    fn vector(&self, values: &[f32]) -> Result<Vec<f32>, BackendError> {
        Ok(values.to_vec())
    }

    fn low_rank(&self, source: LowRankSource) -> Result<LowRank, BackendError> {
        let LowRankSource { a, b, rank, n_in, n_out } = source;
        Ok(LowRank::new(a, &b, rank, n_in, n_out)?)
    }

    fn kv(&self, shape: KvShape) -> Result<CpuKv, BackendError> {
        // Checks the types against the heads, and that the bytes (never
        // fewer than the values) can be addressed.
        shape.bytes()?;
        let (k_cell, v_cell) = shape.cell_bytes()?;
        let values = shape.cells().and_then(|cells| cells.checked_mul(shape.kv_dim)).unwrap_or(usize::MAX);
        let layers =
            (0..shape.n_layer).map(|_| (KvArena::zeros(shape.types.k, values), KvArena::zeros(shape.types.v, values)));
        let block_bytes = (shape.block_tokens * k_cell, shape.block_tokens * v_cell);
        Ok(CpuKv { shape, block_bytes, layers: layers.collect() })
    }

    /// Copies the stored bytes, whatever the types.
    fn copy_kv_block(&self, kv: &mut CpuKv, from: u32, to: u32) {
        let (from, to) = (from as usize, to as usize);
        let (k, v) = kv.block_bytes;
        for (keys, values) in &mut kv.layers {
            keys.bytes_mut().copy_within(from * k..(from + 1) * k, to * k);
            values.bytes_mut().copy_within(from * v..(from + 1) * v, to * v);
        }
    }

    fn kv_block_format(&self, kv: &CpuKv) -> KvBlockFormat {
        let (k, v) = kv.block_bytes;
        KvBlockFormat { element: kv.shape.types.name(), bytes: kv.shape.n_layer * (k + v) }
    }

    fn read_kv_block(&self, kv: &CpuKv, block: u32) -> Result<Vec<u8>, BackendError> {
        let (k, v) = kv.block_range(block)?;
        let mut bytes = Vec::with_capacity(self.kv_block_format(kv).bytes);
        for (keys, values) in &kv.layers {
            bytes.extend_from_slice(&keys.bytes()[k.clone()]);
            bytes.extend_from_slice(&values.bytes()[v.clone()]);
        }
        Ok(bytes)
    }

    fn write_kv_block(&self, kv: &mut CpuKv, block: u32, bytes: &[u8]) -> Result<(), BackendError> {
        let (k, v) = kv.block_range(block)?;
        let expected = self.kv_block_format(kv).bytes;
        if bytes.len() != expected {
            return Err(BackendError::Input(format!("{} bytes for a KV block of {expected}", bytes.len())));
        }
        // `max(1)`: a store of empty blocks has nothing to write.
        for ((keys, values), layer) in kv.layers.iter_mut().zip(bytes.chunks_exact((k.len() + v.len()).max(1))) {
            let (k_bytes, v_bytes) = layer.split_at(k.len());
            keys.bytes_mut()[k.clone()].copy_from_slice(k_bytes);
            values.bytes_mut()[v.clone()].copy_from_slice(v_bytes);
        }
        Ok(())
    }

    fn upload(&self, values: &[f32], out: &mut Vec<f32>) -> Result<(), BackendError> {
        out.clear();
        out.extend_from_slice(values);
        Ok(())
    }

    fn download(&self, rows: &Vec<f32>) -> Result<Vec<f32>, BackendError> {
        Ok(rows.clone())
    }

    fn download_owned(&self, rows: Vec<f32>) -> Result<Vec<f32>, BackendError> {
        Ok(rows)
    }

    fn prepare(&self, rope: &Rope, layout: &PassLayout<'_>, out: &mut CpuPass) -> Result<(), BackendError> {
        if let Some(row) = layout.rows.iter().find(|row| row.seq >= layout.sequences.len()) {
            return Err(BackendError::Input(format!(
                "a row of sequence {} in a pass of {} sequences",
                row.seq,
                layout.sequences.len()
            )));
        }
        out.angles.resize_with(layout.rows.len(), RopeAngles::default);
        for (row, angles) in layout.rows.iter().zip(out.angles.iter_mut()) {
            rope.angles(row.pos, angles);
        }
        out.rows.clear();
        out.rows.extend_from_slice(layout.rows);
        out.blocks.resize_with(layout.sequences.len(), Vec::new);
        out.hidden.resize_with(layout.sequences.len(), Vec::new);
        for ((sequence, blocks), hidden) in layout.sequences.iter().zip(&mut out.blocks).zip(&mut out.hidden) {
            blocks.clear();
            blocks.extend_from_slice(sequence.blocks);
            hidden.clear();
            hidden.extend_from_slice(sequence.hidden);
        }
        Ok(())
    }

    fn embed(
        &self,
        table: Option<&CpuMatrix>,
        inputs: &[Embed<'_>],
        width: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        resize(out, inputs.len() * width);
        let table = table.map(CpuMatrix::view);
        for (input, dst) in inputs.iter().zip(out.chunks_exact_mut(width)) {
            match (*input, &table) {
                (Embed::Token(token), Some(table)) if (token as usize) < table.n_out() && table.n_in() == width => {
                    table.dequantize_row(token as usize, dst)
                }
                (Embed::Token(token), _) => {
                    return Err(BackendError::Input(format!("token {token} has no embedding row of width {width}")));
                }
                (Embed::Values(values), _) if values.len() == width => dst.copy_from_slice(values),
                (Embed::Values(values), _) => {
                    return Err(BackendError::Input(format!("{} values for a row of {width}", values.len())));
                }
            }
        }
        Ok(())
    }

    fn rms_norm(&self, x: &Vec<f32>, weight: &Vec<f32>, eps: f32, out: &mut Vec<f32>) {
        resize(out, x.len());
        let width = weight.len();
        self.split(out, width, |start, out| {
            for (input, output) in x[start..].chunks_exact(width).zip(out.chunks_exact_mut(width)) {
                ops::rms_norm(input, weight, eps, output);
            }
        });
    }

    fn rms_norm_in_place(&self, x: &mut Vec<f32>, weight: &Vec<f32>, eps: f32) {
        self.split(x, weight.len(), |_, x| {
            x.chunks_exact_mut(weight.len()).for_each(|row| ops::rms_norm_in_place(row, weight, eps));
        });
    }

    fn matmul_batch(&self, weights: &CpuMatrix, x: &Vec<f32>, m: usize, out: &mut Vec<f32>) {
        if !gemm::supports(weights.dtype) {
            return self.matmul(weights, x, m, out);
        }
        // gemm writes every element, so stale values need no clearing (a
        // memset of megabytes on one thread while the others wait).
        out.resize(m * weights.n_out, 0.0);
        gemm::gemm(&weights.view(), &x[..m * weights.n_in], m, out, &self.pool);
    }

    fn matmuls(&self, x: &Vec<f32>, m: usize, products: &mut [(&CpuMatrix, &mut Vec<f32>)]) {
        self.grouped_matmuls(&mut [(x, m, products)]);
    }

    fn grouped_matmuls(&self, groups: &mut [MatmulGroup<'_, '_, '_, '_, Self>]) {
        // Each input's rows (the references outlive this borrow of `groups`).
        let inputs: Vec<(&[f32], usize)> = groups
            .iter()
            .map(|&(x, m, ref products)| (&x[..m * products.first().map_or(0, |(weights, _)| weights.n_in)], m))
            .collect();
        let views: Vec<Vec<QuantMatrix>> = groups
            .iter()
            .map(|(_, _, products)| products.iter().map(|(weights, _)| weights.view()).collect())
            .collect();
        let mut jobs: Vec<Vec<(&QuantMatrix, &mut [f32])>> = groups
            .iter_mut()
            .zip(&views)
            .map(|((_, m, products), views)| {
                views
                    .iter()
                    .zip(products.iter_mut())
                    .map(|(view, (weights, out))| {
                        resize(out, *m * weights.n_out);
                        (view, out.as_mut_slice())
                    })
                    .collect()
            })
            .collect();
        let mut groups: Vec<Group> = inputs
            .into_iter()
            .zip(jobs.iter_mut())
            .map(|((x, m), products)| Group { x, m, products: products.as_mut_slice() })
            .collect();
        grouped_matmuls(&mut groups, &self.pool);
    }

    fn add_low_rank(&self, x: &Vec<f32>, terms: &[LowRankTerm<'_, LowRank>], out: &mut Vec<f32>) {
        let Some(first) = terms.first().map(|term| term.factors) else { return };
        let (n_in, n_out) = (first.n_in(), first.n_out());
        // Per row, its (term, scale) in term order.
        let mut per_row: Vec<Vec<(&LowRank, f32)>> = vec![Vec::new(); out.len() / n_out.max(1)];
        let mut work = 0;
        for term in terms {
            for &(row, scale) in term.rows {
                if let Some(list) = per_row.get_mut(row) {
                    list.push((term.factors, scale));
                    work += term.factors.rank() * (n_in + n_out);
                }
            }
        }
        let pieces: Vec<_> = out
            .chunks_exact_mut(n_out)
            .zip(x.chunks_exact(n_in))
            .zip(&per_row)
            .filter(|(_, deltas)| !deltas.is_empty())
            .map(|((out, x), deltas)| Mutex::new((out, x, deltas)))
            .collect();
        let next = AtomicUsize::new(0);
        let run = || {
            let mut t = Vec::new();
            while let Some(piece) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                let Ok(mut piece) = piece.lock() else { return };
                let (out, x, deltas) = &mut *piece;
                for (factors, scale) in deltas.iter() {
                    factors.add_to(x, *scale, out, &mut t);
                }
            }
        };
        // Handing out a few small deltas costs more than computing them.
        if work < LOW_RANK_SERIAL_WORK {
            run();
        } else {
            self.pool.run(|_, _| run());
        }
    }

    fn add_bias(&self, x: &mut Vec<f32>, bias: &Vec<f32>) {
        self.split(x, bias.len(), |_, x| x.chunks_exact_mut(bias.len()).for_each(|row| ops::add_in_place(row, bias)));
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) {
        self.split(x, VECTOR_UNIT, |start, x| ops::add_in_place(x, &y[start..start + x.len()]));
    }

    fn swiglu(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) {
        self.glu(ops::swiglu, gate, up, out);
    }

    fn gather(&self, x: &Vec<f32>, rows: &[usize], width: usize, out: &mut Vec<f32>) {
        out.clear();
        for &row in rows {
            out.extend_from_slice(&x[row * width..(row + 1) * width]);
        }
    }

    fn scatter(
        &self,
        x: &Vec<f32>,
        rows: &[usize],
        width: usize,
        n_rows: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        out.resize(n_rows * width, 0.0);
        ops::scatter_rows(x, rows, width, out).map_err(BackendError::Input)
    }

    fn weighted_sum(
        &self,
        parts: &Vec<f32>,
        weights: &[f32],
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        ops::weighted_sum(parts, weights, n, out).map_err(BackendError::Input)
    }

    fn layer_norm(
        &self,
        x: &Vec<f32>,
        weight: &[f32],
        bias: &[f32],
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        resize(out, x.len());
        let width = weight.len();
        self.split(out, width, |start, out| {
            for (input, output) in x[start..].chunks_exact(width).zip(out.chunks_exact_mut(width)) {
                ops::layer_norm(input, weight, bias, eps, output);
            }
        });
        Ok(())
    }

    fn gelu(&self, x: &mut Vec<f32>, kind: Gelu) -> Result<(), BackendError> {
        self.split(x, VECTOR_UNIT, |_, x| ops::gelu(x, kind));
        Ok(())
    }

    fn geglu(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) -> Result<(), BackendError> {
        self.glu(ops::geglu_f16, gate, up, out);
        Ok(())
    }

    fn swiglu_oai(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) -> Result<(), BackendError> {
        self.glu(ops::swiglu_oai, gate, up, out);
        Ok(())
    }

    /// The value heads spread over the pool's threads.
    fn delta_net(
        &self,
        shape: ops::DeltaShape,
        weights: ops::DeltaWeights<'_>,
        state: ops::DeltaState<'_>,
        rows: ops::DeltaRows<'_>,
        out: &mut [f32],
    ) {
        ops::delta_net(shape, weights, state, rows, out, &PoolHeads(&self.pool));
    }

    fn scale(&self, x: &mut Vec<f32>, factor: f32) -> Result<(), BackendError> {
        self.split(x, VECTOR_UNIT, |_, x| ops::scale(x, factor));
        Ok(())
    }

    fn scale_rows(&self, x: &mut Vec<f32>, factors: &[f32]) -> Result<(), BackendError> {
        scale_each_row(x, factors)
    }

    fn rope(&self, rope: &Rope, pass: &CpuPass, x: &mut Vec<f32>) {
        let Some(width) = x.len().checked_div(pass.angles.len()) else { return };
        self.split(x, width, |start, x| {
            for (row, angles) in x.chunks_exact_mut(width).zip(&pass.angles[start / width..]) {
                rope.apply(angles, row);
            }
        });
    }

    fn store_kv(&self, kv: &mut CpuKv, layer: usize, k: &Vec<f32>, v: &Vec<f32>, pass: &CpuPass) {
        let kv_dim = kv.shape.kv_dim;
        let (keys, values) = &mut kv.layers[layer];
        for (row, pass_row) in pass.rows.iter().enumerate() {
            let at = pass_row.slot * kv_dim;
            keys.write(at, &k[row * kv_dim..(row + 1) * kv_dim]);
            values.write(at, &v[row * kv_dim..(row + 1) * kv_dim]);
        }
    }

    fn attend_within(
        &self,
        _kv: &mut CpuKv,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        pass: &CpuPass,
        heads: HeadShape,
        scale: f32,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        resize(out, q.len());
        let seq: Vec<usize> = pass.rows.iter().map(|row| row.seq).collect();
        Ok(ops::attend_within(q, k, v, &seq, heads, scale, out, &self.pool)?)
    }

    fn attend(
        &self,
        kv: &CpuKv,
        layer: usize,
        q: &Vec<f32>,
        pass: &CpuPass,
        heads: HeadShape,
        scores: Scores<'_>,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        let q_dim = heads.q_len();
        resize(out, pass.rows.len() * q_dim);
        let (keys, values) = (kv.layers[layer].0.rows(), kv.layers[layer].1.rows());
        let block_tokens = kv.shape.block_tokens;
        // Rows are independent, and so are a row's heads. Pieces are runs of up to
        // four consecutive rows of one sequence, which `attend_heads` steps
        // through together, or, with fewer rows than threads (decoding),
        // one row's share of the KV heads. A row's result is the same bits
        // whichever piece computes it.
        let n_threads = self.pool.n_threads();
        let n_kv_head = heads.n_kv_head();
        let parts = if pass.rows.len() >= n_threads { 1 } else { n_kv_head.min(n_threads) };
        let q_per_kv_head = q_dim / n_kv_head;
        let kv_heads = |part: usize| share(n_kv_head, part, parts);
        let mut pieces: Vec<Piece> = Vec::new();
        let mut rest = out.as_mut_slice();
        let mut first = 0;
        while first < pass.rows.len() {
            let seq = pass.rows[first].seq;
            let same = pass.rows[first..].iter().take(if parts == 1 { ROW_BLOCK } else { 1 });
            let rows = first..first + same.take_while(|row| row.seq == seq).count();
            for part in 0..parts {
                let len = rows.len() * kv_heads(part).len() * q_per_kv_head;
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
                pieces.push((rows.clone(), part, Mutex::new(piece)));
                rest = tail;
            }
            first = rows.end;
        }
        let failure: Mutex<Option<ops::OpsError>> = Mutex::new(None);
        let scratch = &self.attention_scratch;
        // Threads claim pieces until none are left, the last (in a prompt,
        // the longest) first: uneven work and uneven threads even out.
        let next = AtomicUsize::new(0);
        let claim = || pieces.len().checked_sub(1 + next.fetch_add(1, Ordering::Relaxed)).map(|index| &pieces[index]);
        self.pool.run(|thread, _| {
            let Ok(mut scratch) = scratch[thread].lock() else { return };
            let mut visible = Vec::with_capacity(ROW_BLOCK);
            while let Some((rows, part, piece)) = claim() {
                let seq = pass.rows[rows.start].seq;
                let Ok(mut out) = piece.lock() else { return };
                let pages = KvPages {
                    k: keys,
                    v: values,
                    pages: PageTable { blocks: &pass.blocks[seq], block_tokens },
                    hidden: &pass.hidden[seq],
                };
                visible.clear();
                visible.extend(pass.rows[rows.clone()].iter().map(|row| row.visible));
                let kv_heads = kv_heads(*part);
                // One row when the heads are split, whole rows otherwise.
                let q = if parts == 1 {
                    &q[rows.start * q_dim..rows.end * q_dim]
                } else {
                    let at = rows.start * q_dim + kv_heads.start * q_per_kv_head;
                    &q[at..at + kv_heads.len() * q_per_kv_head]
                };
                let attended = ops::attend_heads(q, pages, &visible, heads, kv_heads, scores, &mut out, &mut scratch);
                if let (Err(error), Ok(mut failure)) = (attended, failure.lock()) {
                    failure.get_or_insert(error);
                }
            }
        });
        drop(pieces);
        match failure.into_inner().ok().flatten() {
            Some(error) => Err(error.into()),
            None => Ok(()),
        }
    }
}

/// Multiply-adds below which [`Backend::add_low_rank`] stays on the calling
/// thread.
const LOW_RANK_SERIAL_WORK: usize = 1 << 16;

/// Query rows of one sequence that attention steps through together.
const ROW_BLOCK: usize = 4;

/// A piece of a pass's attention: its rows, which part of their KV heads,
/// and where its output goes.
type Piece<'a> = (Range<usize>, usize, Mutex<&'a mut [f32]>);

/// Cleared and zero-filled to `len`: every operation's output starts the same.
fn resize(buffer: &mut Vec<f32>, len: usize) {
    buffer.clear();
    buffer.resize(len, 0.0);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::{KvType, KvTypes, PassSequence};
    use crate::quant::{DType, dequantize_row};

    fn f32_matrix(backend: &CpuBackend, rows: &[[f32; 3]]) -> CpuMatrix {
        let bytes: Vec<u8> = rows.iter().flatten().flat_map(|value| value.to_le_bytes()).collect();
        let len = bytes.len();
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(bytes);
        let source = MatrixSource {
            dtype: DType::F32,
            bytes: SharedBytes::new(owner, 0..len).expect("in bounds"),
            n_out: rows.len(),
            n_in: 3,
        };
        backend.matrix(source).expect("valid matrix")
    }

    #[test]
    fn embeddings_come_from_the_table_or_the_caller() {
        let backend = CpuBackend::new(1);
        let table = f32_matrix(&backend, &[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]);
        let mut out = Vec::new();
        let inputs = [Embed::Token(1), Embed::Values(&[7.0, 8.0, 9.0]), Embed::Token(0)];
        backend.embed(Some(&table), &inputs, 3, &mut out).expect("valid inputs");
        assert_eq!(out, [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 1.0, 2.0, 3.0]);
        assert!(backend.embed(Some(&table), &[Embed::Token(2)], 3, &mut out).is_err(), "past the table");
        assert!(backend.embed(None, &[Embed::Token(0)], 3, &mut out).is_err(), "no table");
        assert!(backend.embed(None, &[Embed::Values(&[1.0])], 3, &mut out).is_err(), "short values");
    }

    #[test]
    fn a_matrix_must_match_its_bytes() {
        let backend = CpuBackend::new(1);
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![0u8; 20]);
        let source = MatrixSource {
            dtype: DType::F32,
            bytes: SharedBytes::new(owner, 0..20).expect("in bounds"),
            n_out: 2,
            n_in: 3,
        };
        assert!(backend.matrix(source).is_err(), "20 bytes are not 2 rows of 3 f32");
    }

    #[test]
    fn a_layout_naming_a_missing_sequence_is_refused() {
        let backend = CpuBackend::new(1);
        let rope = Rope::new(2, 2, 10000.0, 1.0, ops::RopeKind::Neox).expect("valid rope");
        let rows = [PassRow { pos: [0; 4], slot: 0, seq: 1, visible: 1 }];
        let layout = PassLayout { rows: &rows, sequences: &[PassSequence { blocks: &[0], hidden: &[] }] };
        let error = backend.prepare(&rope, &layout, &mut CpuPass::default()).expect_err("sequence 1 is not there");
        assert_eq!(error.to_string(), "a row of sequence 1 in a pass of 1 sequences");
        let shape = KvShape {
            n_layer: 1,
            kv_dim: usize::MAX,
            head_dim: 1,
            n_blocks: 2,
            block_tokens: 16,
            types: KvTypes::default(),
        };
        assert!(matches!(backend.kv(shape), Err(BackendError::Unavailable(_))), "too large to address");
        let q8_0 = KvTypes { k: KvType::F16, v: KvType::Q8_0 };
        let heads_of_48 = KvShape { kv_dim: 96, head_dim: 48, types: q8_0, ..shape };
        assert!(matches!(backend.kv(heads_of_48), Err(BackendError::Unsupported(_))), "heads are not whole blocks");
    }

    #[test]
    fn the_per_row_steps_give_the_same_bits_on_any_number_of_threads() {
        // Enough values for the pool to take them, in rows that are no
        // whole number of vectors.
        let (n_rows, width, head_dim) = (48, 1000, 40);
        assert!(n_rows * width >= PARALLEL_VALUES);
        let (x, y, weight) = (ops_noise(n_rows * width, 21), ops_noise(n_rows * width, 22), ops_noise(width, 23));
        let rope = Rope::new(head_dim, head_dim, 10000.0, 1.0, ops::RopeKind::Neox).expect("valid rope");
        let rows: Vec<PassRow> =
            (0..n_rows).map(|i| PassRow { pos: [7 * i as u32; 4], slot: i, seq: 0, visible: i + 1 }).collect();
        let blocks: Vec<u32> = (0..n_rows as u32).collect();
        let layout = PassLayout { rows: &rows, sequences: &[PassSequence { blocks: &blocks, hidden: &[] }] };
        let steps = |backend: &CpuBackend| {
            let mut pass = CpuPass::default();
            backend.prepare(&rope, &layout, &mut pass).expect("a valid layout");
            let (mut x_out, mut glu) = (Vec::new(), Vec::new());
            backend.rms_norm(&x, &weight, 1e-5, &mut x_out);
            backend.rms_norm_in_place(&mut x_out, &weight, 1e-5);
            backend.add_bias(&mut x_out, &weight);
            backend.add(&mut x_out, &y);
            backend.rope(&rope, &pass, &mut x_out);
            backend.swiglu(&x_out, &y, &mut glu);
            x_out.iter().chain(&glu).map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let alone = steps(&CpuBackend::new(1));
        for threads in [2, 3] {
            assert!(steps(&CpuBackend::new(threads)) == alone, "{threads} threads");
        }
    }

    #[test]
    fn low_rank_deltas_of_a_row_do_not_depend_on_the_other_rows_or_the_threads() {
        // Enough work for the pool to take it (`LOW_RANK_SERIAL_WORK`).
        let (rank, n_in, n_out) = (32, 600, 520);
        let factors = |seed| {
            let source = LowRankSource {
                a: ops_noise(rank * n_in, seed),
                b: ops_noise(n_out * rank, seed + 1),
                rank,
                n_in,
                n_out,
            };
            CpuBackend::new(1).low_rank(source).expect("valid factors")
        };
        let (first, second) = (factors(1), factors(3));
        let x = ops_noise(3 * n_in, 5);
        let base = ops_noise(3 * n_out, 6);
        // Row 0: both adapters; row 1: none; row 2: the second, alone.
        let mixed = |backend: &CpuBackend| {
            let mut out = base.clone();
            let terms = [
                LowRankTerm { factors: &first, rows: &[(0, 0.5)] },
                LowRankTerm { factors: &second, rows: &[(2, 1.0), (0, -2.0)] },
            ];
            backend.add_low_rank(&x, &terms, &mut out);
            out
        };
        let alone = |row: usize, terms: &[(&LowRank, f32)]| {
            let mut out = base[row * n_out..(row + 1) * n_out].to_vec();
            let x = x[row * n_in..(row + 1) * n_in].to_vec();
            for &(factors, scale) in terms {
                CpuBackend::new(1).add_low_rank(&x, &[LowRankTerm { factors, rows: &[(0, scale)] }], &mut out);
            }
            out
        };
        let bits = |values: &[f32]| values.iter().map(|value| value.to_bits()).collect::<Vec<_>>();
        let serial = mixed(&CpuBackend::new(1));
        assert_eq!(bits(&serial), bits(&mixed(&CpuBackend::new(3))), "threads");
        assert_eq!(bits(&serial[..n_out]), bits(&alone(0, &[(&first, 0.5), (&second, -2.0)])));
        assert_eq!(bits(&serial[n_out..2 * n_out]), bits(&base[n_out..2 * n_out]), "no delta");
        assert_eq!(bits(&serial[2 * n_out..]), bits(&alone(2, &[(&second, 1.0)])));
        assert_ne!(bits(&serial[..n_out]), bits(&base[..n_out]));
    }

    fn ops_noise(n: usize, seed: u64) -> Vec<f32> {
        crate::ops::noise(n, seed, 0.5)
    }

    /// A store of 2 layers, 3 blocks of 2 cells, one head of 32.
    fn shape(types: KvTypes) -> KvShape {
        KvShape { n_layer: 2, kv_dim: 32, head_dim: 32, n_blocks: 3, block_tokens: 2, types }
    }

    /// Every pair of K and V types.
    fn all_types() -> impl Iterator<Item = KvTypes> {
        KvType::ALL.into_iter().flat_map(|k| KvType::ALL.into_iter().map(move |v| KvTypes { k, v }))
    }

    /// Values `range` (whole blocks) of an arena, as stored.
    fn stored(arena: &KvArena, range: Range<usize>) -> Vec<f32> {
        let kv_type = arena.rows().kv_type();
        let (start, end) = kv_type.row_bytes(range.start).zip(kv_type.row_bytes(range.end)).expect("whole blocks");
        let mut out = vec![0.0; range.len()];
        dequantize_row(kv_type.dtype(), &arena.bytes()[start..end], &mut out).expect("whole blocks");
        out
    }

    #[test]
    fn a_decoding_row_attends_to_the_same_bits_on_any_number_of_threads() {
        // Groups of 3, 4 and 7 query heads per KV head.
        for (n_head, n_kv_head, head_dim) in [(9, 3, 64), (32, 8, 32), (28, 4, 32)] {
            let heads = HeadShape::new(n_head, n_kv_head, head_dim).expect("valid heads");
            let kv_dim = n_kv_head * head_dim;
            let n_cached = 40;
            let rope = Rope::new(head_dim, head_dim, 10000.0, 1.0, ops::RopeKind::Neox).expect("valid rope");
            let blocks = [2, 0, 1];
            let attend = |threads: usize| {
                let backend = CpuBackend::new(threads);
                let types = KvTypes::default();
                let shape = KvShape { n_layer: 1, kv_dim, head_dim, n_blocks: 3, block_tokens: 16, types };
                let mut kv = backend.kv(shape).expect("a small store");
                let rows: Vec<PassRow> =
                    (0..=n_cached).map(|i| PassRow { pos: [i as u32; 4], slot: i, seq: 0, visible: i + 1 }).collect();
                let layout = PassLayout { rows: &rows, sequences: &[PassSequence { blocks: &blocks, hidden: &[] }] };
                let mut pass = CpuPass::default();
                backend.prepare(&rope, &layout, &mut pass).expect("a valid layout");
                let (k, v) = (ops_noise(rows.len() * kv_dim, 31), ops_noise(rows.len() * kv_dim, 32));
                backend.store_kv(&mut kv, 0, &k, &v, &pass);
                // The last row alone, as a decoding step.
                let layout = PassLayout { rows: &rows[n_cached..], ..layout };
                backend.prepare(&rope, &layout, &mut pass).expect("a valid layout");
                let (q, mut out) = (ops_noise(heads.q_len(), 33), Vec::new());
                backend.attend(&kv, 0, &q, &pass, heads, Scores::scaled(0.125), &mut out).expect("valid inputs");
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let alone = attend(1);
            for threads in [2, 3] {
                assert!(attend(threads) == alone, "{n_head}/{n_kv_head} heads, {threads} threads");
            }
        }
    }

    #[test]
    fn kv_blocks_copy_across_every_layer() {
        let backend = CpuBackend::new(1);
        // Whole numbers and ±127 in every block of 32, which both types
        // store exactly.
        let row = |sign: f32| -> Vec<f32> {
            (0..64).map(|i| sign * if i % 32 == 0 { 127.0 } else { i as f32 - 40.0 }).collect()
        };
        let (k, v) = (row(1.0), row(-1.0));
        let rope = Rope::new(2, 2, 10000.0, 1.0, ops::RopeKind::Neox).expect("valid rope");
        let rows = [0, 1].map(|slot| PassRow { pos: [slot as u32; 4], slot, seq: 0, visible: slot + 1 });
        let layout = PassLayout { rows: &rows, sequences: &[PassSequence { blocks: &[0], hidden: &[] }] };
        let mut pass = CpuPass::default();
        backend.prepare(&rope, &layout, &mut pass).expect("a valid layout");
        for types in all_types() {
            let mut kv = backend.kv(shape(types)).expect("a small store");
            for layer in 0..2 {
                backend.store_kv(&mut kv, layer, &k, &v, &pass);
            }
            backend.copy_kv_block(&mut kv, 0, 2);
            for (keys, values) in &kv.layers {
                assert_eq!((stored(keys, 128..192), stored(values, 128..192)), (k.clone(), v.clone()), "{types:?}");
            }
        }
    }

    #[test]
    fn kv_blocks_read_back_into_another_store_bit_for_bit() {
        let backend = CpuBackend::new(1);
        for types in all_types() {
            let mut kv = backend.kv(shape(types)).expect("a small store");
            for (layer, (keys, values)) in kv.layers.iter_mut().enumerate() {
                for (arena, salt) in [(keys, 0x7c), (values, 0)] {
                    // Bytes, not values: NaN payloads and any scale too.
                    for (index, byte) in arena.bytes_mut().iter_mut().enumerate() {
                        *byte = (index * 7 + layer * 31 + salt) as u8 | 1;
                    }
                }
            }
            let format = backend.kv_block_format(&kv);
            let (k_cell, v_cell) = shape(types).cell_bytes().expect("whole blocks");
            assert_eq!(format, KvBlockFormat { element: types.name(), bytes: 2 * 2 * (k_cell + v_cell) });
            let bytes = backend.read_kv_block(&kv, 1).expect("block 1 exists");
            assert_eq!(bytes.len(), format.bytes);
            let mut other = backend.kv(shape(types)).expect("a small store");
            backend.write_kv_block(&mut other, 2, &bytes).expect("same format");
            assert_eq!(backend.read_kv_block(&other, 2).expect("block 2 exists"), bytes);
            let (kb, vb) = other.block_bytes;
            for ((keys, values), (copied_keys, copied_values)) in kv.layers.iter().zip(&other.layers) {
                assert_eq!(keys.bytes()[kb..2 * kb], copied_keys.bytes()[2 * kb..], "{types:?}");
                assert_eq!(values.bytes()[vb..2 * vb], copied_values.bytes()[2 * vb..], "{types:?}");
                assert!(copied_keys.bytes()[..2 * kb].iter().all(|&byte| byte == 0), "other blocks untouched");
            }
            assert!(backend.read_kv_block(&kv, 3).is_err(), "past the store");
            assert!(backend.write_kv_block(&mut other, 3, &bytes).is_err(), "past the store");
            assert!(backend.write_kv_block(&mut other, 0, &bytes[1..]).is_err(), "short");
        }
        // Two layers of keys and values of a block of two cells of 32:
        // 64 bytes a cell as f16, 34 as Q8_0.
        let bytes = |k, v| backend.kv_block_format(&backend.kv(shape(KvTypes { k, v })).expect("a store")).bytes;
        assert_eq!(bytes(KvType::F16, KvType::F16), 2 * 2 * 2 * 64);
        assert_eq!(bytes(KvType::Q8_0, KvType::Q8_0), 2 * 2 * 2 * 34);
    }
}
