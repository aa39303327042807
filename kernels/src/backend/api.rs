//! The [`Backend`] trait, which `cpu.rs` and `cuda/` implement, and the
//! types its operations take; `mod.rs` re-exports them.

use std::ops::Range;
use std::sync::Arc;

use crate::ops::{self, Gelu, HeadShape, KvType, OpsError, Rope, RopePos, Scores};
use crate::quant::{DType, KernelError};

/// Bytes that stay where they are while anyone holds them, such as a
/// model file's memory map: the CPU backend computes on them in place.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl SharedBytes {
    /// `range` of `owner`'s bytes; `None` if it is out of bounds.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Option<Self> {
        ((*owner).as_ref().get(range.clone()).is_some()).then_some(SharedBytes { owner, range })
    }

    pub fn as_slice(&self) -> &[u8] {
        // In bounds: checked in `new`, and the owner's bytes never change.
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

/// A weight matrix as a model file stores it: `n_out` rows of `n_in`
/// elements of `dtype`.
#[derive(Clone)]
pub struct MatrixSource {
    pub dtype: DType,
    pub bytes: SharedBytes,
    pub n_out: usize,
    pub n_in: usize,
}

/// One LoRA adapter's factors for one weight matrix, on the host in f32:
/// `a` holds `rank` rows of `n_in`, `b` holds `n_out` rows of `rank` (GGUF
/// `lora_a` of shape `[n_in, rank]` and `lora_b` of `[rank, n_out]`).
#[derive(Clone, Debug, PartialEq)]
pub struct LowRankSource {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub rank: usize,
    pub n_in: usize,
    pub n_out: usize,
}

/// Rows of a pass that add one adapter's delta, each with its scale.
#[derive(Clone, Copy, Debug)]
pub struct LowRankTerm<'a, L> {
    pub factors: &'a L,
    /// (row, scale), rows in any order, none twice.
    pub rows: &'a [(usize, f32)],
}

/// How a KV store holds its keys and its values, chosen independently
/// (llama.cpp's `-ctk` and `-ctv`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// One name for both: the type when they agree (`f16`), else
    /// `k=q8_0,v=f16`.
    pub fn name(&self) -> &'static str {
        match (self.k, self.v) {
            (KvType::F16, KvType::F16) => "f16",
            (KvType::Q8_0, KvType::Q8_0) => "q8_0",
            (KvType::F16, KvType::Q8_0) => "k=f16,v=q8_0",
            (KvType::Q8_0, KvType::F16) => "k=q8_0,v=f16",
        }
    }
}

/// The shape of a paged KV store: per layer, `n_blocks` blocks of
/// `block_tokens` cells of `kv_dim` keys and as many values, in heads of
/// `head_dim`, stored as `types` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_layer: usize,
    pub kv_dim: usize,
    pub head_dim: usize,
    pub n_blocks: usize,
    pub block_tokens: usize,
    pub types: KvTypes,
}

impl KvShape {
    /// Bytes of one cell's keys and of its values in one layer, or why the
    /// types cannot hold them: a block-quantized type stores every head in
    /// whole blocks (Q8_0: of 32 values).
    pub fn cell_bytes(&self) -> Result<(usize, usize), BackendError> {
        let row = |kv_type: KvType, what: &str, flag: &str| {
            let block = kv_type.block_values();
            if !self.head_dim.is_multiple_of(block) || !self.kv_dim.is_multiple_of(block) {
                return Err(BackendError::Unsupported(format!(
                    "{kv_type} {what} ({flag}) are stored in blocks of {block} values, which this model's \
                     heads of {} values do not fill",
                    self.head_dim
                )));
            }
            kv_type.row_bytes(self.kv_dim).ok_or_else(|| self.too_large())
        };
        Ok((row(self.types.k, "keys", "--cache-type-k")?, row(self.types.v, "values", "--cache-type-v")?))
    }

    /// Bytes of the whole store, every layer's keys and values.
    pub fn bytes(&self) -> Result<usize, BackendError> {
        let (k, v) = self.cell_bytes()?;
        self.cells()
            .and_then(|cells| cells.checked_mul(k + v))
            .and_then(|layer| layer.checked_mul(self.n_layer))
            .ok_or_else(|| self.too_large())
    }

