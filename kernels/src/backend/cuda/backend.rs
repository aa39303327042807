//! The CUDA backend: weights, activations and the paged KV store resident on
//! one device, every operation a kernel of `kernels/cuda/` on one stream.
//!
//! Operations that cannot return an error (the trait's arithmetic) keep the
//! first failure, and the next download reports it: the stream runs
//! asynchronously, so that is where a device fault surfaces anyway.
//!
//! Guarantees: every kernel computes a value in an order fixed by its
//! launch's shapes, so results are deterministic. They are not batch
//! invariant: a product of more than [`MATVEC_ROWS`] rows takes the tiled
//! prefill kernel (f16 operands) instead of the decode kernel (f32), and
//! attention takes its prefill kernel when a pass averages more than two
//! rows per sequence, so a row's bits depend on what shares its pass.
//! Results equal the CPU backend's to tolerance, not to the bit: the CPU
//! follows llama.cpp's CPU roundings, which a GPU has no reason to copy.

use cudarc::driver::{CudaContext, CudaSlice, DriverError, PushKernelArg};

use super::super::{
    Backend, BackendError, Embed, KvBlockFormat, KvShape, LowRankSource, LowRankTerm, MatrixSource, PassLayout,
};
use super::blas::Blas;
use super::cache::{Cached, KernelCache};
use super::functions::{Functions, LoadError, gemm_grid, grid};
use super::gpu::{CudaKv, CudaLowRank, CudaMatrix, CudaRows, Gpu, MATVEC_ROWS, int};
use super::nvrtc::{Arch, Nvrtc};
use super::pass::CudaPass;
use crate::ops::{HeadShape, Rope, Scores};
use crate::quant::DType;

/// One device, its kernels and its stream.
pub struct CudaBackend {
    gpu: Gpu,
    arch: Arch,
    /// cuBLAS for large f16/bf16 products, where the library is present.
    blas: Option<Blas>,
}

