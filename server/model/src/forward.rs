//! Running a [`Transformer`]: the [`Model`] it is to the engine, and one
//! forward pass over a [`Batch`] on its backend, in a context that holds
//! the sequences' KV and the pass's buffers.
//!
//! Batch invariance (where the backend promises it, as the CPU backend
//! does): every row is computed by the same per-row operations in the same
//! order whatever else shares the batch, so a row's logits depend only on
//! its own inputs and its sequence's KV cells.

use std::sync::Arc;

use sluice_kernels::backend::{
    Backend, BackendError, Embed, KvBlockFormat, KvShape, KvTypes, PassLayout, PassRow, PassSequence,
};

use super::batch::{Batch, ForwardError, ForwardOutput, RowInput};
use super::blocks::{Pass, Scratch};
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::lora::{AdapterInfo, PassAdapters};
use super::transformer::Transformer;
use super::vision::{Encoder, Projector};
use super::weights::LoadError;
use super::{Context, Model};

/// A model's KV store and buffers for the sequences one owner runs.
struct TransformerContext<B: Backend> {
    model: Arc<Transformer<B>>,
    shape: KvShape,
    kv: B::Kv,
    scratch: Scratch<B>,
    pass: B::Pass,
    /// The pass's angles of the model's local RoPE, if it has one.
    local_pass: B::Pass,
    /// The pass's query factors, where the model scales queries by
    /// position.
    q_temperature: Vec<f32>,
}

impl<B: Backend> TransformerContext<B> {
    fn new(
        model: Arc<Transformer<B>>,
        n_blocks: usize,
        block_tokens: usize,
        types: KvTypes,
    ) -> Result<Self, BackendError> {
        let hp = &model.hparams;
        // Only the layers that keep K/V in paged cells have a layer here.
        let (n_layer, kv_dim, head_dim) = (model.caches.paged, hp.kv_dim(), hp.head_dim);
        let shape = KvShape { n_layer, kv_dim, head_dim, n_blocks, block_tokens, types };
        let kv = model.backend.kv(shape)?;
        // The store's real size, in llama.cpp's words (the store exists, so
        // these products do not overflow).
        let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
        let ((k_cell, v_cell), cells) = (shape.cell_bytes()?, n_blocks * block_tokens);
        tracing::info!(
            "KV cache: {:.2} MiB ({cells} cells, {n_layer} layers), K ({}): {:.2} MiB, V ({}): {:.2} MiB",
            mib(shape.bytes()?),
            types.k,
            mib(cells * n_layer * k_cell),
            types.v,
            mib(cells * n_layer * v_cell),
        );
        Ok(TransformerContext {
            model,
            shape,
            kv,
            scratch: Scratch::default(),
            pass: B::Pass::default(),
            local_pass: B::Pass::default(),
            q_temperature: Vec::new(),
        })
    }

    /// Validate the batch and lay out its rows for the backend.
    fn layout(&self, batch: &Batch) -> Result<Vec<PassRow>, ForwardError> {
        let model = &*self.model;
        let n_embd = model.hparams.n_embd;
        let table_rows = model.token_embd.as_ref().map(|table| table.n_out);
        let spans = attention_spans(batch);
        let mut rows = Vec::with_capacity(batch.rows.len());
        for (row, (entry, visible)) in batch.rows.iter().zip(spans).enumerate() {
            match (entry.input, table_rows) {
                (RowInput::Token(_), None) => return Err(ForwardError::NoEmbeddings(row)),
                (RowInput::Token(token), Some(n_vocab)) if token as usize >= n_vocab => {
                    return Err(ForwardError::Token { row, token, n_vocab });
                }
                (RowInput::Embedding(index), _) if (index + 1) * n_embd > batch.embeddings.len() => {
                    return Err(ForwardError::Embedding { row, index });
                }
                _ => {}
            }
            if entry.logits && model.output.is_none() {
                return Err(ForwardError::NoLmHead(row));
            }
            if model.embed_scale.is_some() && matches!(entry.input, RowInput::Embedding(_)) {
                return Err(ForwardError::ScaledEmbeddings(row));
            }
            let table = batch.block_tables.get(entry.seq).ok_or(ForwardError::Sequence { row, seq: entry.seq })?;
            let slot =
                self.shape.slot(table, entry.cell as usize).ok_or(ForwardError::Cell { row, cell: entry.cell })?;
            rows.push(PassRow { pos: entry.pos, slot, seq: entry.seq, visible });
        }
        match batch.taps.iter().find(|tap| **tap > model.hparams.n_layer) {
            Some(tap) => Err(ForwardError::Tap(*tap)),
            None => Ok(rows),
        }
    }

