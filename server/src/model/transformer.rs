//! The decoder-only transformer shared by llama, qwen2, qwen3 and the text
//! path of qwen2vl/qwen3vl: RMSNorm, rotary attention with grouped KV heads
//! (q/k norms on qwen3, q/k/v biases on qwen2), SwiGLU feed-forward.
//!
//! Batch invariance: every row is computed by the same per-row kernels in
//! the same order whatever else shares the batch, so a row's logits depend
//! only on its own inputs and its sequence's KV cells.

use std::path::Path;
use std::sync::Mutex;

use sluice_kernels::matmul::{QuantMatrix, matmul};
use sluice_kernels::ops::{self, HeadShape, KvPages, PageTable, Rope, RopeAngles};
use sluice_kernels::pool::ThreadPool;
use sluice_kernels::quant::{DType, dequantize_row};

use super::batch::{Batch, RowInput};
use super::dflash::DflashParams;
use super::gguf::{GgufError, GgufFile, TensorInfo};
use super::hparams::{Architecture, HParams, HParamsError, RopeStyle};
use super::kv::KvStore;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    HParams(#[from] HParamsError),
    #[error("tensor {name:?}: {problem}")]
    Tensor { name: String, problem: String },
}

/// Why a forward pass was refused (nothing is computed or written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("row {row}: token id {token} is outside the vocabulary of {n_vocab}")]
    Token { row: usize, token: u32, n_vocab: usize },
    #[error("row {row}: embedding row {index} is not in the batch")]
    Embedding { row: usize, index: usize },
    #[error("row {row}: sequence {seq} has no block table")]
    Sequence { row: usize, seq: usize },
    #[error("row {row}: KV cell {cell} is outside its sequence's blocks")]
    Cell { row: usize, cell: u32 },
    #[error("tap at layer {0} is past the last layer")]
    Tap(usize),
    #[error("row {0}: this model has no token embeddings of its own; pass embedding rows")]
    NoEmbeddings(usize),
    #[error("kernel: {0}")]
    Kernel(String),
}

/// A weight matrix: where its bytes are and its shape.
#[derive(Debug, Clone)]
pub(crate) struct Weight {
    tensor: TensorInfo,
    dtype: DType,
    n_in: usize,
    n_out: usize,
}

struct Layer {
    attn_norm: Vec<f32>,
    q: Weight,
    k: Weight,
    v: Weight,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    output: Weight,
    ffn_norm: Vec<f32>,
    gate: Weight,
    up: Weight,
    down: Weight,
}

/// A loaded model: hyper-parameters, small tensors in memory, large ones
/// borrowed from the file's map.
pub struct Transformer {
    file: GgufFile,
    hparams: HParams,
    /// Absent in a DFlash draft that borrows its target's.
    token_embd: Option<Weight>,
    output_norm: Vec<f32>,
    /// Absent in a DFlash draft that borrows its target's LM head; the
    /// forward pass then returns normalized hidden states instead of logits.
    output: Option<Weight>,
    layers: Vec<Layer>,
    /// A DFlash draft's feature fusion: `fc` (the target taps, concatenated,
    /// to n_embd), then RMSNorm with `enc.output_norm`.
    fusion: Option<(Weight, Vec<f32>)>,
    rope: Rope,
    heads: HeadShape,
}

/// Per-row outputs of a forward pass.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ForwardOutput {
    /// Logits of the rows that asked for them, in row order, n_vocab each.
    pub logits: Vec<f32>,
    /// Row index of each logits row.
    pub logit_rows: Vec<usize>,
    /// Per requested tap (in `Batch::taps` order): n_rows × n_embd.
    pub taps: Vec<Vec<f32>>,
    /// For a model without an LM head: the final-normed hidden states of
    /// the rows that asked for logits (n_embd each) instead of logits.
    pub hidden: Vec<f32>,
}

/// Reusable buffers of a forward pass.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    ffn: Vec<f32>,
    /// One attention scratch buffer per pool thread.
    attn_scratch: Vec<Mutex<Vec<f32>>>,
    angles: Vec<RopeAngles>,
}