impl CudaBackend {
    /// Device `index`, its kernels compiled for its architecture by `nvrtc`
    /// or read from `cache`; `log` hears what was compiled or reused.
    pub fn new(
        index: u32,
        nvrtc: &Nvrtc,
        cache: &KernelCache,
        mut log: impl FnMut(&str),
    ) -> Result<Self, BackendError> {
        let fail = |what: &str, error: DriverError| BackendError::Unavailable(format!("cuda:{index}: {what}: {error}"));
        let context = CudaContext::new(index as usize).map_err(|error| fail("no context", error))?;
        let name = context.name().map_err(|error| fail("no name", error))?;
        let (major, minor) = context.compute_capability().map_err(|error| fail("no compute capability", error))?;
        let arch = Arch { major: major.unsigned_abs(), minor: minor.unsigned_abs() };
        let functions = Functions::load(&context, &kernel_names(), |program| {
            let (cubin, how) = cache
                .cubin(nvrtc, program, arch)
                .map_err(|error| BackendError::Unavailable(format!("cuda:{index}: {error}")))?;
            log(&match how {
                Cached::Reused => format!("CUDA kernels {} for {arch}: reused from the cache", program.name()),
                Cached::Compiled(took) => {
                    format!("CUDA kernels {} for {arch}: compiled in {:.2} s", program.name(), took.as_secs_f64())
                }
            });
            Ok(cubin)
        })
        .map_err(|error| match error {
            LoadError::Backend(error) => error,
            LoadError::Driver(what, error) => fail(&what, error),
        })?;
        let multiprocessors = context
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|error| fail("no multiprocessor count", error))?;
        // SAFETY: every buffer is used on the one stream made here, in
        // order, so cudarc's cross-stream events would only cost a record
        // per argument of every launch (and cannot sit inside a graph).
        unsafe { context.disable_event_tracking() };
        // Its own stream: the legacy default stream cannot be captured.
        let stream = context.new_stream().map_err(|error| fail("no stream", error))?;
        let blas = Blas::load(&stream)
            .inspect(|_| log("cuBLAS: f16 and bf16 products of more than 8 rows"))
            .map_err(|why| log(&format!("cuBLAS: {why}; the tiled kernel takes every product")))
            .ok();
        let gpu = Gpu::new(stream, functions, name, multiprocessors.unsigned_abs() as usize);
        Ok(CudaBackend { gpu, arch, blas })
    }

    #[cfg(test)]
    pub(super) fn graphs_enabled(&self) -> bool {
        self.gpu.graphs.enabled()
    }

    #[cfg(test)]
    pub(super) fn graphs_launched(&self) -> u64 {
        self.gpu.graphs.launched()
    }

    #[cfg(test)]
    pub(super) fn uses_blas(&self) -> bool {
        self.blas.is_some()
    }

    /// The index of each row's largest logit (`n_vocab` wide; ties to the
    /// lowest index): greedy sampling without downloading the logits.
    pub fn argmax(&self, logits: &CudaRows, n_vocab: usize) -> Result<Vec<u32>, BackendError> {
        let (rows, width) = logit_rows(logits, n_vocab)?;
        let Some(buffer) = logits.buffer.as_ref().filter(|_| rows > 0) else { return Ok(Vec::new()) };
        let mut out = self.gpu.transfers().alloc_zeros::<i32>(rows).map_err(self.gpu.driver("allocating"))?;
        if let Some(function) = self.gpu.function("sl_argmax") {
            let mut args = self.gpu.stream().launch_builder(&function);
            args.arg(&mut out).arg(buffer).arg(&width);
            // SAFETY: sl_argmax(int* out, const float* logits, int n_vocab):
            // `out` holds a value per row, `buffer` rows × n_vocab floats.
            self.gpu.record("argmax", unsafe { args.launch(grid((rows, 1, 1), 1024)) });
        }
        self.gpu.check()?;
        let indices = self.gpu.transfers().clone_dtoh(&out).map_err(self.gpu.driver("downloading"))?;
        Ok(indices.into_iter().map(i32::unsigned_abs).collect())
    }

    /// Each row's `k` (1..=64) largest logits, largest first, and their
    /// indices: equal values by ascending index, NaN below everything.
    pub fn top_k(&self, logits: &CudaRows, n_vocab: usize, k: usize) -> Result<Vec<Vec<(u32, f32)>>, BackendError> {
        let (rows, width) = logit_rows(logits, n_vocab)?;
        if !(1..=64).contains(&k) {
            return Err(BackendError::Input(format!("top-k of {k}: from 1 to 64 on CUDA")));
        }
        let k_int = k as i32;
        let Some(buffer) = logits.buffer.as_ref().filter(|_| rows > 0) else { return Ok(Vec::new()) };
        let mut values = self.gpu.transfers().alloc_zeros::<f32>(rows * k).map_err(self.gpu.driver("allocating"))?;
        let mut indices = self.gpu.transfers().alloc_zeros::<i32>(rows * k).map_err(self.gpu.driver("allocating"))?;
        if let Some(function) = self.gpu.function("sl_top_k") {
            let mut args = self.gpu.stream().launch_builder(&function);
            args.arg(&mut values).arg(&mut indices).arg(buffer).arg(&width).arg(&k_int);
            // SAFETY: sl_top_k(float* out_values, int* out_indices, const
            // float* logits, int n_vocab, int k): both outputs hold k per
            // row, `buffer` rows × n_vocab floats, 1 ≤ k ≤ 64.
            self.gpu.record("top_k", unsafe { args.launch(grid((rows, 1, 1), 1024)) });
        }
        self.gpu.check()?;
        let values = self.gpu.transfers().clone_dtoh(&values).map_err(self.gpu.driver("downloading"))?;
        let indices = self.gpu.transfers().clone_dtoh(&indices).map_err(self.gpu.driver("downloading"))?;
        Ok(indices
            .chunks_exact(k)
            .zip(values.chunks_exact(k))
            .map(|(indices, values)| {
                // Places past n_vocab hold index -1.
                indices.iter().zip(values).filter_map(|(&i, &v)| u32::try_from(i).ok().map(|i| (i, v))).collect()
            })
            .collect())
    }

    fn product(&self, weights: &CudaMatrix, x: &CudaSlice<f32>, m: usize, out: &mut CudaRows) {
        if !self.gpu.size(out, m * weights.n_out) || m == 0 {
            return;
        }
        let (Some(n_in), Some(n_out), Some(rows), Some(y)) =
            (int(weights.n_in), int(weights.n_out), int(m), out.buffer.as_mut())
        else {
            return self.gpu.fail(format!("a product of {m} rows"));
        };
        if let Some(blas) = self.blas.as_ref().filter(|_| Blas::takes(weights, m)) {
            return blas.product(&self.gpu, weights, x, m, y);
        }
        let (function, config) = if m <= MATVEC_ROWS {
            (&weights.matvec, grid((weights.n_out.div_ceil(4), 1, 1), 128))
        } else {
            (&weights.gemm, gemm_grid(weights.n_out, m))
        };
        let mut args = self.gpu.stream().launch_builder(function);
        args.arg(&weights.bytes).arg(x).arg(y).arg(&n_in).arg(&n_out).arg(&rows);
        // SAFETY: sl_matvec_<fmt> and sl_gemm_<fmt>(const u8* w, const float*
        // x, float* y, int n_in, int n_out, int m): `w` holds n_out rows of
        // the format (checked in `matrix`), `x` m × n_in floats (checked by
        // `matmuls`), `y` m × n_out (sized above).
        self.gpu.record("matmul", unsafe { args.launch(config) });
    }
}

