//! Products of a quantized weight matrix with rows of f32 activations.
//!
//! Every output element is exactly `vec_dot(weight row, activation row)`
//! with the process's one dot kernel, whatever the batch size, tiling or
//! thread count: tiling only changes the order in which elements are
//! computed, and which thread computes a run of weight rows changes nothing.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::pool::ThreadPool;
use crate::quant::packed::GROUP_ROWS;
use crate::quant::{ActFormat, DType, Dot, KernelError, Kernels, PackedRows};

/// Weight rows held at once per tile while the activation rows pass over
/// them: about half of a typical L1 data cache.
const TILE_BYTES: usize = 16 * 1024;

/// The unit in which threads take rows: two packed groups, the most a
/// packed kernel takes per call, so that a share ends in no half call.
const UNIT_ROWS: usize = 2 * GROUP_ROWS;

/// Activation rows per pass over a tile of packed groups: the widest
/// packed kernel's.
const PACKED_ACT_ROWS: usize = 8;

/// Activation rows from which packed calls are widened before the passes
/// (`crate::quant::packed`, "Wide blocks"): a widening costs about a
/// third of one pass of eight rows.
const WIDE_ACT_ROWS: usize = 32;

thread_local! {
    /// Each thread's wide copy of the calls of its current tile.
    static WIDE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A row-major `n_out × n_in` weight matrix in one dtype, borrowed from its
/// file, and the packed copy of its rows where the kernels have one
/// ([`QuantMatrix::pack`]).
#[derive(Clone, Copy)]
pub struct QuantMatrix<'a> {
    dtype: DType,
    data: &'a [u8],
    n_out: usize,
    n_in: usize,
    row_bytes: usize,
    act_row_bytes: usize,
    packed: Option<&'a PackedRows>,
}

/// Shape and type only: the data is megabytes.
impl std::fmt::Debug for QuantMatrix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantMatrix({} × {} {})", self.n_out, self.n_in, self.dtype)
    }
}

impl<'a> QuantMatrix<'a> {
    /// Checks that `data` is exactly `n_out` rows of `n_in` elements, and
    /// that a row is a whole number of blocks.
    pub fn new(dtype: DType, data: &'a [u8], n_out: usize, n_in: usize) -> Result<QuantMatrix<'a>, KernelError> {
        let row_bytes = dtype.row_bytes(n_in);
        let act_row_bytes = dtype.act_format().row_bytes(n_in);
        let (Some(row_bytes), Some(act_row_bytes)) = (row_bytes, act_row_bytes) else {
            return Err(if n_in.is_multiple_of(dtype.block_elems()) {
                KernelError::TooLarge { format: dtype.name(), n: n_in }
            } else {
                KernelError::PartialBlock { format: dtype.name(), n: n_in, block: dtype.block_elems() }
            });
        };
        let total = row_bytes.checked_mul(n_out).ok_or(KernelError::TooLarge { format: dtype.name(), n: n_in })?;
        if data.len() != total {
            return Err(KernelError::Length { what: "the weight matrix (bytes)", got: data.len(), expected: total });
        }
        Ok(QuantMatrix { dtype, data, n_out, n_in, row_bytes, act_row_bytes, packed: None })
    }

    /// A matrix whose bytes [`QuantMatrix::new`] accepted before (the CPU
    /// backend's resident weights): the same checks cannot fail again, so
    /// only the derived sizes are recomputed.
    pub(crate) fn checked_at_load(dtype: DType, data: &'a [u8], n_out: usize, n_in: usize) -> QuantMatrix<'a> {
        let row_bytes = dtype.row_bytes(n_in).unwrap_or_default();
        let act_row_bytes = dtype.act_format().row_bytes(n_in).unwrap_or_default();
        debug_assert_eq!(Some(data.len()), row_bytes.checked_mul(n_out));
        QuantMatrix { dtype, data, n_out, n_in, row_bytes, act_row_bytes, packed: None }
    }

    /// The matrix's whole groups of eight rows packed for this process's
    /// kernels, or `None` where they multiply the file's layout (a type
    /// without packed kernels, the scalar level, fewer than eight rows).
    /// A copy: as many bytes as those rows (Q4_K's scales unpacked add
    /// 3 %).
    pub fn pack(&self, pool: &ThreadPool) -> Option<PackedRows> {
        let dot = Kernels::current().dot(self.dtype);
        if !dot.packs() {
            return None;
        }
        PackedRows::new(self.dtype, self.data, self.n_out, self.n_in, dot.packed_groups(), pool)
    }

    /// This matrix multiplied through `packed`, which [`QuantMatrix::pack`]
    /// made from the same bytes; a packed copy of another shape or type is
    /// refused.
    pub fn with_packed(self, packed: &'a PackedRows) -> Result<QuantMatrix<'a>, KernelError> {
        let per_call = Kernels::current().dot(self.dtype).packed_groups();
        let expected = PackedRows::len_for(self.dtype, self.n_out, self.n_in, per_call);
        if packed.dtype() != self.dtype || Some(packed.bytes().len()) != expected {
            let expected = expected.unwrap_or_default();
            return Err(KernelError::Length { what: "the packed matrix (bytes)", got: packed.bytes().len(), expected });
        }
        Ok(QuantMatrix { packed: Some(packed), ..self })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn n_out(&self) -> usize {
        self.n_out
    }

    pub fn n_in(&self) -> usize {
        self.n_in
    }

    /// The bytes of weight row `row`. Panics if `row >= n_out`.
    pub fn row(&self, row: usize) -> &'a [u8] {
        &self.data[row * self.row_bytes..(row + 1) * self.row_bytes]
    }

    /// Decodes weight row `row` (an embedding lookup) into `dst`. Panics if
    /// `row >= n_out` or `dst.len() != n_in`, which callers check up front.
    pub fn dequantize_row(&self, row: usize, dst: &mut [f32]) {
        assert!(row < self.n_out, "row {row} of a matrix with {} rows", self.n_out);
        assert_eq!(dst.len(), self.n_in, "destination length vs row length");
        crate::quant::dequantize_valid_row(self.dtype, self.row(row), dst);
    }
}

/// `out[i][j] = Σ_k weights[j][k] · x[i][k]` for the `m` rows of `x`
/// (`m × n_in`, row-major) into `out` (`m × n_out`, row-major).
///
/// Each activation row is quantized once, then the threads of `pool` claim
/// runs of weight rows until none are left; within a run, tiles of weight rows
/// stay in cache while every activation row passes over them. Panics if
/// `x` or `out` has the wrong length.
pub fn matmul(weights: &QuantMatrix, x: &[f32], m: usize, out: &mut [f32], pool: &ThreadPool) {
    matmuls(x, m, &mut [(weights, out)], pool);
}

/// [`matmul`] of one input with several matrices of the same `n_in` (q, k
/// and v; gate and up): `x` is quantized once per activation format they
/// need, and the threads split the matrices' rows together, so small
/// matrices share one hand-out instead of each paying for its own. Every
/// output is the same bits as its own `matmul`. Panics on mismatched
/// lengths.
pub fn matmuls(x: &[f32], m: usize, products: &mut [(&QuantMatrix, &mut [f32])], pool: &ThreadPool) {
    grouped_matmuls(&mut [Group { x, m, products }], pool);
}

/// One input of a [`grouped_matmuls`] call: its `m` rows and the
/// matrices (of one `n_in`) they multiply.
pub struct Group<'x, 'p, 'r, 'w, 'o> {
    pub x: &'x [f32],
    pub m: usize,
    pub products: &'p mut [(&'r QuantMatrix<'w>, &'o mut [f32])],
}

