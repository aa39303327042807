//! Running a [`Transformer`]: the [`Model`] it is to the engine, and one
//! forward pass over a [`Batch`] on its backend, in a context that holds
//! the sequences' KV and the pass's buffers.
//!
//! Batch invariance (where the backend promises it, as the CPU backend
//! does): every row is computed by the same per-row operations in the same
//! order whatever else shares the batch, so a row's logits depend only on
//! its own inputs and its sequence's KV cells.

use std::sync::Arc;

use sluice_kernels::backend::{AttentionRow, Backend, Embed, KvShape};

use super::batch::{Batch, BatchRow, RowInput};
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::transformer::{LoadError, Transformer};
use super::{Context, Model};

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

/// Per-row outputs of a forward pass, on the host.
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
struct Scratch<B: Backend> {
    x: B::Rows,
    h: B::Rows,
    q: B::Rows,
    k: B::Rows,
    v: B::Rows,
    attn: B::Rows,
    gate: B::Rows,
    up: B::Rows,
    ffn: B::Rows,
    angles: B::Angles,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Scratch {
            x: B::Rows::default(),
            h: B::Rows::default(),
            q: B::Rows::default(),
            k: B::Rows::default(),
            v: B::Rows::default(),
            attn: B::Rows::default(),
            gate: B::Rows::default(),
            up: B::Rows::default(),
            ffn: B::Rows::default(),
            angles: B::Angles::default(),
        }
    }
}

/// A model's KV store and buffers for the sequences one owner runs.
struct TransformerContext<B: Backend> {
    model: Arc<Transformer<B>>,
    shape: KvShape,
    kv: B::Kv,
    scratch: Scratch<B>,
}

impl<B: Backend> TransformerContext<B> {
    fn new(model: Arc<Transformer<B>>, n_blocks: usize, block_tokens: usize) -> Self {
        let hp = &model.hparams;
        let shape = KvShape { n_layer: hp.n_layer, kv_dim: hp.kv_dim(), n_blocks, block_tokens };
        let kv = model.backend.kv(shape);
        TransformerContext { model, shape, kv, scratch: Scratch::default() }
    }

    /// Validate the batch; return each row's KV slot.
    fn check(&self, batch: &Batch) -> Result<Vec<usize>, ForwardError> {
        let model = &*self.model;
        let mut slots = Vec::with_capacity(batch.rows.len());
        let n_vocab = model.hparams.n_vocab;
        let n_embd = model.hparams.n_embd;
        for (row, entry) in batch.rows.iter().enumerate() {
            match entry.input {
                RowInput::Token(_) if model.token_embd.is_none() => return Err(ForwardError::NoEmbeddings(row)),
                RowInput::Token(token) if token as usize >= n_vocab => {
                    return Err(ForwardError::Token { row, token, n_vocab });
                }
                RowInput::Embedding(index) if (index + 1) * n_embd > batch.embeddings.len() => {
                    return Err(ForwardError::Embedding { row, index });
                }
                _ => {}
            }
            let table = batch.block_tables.get(entry.seq).ok_or(ForwardError::Sequence { row, seq: entry.seq })?;
            let slot =
                self.shape.slot(table, entry.cell as usize).ok_or(ForwardError::Cell { row, cell: entry.cell })?;
            slots.push(slot);
        }
        match batch.taps.iter().find(|tap| **tap > model.hparams.n_layer) {
            Some(tap) => Err(ForwardError::Tap(*tap)),
            None => Ok(slots),
        }
    }
}