/// Rows of `n_vocab` logits, and `n_vocab` as a kernel's `int`.
fn logit_rows(logits: &CudaRows, n_vocab: usize) -> Result<(usize, i32), BackendError> {
    match int(n_vocab).filter(|&width| width > 0 && logits.len.is_multiple_of(n_vocab)) {
        Some(width) => Ok((logits.len / n_vocab, width)),
        None => Err(BackendError::Input(format!("{} logits are not rows of {n_vocab}", logits.len))),
    }
}

/// Every kernel the backend may launch: the CUDA kernel check compares it
/// with the entries of the compiled programs, both ways.
pub fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "sl_argmax",
        "sl_top_k",
        "sl_copy_kv_block",
        "sl_rms_norm",
        "sl_rms_norm_in_place",
        "sl_add_bias",
        "sl_add",
        "sl_swiglu",
        "sl_gather",
        "sl_round_half",
        "sl_rope",
        "sl_store_kv_f16",
        "sl_store_kv_q8_0",
        "sl_attend_merge",
        "sl_lora_down",
        "sl_lora_up",
    ]
    .map(String::from)
    .into();
    for dtype in DType::ALL {
        let format = dtype.name().to_lowercase();
        names.extend(["matvec", "gemm", "embed"].map(|op| format!("sl_{op}_{format}")));
    }
    for d in [64, 128, 256] {
        names.push(format!("sl_attend_prefill_d{d}"));
        for group in 1..=8 {
            names.push(format!("sl_attend_decode_d{d}_l{}", 32 / super::functions::decode_heads_per_block(group)));
        }
    }
    names
}

impl Backend for CudaBackend {
    type Matrix = CudaMatrix;
    type Vector = CudaSlice<f32>;
    type Rows = CudaRows;
    type Pass = CudaPass;
    type Kv = CudaKv;
    type LowRank = CudaLowRank;

    fn describe(&self) -> String {
        let blas = if self.blas.is_some() { ", cuBLAS" } else { "" };
        format!("CUDA on {} ({}{blas})", self.gpu.name, self.arch)
    }

    fn matrix(&self, source: MatrixSource) -> Result<CudaMatrix, BackendError> {
        let MatrixSource { dtype, bytes, n_out, n_in } = source;
        // The float types are read in blocks of 32 values too.
        if dtype.block_elems() == 1 && !n_in.is_multiple_of(32) {
            return Err(BackendError::Unsupported(format!(
                "{} rows of {n_in} values: the CUDA kernels take multiples of 32",
                dtype.name()
            )));
        }
        let expected = dtype.row_bytes(n_in).and_then(|row| row.checked_mul(n_out));
        if expected != Some(bytes.as_slice().len()) || int(n_in).is_none() || int(n_out).is_none() {
            return Err(BackendError::Input(format!(
                "a {n_out} × {n_in} {} matrix of {} bytes",
                dtype.name(),
                bytes.as_slice().len()
            )));
        }
        let bytes = self.gpu.transfers().clone_htod(bytes.as_slice()).map_err(self.gpu.driver("uploading weights"))?;
        let format = dtype.name().to_lowercase();
        let kernel = |op: &str| self.gpu.functions.get(&format!("sl_{op}_{format}")).map_err(BackendError::Unavailable);
        Ok(CudaMatrix { dtype, bytes, n_out, n_in, matvec: kernel("matvec")?, gemm: kernel("gemm")? })
    }