/// [`matmuls`] of several inputs at once (a mixture of experts' experts,
/// each with its own rows): every input is quantized and every matrix's
/// rows handed out in one run of the pool, the threads taking runs of
/// weight rows across all the groups' matrices. Every output is the same
/// bits as its own `matmul`. Panics on mismatched lengths.
pub fn grouped_matmuls(groups: &mut [Group], pool: &ThreadPool) {
    for group in groups.iter_mut() {
        let Some(n_in) = group.products.first().map(|(weights, _)| weights.n_in) else { continue };
        let m = group.m;
        assert_eq!(Some(group.x.len()), m.checked_mul(n_in), "activations: {m} rows of {n_in}");
        for (weights, out) in group.products.iter_mut() {
            assert_eq!(weights.n_in, n_in, "matrices of one input share its width");
            assert_eq!(Some(out.len()), m.checked_mul(weights.n_out), "outputs: {m} rows of {}", weights.n_out);
            if n_in == 0 {
                out.fill(0.0);
            }
        }
    }
    let kernels = Kernels::current();
    // Each group's input in each activation format its matrices need.
    let mut inputs: Vec<(usize, ActFormat)> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let n_in = group.products.first().map_or(0, |(weights, _)| weights.n_in);
        if group.m == 0 || n_in == 0 {
            continue;
        }
        let mut formats: Vec<ActFormat> =
            group.products.iter().map(|(weights, _)| weights.dtype.act_format()).collect();
        formats.sort_by_key(|format| format.name());
        formats.dedup();
        inputs.extend(formats.into_iter().map(|format| (g, format)));
    }
    ACTS.with_borrow_mut(|buffer| {
        let ranges = quantize_inputs(kernels, groups, &inputs, buffer, pool);
        let mut jobs: Vec<Job> = Vec::new();
        for (g, group) in groups.iter_mut().enumerate() {
            for (weights, out) in group.products.iter_mut() {
                let format = weights.dtype.act_format();
                let Some(at) = inputs.iter().position(|&input| input == (g, format)) else { continue };
                jobs.push(Job {
                    weights,
                    m: group.m,
                    acts: &buffer[ranges[at].clone()],
                    dot: kernels.dot(weights.dtype),
                    out: as_atomic(out),
                });
            }
        }
        run_jobs(&jobs, pool);
    });
}