impl Transformer {
    /// Open a GGUF file and check every tensor the architecture needs.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        Self::from_file(GgufFile::open(path)?)
    }

    pub fn from_file(file: GgufFile) -> Result<Self, LoadError> {
        let hparams = HParams::from_gguf(&file)?;
        let hp = &hparams;
        let borrows = hp.arch == Architecture::Dflash;
        let token_embd = match file.tensor("token_embd.weight") {
            None if borrows => None,
            _ => Some(weight(&file, "token_embd.weight", hp.n_embd, hp.n_vocab)?),
        };
        // A reduced-vocabulary DFlash head has one row per `d2t` entry.
        let head_rows = file.tensor("d2t").filter(|_| borrows).map_or(hp.n_vocab, |d2t| d2t.elements() as usize);
        let output = match (file.tensor("output.weight"), &token_embd) {
            (Some(_), _) => Some(weight(&file, "output.weight", hp.n_embd, head_rows)?),
            // Tied embeddings: the LM head is the embedding table.
            (None, Some(token_embd)) if !borrows => Some(token_embd.clone()),
            (None, _) => None,
        };
        let output_norm = vector(&file, "output_norm.weight", hp.n_embd)?;
        let qwen2_biases = matches!(hp.arch, Architecture::Qwen2 | Architecture::Qwen2Vl);
        let qk_norms = matches!(hp.arch, Architecture::Qwen3 | Architecture::Qwen3Vl | Architecture::Dflash);
        let layers = (0..hp.n_layer)
            .map(|layer| {
                let name = |suffix: &str| format!("blk.{layer}.{suffix}");
                let optional = |suffix: &str, len: usize, present: bool| -> Result<Option<Vec<f32>>, LoadError> {
                    let tensor_name = name(suffix);
                    match file.tensor(&tensor_name) {
                        Some(_) => vector(&file, &tensor_name, len).map(Some),
                        None if present => Err(tensor_problem(&tensor_name, "missing")),
                        None => Ok(None),
                    }
                };
                Ok(Layer {
                    attn_norm: vector(&file, &name("attn_norm.weight"), hp.n_embd)?,
                    q: weight(&file, &name("attn_q.weight"), hp.n_embd, hp.q_dim())?,
                    k: weight(&file, &name("attn_k.weight"), hp.n_embd, hp.kv_dim())?,
                    v: weight(&file, &name("attn_v.weight"), hp.n_embd, hp.kv_dim())?,
                    q_bias: optional("attn_q.bias", hp.q_dim(), qwen2_biases)?,
                    k_bias: optional("attn_k.bias", hp.kv_dim(), qwen2_biases)?,
                    v_bias: optional("attn_v.bias", hp.kv_dim(), qwen2_biases)?,
                    q_norm: optional("attn_q_norm.weight", hp.head_dim, qk_norms)?,
                    k_norm: optional("attn_k_norm.weight", hp.head_dim, qk_norms)?,
                    output: weight(&file, &name("attn_output.weight"), hp.q_dim(), hp.n_embd)?,
                    ffn_norm: vector(&file, &name("ffn_norm.weight"), hp.n_embd)?,
                    gate: weight(&file, &name("ffn_gate.weight"), hp.n_embd, hp.n_ff)?,
                    up: weight(&file, &name("ffn_up.weight"), hp.n_embd, hp.n_ff)?,
                    down: weight(&file, &name("ffn_down.weight"), hp.n_ff, hp.n_embd)?,
                })
            })
            .collect::<Result<_, LoadError>>()?;
        let fusion = match hp.arch {
            Architecture::Dflash => {
                let n_taps = DflashParams::from_gguf(&file)?.target_layers.len();
                Some((
                    weight(&file, "fc.weight", n_taps * hp.n_embd, hp.n_embd)?,
                    vector(&file, "enc.output_norm.weight", hp.n_embd)?,
                ))
            }
            _ => None,
        };
        if file.tensor("rope_freqs.weight").is_some() {
            return Err(tensor_problem("rope_freqs.weight", "per-frequency rope factors are not supported yet"));
        }
        let rope = Rope::new(hp.head_dim, hp.n_rot, hp.rope_base, hp.rope_freq_scale, rope_kind(hp.rope))
            .map_err(|error| tensor_problem("rope", &error.to_string()))?;
        let heads = HeadShape::new(hp.n_head, hp.n_head_kv, hp.head_dim)
            .map_err(|error| tensor_problem("attention", &error.to_string()))?;
        Ok(Transformer { file, hparams, token_embd, output_norm, output, layers, fusion, rope, heads })
    }

    pub fn hparams(&self) -> &HParams {
        &self.hparams
    }

    /// The GGUF file the model was loaded from (metadata for tokenizers).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// A KV store sized for this model.
    pub fn kv_store(&self, n_blocks: usize, block_tokens: usize) -> KvStore {
        KvStore::new(self.hparams.n_layer, self.hparams.kv_dim(), n_blocks, block_tokens)
    }

    /// Write token `token`'s embedding row into `dst` (n_embd); `false` if
    /// the model has no embeddings or the token is out of range.
    pub fn embed(&self, token: u32, dst: &mut [f32]) -> bool {
        match &self.token_embd {
            Some(embd) if (token as usize) < self.hparams.n_vocab && dst.len() == self.hparams.n_embd => {
                self.matrix(embd).dequantize_row(token as usize, dst);
                true
            }
            _ => false,
        }
    }

    /// A DFlash draft's fused context features for `n` rows of
    /// concatenated target taps; `None` for other models.
    pub fn fuse(&self, taps: &[f32], n: usize, pool: &ThreadPool) -> Option<Vec<f32>> {
        let (fc, norm) = self.fusion.as_ref()?;
        let n_embd = self.hparams.n_embd;
        let mut fused = vec![0.0; n * n_embd];
        matmul(&self.matrix(fc), &taps[..n * fc.n_in], n, &mut fused, pool);
        let mut normed = Vec::new();
        norm_rows(&fused, norm, self.hparams.rms_eps, n_embd, &mut normed);
        Some(normed)
    }

    /// Whether the model has its own LM head.
    pub fn has_lm_head(&self) -> bool {
        self.output.is_some()
    }

    /// Logits of `m` final-normed hidden rows (n_embd each) through this
    /// model's LM head; empty if it has none.
    pub fn lm_head(&self, hidden: &[f32], m: usize, pool: &ThreadPool) -> Vec<f32> {
        let Some(output) = &self.output else { return Vec::new() };
        let mut logits = vec![0.0; m * output.n_out];
        matmul(&self.matrix(output), &hidden[..m * self.hparams.n_embd], m, &mut logits, pool);
        logits
    }

    fn matrix(&self, weight: &Weight) -> QuantMatrix<'_> {
        QuantMatrix::new(weight.dtype, self.file.data(&weight.tensor), weight.n_out, weight.n_in)
            .expect("weight shapes were validated at load")
    }

    /// Validate the batch; return each row's KV cell offset.
    fn check(&self, batch: &Batch, kv: &KvStore) -> Result<Vec<usize>, ForwardError> {
        let mut offsets = Vec::with_capacity(batch.rows.len());
        let n_vocab = self.hparams.n_vocab;
        let n_embd = self.hparams.n_embd;
        for (row, entry) in batch.rows.iter().enumerate() {
            match entry.input {
                RowInput::Token(_) if self.token_embd.is_none() => return Err(ForwardError::NoEmbeddings(row)),
                RowInput::Token(token) if token as usize >= n_vocab => {
                    return Err(ForwardError::Token { row, token, n_vocab });
                }
                RowInput::Embedding(index) if (index + 1) * n_embd > batch.embeddings.len() => {
                    return Err(ForwardError::Embedding { row, index });
                }
                _ => {}
            }
            let table = batch.block_tables.get(entry.seq).ok_or(ForwardError::Sequence { row, seq: entry.seq })?;
            let offset =
                kv.cell_offset(table, entry.cell as usize).ok_or(ForwardError::Cell { row, cell: entry.cell })?;
            offsets.push(offset);
        }
        match batch.taps.iter().find(|tap| **tap > self.hparams.n_layer) {
            Some(tap) => Err(ForwardError::Tap(*tap)),
            None => Ok(offsets),
        }
    }

    /// Run the rows of `batch`, writing their K/V into `kv`.
    pub fn forward(
        &self,
        batch: &Batch,
        kv: &mut KvStore,
        pool: &ThreadPool,
        scratch: &mut Scratch,
    ) -> Result<ForwardOutput, ForwardError> {
        let offsets = self.check(batch, kv)?;
        let hp = &self.hparams;
        let n = batch.rows.len();
        let mut output = ForwardOutput { taps: vec![Vec::new(); batch.taps.len()], ..Default::default() };
        if n == 0 {
            return Ok(output);
        }
        let (n_embd, q_dim, kv_dim) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let s = scratch;
        resize(&mut s.x, n * n_embd);
        let embd = self.token_embd.as_ref().map(|embd| self.matrix(embd));
        for (row, entry) in batch.rows.iter().enumerate() {
            let dst = &mut s.x[row * n_embd..(row + 1) * n_embd];
            match (entry.input, &embd) {
                (RowInput::Token(token), Some(embd)) => embd.dequantize_row(token as usize, dst),
                // Refused by `check`.
                (RowInput::Token(_), None) => {}
                (RowInput::Embedding(index), _) => {
                    dst.copy_from_slice(&batch.embeddings[index * n_embd..(index + 1) * n_embd])
                }
            }
        }

        // Each row's rotation is the same in every layer.
        s.angles.resize_with(n, RopeAngles::default);
        for (entry, angles) in batch.rows.iter().zip(&mut s.angles) {
            self.rope.angles(entry.pos, angles);
        }
        let spans = attention_spans(batch);
        let scale = 1.0 / (hp.head_dim as f32).sqrt();
        for (index, layer) in self.layers.iter().enumerate() {
            tap(batch, index, &s.x, &mut output.taps);
            norm_rows(&s.x, &layer.attn_norm, hp.rms_eps, n_embd, &mut s.h);
            resize(&mut s.q, n * q_dim);
            resize(&mut s.k, n * kv_dim);
            resize(&mut s.v, n * kv_dim);
            matmul(&self.matrix(&layer.q), &s.h, n, &mut s.q, pool);
            matmul(&self.matrix(&layer.k), &s.h, n, &mut s.k, pool);
            matmul(&self.matrix(&layer.v), &s.h, n, &mut s.v, pool);
            for (values, bias) in [(&mut s.q, &layer.q_bias), (&mut s.k, &layer.k_bias), (&mut s.v, &layer.v_bias)] {
                if let Some(bias) = bias {
                    values.chunks_exact_mut(bias.len()).for_each(|row| ops::add_in_place(row, bias));
                }
            }
            for (values, norm) in [(&mut s.q, &layer.q_norm), (&mut s.k, &layer.k_norm)] {
                head_norm(values, norm.as_deref(), hp.head_dim, hp.rms_eps);
            }
            for (row, angles) in s.angles.iter().enumerate() {
                self.rope.apply(angles, &mut s.q[row * q_dim..(row + 1) * q_dim]);
                self.rope.apply(angles, &mut s.k[row * kv_dim..(row + 1) * kv_dim]);
            }
            // Every row's K/V is written before any row attends, so rows of
            // one sequence in this batch see each other causally.
            let (keys, values) = kv.layer_mut(index);
            for (row, &offset) in offsets.iter().enumerate() {
                ops::f32_to_f16_row(&s.k[row * kv_dim..(row + 1) * kv_dim], &mut keys[offset..offset + kv_dim]);
                ops::f32_to_f16_row(&s.v[row * kv_dim..(row + 1) * kv_dim], &mut values[offset..offset + kv_dim]);
            }
            resize(&mut s.attn, n * q_dim);
            let (keys, values) = kv.layer(index);
            // Rows are independent: threads take every n-th row (later rows
            // of a prompt attend to more positions, so interleaving keeps
            // the shares even). Each row's result is the same whichever
            // thread computes it.
            let outputs: Vec<Mutex<&mut [f32]>> = s.attn.chunks_exact_mut(q_dim).map(Mutex::new).collect();
            s.attn_scratch.resize_with(pool.n_threads(), Mutex::default);
            let (q, scratch, heads, block_tokens, spans) =
                (&s.q, &s.attn_scratch, self.heads, kv.block_tokens(), &spans);
            let failure: Mutex<Option<String>> = Mutex::new(None);
            pool.run(|thread, n_threads| {
                let Ok(mut scratch) = scratch[thread].lock() else { return };
                for (row, entry) in batch.rows.iter().enumerate().skip(thread).step_by(n_threads) {
                    let pages = PageTable { blocks: &batch.block_tables[entry.seq], block_tokens };
                    let Ok(mut out) = outputs[row].lock() else { return };
                    let attended = ops::attend(
                        &q[row * q_dim..(row + 1) * q_dim],
                        KvPages {
                            k: keys,
                            v: values,
                            pages,
                            hidden: batch.hidden.get(entry.seq).map_or(&[], Vec::as_slice),
                        },
                        spans[row],
                        heads,
                        scale,
                        &mut out,
                        &mut scratch,
                    );
                    if let (Err(error), Ok(mut failure)) = (attended, failure.lock()) {
                        failure.get_or_insert(error.to_string());
                    }
                }
            });
            drop(outputs);
            if let Some(error) = failure.into_inner().ok().flatten() {
                return Err(ForwardError::Kernel(error));
            }
            resize(&mut s.h, n * n_embd);
            matmul(&self.matrix(&layer.output), &s.attn, n, &mut s.h, pool);
            ops::add_in_place(&mut s.x, &s.h);

            norm_rows(&s.x, &layer.ffn_norm, hp.rms_eps, n_embd, &mut s.h);
            resize(&mut s.gate, n * hp.n_ff);
            resize(&mut s.up, n * hp.n_ff);
            matmul(&self.matrix(&layer.gate), &s.h, n, &mut s.gate, pool);
            matmul(&self.matrix(&layer.up), &s.h, n, &mut s.up, pool);
            resize(&mut s.ffn, n * hp.n_ff);
            ops::swiglu(&s.gate, &s.up, &mut s.ffn);
            resize(&mut s.h, n * n_embd);
            matmul(&self.matrix(&layer.down), &s.ffn, n, &mut s.h, pool);
            ops::add_in_place(&mut s.x, &s.h);
        }
        tap(batch, hp.n_layer, &s.x, &mut output.taps);

        output.logit_rows =
            batch.rows.iter().enumerate().filter(|(_, row)| row.logits).map(|(index, _)| index).collect();
        let m = output.logit_rows.len();
        if m > 0 {
            resize(&mut s.h, m * n_embd);
            for (out_row, &row) in output.logit_rows.iter().enumerate() {
                ops::rms_norm(
                    &s.x[row * n_embd..(row + 1) * n_embd],
                    &self.output_norm,
                    hp.rms_eps,
                    &mut s.h[out_row * n_embd..(out_row + 1) * n_embd],
                );
            }
            match &self.output {
                Some(head) => {
                    output.logits = vec![0.0; m * head.n_out];
                    matmul(&self.matrix(head), &s.h[..m * n_embd], m, &mut output.logits, pool);
                }
                None => output.hidden = s.h[..m * n_embd].to_vec(),
            }
        }
        Ok(output)
    }

    /// DFlash context injection: row i of `batch` carries the fused
    /// features in embedding row i; write every layer's K (k-normed and
    /// rotated at the row's position) and V into the row's KV cell. No
    /// attention or feed-forward runs for context rows.
    pub fn inject(
        &self,
        batch: &Batch,
        kv: &mut KvStore,
        pool: &ThreadPool,
        scratch: &mut Scratch,
    ) -> Result<(), ForwardError> {
        let hp = &self.hparams;
        let (n, kv_dim) = (batch.rows.len(), hp.kv_dim());
        let offsets = self.check(batch, kv)?;
        if let Some(row) =
            batch.rows.iter().enumerate().position(|(row, entry)| entry.input != RowInput::Embedding(row))
        {
            return Err(ForwardError::Embedding { row, index: row });
        }
        let features = &batch.embeddings[..n * hp.n_embd];
        let s = scratch;
        s.angles.resize_with(n, RopeAngles::default);
        for (entry, angles) in batch.rows.iter().zip(&mut s.angles) {
            self.rope.angles(entry.pos, angles);
        }
        for (index, layer) in self.layers.iter().enumerate() {
            resize(&mut s.k, n * kv_dim);
            resize(&mut s.v, n * kv_dim);
            matmul(&self.matrix(&layer.k), features, n, &mut s.k, pool);
            matmul(&self.matrix(&layer.v), features, n, &mut s.v, pool);
            head_norm(&mut s.k, layer.k_norm.as_deref(), hp.head_dim, hp.rms_eps);
            for (row, angles) in s.angles.iter().enumerate() {
                self.rope.apply(angles, &mut s.k[row * kv_dim..(row + 1) * kv_dim]);
            }
            let (keys, values) = kv.layer_mut(index);
            for (row, &offset) in offsets.iter().enumerate() {
                ops::f32_to_f16_row(&s.k[row * kv_dim..(row + 1) * kv_dim], &mut keys[offset..offset + kv_dim]);
                ops::f32_to_f16_row(&s.v[row * kv_dim..(row + 1) * kv_dim], &mut values[offset..offset + kv_dim]);
            }
        }
        Ok(())
    }
}