    fn vector(&self, values: &[f32]) -> Result<CudaSlice<f32>, BackendError> {
        self.gpu.transfers().clone_htod(values).map_err(self.gpu.driver("uploading a vector"))
    }

    fn low_rank(&self, source: LowRankSource) -> Result<CudaLowRank, BackendError> {
        let LowRankSource { a, b, rank, n_in, n_out } = source;
        // The CPU's factors check the shapes and transpose B.
        let host = crate::ops::LowRank::new(a, &b, rank, n_in, n_out)?;
        let (a, b_t) = host.factors();
        let upload =
            |values: &[f32]| self.gpu.transfers().clone_htod(values).map_err(self.gpu.driver("uploading an adapter"));
        Ok(CudaLowRank { a: upload(a)?, b_t: upload(b_t)?, rank, n_in, n_out })
    }

    fn kv(&self, shape: KvShape) -> Result<CudaKv, BackendError> {
        shape.bytes()?;
        let (k_cell, v_cell) = shape.cell_bytes()?;
        let cells = shape.cells().unwrap_or(usize::MAX);
        if u32::try_from(cells).is_err() {
            return Err(BackendError::Unsupported(format!("{cells} KV cells per layer: fewer than 2^32 on CUDA")));
        }
        let arena_bytes = (cells * k_cell, cells * v_cell);
        let alloc = |bytes: usize| {
            self.gpu
                .transfers()
                .alloc_zeros::<u8>((bytes * shape.n_layer).max(1))
                .map_err(self.gpu.driver("allocating the KV store"))
        };
        let block_bytes = (shape.block_tokens * k_cell, shape.block_tokens * v_cell);
        Ok(CudaKv { shape, keys: alloc(arena_bytes.0)?, values: alloc(arena_bytes.1)?, arena_bytes, block_bytes })
    }

    fn copy_kv_block(&self, kv: &mut CudaKv, from: u32, to: u32) {
        let n_blocks = kv.shape.n_blocks;
        if from as usize >= n_blocks || to as usize >= n_blocks {
            return self.gpu.fail(format!("copying KV block {from} to {to} in a store of {n_blocks}"));
        }
        if from == to || kv.shape.n_layer == 0 {
            return;
        }
        for (arena, stride, block) in
            [(&mut kv.keys, kv.arena_bytes.0, kv.block_bytes.0), (&mut kv.values, kv.arena_bytes.1, kv.block_bytes.1)]
        {
            if block == 0 {
                continue;
            }
            let (stride, block_u64) = (stride as u64, block as u64);
            let Some(function) = self.gpu.function("sl_copy_kv_block") else { return };
            let mut args = self.gpu.stream().launch_builder(&function);
            args.arg(arena).arg(&stride).arg(&block_u64).arg(&from).arg(&to);
            let config = grid((block.div_ceil(4096), kv.shape.n_layer, 1), 256);
            // SAFETY: sl_copy_kv_block(u8* arena, u64 arena_stride, u64
            // block_bytes, u32 from, u32 to): n_layer arenas at that stride,
            // both blocks inside each (checked above) and distinct.
            self.gpu.record("copying a KV block", unsafe { args.launch(config) });
        }
    }

    fn kv_block_format(&self, kv: &CudaKv) -> KvBlockFormat {
        KvBlockFormat {
            element: kv.shape.types.name(),
            bytes: kv.shape.n_layer * (kv.block_bytes.0 + kv.block_bytes.1),
        }
    }