/// Every job's outputs, the threads of `pool` claiming runs of weight rows
/// across all the jobs' matrices.
fn run_jobs(jobs: &[Job], pool: &ThreadPool) {
    // Each matrix's rows as units of sixteen (whole calls of the packed
    // kernels, four of the others'), numbered through all the matrices; a
    // thread takes a contiguous run of units.
    let firsts: Vec<usize> = jobs
        .iter()
        .scan(0, |next, job| {
            let first = *next;
            *next += job.weights.n_out.div_ceil(UNIT_ROWS);
            Some(first)
        })
        .collect();
    let n_groups = jobs.iter().map(|job| job.weights.n_out.div_ceil(UNIT_ROWS)).sum::<usize>();
    if n_groups == 0 {
        return;
    }
    // Threads claim runs of groups until none are left, so that a thread
    // slowed by its neighbours (a shared core, a busy host) does less of
    // the work instead of holding up the others.
    let run = n_groups.div_ceil(pool.n_threads() * RUNS_PER_THREAD).max(1);
    let next = AtomicUsize::new(0);
    pool.run(|_, _| {
        loop {
            let start = next.fetch_add(run, Ordering::Relaxed);
            if start >= n_groups {
                break;
            }
            let groups = start..(start + run).min(n_groups);
            for (job, &first) in jobs.iter().zip(&firsts) {
                let n_out = job.weights.n_out;
                let start = groups.start.clamp(first, first + n_out.div_ceil(UNIT_ROWS)) - first;
                let end = groups.end.clamp(first, first + n_out.div_ceil(UNIT_ROWS)) - first;
                if start < end {
                    job.rows(job.m, UNIT_ROWS * start..(UNIT_ROWS * end).min(n_out));
                }
            }
        }
    });
}

/// How many runs of weight rows a matmul is cut into per thread: enough
/// to even out threads of unequal speed, few enough that each run is a
/// long stream of weights.
const RUNS_PER_THREAD: usize = 8;