    /// Cells per layer, `n_blocks × block_tokens`; `None` on overflow.
    pub fn cells(&self) -> Option<usize> {
        self.n_blocks.checked_mul(self.block_tokens)
    }

    fn too_large(&self) -> BackendError {
        BackendError::Unavailable(format!("a KV store of {self:?} is too large to address"))
    }

    /// The cell index (in `0..n_blocks × block_tokens`) that holds cell
    /// `cell` of a sequence whose blocks are `table`; `None` when the table
    /// does not reach it or names a block past the store.
    pub fn slot(&self, table: &[u32], cell: usize) -> Option<usize> {
        let block = *table.get(cell.checked_div(self.block_tokens)?)? as usize;
        (block < self.n_blocks).then(|| block * self.block_tokens + cell % self.block_tokens)
    }
}

/// The raw layout of one block of a KV store ([`Backend::read_kv_block`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBlockFormat {
    /// The element type keys and values are stored in (`f16`).
    pub element: &'static str,
    /// Bytes of one block: every layer's keys and values.
    pub bytes: usize,
}

/// The input of one batch row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Embed<'a> {
    /// A row of the embedding table.
    Token(u32),
    /// Values given by the caller (an image's embeddings, fused features).
    Values(&'a [f32]),
}

/// One row of a forward pass, as every layer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassRow {
    /// Its rotary position.
    pub pos: RopePos,
    /// The KV cell it writes (see [`KvShape::slot`]).
    pub slot: usize,
    /// Its sequence: an index into [`PassLayout::sequences`].
    pub seq: usize,
    /// It attends to its sequence's cells `0..visible`…
    pub visible: usize,
}

/// One sequence of a forward pass.
#[derive(Clone, Copy, Debug)]
pub struct PassSequence<'a> {
    /// Its blocks, in position order.
    pub blocks: &'a [u32],
    /// …except these cells (sorted, disjoint).
    pub hidden: &'a [Range<usize>],
}

/// What the layers of one pass share: where each row sits and what it
/// attends to. A backend prepares it once per pass ([`Backend::prepare`]),
/// so a device backend moves it to the device once, not once per layer.
#[derive(Clone, Copy, Debug)]
pub struct PassLayout<'a> {
    pub rows: &'a [PassRow],
    pub sequences: &'a [PassSequence<'a>],
}

/// One input of [`Backend::grouped_matmuls`]: its rows, how many, and the
/// matrices they multiply with where each product goes.
pub type MatmulGroup<'x, 'p, 'm, 'o, B> =
    (&'x <B as Backend>::Rows, usize, &'p mut [(&'m <B as Backend>::Matrix, &'o mut <B as Backend>::Rows)]);

/// Why a backend refused an operation or could not start.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Ops(#[from] OpsError),
    /// A row input that does not fit: a token past the table, values of
    /// the wrong width, a sequence index past the layout.
    #[error("{0}")]
    Input(String),
    /// The device cannot be used, or ran out of memory.
    #[error("{0}")]
    Unavailable(String),
    /// What was asked does not fit the model: a KV type whose blocks its
    /// heads do not fill.
    #[error("{0}")]
    Unsupported(String),
}