    /// Prepare the pass's layout on the backend.
    fn prepare(&mut self, batch: &Batch, rows: &[PassRow]) -> Result<(), ForwardError> {
        let sequences: Vec<PassSequence> = batch
            .block_tables
            .iter()
            .enumerate()
            .map(|(seq, blocks)| PassSequence { blocks, hidden: batch.hidden.get(seq).map_or(&[], Vec::as_slice) })
            .collect();
        let model = &*self.model;
        let layout = PassLayout { rows, sequences: &sequences };
        model.backend.prepare(&model.rope, &layout, &mut self.pass)?;
        if let Some(local) = &model.local_rope {
            model.backend.prepare(local, &layout, &mut self.local_pass)?;
        }
        self.q_temperature.clear();
        if let Some(scale) = model.q_temperature {
            let floor = model.hparams.n_ctx_orig as f32;
            self.q_temperature.extend(rows.iter().map(|row| query_temperature(row.pos[0], floor, scale)));
        }
        Ok(())
    }
}

impl<B: Backend> Context for TransformerContext<B> {
    /// Run the rows of `batch`, writing their K/V into the context's store.
    fn forward(&mut self, batch: &Batch) -> Result<ForwardOutput, ForwardError> {
        let rows = self.layout(batch)?;
        let mut output = ForwardOutput { taps: vec![Vec::new(); batch.taps.len()], ..Default::default() };
        if rows.is_empty() {
            return Ok(output);
        }
        self.prepare(batch, &rows)?;
        let model = &*self.model;
        let (b, hp) = (&*model.backend, &model.hparams);
        let n = rows.len();
        let n_embd = hp.n_embd;
        let s = &mut self.scratch;
        let table = model.token_embd.as_ref().map(|embd| &embd.matrix);
        b.embed(table, &embed_inputs(batch, n_embd), n_embd, &mut s.x)?;
        // Every row is a token here (checked in `layout`).
        if let Some(factor) = model.embed_scale {
            b.scale(&mut s.x, factor)?;
        }
        let lora = PassAdapters::new(batch.rows.iter().map(|row| row.seq), &batch.adapters, model.adapters.len())?;
        let pass = model.pass(&self.pass, &self.local_pass, &self.q_temperature, n, &lora);
        b.begin_layers(&self.pass);
        // The bracket is closed whatever the layers return: a device
        // backend must not be left recording.
        let layers = (|| -> Result<(), ForwardError> {
            for (index, layer) in model.layers.iter().enumerate() {
                tap(b, batch, index, &s.x, &mut output.taps)?;
                layer.run(&pass, index, &mut self.kv, s)?;
            }
            Ok(())
        })();
        let ended = b.end_layers(&self.pass);
        layers?;
        ended?;
        tap(b, batch, hp.n_layer, &s.x, &mut output.taps)?;

        output.logit_rows =
            batch.rows.iter().enumerate().filter(|(_, row)| row.logits).map(|(index, _)| index).collect();
        let m = output.logit_rows.len();
        // Checked in `layout`: rows that want logits have a head.
        if let (true, Some(head)) = (m > 0, &model.output) {
            b.gather(&s.x, &output.logit_rows, n_embd, &mut s.ffn);
            b.rms_norm(&s.ffn, &model.output_norm, hp.rms_eps, &mut s.h);
            let mut logits = B::Rows::default();
            b.matmul(&head.matrix, &s.h, m, &mut logits);
            lora.select(&output.logit_rows).apply(b, &model.adapters, None, &s.h, &mut logits);
            output.logits = b.download_owned(logits)?;
            if let Some(factor) = model.logit_scale {
                output.logits.iter_mut().for_each(|logit| *logit *= factor);
            }
            if let Some(cap) = model.logit_softcap {
                // llama.cpp's order: times the f32 reciprocal, tanh, times the cap.
                let inverse = 1.0 / cap;
                output.logits.iter_mut().for_each(|logit| *logit = (*logit * inverse).tanh() * cap);
            }
        }
        Ok(output)
    }

    /// DFlash context injection: row i of `batch` carries the fused
    /// features in embedding row i; write every layer's K (k-normed and
    /// rotated at the row's position) and V into the row's KV cell. No
    /// attention or feed-forward runs for context rows.
    fn inject(&mut self, batch: &Batch) -> Result<(), ForwardError> {
        let rows = self.layout(batch)?;
        if let Some(row) =
            batch.rows.iter().enumerate().position(|(row, entry)| entry.input != RowInput::Embedding(row))
        {
            return Err(ForwardError::Embedding { row, index: row });
        }
        self.prepare(batch, &rows)?;
        let model = &*self.model;
        let (b, hp) = (&*model.backend, &model.hparams);
        let n = rows.len();
        let s = &mut self.scratch;
        b.upload(&batch.embeddings[..n * hp.n_embd], &mut s.x)?;
        // No adapter applies to context rows.
        let lora = PassAdapters::new(std::iter::empty(), &[], model.adapters.len())?;
        let pass = model.pass(&self.pass, &self.local_pass, &self.q_temperature, n, &lora);
        for layer in &model.layers {
            layer.inject(&pass, &mut self.kv, s);
        }
        Ok(())
    }