thread_local! {
    /// The calling thread's quantized activations, kept from call to call:
    /// a fresh buffer per call (megabytes for a mixture of experts' layer)
    /// may be handed back to the system when freed and faulted in again,
    /// page by page, by the next call.
    static ACTS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Each of `inputs` (a group's rows in an activation format) quantized
/// into `buffer`, one after another, in one run of the pool: the rows of
/// all of them are shared out in contiguous runs, a thread writing only
/// its own. A single row is quantized on the calling thread. Returns where
/// each input's rows are.
fn quantize_inputs(
    kernels: Kernels,
    groups: &[Group],
    inputs: &[(usize, ActFormat)],
    buffer: &mut Vec<u8>,
    pool: &ThreadPool,
) -> Vec<std::ops::Range<usize>> {
    let n_in = |g: usize| groups[g].products.first().map_or(0, |(weights, _)| weights.n_in);
    let row_bytes = |(g, format): (usize, ActFormat)| format.row_bytes(n_in(g)).unwrap_or_default();
    // No overflow: every activation format takes at most 4 bytes per value,
    // so each input is at most the size of its group's `x`.
    let ranges: Vec<std::ops::Range<usize>> = inputs
        .iter()
        .scan(0, |end, &input| {
            let start = *end;
            *end += groups[input.0].m * row_bytes(input);
            Some(start..*end)
        })
        .collect();
    let total = ranges.last().map_or(0, |range| range.end);
    // Grown, never shrunk or cleared: quantizing writes every byte used.
    if buffer.len() < total {
        buffer.resize(total, 0);
    }
    // Every row to quantize: (input, row, its bytes).
    let mut rows: Vec<(usize, usize, &mut [u8])> = Vec::new();
    let mut rest = &mut buffer[..total];
    for (at, &input) in inputs.iter().enumerate() {
        let (part, tail) = rest.split_at_mut(ranges[at].len());
        rows.extend(part.chunks_exact_mut(row_bytes(input).max(1)).enumerate().map(|(i, dst)| (at, i, dst)));
        rest = tail;
    }
    let quantize = |(at, i, dst): &mut (usize, usize, &mut [u8])| {
        let (g, format) = inputs[*at];
        let n = n_in(g);
        kernels.quantize(format, &groups[g].x[*i * n..(*i + 1) * n], dst);
    };
    if rows.len() <= 1 {
        rows.iter_mut().for_each(quantize);
    } else {
        // One contiguous run of rows per thread.
        let (n_threads, n_rows) = (pool.n_threads(), rows.len());
        let mut parts = Vec::with_capacity(n_threads);
        let mut rest = rows.as_mut_slice();
        for thread in 0..n_threads {
            let (part, tail) = rest.split_at_mut(share(n_rows, thread, n_threads).len());
            parts.push(Mutex::new(part));
            rest = tail;
        }
        pool.run(|thread, _| {
            let Ok(mut part) = parts[thread].lock() else { return };
            part.iter_mut().for_each(quantize);
        });
    }
    ranges
}

/// One matrix of a [`grouped_matmuls`] call with its quantized input and
/// output.
struct Job<'a> {
    weights: &'a QuantMatrix<'a>,
    /// Activation rows.
    m: usize,
    acts: &'a [u8],
    dot: Dot,
    out: &'a [AtomicU32],
}

impl Job<'_> {
    /// Outputs of weight rows `rows` (from a multiple of eight) for all `m`
    /// activation rows: tiles of weight rows stay in cache while every
    /// activation row passes. Packed groups first, then the rest from the
    /// file's layout.
    fn rows(&self, m: usize, mut rows: std::ops::Range<usize>) {
        if let Some(packed) = self.weights.packed {
            let groups = rows.start / GROUP_ROWS..(rows.end / GROUP_ROWS).min(packed.n_groups());
            if !groups.is_empty() {
                rows.start = GROUP_ROWS * groups.end;
                self.packed_rows(packed, m, groups);
            }
        }
        if !rows.is_empty() {
            self.file_rows(m, rows);
        }
    }

    fn act(&self, i: usize) -> &[u8] {
        let n = self.weights.act_row_bytes;
        &self.acts[i * n..(i + 1) * n]
    }

    fn store(&self, i: usize, j: usize, values: &[f32]) {
        let out = &self.out[i * self.weights.n_out + j..];
        let n = values.len().min(out.len());
        let dst = out.as_ptr().cast::<f32>().cast_mut();
        // A copy rather than one relaxed store per value, and a packed
        // call's sixteen outputs as one fixed-size copy (a vector store):
        // value by value, or through `memmove`, they took 3 % of a
        // 512-token prompt.
        // SAFETY: `out` is the shared view `as_atomic` gives of an
        // exclusively borrowed f32 slice, whose elements are written through
        // their `UnsafeCell` by one thread each (the shares are disjoint)
        // and read only after the pool's run returns, which orders the
        // writes before the reads; `n` values fit both slices.
        unsafe {
            match values.first_chunk::<16>() {
                Some(chunk) if n == 16 => dst.cast::<[f32; 16]>().write_unaligned(*chunk),
                _ => std::ptr::copy_nonoverlapping(values.as_ptr(), dst, n),
            }
        }
    }

    /// Packed groups `groups` for all `m` activation rows, eight at a
    /// time, in tiles of groups as [`Job::file_rows`] does, as many groups
    /// per call as the kernels take. A call reads its groups' bytes in
    /// order, so the hardware prefetcher follows one stream: asking for
    /// the next call's bytes ahead of it, as the file's layout needs,
    /// slowed a 1B-shaped model's decoding by a fifth on a 2-core Zen 4.
    /// From [`WIDE_ACT_ROWS`] activation rows on, where the level widens
    /// the format, each call of a tile is widened once and every pass
    /// reads the wide copy: the same bits.
    fn packed_rows(&self, packed: &PackedRows, m: usize, groups: std::ops::Range<usize>) {
        let group_bytes = packed.group_bytes();
        let per_call = self.dot.packed_groups();
        let tile = (TILE_BYTES / group_bytes.max(1)).max(1).next_multiple_of(per_call);
        let acts: Vec<&[u8]> = (0..m).map(|i| self.act(i)).collect();
        let wide_call = (m >= WIDE_ACT_ROWS && self.dot.widens()).then(|| per_call * packed.wide_group_bytes());
        let Some(bytes) = wide_call else {
            return self.packed_tiles(packed, &acts, groups, tile, None);
        };
        // Kept per thread: a fresh buffer per call was zeroed and, past the
        // allocator's mmap threshold, faulted in page by page (3 % of a
        // 512-token prompt). Widening writes every byte the passes read.
        WIDE.with_borrow_mut(|wide| {
            wide.resize(wide.len().max(bytes * (tile / per_call)), 0);
            self.packed_tiles(packed, &acts, groups, tile, Some((bytes, wide)));
        });
    }

    /// [`Job::packed_rows`] in tiles of `tile` groups, widening each call
    /// into `wide` first when it is given with the bytes of a wide call.
    fn packed_tiles(
        &self,
        packed: &PackedRows,
        acts: &[&[u8]],
        groups: std::ops::Range<usize>,
        tile: usize,
        mut wide: Option<(usize, &mut Vec<u8>)>,
    ) {
        let group_bytes = packed.group_bytes();
        let per_call = self.dot.packed_groups();
        for tile_start in groups.clone().step_by(tile) {
            let tile_end = (tile_start + tile).min(groups.end);
            // The whole call's bytes: a lone last group is stored as one.
            let call = |g: usize| &packed.bytes()[g * group_bytes..(g + per_call) * group_bytes];
            if let Some((bytes, wide)) = &mut wide {
                for (g, wide) in (tile_start..tile_end).step_by(per_call).zip(wide.chunks_exact_mut(*bytes)) {
                    self.dot.widen(call(g), wide);
                }
            }
            for (chunk, acts) in acts.chunks(PACKED_ACT_ROWS).enumerate() {
                for (k, g) in (tile_start..tile_end).step_by(per_call).enumerate() {
                    let n = per_call.min(tile_end - g);
                    let store = |i, values: &[f32]| self.store(PACKED_ACT_ROWS * chunk + i, GROUP_ROWS * g, values);
                    match &wide {
                        Some((bytes, wide)) => self.dot.call_wide(&wide[k * bytes..(k + 1) * bytes], n, acts, store),
                        None => self.dot.call_packed(call(g), n, acts, store),
                    }
                }
            }
        }
    }

    /// Rows `rows` from the file's layout, for the activation rows in
    /// blocks of about [`act_block_bytes`]: a block stays in cache while
    /// the weight tiles pass over it, so that a long prompt's (or an
    /// image's) activations are not streamed from memory once per tile.
    fn file_rows(&self, m: usize, rows: std::ops::Range<usize>) {
        let block = (act_block_bytes() / self.weights.act_row_bytes.max(1)).max(8) / 8 * 8;
        for start in (0..m).step_by(block) {
            self.file_block(start..(start + block).min(m), rows.clone());
        }
    }

    /// Weight rows `rows` against activation rows `acts`.
    fn file_block(&self, acts: std::ops::Range<usize>, rows: std::ops::Range<usize>) {
        let (first, m) = (acts.start, acts.end);
        let (weights, dot) = (self.weights, self.dot);
        // Whole groups of four rows, so that only a share's last rows run one by one.
        let tile = (TILE_BYTES / weights.row_bytes.max(1)).max(4) / 4 * 4;
        let act = |i: usize| self.act(i);
        let store = |i: usize, j: usize, values: &[f32]| self.store(i, j, values);
        for tile_start in rows.clone().step_by(tile) {
            let tile_rows = tile_start..(tile_start + tile).min(rows.end);
            let groups_end = tile_rows.start + (tile_rows.len() / 4) * 4;
            let four = |j: usize| -> [&[u8]; 4] { std::array::from_fn(|r| weights.row(j + r)) };
            // The first pass over a tile streams it from memory (the only
            // pass when decoding); later passes find it in cache.
            let first_pass = |i: usize, j: usize| {
                if i == first {
                    let group = 4 * weights.row_bytes;
                    prefetch_ahead(weights.data, j * weights.row_bytes..j * weights.row_bytes + group, group);
                }
            };
            // Activation rows in eights, a four, then a pair: each weight
            // block is decoded once for all of them, with the same bits as
            // one row at a time.
            let n = m - first;
            let eights_end = first + n - n % 8;
            for i in (first..eights_end).step_by(8) {
                for j in (tile_rows.start..groups_end).step_by(4) {
                    first_pass(i, j);
                    let values = dot.call4x8(four(j), std::array::from_fn(|a| act(i + a)));
                    for (a, values) in values.iter().enumerate() {
                        store(i + a, j, values);
                    }
                }
            }
            let quads_end = first + n - n % 4;
            for i in (eights_end..quads_end).step_by(4) {
                for j in (tile_rows.start..groups_end).step_by(4) {
                    first_pass(i, j);
                    let values = dot.call4x4(four(j), std::array::from_fn(|a| act(i + a)));
                    for (a, values) in values.iter().enumerate() {
                        store(i + a, j, values);
                    }
                }
            }
            if n % 4 >= 2 {
                let i = quads_end;
                for j in (tile_rows.start..groups_end).step_by(4) {
                    first_pass(i, j);
                    let [v0, v1] = dot.call4x2(four(j), [act(i), act(i + 1)]);
                    store(i, j, &v0);
                    store(i + 1, j, &v1);
                }
            }
            if n % 2 == 1 {
                for j in (tile_rows.start..groups_end).step_by(4) {
                    first_pass(m - 1, j);
                    store(m - 1, j, &dot.call4(four(j), act(m - 1)));
                }
            }
            for i in acts.clone() {
                for row in groups_end..tile_rows.end {
                    store(i, row, &[dot.call(weights.row(row), act(i))]);
                }
            }
        }
    }
}