    fn read_kv_block(&self, kv: &CudaKv, block: u32) -> Result<Vec<u8>, BackendError> {
        // A failed write before this would leave stale bytes to save.
        self.gpu.check()?;
        let (k, v) = kv_block_ranges(kv, block)?;
        let mut bytes = Vec::with_capacity(self.kv_block_format(kv).bytes);
        for layer in 0..kv.shape.n_layer {
            for (arena, stride, range) in [(&kv.keys, kv.arena_bytes.0, &k), (&kv.values, kv.arena_bytes.1, &v)] {
                let at = layer * stride;
                let piece = arena.slice(at + range.start..at + range.end);
                bytes.extend(self.gpu.transfers().clone_dtoh(&piece).map_err(self.gpu.driver("reading a KV block"))?);
            }
        }
        Ok(bytes)
    }

    fn write_kv_block(&self, kv: &mut CudaKv, block: u32, bytes: &[u8]) -> Result<(), BackendError> {
        self.gpu.check()?;
        let (k, v) = kv_block_ranges(kv, block)?;
        let expected = self.kv_block_format(kv).bytes;
        if bytes.len() != expected {
            return Err(BackendError::Input(format!("{} bytes for a KV block of {expected}", bytes.len())));
        }
        let mut rest = bytes;
        for layer in 0..kv.shape.n_layer {
            for (arena, stride, range) in [(&mut kv.keys, kv.arena_bytes.0, &k), (&mut kv.values, kv.arena_bytes.1, &v)]
            {
                let at = layer * stride;
                let (piece, after) = rest.split_at(range.len());
                let mut target = arena.slice_mut(at + range.start..at + range.end);
                self.gpu.transfers().memcpy_htod(piece, &mut target).map_err(self.gpu.driver("writing a KV block"))?;
                rest = after;
            }
        }
        Ok(())
    }

    fn upload(&self, values: &[f32], out: &mut CudaRows) -> Result<(), BackendError> {
        out.buffer = Some(
            self.gpu
                .transfers()
                .clone_htod(if values.is_empty() { &[0.0][..] } else { values })
                .map_err(self.gpu.driver("uploading"))?,
        );
        out.len = values.len();
        Ok(())
    }

    fn download(&self, rows: &CudaRows) -> Result<Vec<f32>, BackendError> {
        self.gpu.check()?;
        let Some(buffer) = &rows.buffer else { return Ok(Vec::new()) };
        let values =
            self.gpu.transfers().clone_dtoh(&buffer.slice(..rows.len)).map_err(self.gpu.driver("downloading"))?;
        self.gpu.check()?;
        Ok(values)
    }

    fn download_owned(&self, rows: CudaRows) -> Result<Vec<f32>, BackendError> {
        self.download(&rows)
    }

    fn prepare(&self, rope: &Rope, layout: &PassLayout<'_>, out: &mut CudaPass) -> Result<(), BackendError> {
        super::pass::prepare(&self.gpu, rope, layout, out)
    }

    /// Record decode passes (at most [`MATVEC_ROWS`] rows) as CUDA graphs.
    fn begin_layers(&self, pass: &CudaPass) {
        // Passes whose attention takes the prefill kernel (more than two
        // rows per sequence) upload its tile list in the first layer, which
        // would end the record at once.
        let decoding = pass.tables.as_ref().is_some_and(|tables| pass.rows <= 2 * tables.runs.len());
        if pass.id != 0 && (1..=MATVEC_ROWS).contains(&pass.rows) && decoding {
            let begun = self.gpu.graphs.begin(self.gpu.stream(), (pass.id, pass.rows));
            self.gpu.record("beginning a CUDA graph (graphs now off)", begun);
        }
    }

    fn end_layers(&self, _pass: &CudaPass) -> Result<(), BackendError> {
        self.gpu.transfers();
        self.gpu.check()
    }