/// How many cells of its sequence each row attends to: causally up to its
/// own cell, or, in a bidirectional batch (a DFlash block), up to the last
/// cell its sequence has in the batch.
fn attention_spans(batch: &Batch) -> Vec<usize> {
    if !batch.bidirectional {
        return batch.rows.iter().map(|row| row.cell as usize + 1).collect();
    }
    let mut last = vec![0usize; batch.block_tables.len()];
    for row in &batch.rows {
        if let Some(last) = last.get_mut(row.seq) {
            *last = (*last).max(row.cell as usize + 1);
        }
    }
    batch.rows.iter().map(|row| last.get(row.seq).copied().unwrap_or(row.cell as usize + 1)).collect()
}

/// Per-head RMS norm (qwen3's q/k norms), when the layer has one.
fn head_norm(values: &mut [f32], norm: Option<&[f32]>, head_dim: usize, eps: f32) {
    if let Some(norm) = norm {
        values.chunks_exact_mut(head_dim).for_each(|head| {
            let input = head.to_vec();
            ops::rms_norm(&input, norm, eps, head);
        });
    }
}

fn resize(buffer: &mut Vec<f32>, len: usize) {
    buffer.clear();
    buffer.resize(len, 0.0);
}

fn norm_rows(x: &[f32], weight: &[f32], eps: f32, width: usize, out: &mut Vec<f32>) {
    resize(out, x.len());
    for (input, output) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        ops::rms_norm(input, weight, eps, output);
    }
}