/// Activation bytes multiplied per pass over a run of weight rows from the
/// file's layout: half of a core's L2 cache as the system reports it
/// (between [`ACT_BLOCK_BYTES`]' bounds; the lower one where it reports
/// none), so that the block is read from there while the weight tiles
/// pass, each streamed from memory once per block. On the 2-core AVX-512
/// VM (2 MiB of L2) 1 MiB instead of 256 KiB took a 448 × 448 encode with
/// Qwen2-VL-2B's tower shapes from 7.8 to 7.2 s: the 5120-wide MLP matrix
/// had taken eight activation rows per pass.
pub(crate) fn act_block_bytes() -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| {
        let (least, most) = (*ACT_BLOCK_BYTES.start(), *ACT_BLOCK_BYTES.end());
        l2_cache_bytes().map_or(least, |l2| (l2 / 2).clamp(least, most))
    })
}

/// The bounds of [`act_block_bytes`].
const ACT_BLOCK_BYTES: std::ops::RangeInclusive<usize> = 256 * 1024..=4 * 1024 * 1024;

/// The first CPU's level-2 data (or unified) cache, as Linux lists it.
fn l2_cache_bytes() -> Option<usize> {
    let caches = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    caches.flatten().find_map(|cache| {
        let read = |name: &str| std::fs::read_to_string(cache.path().join(name)).ok();
        let level_two = read("level")?.trim() == "2" && read("type")?.trim() != "Instruction";
        level_two.then(|| parse_cache_size(&read("size")?)).flatten()
    })
}

/// A cache size as sysfs writes it: `2048K`, `1M` or plain bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.strip_suffix(['K', 'k']) {
        Some(digits) => (digits, 1024),
        None => match text.strip_suffix(['M', 'm']) {
            Some(digits) => (digits, 1024 * 1024),
            None => (text, 1),
        },
    };
    digits.parse::<usize>().ok()?.checked_mul(unit).filter(|&bytes| bytes > 0)
}