impl<B: Backend> Context for TransformerContext<B> {
    /// Run the rows of `batch`, writing their K/V into the context's store.
    fn forward(&mut self, batch: &Batch) -> Result<ForwardOutput, ForwardError> {
        let slots = self.check(batch)?;
        let model = &*self.model;
        let (b, hp) = (&*model.backend, &model.hparams);
        let n = batch.rows.len();
        let mut output = ForwardOutput { taps: vec![Vec::new(); batch.taps.len()], ..Default::default() };
        if n == 0 {
            return Ok(output);
        }
        let n_embd = hp.n_embd;
        let s = &mut self.scratch;
        let kv = &mut self.kv;
        let table = model.token_embd.as_ref().map(|embd| &embd.matrix);
        b.embed(table, &embed_inputs(&batch.rows, &batch.embeddings, n_embd), n_embd, &mut s.x)
            .map_err(|error| ForwardError::Kernel(error.to_string()))?;

        // Each row's rotation is the same in every layer.
        let positions: Vec<_> = batch.rows.iter().map(|row| row.pos).collect();
        b.rope_angles(&model.rope, &positions, &mut s.angles);
        let spans = attention_spans(batch);
        let attention: Vec<AttentionRow> = batch
            .rows
            .iter()
            .zip(&spans)
            .map(|(entry, &visible)| AttentionRow {
                blocks: &batch.block_tables[entry.seq],
                visible,
                hidden: batch.hidden.get(entry.seq).map_or(&[], Vec::as_slice),
            })
            .collect();
        let scale = 1.0 / (hp.head_dim as f32).sqrt();
        for (index, layer) in model.layers.iter().enumerate() {
            tap(b, batch, index, &s.x, &mut output.taps);
            b.rms_norm(&s.x, &layer.attn_norm, hp.rms_eps, &mut s.h);
            b.matmul(&layer.q.matrix, &s.h, n, &mut s.q);
            b.matmul(&layer.k.matrix, &s.h, n, &mut s.k);
            b.matmul(&layer.v.matrix, &s.h, n, &mut s.v);
            for (values, bias) in [(&mut s.q, &layer.q_bias), (&mut s.k, &layer.k_bias), (&mut s.v, &layer.v_bias)] {
                if let Some(bias) = bias {
                    b.add_bias(values, bias);
                }
            }
            for (values, norm) in [(&mut s.q, &layer.q_norm), (&mut s.k, &layer.k_norm)] {
                if let Some(norm) = norm {
                    b.rms_norm_in_place(values, norm, hp.rms_eps);
                }
            }
            b.rope(&model.rope, &s.angles, &mut s.q);
            b.rope(&model.rope, &s.angles, &mut s.k);
            // Every row's K/V is written before any row attends, so rows of
            // one sequence in this batch see each other causally.
            b.store_kv(kv, index, &s.k, &s.v, &slots);
            b.attend(kv, index, &s.q, &attention, model.heads, scale, &mut s.attn)
                .map_err(|error| ForwardError::Kernel(error.to_string()))?;
            b.matmul(&layer.output.matrix, &s.attn, n, &mut s.h);
            b.add(&mut s.x, &s.h);

            b.rms_norm(&s.x, &layer.ffn_norm, hp.rms_eps, &mut s.h);
            b.matmul(&layer.gate.matrix, &s.h, n, &mut s.gate);
            b.matmul(&layer.up.matrix, &s.h, n, &mut s.up);
            b.swiglu(&s.gate, &s.up, &mut s.ffn);
            b.matmul(&layer.down.matrix, &s.ffn, n, &mut s.h);
            b.add(&mut s.x, &s.h);
        }
        tap(b, batch, hp.n_layer, &s.x, &mut output.taps);

        output.logit_rows =
            batch.rows.iter().enumerate().filter(|(_, row)| row.logits).map(|(index, _)| index).collect();
        let m = output.logit_rows.len();
        if m > 0 {
            b.gather(&s.x, &output.logit_rows, n_embd, &mut s.ffn);
            b.rms_norm(&s.ffn, &model.output_norm, hp.rms_eps, &mut s.h);
            match &model.output {
                Some(head) => {
                    let mut logits = B::Rows::default();
                    b.matmul(&head.matrix, &s.h, m, &mut logits);
                    output.logits = b.download_owned(logits);
                }
                None => output.hidden = b.download(&s.h),
            }
        }
        Ok(output)
    }