    fn embed(
        &self,
        table: Option<&CudaMatrix>,
        inputs: &[Embed<'_>],
        width: usize,
        out: &mut CudaRows,
    ) -> Result<(), BackendError> {
        super::pass::embed(&self.gpu, table, inputs, width, out)
    }

    fn rms_norm(&self, x: &CudaRows, weight: &CudaSlice<f32>, eps: f32, out: &mut CudaRows) {
        let width = weight.len();
        let rows = x.len / width.max(1);
        if !self.gpu.size(out, rows * width) || rows == 0 {
            return;
        }
        let (Some(input), Some(width_int), Some(output)) = (&x.buffer, int(width), out.buffer.as_mut()) else {
            return self.gpu.fail(format!("rms_norm: rows of {width}"));
        };
        let Some(function) = self.gpu.function("sl_rms_norm") else { return };
        let mut args = self.gpu.stream().launch_builder(&function);
        args.arg(output).arg(input).arg(weight).arg(&width_int).arg(&eps);
        // SAFETY: sl_rms_norm(float* out, const float* x, const float*
        // weight, int width, float eps): rows × width floats in and out
        // (distinct buffers), `weight` width floats.
        self.gpu.record("rms_norm", unsafe { args.launch(grid((rows, 1, 1), 256)) });
    }

    fn rms_norm_in_place(&self, x: &mut CudaRows, weight: &CudaSlice<f32>, eps: f32) {
        let width = weight.len();
        let pieces = (x.len / width.max(1)) as i64;
        let (Some(values), Some(width_int)) = (x.buffer.as_mut(), int(width)) else { return };
        if pieces == 0 {
            return;
        }
        let Some(function) = self.gpu.function("sl_rms_norm_in_place") else { return };
        let mut args = self.gpu.stream().launch_builder(&function);
        args.arg(values).arg(weight).arg(&width_int).arg(&pieces).arg(&eps);
        // SAFETY: sl_rms_norm_in_place(float* x, const float* weight, int
        // width, long long n_pieces, float eps): `x` holds n_pieces × width
        // floats, `weight` width.
        self.gpu.record("rms_norm_in_place", unsafe { args.launch(grid(((pieces as usize).div_ceil(8), 1, 1), 256)) });
    }

    fn matmuls(&self, x: &CudaRows, m: usize, products: &mut [(&CudaMatrix, &mut CudaRows)]) {
        let Some(input) = &x.buffer else { return };
        for (weights, out) in products.iter_mut() {
            if x.len < m * weights.n_in {
                self.gpu.fail(format!("matmul: {} values for {m} rows of {}", x.len, weights.n_in));
                continue;
            }
            self.product(weights, input, m, out);
        }
    }

    fn add_low_rank(&self, x: &CudaRows, terms: &[LowRankTerm<'_, CudaLowRank>], out: &mut CudaRows) {
        super::pass::add_low_rank(&self.gpu, x, terms, out)
    }

    fn add_bias(&self, x: &mut CudaRows, bias: &CudaSlice<f32>) {
        let width = bias.len();
        let rows = x.len / width.max(1);
        let (Some(values), Some(width_int)) = (x.buffer.as_mut(), int(width)) else { return };
        if rows == 0 {
            return;
        }
        let Some(function) = self.gpu.function("sl_add_bias") else { return };
        let mut args = self.gpu.stream().launch_builder(&function);
        args.arg(values).arg(bias).arg(&width_int);
        // SAFETY: sl_add_bias(float* x, const float* bias, int width): `x`
        // rows × width floats, `bias` width.
        self.gpu.record("add_bias", unsafe { args.launch(grid((rows, 1, 1), 256)) });
    }

    fn add(&self, x: &mut CudaRows, y: &CudaRows) {
        if x.len != y.len {
            return self.gpu.fail(format!("add: {} values and {}", x.len, y.len));
        }
        let n = x.len as i64;
        let (Some(values), Some(other)) = (x.buffer.as_mut(), &y.buffer) else { return };
        if n == 0 {
            return;
        }
        let Some(function) = self.gpu.function("sl_add") else { return };
        let mut args = self.gpu.stream().launch_builder(&function);
        args.arg(values).arg(other).arg(&n);
        // SAFETY: sl_add(float* x, const float* y, long long n): both hold
        // at least n floats.
        self.gpu.record("add", unsafe { args.launch(grid(((n as usize).div_ceil(256).min(65535), 1, 1), 256)) });
    }

    fn swiglu(&self, gate: &CudaRows, up: &CudaRows, out: &mut CudaRows) {
        if gate.len != up.len {
            return self.gpu.fail(format!("swiglu: {} gate values and {} up", gate.len, up.len));
        }
        let n = gate.len;
        if !self.gpu.size(out, n) || n == 0 {
            return;
        }
        let (Some(g), Some(u), Some(output)) = (&gate.buffer, &up.buffer, out.buffer.as_mut()) else { return };
        let count = n as i64;
        let Some(function) = self.gpu.function("sl_swiglu") else { return };
        let mut args = self.gpu.stream().launch_builder(&function);
        args.arg(output).arg(g).arg(u).arg(&count);
        // SAFETY: sl_swiglu(float* out, const float* gate, const float* up,
        // long long n): all three hold at least n floats.
        self.gpu.record("swiglu", unsafe { args.launch(grid((n.div_ceil(256).min(65535), 1, 1), 256)) });
    }

    fn gather(&self, x: &CudaRows, rows: &[usize], width: usize, out: &mut CudaRows) {
        let available = x.len / width.max(1);
        let indices: Option<Vec<i32>> = rows.iter().map(|&row| if row < available { int(row) } else { None }).collect();
        let (Some(indices), Some(input), Some(width_int)) = (indices, &x.buffer, int(width)) else {
            return self.gpu.fail(format!("gather: rows {rows:?} of {available} rows of {width}"));
        };
        if !self.gpu.size(out, indices.len() * width) || indices.is_empty() {
            return;
        }
        let Some(list) = self.gpu.record("gather", self.gpu.transfers().clone_htod(&indices)) else { return };
        let Some(output) = out.buffer.as_mut() else { return };
        let Some(function) = self.gpu.function("sl_gather") else { return };
        let mut args = self.gpu.stream().launch_builder(&function);
        args.arg(output).arg(input).arg(&list).arg(&width_int);
        // SAFETY: sl_gather(float* out, const float* x, const int* rows, int
        // width): every index is a row of `x` (checked above), `out` holds
        // as many rows.
        self.gpu.record("gather", unsafe { args.launch(grid((indices.len(), 1, 1), 256)) });
    }

    fn rope(&self, rope: &Rope, pass: &CudaPass, x: &mut CudaRows) {
        let Some(tables) = &pass.tables else { return };
        let head_dim = rope.head_dim();
        let width = x.len / pass.rows.max(1);
        let heads = width / head_dim.max(1);
        let (Some(values), Some(heads), Some(head_dim), Some(pairs)) =
            (x.buffer.as_mut(), int(heads), int(head_dim), int(tables.pairs))
        else {
            return;
        };
        if pass.rows == 0 {
            return;
        }
        let adjacent = i32::from(rope.adjacent());
        let Some(function) = self.gpu.function("sl_rope") else { return };
        let mut args = self.gpu.stream().launch_builder(&function);
        args.arg(values).arg(&tables.cos).arg(&tables.sin).arg(&heads).arg(&head_dim).arg(&pairs).arg(&adjacent);
        // SAFETY: sl_rope(float* x, const float* cos, const float* sin, int
        // n_heads, int head_dim, int pairs, int adjacent): `x` holds the
        // pass's rows of n_heads × head_dim, the tables a row of pairs each.
        self.gpu.record("rope", unsafe { args.launch(grid((pass.rows, 1, 1), 128)) });
    }

    fn store_kv(&self, kv: &mut CudaKv, layer: usize, k: &CudaRows, v: &CudaRows, pass: &CudaPass) {
        super::pass::store_kv(&self.gpu, kv, layer, k, v, pass)
    }

    fn attend(
        &self,
        kv: &CudaKv,
        layer: usize,
        q: &CudaRows,
        pass: &CudaPass,
        heads: HeadShape,
        scores: Scores<'_>,
        out: &mut CudaRows,
    ) -> Result<(), BackendError> {
        super::pass::attend(&self.gpu, kv, layer, q, pass, heads, scores, out)
    }
}

fn kv_block_ranges(kv: &CudaKv, block: u32) -> Result<(std::ops::Range<usize>, std::ops::Range<usize>), BackendError> {
    let block = block as usize;
    if block >= kv.shape.n_blocks {
        return Err(BackendError::Input(format!("KV block {block} of a store of {}", kv.shape.n_blocks)));
    }
    let (k, v) = kv.block_bytes;
    Ok((block * k..(block + 1) * k, block * v..(block + 1) * v))
}