/// The operations a decoder forward pass needs, on one device.
///
/// Buffers are rows of f32 in row-major order; an operation sizes its
/// output. Operations that take a width (`rms_norm`'s weight length, a
/// matrix's `n_in`) treat a buffer as whole rows of it. What allocates can
/// fail; the arithmetic itself cannot fail on the CPU, and a device
/// backend reports an asynchronous failure at the next download.
pub trait Backend: Send + Sync + 'static {
    /// A weight matrix resident on the device.
    type Matrix: Send + Sync;
    /// A small f32 parameter vector (a norm's weights, a bias).
    type Vector: Send + Sync;
    /// Activations.
    type Rows: Default + Send;
    /// A pass's [`PassLayout`] and rotary angles, prepared for the device.
    type Pass: Default + Send;
    /// A paged KV store of the types its [`KvShape`] names.
    type Kv: Send;
    /// A LoRA adapter's factors for one weight matrix.
    type LowRank: Send + Sync;

    /// One line for the log: the device and how it computes.
    fn describe(&self) -> String;

    /// Make a weight matrix resident.
    fn matrix(&self, source: MatrixSource) -> Result<Self::Matrix, BackendError>;
    fn vector(&self, values: &[f32]) -> Result<Self::Vector, BackendError>;
    /// Make an adapter's factors resident.
    fn low_rank(&self, source: LowRankSource) -> Result<Self::LowRank, BackendError>;
    fn kv(&self, shape: KvShape) -> Result<Self::Kv, BackendError>;
    /// Copy one block of every layer (copy-on-write of a shared tail).
    fn copy_kv_block(&self, kv: &mut Self::Kv, from: u32, to: u32);
    /// How [`Backend::read_kv_block`] lays out a block of this store.
    fn kv_block_format(&self, kv: &Self::Kv) -> KvBlockFormat;
    /// One block of every layer as the store holds it (layer by layer, its
    /// keys then its values), whatever the element type: saved slots carry
    /// these bytes and [`Backend::write_kv_block`] puts them back exactly.
    fn read_kv_block(&self, kv: &Self::Kv, block: u32) -> Result<Vec<u8>, BackendError>;
    /// Overwrite one block of every layer with what
    /// [`Backend::read_kv_block`] gave (of a store of the same format).
    fn write_kv_block(&self, kv: &mut Self::Kv, block: u32, bytes: &[u8]) -> Result<(), BackendError>;

    /// Host values into a buffer.
    fn upload(&self, values: &[f32], out: &mut Self::Rows) -> Result<(), BackendError>;
    /// A buffer's values on the host.
    fn download(&self, rows: &Self::Rows) -> Result<Vec<f32>, BackendError>;
    /// [`Backend::download`] of a buffer no longer needed (no copy where
    /// the buffer already is host memory).
    fn download_owned(&self, rows: Self::Rows) -> Result<Vec<f32>, BackendError>;

    /// Prepare a pass: the rotary angles of every row and its layout.
    fn prepare(&self, rope: &Rope, layout: &PassLayout<'_>, out: &mut Self::Pass) -> Result<(), BackendError>;

    /// The operations from here to [`Backend::end_layers`] are a prepared
    /// pass's layers: the same launches with the same shapes, pass after
    /// pass of its size, which a device backend may record and replay as
    /// one submission. Nothing changes in what they compute.
    fn begin_layers(&self, _pass: &Self::Pass) {}
    /// End what [`Backend::begin_layers`] began (submit the record).
    fn end_layers(&self, _pass: &Self::Pass) -> Result<(), BackendError> {
        Ok(())
    }

    /// One row per input: a row of `table` or the given values (`width`
    /// each). Token ids must be rows of `table`.
    fn embed(
        &self,
        table: Option<&Self::Matrix>,
        inputs: &[Embed<'_>],
        width: usize,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError>;

    /// RMSNorm of every row of `x` (rows as long as `weight`) into `out`.
    fn rms_norm(&self, x: &Self::Rows, weight: &Self::Vector, eps: f32, out: &mut Self::Rows);
    /// RMSNorm of every `weight`-long piece of `x` in place (per-head norms).
    fn rms_norm_in_place(&self, x: &mut Self::Rows, weight: &Self::Vector, eps: f32);
    /// `out = x · weightsᵀ` for the `m` rows of `x`.
    fn matmul(&self, weights: &Self::Matrix, x: &Self::Rows, m: usize, out: &mut Self::Rows) {
        self.matmuls(x, m, &mut [(weights, out)]);
    }
    /// `out = x · weightsᵀ` for rows that are always multiplied together
    /// (an image's rows through a vision tower), so that a row's bits need
    /// not equal its product alone or in another batch: a backend may sum
    /// in whatever fixed order is fastest for the whole batch (the CPU
    /// backend's float matrices: [`crate::gemm`]). Defaults to
    /// [`Backend::matmul`].
    fn matmul_batch(&self, weights: &Self::Matrix, x: &Self::Rows, m: usize, out: &mut Self::Rows) {
        self.matmul(weights, x, m, out);
    }
    /// [`Backend::matmul`] of one input with several matrices (q, k and v;
    /// gate and up), each output the same as its own matmul: the input is
    /// prepared once and the work handed out once.
    fn matmuls(&self, x: &Self::Rows, m: usize, products: &mut [(&Self::Matrix, &mut Self::Rows)]);
    /// [`Backend::matmuls`] of several inputs, each `(x, m, products)` (a
    /// mixture of experts' experts, each with its own rows), every output
    /// the same as its own matmul: a backend may hand out all of the work
    /// at once. Defaults to one `matmuls` per input.
    fn grouped_matmuls(&self, groups: &mut [MatmulGroup<'_, '_, '_, '_, Self>]) {
        for (x, m, products) in groups.iter_mut() {
            self.matmuls(x, *m, products);
        }
    }
    /// For each term, `out[row] += scale · B·(A·x[row])` for its rows; a
    /// row's deltas are added in the order of the terms that name it, so
    /// a row's result depends only on its own terms. Every term's factors
    /// have one shape, and `x` and `out` are whole rows of it.
    fn add_low_rank(&self, x: &Self::Rows, terms: &[LowRankTerm<'_, Self::LowRank>], out: &mut Self::Rows);
    /// `bias` added to every row of `x`.
    fn add_bias(&self, x: &mut Self::Rows, bias: &Self::Vector);
    /// `x += y`.
    fn add(&self, x: &mut Self::Rows, y: &Self::Rows);
    /// `out = silu(gate) · up`.
    fn swiglu(&self, gate: &Self::Rows, up: &Self::Rows, out: &mut Self::Rows);
    /// Rows `rows` of `x` (`width` each), in that order.
    fn gather(&self, x: &Self::Rows, rows: &[usize], width: usize, out: &mut Self::Rows);
    /// Row i of `x` (`width` wide) into row `rows[i]` of `out`, which is
    /// made `n_rows` rows long; its other rows keep what they held, or
    /// zeros where it grew. A row named twice is refused.
    fn scatter(
        &self,
        x: &Self::Rows,
        rows: &[usize],
        width: usize,
        n_rows: usize,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        let x = self.download(x)?;
        let mut values = self.download(out)?;
        values.resize(n_rows * width, 0.0);
        ops::scatter_rows(&x, rows, width, &mut values).map_err(BackendError::Input)?;
        self.upload(&values, out)
    }
    /// Row r of `out` = `Σ_k weights[r·n + k] · parts[r·n + k]` for the
    /// `weights.len() / n` rows, each product rounded to f32 and added in
    /// order of `k` (as llama.cpp weighs and sums a row's experts).
    fn weighted_sum(
        &self,
        parts: &Self::Rows,
        weights: &[f32],
        n: usize,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        let parts = self.download(parts)?;
        let mut values = Vec::new();
        ops::weighted_sum(&parts, weights, n, &mut values).map_err(BackendError::Input)?;
        self.upload(&values, out)
    }

    /// LayerNorm of every `weight`-long row of `x` into `out`, scaled by
    /// `weight` and shifted by `bias` (a vision tower's norm).
    ///
    /// The encoder-only steps take their parameters from the host; a
    /// backend without a kernel of its own runs them there, a round trip
    /// per step (correct, and small beside the encoder's matmuls).
    fn layer_norm(
        &self,
        x: &Self::Rows,
        weight: &[f32],
        bias: &[f32],
        eps: f32,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        host_layer_norm(self, x, weight, bias, eps, out)
    }
    /// `x = gelu(x)` element-wise (an encoder's feed-forward).
    fn gelu(&self, x: &mut Self::Rows, kind: Gelu) -> Result<(), BackendError> {
        host_gelu(self, x, kind)
    }
    /// `out = gelu(gate) · up` with GELU as [`ops::geglu_f16`] evaluates
    /// it (Gemma's feed-forward).
    fn geglu(&self, gate: &Self::Rows, up: &Self::Rows, out: &mut Self::Rows) -> Result<(), BackendError> {
        let (gate, up) = (self.download(gate)?, self.download(up)?);
        let mut values = vec![0.0; gate.len()];
        ops::geglu_f16(&gate, &up, &mut values);
        self.upload(&values, out)
    }
    /// `out = swiglu_oai(gate, up)` as [`ops::swiglu_oai`] computes it
    /// (gpt-oss's experts).
    fn swiglu_oai(&self, gate: &Self::Rows, up: &Self::Rows, out: &mut Self::Rows) -> Result<(), BackendError> {
        let (gate, up) = (self.download(gate)?, self.download(up)?);
        let mut values = vec![0.0; gate.len()];
        ops::swiglu_oai(&gate, &up, &mut values);
        self.upload(&values, out)
    }
    /// One sequence's consecutive `rows` through a Gated DeltaNet layer,
    /// on the host ([`ops::delta_net`]): a recurrence over the tokens, its
    /// value heads here on the calling thread.
    fn delta_net(
        &self,
        shape: ops::DeltaShape,
        weights: ops::DeltaWeights<'_>,
        state: ops::DeltaState<'_>,
        rows: ops::DeltaRows<'_>,
        out: &mut [f32],
    ) {
        ops::delta_net(shape, weights, state, rows, out, &ops::Serial)
    }
    /// `x *= σ(gate)` as [`ops::sigmoid_gate`] computes it (Qwen3.5's
    /// attention output gate).
    fn sigmoid_gate(&self, x: &mut Self::Rows, gate: &Self::Rows) -> Result<(), BackendError> {
        let (mut values, gate) = (self.download(x)?, self.download(gate)?);
        if values.len() != gate.len() {
            return Err(BackendError::Input(format!("{} values gated by {}", values.len(), gate.len())));
        }
        ops::sigmoid_gate(&mut values, &gate);
        self.upload(&values, x)
    }
    /// `x *= factor` element-wise (Gemma's embedding scale and pre-scaled
    /// queries).
    fn scale(&self, x: &mut Self::Rows, factor: f32) -> Result<(), BackendError> {
        let mut values = self.download(x)?;
        ops::scale(&mut values, factor);
        self.upload(&values, x)
    }

    /// Row i of `x` times `factors[i]` (Llama 4's query temperature); `x`
    /// holds one row per factor.
    fn scale_rows(&self, x: &mut Self::Rows, factors: &[f32]) -> Result<(), BackendError> {
        let mut values = self.download(x)?;
        scale_each_row(&mut values, factors)?;
        self.upload(&values, x)
    }

    /// Rotate every row of `x` (one per row of the pass) in place.
    fn rope(&self, rope: &Rope, pass: &Self::Pass, x: &mut Self::Rows);
    /// Write row i of `k` and `v` into the pass's row i's KV cell of
    /// `layer`, rounded to f16 or quantized to Q8_0 (the store's types).
    fn store_kv(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Rows, v: &Self::Rows, pass: &Self::Pass);
    /// Attention of each query row of `q` over what its pass row sees in
    /// `layer` (within `scores`' window, if it has one), into `out` (the
    /// shape of `q`).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        kv: &Self::Kv,
        layer: usize,
        q: &Self::Rows,
        pass: &Self::Pass,
        heads: HeadShape,
        scores: Scores<'_>,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError>;
    /// Attention in which each row of the pass sees every row of its own
    /// sequence and no other (an encoder's bidirectional attention), keys
    /// and values being the rows' own `k` and `v`; rows' `visible` must be
    /// their sequence's length. `kv` holds a cell per row of the pass: the
    /// default stores the rows there and attends as a decoder does; a
    /// backend with a kernel of its own (the CPU's, in f32) may ignore it.
    #[allow(clippy::too_many_arguments)]
    fn attend_within(
        &self,
        kv: &mut Self::Kv,
        q: &Self::Rows,
        k: &Self::Rows,
        v: &Self::Rows,
        pass: &Self::Pass,
        heads: HeadShape,
        scale: f32,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        self.store_kv(kv, 0, k, v, pass);
        self.attend(kv, 0, q, pass, heads, Scores::scaled(scale), out)
    }
}

/// [`Backend::layer_norm`] through the host: the rows downloaded, normed
/// and uploaded.
pub(super) fn host_layer_norm<B: Backend + ?Sized>(
    backend: &B,
    x: &B::Rows,
    weight: &[f32],
    bias: &[f32],
    eps: f32,
    out: &mut B::Rows,
) -> Result<(), BackendError> {
    let mut values = backend.download(x)?;
    for row in values.chunks_exact_mut(weight.len().max(1)) {
        let input = row.to_vec();
        ops::layer_norm(&input, weight, bias, eps, row);
    }
    backend.upload(&values, out)
}

/// [`Backend::gelu`] through the host.
pub(super) fn host_gelu<B: Backend + ?Sized>(backend: &B, x: &mut B::Rows, kind: Gelu) -> Result<(), BackendError> {
    let mut values = backend.download(x)?;
    ops::gelu(&mut values, kind);
    backend.upload(&values, x)
}

/// `x`'s rows, as many as `factors`, each times its factor.
pub(crate) fn scale_each_row(x: &mut [f32], factors: &[f32]) -> Result<(), BackendError> {
    let width = x.len().checked_div(factors.len()).unwrap_or(0);
    if width * factors.len() != x.len() {
        return Err(BackendError::Input(format!("{} values are not {} rows", x.len(), factors.len())));
    }
    for (row, &factor) in x.chunks_exact_mut(width.max(1)).zip(factors) {
        ops::scale(row, factor);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_block_table_and_stop_at_its_end() {
        let shape =
            KvShape { n_layer: 1, kv_dim: 8, head_dim: 8, n_blocks: 4, block_tokens: 16, types: KvTypes::default() };
        assert_eq!(shape.slot(&[2, 0], 0), Some(32));
        assert_eq!(shape.slot(&[2, 0], 17), Some(1));
        assert_eq!(shape.slot(&[2, 0], 32), None);
        assert_eq!(shape.slot(&[9], 0), None, "a block past the store");
        let empty = KvShape { block_tokens: 0, ..shape };
        assert_eq!(empty.slot(&[0], 0), None);
    }

    #[test]
    fn cells_take_the_bytes_of_their_types_and_heads_fill_whole_blocks() {
        let (f16, q8_0) = (KvType::F16, KvType::Q8_0);
        let types = |k, v| KvTypes { k, v };
        let shape =
            KvShape { n_layer: 30, kv_dim: 192, head_dim: 64, n_blocks: 4, block_tokens: 16, types: types(f16, f16) };
        assert_eq!(shape.cell_bytes().unwrap(), (384, 384));
        assert_eq!(shape.bytes().unwrap(), 30 * 64 * 768);
        // 34 bytes per 32 values.
        let quantized = KvShape { types: types(q8_0, q8_0), ..shape };
        assert_eq!(quantized.cell_bytes().unwrap(), (204, 204));
        assert_eq!(quantized.bytes().unwrap(), 30 * 64 * 408);
        assert_eq!(KvShape { types: types(f16, q8_0), ..shape }.cell_bytes().unwrap(), (384, 204));
        assert_eq!(types(q8_0, f16).name(), "k=q8_0,v=f16");
        let heads_of_48 = KvShape { kv_dim: 96, head_dim: 48, ..quantized };
        assert_eq!(
            heads_of_48.cell_bytes().unwrap_err().to_string(),
            "q8_0 keys (--cache-type-k) are stored in blocks of 32 values, which this model's heads of 48 values \
             do not fill"
        );
        let error = KvShape { types: types(f16, q8_0), ..heads_of_48 }.cell_bytes().unwrap_err().to_string();
        assert!(error.starts_with("q8_0 values (--cache-type-v) are stored in blocks of 32 values"), "{error}");
        assert!(KvShape { types: types(f16, f16), ..heads_of_48 }.cell_bytes().is_ok());
        assert!(KvShape { n_blocks: usize::MAX, ..shape }.bytes().is_err(), "too large");
    }

    #[test]
    fn shared_bytes_refuse_ranges_past_their_owner() {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![1u8, 2, 3, 4]);
        assert_eq!(SharedBytes::new(Arc::clone(&owner), 1..3).map(|bytes| bytes.as_slice().to_vec()), Some(vec![2, 3]));
        assert!(SharedBytes::new(owner, 2..5).is_none());
    }
}