    /// DFlash context injection: row i of `batch` carries the fused
    /// features in embedding row i; write every layer's K (k-normed and
    /// rotated at the row's position) and V into the row's KV cell. No
    /// attention or feed-forward runs for context rows.
    fn inject(&mut self, batch: &Batch) -> Result<(), ForwardError> {
        let slots = self.check(batch)?;
        let model = &*self.model;
        let (b, hp) = (&*model.backend, &model.hparams);
        let n = batch.rows.len();
        if let Some(row) =
            batch.rows.iter().enumerate().position(|(row, entry)| entry.input != RowInput::Embedding(row))
        {
            return Err(ForwardError::Embedding { row, index: row });
        }
        let s = &mut self.scratch;
        b.upload(&batch.embeddings[..n * hp.n_embd], &mut s.x);
        let positions: Vec<_> = batch.rows.iter().map(|row| row.pos).collect();
        b.rope_angles(&model.rope, &positions, &mut s.angles);
        for (index, layer) in model.layers.iter().enumerate() {
            b.matmul(&layer.k.matrix, &s.x, n, &mut s.k);
            b.matmul(&layer.v.matrix, &s.x, n, &mut s.v);
            if let Some(norm) = &layer.k_norm {
                b.rms_norm_in_place(&mut s.k, norm, hp.rms_eps);
            }
            b.rope(&model.rope, &s.angles, &mut s.k);
            b.store_kv(&mut self.kv, index, &s.k, &s.v, &slots);
        }
        Ok(())
    }

    fn copy_block(&mut self, from: u32, to: u32) {
        self.model.backend.copy_kv_block(&mut self.kv, from, to);
    }
}

impl<B: Backend> Model for Transformer<B> {
    fn hparams(&self) -> &HParams {
        &self.hparams
    }

    fn file(&self) -> &GgufFile {
        &self.file
    }

    fn backend(&self) -> String {
        self.backend.describe()
    }

    fn context(self: Arc<Self>, n_blocks: usize, block_tokens: usize) -> Box<dyn Context> {
        Box::new(TransformerContext::new(self, n_blocks, block_tokens))
    }

    fn load_sibling(&self, file: GgufFile) -> Result<Arc<dyn Model>, LoadError> {
        Ok(Arc::new(Transformer::from_file(file, Arc::clone(&self.backend))?))
    }

    fn embed(&self, token: u32, dst: &mut [f32]) -> bool {
        match &self.token_embd {
            Some(embd) if (token as usize) < self.hparams.n_vocab && dst.len() == self.hparams.n_embd => {
                self.backend.dequantize_row(&embd.matrix, token as usize, dst).is_ok()
            }
            _ => false,
        }
    }

    fn has_lm_head(&self) -> bool {
        self.output.is_some()
    }

    fn lm_head(&self, hidden: &[f32], m: usize) -> Vec<f32> {
        let Some(output) = &self.output else { return Vec::new() };
        let b = &*self.backend;
        let mut rows = B::Rows::default();
        b.upload(&hidden[..m * self.hparams.n_embd], &mut rows);
        let mut logits = B::Rows::default();
        b.matmul(&output.matrix, &rows, m, &mut logits);
        b.download_owned(logits)
    }

    fn fuse(&self, taps: &[f32], n: usize) -> Option<Vec<f32>> {
        let (fc, norm) = self.fusion.as_ref()?;
        let b = &*self.backend;
        let mut rows = B::Rows::default();
        b.upload(&taps[..n * fc.n_in], &mut rows);
        let mut fused = B::Rows::default();
        b.matmul(&fc.matrix, &rows, n, &mut fused);
        let mut normed = B::Rows::default();
        b.rms_norm(&fused, norm, self.hparams.rms_eps, &mut normed);
        Some(b.download_owned(normed))
    }
}

/// The rows' inputs for [`Backend::embed`]. Rows were checked against the
/// batch (see `forward::check`).
fn embed_inputs<'a>(rows: &[BatchRow], embeddings: &'a [f32], n_embd: usize) -> Vec<Embed<'a>> {
    rows.iter()
        .map(|row| match row.input {
            RowInput::Token(token) => Embed::Token(token),
            RowInput::Embedding(index) => Embed::Values(&embeddings[index * n_embd..(index + 1) * n_embd]),
        })
        .collect()
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

fn tap<B: Backend>(backend: &B, batch: &Batch, layer: usize, x: &B::Rows, taps: &mut [Vec<f32>]) {
    for (index, _) in batch.taps.iter().enumerate().filter(|(_, tap)| **tap == layer) {
        taps[index] = backend.download(x);
    }
}