    fn copy_block(&mut self, from: u32, to: u32) {
        self.model.backend.copy_kv_block(&mut self.kv, from, to);
    }

    fn block_format(&self) -> KvBlockFormat {
        self.model.backend.kv_block_format(&self.kv)
    }

    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError> {
        self.model.backend.read_kv_block(&self.kv, block)
    }

    fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), BackendError> {
        self.model.backend.write_kv_block(&mut self.kv, block, bytes)
    }
}

impl<B: Backend> Model for Transformer<B> {
    fn hparams(&self) -> &HParams {
        &self.hparams
    }

    fn file(&self) -> &GgufFile {
        &self.file
    }

    fn describe(&self) -> String {
        self.backend.describe()
    }

    fn adapters(&self) -> Vec<&AdapterInfo> {
        self.adapters.iter().map(|adapter| &adapter.info).collect()
    }

    fn context(
        self: Arc<Self>,
        n_blocks: usize,
        block_tokens: usize,
        types: KvTypes,
    ) -> Result<Box<dyn Context>, BackendError> {
        Ok(Box::new(TransformerContext::new(self, n_blocks, block_tokens, types)?))
    }

    fn load_sibling(&self, file: GgufFile) -> Result<Arc<dyn Model>, LoadError> {
        Ok(Arc::new(Transformer::lending(file, Arc::clone(&self.backend), Some(self))?))
    }

    fn load_projector(&self, file: &GgufFile) -> Result<Arc<dyn Encoder>, LoadError> {
        Ok(Arc::new(Projector::load(file, Arc::clone(&self.backend), self.hparams.n_embd)?))
    }

    fn fuse(&self, taps: &[f32], n: usize) -> Result<Vec<f32>, ForwardError> {
        let (fc, norm) = self.fusion.as_ref().ok_or(ForwardError::NoFusion)?;
        let b = &*self.backend;
        let mut rows = B::Rows::default();
        b.upload(&taps[..n * fc.n_in], &mut rows)?;
        let mut fused = B::Rows::default();
        b.matmul(&fc.matrix, &rows, n, &mut fused);
        let mut normed = B::Rows::default();
        b.rms_norm(&fused, norm, self.hparams.rms_eps, &mut normed);
        Ok(b.download_owned(normed)?)
    }
}

impl<B: Backend> Transformer<B> {
    /// What the blocks of a pass over `rows` rows laid out as `layout`
    /// (and as `local`, with the local RoPE's angles) read.
    fn pass<'a>(
        &'a self,
        layout: &'a B::Pass,
        local: &'a B::Pass,
        q_temperature: &'a [f32],
        rows: usize,
        lora: &'a PassAdapters,
    ) -> Pass<'a, B> {
        Pass {
            backend: &self.backend,
            layout,
            rows,
            rms_eps: self.hparams.rms_eps,
            rope: &self.rope,
            local_rope: self.local_rope.as_ref().map(|rope| (rope, local)),
            heads: self.heads,
            q_temperature,
            lora,
            adapters: &self.adapters,
        }
    }
}

/// Llama 4's query factor at `pos`, as llama.cpp evaluates it: the
/// bucket in f32, the logarithm in f64, rounded to f32 at the end.
fn query_temperature(pos: u32, floor: f32, scale: f32) -> f32 {
    (((pos as f32 / floor).floor() as f64 + 1.0).ln() * scale as f64 + 1.0) as f32
}

/// The rows' inputs for [`Backend::embed`] (checked by `layout`).
fn embed_inputs(batch: &Batch, n_embd: usize) -> Vec<Embed<'_>> {
    batch
        .rows
        .iter()
        .map(|row| match row.input {
            RowInput::Token(token) => Embed::Token(token),
            RowInput::Embedding(index) => Embed::Values(&batch.embeddings[index * n_embd..(index + 1) * n_embd]),
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

fn tap<B: Backend>(
    backend: &B,
    batch: &Batch,
    layer: usize,
    x: &B::Rows,
    taps: &mut [Vec<f32>],
) -> Result<(), BackendError> {
    for (index, _) in batch.taps.iter().enumerate().filter(|(_, tap)| **tap == layer) {
        taps[index] = backend.download(x)?;
    }
    Ok(())
}