/// How far ahead of the rows being multiplied a thread asks for weights,
/// at least. A decode step streams every weight once, from memory: the
/// hardware prefetcher alone keeps too few cache misses in flight to use
/// the memory bandwidth, and asking 2 KiB ahead took a model-sized stream
/// (96 MB, 2 threads) from 6.1 to 3.5 ms on the development machine (1, 4
/// and 8 KiB did less well).
const PREFETCH_DISTANCE: usize = 2048;

/// Asks the CPU to start loading `data[range]` shifted `ahead` bytes (at
/// least `PREFETCH_DISTANCE`; clamped to `data`) into its caches. The
/// callers ask a whole group of rows ahead, so that the next group is on
/// its way however a kernel walks the current one (some read its rows
/// side by side, block by block, and then need the next group's first
/// blocks of all four rows at once).
#[inline(always)]
fn prefetch_ahead(data: &[u8], range: std::ops::Range<usize>, ahead: usize) {
    let ahead = |at: usize| (at + ahead.max(PREFETCH_DISTANCE)).min(data.len());
    let Some(bytes) = data.get(ahead(range.start)..ahead(range.end)) else { return };
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch only hints the cache; it never faults or
        // changes memory, and the address lies inside `data` anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Thread `thread`'s contiguous share of `n` items, as even as can be.
pub(crate) fn share(n: usize, thread: usize, n_threads: usize) -> std::ops::Range<usize> {
    let (base, extra) = (n / n_threads, n % n_threads);
    let start = base * thread + thread.min(extra);
    start..start + base + usize::from(thread < extra)
}

/// Lets the pool's threads write disjoint elements of `out` through a
/// shared view (`Job::store` copies into it through the atomics' cells);
/// the pool's completion handshake publishes the writes to the caller.
fn as_atomic(out: &mut [f32]) -> &[AtomicU32] {
    // SAFETY: AtomicU32 has the size, alignment and bit validity of u32,
    // hence of f32, and the exclusive borrow of `out` guarantees that no
    // other access to it overlaps the returned shared view.
    unsafe { &*(out as *mut [f32] as *const [AtomicU32]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{Rng, random_acts, random_weights};
    use crate::quant::{quantize_act_row, vec_dot};

    fn per_element(w: &QuantMatrix, x: &[f32], m: usize) -> Vec<f32> {
        let format = w.dtype().act_format();
        let mut out = Vec::with_capacity(m * w.n_out());
        for x in x.chunks_exact(w.n_in()) {
            let mut a = vec![0u8; format.row_bytes(w.n_in()).expect("whole blocks")];
            quantize_act_row(format, x, &mut a).expect("valid lengths");
            out.extend((0..w.n_out()).map(|j| vec_dot(w.dtype(), w.row(j), &a, w.n_in())));
        }
        out
    }

    #[test]
    fn outputs_equal_per_element_dots_for_any_batch_and_thread_count() {
        let mut rng = Rng::new(11);
        let pools: Vec<ThreadPool> = [1, 2, 3].into_iter().map(ThreadPool::new).collect();
        for dtype in DType::ALL {
            // Float rows end in a tail shorter than a vector.
            let n_in = match dtype.block_elems() {
                256 => 512,
                1 => 100,
                _ => 96,
            };
            // Enough rows for several tiles at the smaller row sizes.
            let n_out = 301;
            let data: Vec<u8> = (0..n_out).flat_map(|_| random_weights(&mut rng, dtype, n_in)).collect();
            let w = QuantMatrix::new(dtype, &data, n_out, n_in).expect("consistent shapes");
            for m in [1, 3, 7, 13, 15, 64] {
                let x = random_acts(&mut rng, m * n_in);
                let want = per_element(&w, &x, m);
                for pool in &pools {
                    let mut out = vec![f32::NAN; m * n_out];
                    matmul(&w, &x, m, &mut out, pool);
                    let same = out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dtype} m={m} threads={}", pool.n_threads());
                }
            }
        }
    }

    #[test]
    fn packed_matrices_give_the_bits_of_the_file_layout() {
        let mut rng = Rng::new(16);
        let pools: Vec<ThreadPool> = [1, 2, 3].into_iter().map(ThreadPool::new).collect();
        for dtype in [DType::Q4_K, DType::Q6_K, DType::IQ4_XS] {
            // Rows past the last whole group, groups in several tiles, and
            // a matrix too small to pack; past `WIDE_ACT_ROWS` the
            // calls are widened where the level widens the format.
            for (n_out, n_in) in [(45, 512), (8, 256), (7, 256), (130, 1024)] {
                let data: Vec<u8> = (0..n_out).flat_map(|_| random_weights(&mut rng, dtype, n_in)).collect();
                let w = QuantMatrix::new(dtype, &data, n_out, n_in).expect("consistent shapes");
                let Some(packed) = w.pack(&pools[2]) else {
                    assert!(n_out < 8 || !Kernels::current().dot(dtype).packs(), "{dtype} {n_out} rows");
                    continue;
                };
                let packed_w = w.with_packed(&packed).expect("packed from these bytes");
                for m in [1, 3, 4, 9, 17, WIDE_ACT_ROWS + 8] {
                    let x = random_acts(&mut rng, m * n_in);
                    let want = per_element(&w, &x, m);
                    for pool in &pools {
                        let mut out = vec![f32::NAN; m * n_out];
                        matmul(&packed_w, &x, m, &mut out, pool);
                        let same = out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{dtype} {n_out}×{n_in} m={m} threads={}", pool.n_threads());
                    }
                }
            }
        }
    }

    #[test]
    fn a_packed_copy_of_another_matrix_is_refused() {
        let mut rng = Rng::new(17);
        let data: Vec<u8> = (0..16).flat_map(|_| random_weights(&mut rng, DType::Q4_K, 256)).collect();
        let w = QuantMatrix::new(DType::Q4_K, &data, 16, 256).expect("consistent shapes");
        // Packed directly, so that the check runs at every level.
        let packed = PackedRows::new(DType::Q4_K, &data[..data.len() / 2], 8, 256, 1, &ThreadPool::new(2))
            .expect("a whole group");
        let err = w.with_packed(&packed).expect_err("8 rows packed, 16 in the matrix");
        assert!(err.to_string().contains("packed"), "{err}");
        let q6: Vec<u8> = (0..8).flat_map(|_| random_weights(&mut rng, DType::Q6_K, 256)).collect();
        let q6 = QuantMatrix::new(DType::Q6_K, &q6, 8, 256).expect("consistent shapes");
        assert!(q6.with_packed(&packed).is_err(), "Q4_K rows for a Q6_K matrix");
    }

    #[test]
    fn a_row_is_the_same_alone_or_in_a_batch() {
        let mut rng = Rng::new(12);
        let pool = ThreadPool::new(2);
        let (n_out, n_in) = (50, 256);
        let data: Vec<u8> = (0..n_out).flat_map(|_| random_weights(&mut rng, DType::Q4_1, n_in)).collect();
        let w = QuantMatrix::new(DType::Q4_1, &data, n_out, n_in).expect("consistent shapes");
        let x = random_acts(&mut rng, 5 * n_in);
        let mut batch = vec![0.0; 5 * n_out];
        matmul(&w, &x, 5, &mut batch, &pool);
        for i in 0..5 {
            let mut alone = vec![0.0; n_out];
            matmul(&w, &x[i * n_in..(i + 1) * n_in], 1, &mut alone, &pool);
            assert_eq!(alone, batch[i * n_out..(i + 1) * n_out]);
        }
    }

    /// Experts' products: inputs of their own row counts (one empty),
    /// matrices of several types (activation formats) and packed or not,
    /// all handed out at once, each the bits of its own matmul.
    #[test]
    fn grouped_products_are_each_the_bits_of_their_own_matmul() {
        let mut rng = Rng::new(14);
        let pool = ThreadPool::new(2);
        let n_in = 256;
        let types = [DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F32];
        let data: Vec<Vec<u8>> = types
            .iter()
            .enumerate()
            .map(|(k, &dtype)| (0..24 + 8 * k).flat_map(|_| random_weights(&mut rng, dtype, n_in)).collect())
            .collect();
        let matrices: Vec<QuantMatrix> = (types.iter().zip(&data).enumerate())
            .map(|(k, (&dtype, data))| QuantMatrix::new(dtype, data, 24 + 8 * k, n_in).expect("consistent"))
            .collect();
        let packed: Vec<Option<PackedRows>> = matrices.iter().map(|w| w.pack(&pool)).collect();
        let matrices: Vec<QuantMatrix> = (matrices.iter().zip(&packed))
            .map(|(w, packed)| packed.as_ref().map_or(*w, |p| w.with_packed(p).expect("its own packing")))
            .collect();
        let ms = [3, 1, 0, 40];
        let xs: Vec<Vec<f32>> = ms.iter().map(|&m| random_acts(&mut rng, m * n_in)).collect();
        // Group g multiplies matrices g and g + 1 (mod 4).
        let pairs = |g: usize| [&matrices[g], &matrices[(g + 1) % 4]];
        let mut outs: Vec<[Vec<f32>; 2]> =
            (0..4).map(|g| pairs(g).map(|w| vec![f32::NAN; ms[g] * w.n_out()])).collect();
        let mut products: Vec<[(&QuantMatrix, &mut [f32]); 2]> = (outs.iter_mut().enumerate())
            .map(|(g, [a, b])| {
                let [wa, wb] = pairs(g);
                [(wa, a.as_mut_slice()), (wb, b.as_mut_slice())]
            })
            .collect();
        let mut groups: Vec<Group> = (products.iter_mut().enumerate())
            .map(|(g, products)| Group { x: &xs[g], m: ms[g], products: &mut products[..] })
            .collect();
        grouped_matmuls(&mut groups, &pool);
        for g in 0..4 {
            for (w, out) in pairs(g).into_iter().zip(&outs[g]) {
                let mut alone = vec![0.0; ms[g] * w.n_out()];
                matmul(w, &xs[g], ms[g], &mut alone, &pool);
                let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(out), bits(&alone), "group {g}, {w:?}");
            }
        }
    }

    #[test]
    fn matrices_with_partial_blocks_or_wrong_sizes_are_refused() {
        let mut rng = Rng::new(13);
        let mut data = vec![0u8; 4 * 100 * 18];
        rng.fill(&mut data);
        let err = QuantMatrix::new(DType::Q4_0, &data, 4, 100).expect_err("100 is not a multiple of 32");
        assert_eq!(err, KernelError::PartialBlock { format: "Q4_0", n: 100, block: 32 });
        assert!(err.to_string().contains("100"), "{err}");
        let err = QuantMatrix::new(DType::Q6_K, &data, 1, 300).expect_err("300 is not a multiple of 256");
        assert!(err.to_string().contains("300"), "{err}");

        let err = QuantMatrix::new(DType::Q4_0, &data[..18 * 7], 2, 64).expect_err("short data");
        assert_eq!(err, KernelError::Length { what: "the weight matrix (bytes)", got: 126, expected: 72 });
        assert!(QuantMatrix::new(DType::Q8_0, &[], usize::MAX, 64).is_err());
        assert!(QuantMatrix::new(DType::Q8_0, &data[..68], 2, 32).is_ok());
    }

    #[test]
    fn debug_shows_the_shape_not_the_data() {
        let data = vec![0u8; 2 * 34];
        let w = QuantMatrix::new(DType::Q8_0, &data, 2, 32).expect("consistent shapes");
        assert_eq!(format!("{w:?}"), "QuantMatrix(2 × 32 Q8_0)");
    }

    #[test]
    fn dequantize_row_reads_the_right_row() {
        let mut rng = Rng::new(14);
        let data: Vec<u8> = (0..3).flat_map(|_| random_weights(&mut rng, DType::Q8_0, 64)).collect();
        let w = QuantMatrix::new(DType::Q8_0, &data, 3, 64).expect("consistent shapes");
        let mut row = vec![0.0; 64];
        w.dequantize_row(2, &mut row);
        let mut want = vec![0.0; 64];
        crate::quant::dequantize_row(DType::Q8_0, &data[2 * 68..], &mut want).expect("valid row");
        assert_eq!(row, want);
    }

    #[test]
    fn prefetching_near_or_past_the_end_is_harmless() {
        let data = vec![7u8; 3000];
        for range in [0..0, 0..64, 900..3000, 2999..3000, 3000..3000, 5000..9000] {
            prefetch_ahead(&data, range, 64);
        }
        prefetch_ahead(&[], 0..10, 4096);
        assert!(data.iter().all(|&b| b == 7));
    }

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("65536"), Some(65536));
        for bad in ["", "K", "0K", "-1K", "12Q", "99999999999999999999M"] {
            assert_eq!(parse_cache_size(bad), None, "{bad:?}");
        }
        assert!(ACT_BLOCK_BYTES.contains(&act_block_bytes()));
    }

    #[test]
    fn shares_cover_the_rows_once() {
        for n in [0, 1, 5, 301, 1536] {
            for n_threads in 1..6 {
                let shares: Vec<_> = (0..n_threads).map(|t| share(n, t, n_threads)).collect();
                assert_eq!(shares[0].start, 0);
                assert_eq!(shares[n_threads - 1].end, n);
                assert!(shares.windows(2).all(|w| w[0].end == w[1].start));
            }
        }
    }

    #[test]
    fn products_sharing_an_input_equal_their_own_matmuls() {
        let mut rng = Rng::new(15);
        let n_in = 512;
        // Mixed formats (a K-quant file's q/k/v are Q4_K and Q6_K), sizes
        // that do not fill whole groups, and a second activation format.
        let shapes = [(DType::Q4_K, 70), (DType::Q6_K, 9), (DType::Q8_0, 33), (DType::Q4_K, 1)];
        let data: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(dtype, n_out)| (0..n_out).flat_map(|_| random_weights(&mut rng, dtype, n_in)).collect())
            .collect();
        let matrices: Vec<QuantMatrix> = shapes
            .iter()
            .zip(&data)
            .map(|(&(dtype, n_out), data)| QuantMatrix::new(dtype, data, n_out, n_in).expect("consistent shapes"))
            .collect();
        for m in [1, 2, 5, 9] {
            let x = random_acts(&mut rng, m * n_in);
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut outs: Vec<Vec<f32>> = matrices.iter().map(|w| vec![f32::NAN; m * w.n_out()]).collect();
                let mut products: Vec<(&QuantMatrix, &mut [f32])> =
                    matrices.iter().zip(outs.iter_mut()).map(|(w, out)| (w, out.as_mut_slice())).collect();
                matmuls(&x, m, &mut products, &pool);
                for (w, got) in matrices.iter().zip(&outs) {
                    let want = per_element(w, &x, m);
                    let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{w:?} m={m} threads={threads}");
                }
            }
        }
    }

    #[test]
    fn empty_products_do_nothing() {
        let pool = ThreadPool::new(2);
        let w = QuantMatrix::new(DType::F32, &[], 0, 8).expect("empty matrix");
        matmul(&w, &[1.0; 16], 2, &mut [], &pool);
        let data = vec![0u8; 3 * 20];
        let w = QuantMatrix::new(DType::Q4_1, &data, 3, 32).expect("consistent shapes");
        matmul(&w, &[], 0, &mut [], &pool);
        let w = QuantMatrix::new(DType::Q4_1, &[], 3, 0).expect("rows of nothing");
        let mut out = [f32::NAN; 6];
        matmul(&w, &[], 2, &mut out, &pool);
        assert_eq!(out, [0.0; 6]);
    }
}