fn tap(batch: &Batch, layer: usize, x: &[f32], taps: &mut [Vec<f32>]) {
    for (index, _) in batch.taps.iter().enumerate().filter(|(_, tap)| **tap == layer) {
        taps[index] = x.to_vec();
    }
}

fn rope_kind(style: RopeStyle) -> ops::RopeKind {
    match style {
        RopeStyle::Norm => ops::RopeKind::Norm,
        RopeStyle::Neox => ops::RopeKind::Neox,
        RopeStyle::MRope(sections) => ops::RopeKind::MRope { sections },
        RopeStyle::IMRope(sections) => ops::RopeKind::IMRope { sections },
    }
}

pub(crate) fn tensor_problem(name: &str, problem: &str) -> LoadError {
    LoadError::Tensor { name: name.into(), problem: problem.into() }
}

pub(crate) fn weight(file: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<Weight, LoadError> {
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    if tensor.dims.len() != 2 || tensor.dims[0] != n_in as u64 || tensor.dims[1] != n_out as u64 {
        return Err(tensor_problem(name, &format!("shape {:?}, expected [{n_in}, {n_out}]", tensor.dims)));
    }
    let dtype = tensor
        .dtype
        .weights()
        .ok_or_else(|| tensor_problem(name, &format!("type {} is not a weight format", tensor.dtype.name())))?;
    Ok(Weight { tensor: tensor.clone(), dtype, n_in, n_out })
}

/// A small f32 (or f16/bf16) vector, dequantized into memory.
pub(crate) fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    if tensor.elements() != len as u64 {
        return Err(tensor_problem(name, &format!("shape {:?}, expected [{len}]", tensor.dims)));
    }
    let Some(dtype @ (DType::F32 | DType::F16 | DType::BF16)) = tensor.dtype.weights() else {
        return Err(tensor_problem(name, &format!("type {} for a norm/bias vector", tensor.dtype.name())));
    };
    let mut out = vec![0.0; len];
    dequantize_row(dtype, file.data(tensor), &mut out).map_err(|error| tensor_problem(name, &error.to_string()))?;
    Ok(out)
}
