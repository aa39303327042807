//! Running a [`Transformer`]: the [`Model`] it is to the engine, and one
//! forward pass over a [`Batch`] on its backend, in a context that holds
//! the sequences' KV and the pass's buffers.
//!
//! Batch invariance (where the backend promises it, as the CPU backend
//! does): every row is computed by the same per-row operations in the same
//! order whatever else shares the batch, so a row's logits depend only on
//! its own inputs and its sequence's KV cells.

use std::ops::Range;
use std::sync::Arc;

use sluice_kernels::backend::{
    Backend, BackendError, Embed, KvBlockFormat, KvShape, KvTypes, PassLayout, PassRow, PassSequence,
};

use super::batch::{Batch, ForwardError, ForwardOutput, RowInput, StateSnapshot};
use super::blocks::{CacheLayout, Pass, Scratch, Stores};
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::lora::{AdapterInfo, PassAdapters};
use super::recurrent::{RecurrentStore, Run};
use super::transformer::Transformer;
use super::vision::{Encoder, Projector};
use super::weights::LoadError;
use super::{Context, Model};

/// A model's KV stores and buffers for the sequences one owner runs.
struct TransformerContext<B: Backend> {
    model: Arc<Transformer<B>>,
    shape: KvShape,
    /// The paged layers' store, and the window layers' when they have none
    /// of their own.
    kv: B::Kv,
    /// The window layers' store, where their old cells are freed.
    window: Option<WindowStore<B>>,
    scratch: Scratch<B>,
    pass: B::Pass,
    /// The pass's angles of the model's local RoPE, if it has one.
    local_pass: B::Pass,
    /// The pass's query factors, where the model scales queries by
    /// position.
    q_temperature: Vec<f32>,
    /// The recurrent layers' states, in a model that has them.
    recurrent: Option<RecurrentStore>,
}

/// The window layers' own store and the pass's layout of its cells.
struct WindowStore<B: Backend> {
    shape: KvShape,
    kv: B::Kv,
    pass: B::Pass,
}

impl<B: Backend> TransformerContext<B> {
    /// A context whose window layers have a store of `window_blocks` blocks
    /// of their own, or keep every cell beside the paged layers (`None`).
    fn new(
        model: Arc<Transformer<B>>,
        n_blocks: usize,
        window_blocks: Option<usize>,
        block_tokens: usize,
        types: KvTypes,
    ) -> Result<Self, BackendError> {
        let hp = &model.hparams;
        let caches = &model.caches;
        let (kv_dim, head_dim) = (hp.kv_dim(), hp.head_dim);
        let window_blocks = window_blocks.filter(|_| caches.window > 0);
        // Only the layers that keep K/V in paged cells have a layer here.
        let n_layer = caches.paged + if window_blocks.is_some() { 0 } else { caches.window };
        let shape = KvShape { n_layer, kv_dim, head_dim, n_blocks, block_tokens, types };
        let kv = model.backend.kv(shape)?;
        let window = match window_blocks {
            Some(blocks) => {
                let shape = KvShape { n_layer: caches.window, n_blocks: blocks.max(1), ..shape };
                Some(WindowStore { shape, kv: model.backend.kv(shape)?, pass: B::Pass::default() })
            }
            None => None,
        };
        log_stores(&shape, window.as_ref().map(|window| &window.shape), caches)?;
        // Its size is in the engine's start log, per slot and for all.
        let recurrent = (!caches.recurrent.is_empty()).then(|| RecurrentStore::new(caches.recurrent.clone()));
        Ok(TransformerContext {
            model,
            shape,
            kv,
            window,
            scratch: Scratch::default(),
            pass: B::Pass::default(),
            local_pass: B::Pass::default(),
            q_temperature: Vec::new(),
            recurrent,
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

    /// The rows in the window store, through the batch's window tables.
    fn window_rows(&self, batch: &Batch, rows: &[PassRow]) -> Result<Vec<PassRow>, ForwardError> {
        let Some(window) = &self.window else { return Ok(Vec::new()) };
        batch
            .rows
            .iter()
            .zip(rows)
            .enumerate()
            .map(|(row, (entry, pass_row))| {
                let table = batch.window_tables.get(entry.seq).ok_or(ForwardError::Sequence { row, seq: entry.seq })?;
                let slot = window
                    .shape
                    .slot(table, entry.cell as usize)
                    .ok_or(ForwardError::Cell { row, cell: entry.cell })?;
                Ok(PassRow { slot, ..*pass_row })
            })
            .collect()
    }

    /// Prepare the pass's layout on the backend.
    fn prepare(&mut self, batch: &Batch, rows: &[PassRow]) -> Result<(), ForwardError> {
        let sequences = pass_sequences(&batch.block_tables, &batch.hidden);
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
        let window_rows = self.window_rows(batch, rows)?;
        if let Some(window) = &mut self.window {
            let sequences = pass_sequences(&batch.window_tables, &batch.hidden);
            // Its angles are never used: the layers rotate with the pass's.
            let layout = PassLayout { rows: &window_rows, sequences: &sequences };
            model.backend.prepare(&model.rope, &layout, &mut window.pass)?;
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
        let runs = self.recurrent.as_ref().map(|store| store.plan(batch)).transpose()?.unwrap_or_default();
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
        if let Some(store) = &mut self.recurrent {
            store.begin(&runs);
        }
        let (mut kv, window_layout) =
            stores(&mut self.kv, &mut self.window, self.recurrent.as_mut(), model.caches.paged);
        let layouts = Layouts { layout: &self.pass, local: &self.local_pass, window: window_layout };
        let pass = model.pass(layouts, &self.q_temperature, n, &lora, &runs);
        b.begin_layers(&self.pass);
        // The bracket is closed whatever the layers return: a device
        // backend must not be left recording.
        let layers = (|| -> Result<(), ForwardError> {
            for (index, layer) in model.layers.iter().enumerate() {
                tap(b, batch, index, &s.x, &mut output.taps)?;
                layer.run(&pass, index, &mut kv, s)?;
            }
            Ok(())
        })();
        let ended = b.end_layers(&self.pass);
        layers?;
        ended?;
        if let Some(store) = &mut self.recurrent {
            store.commit(&runs);
        }
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
        if self.recurrent.is_some() {
            return Err(ForwardError::NoFusion);
        }
        self.prepare(batch, &rows)?;
        let model = &*self.model;
        let (b, hp) = (&*model.backend, &model.hparams);
        let n = rows.len();
        let s = &mut self.scratch;
        b.upload(&batch.embeddings[..n * hp.n_embd], &mut s.x)?;
        // No adapter applies to context rows.
        let lora = PassAdapters::new(std::iter::empty(), &[], model.adapters.len())?;
        let (mut kv, window) = stores(&mut self.kv, &mut self.window, None, model.caches.paged);
        let layouts = Layouts { layout: &self.pass, local: &self.local_pass, window };
        let pass = model.pass(layouts, &self.q_temperature, n, &lora, &[]);
        for layer in &model.layers {
            layer.inject(&pass, &mut kv, s);
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

    fn read_state(&self, slot: u32) -> Option<StateSnapshot> {
        self.recurrent.as_ref()?.read(slot as usize)
    }

    fn write_state(&mut self, slot: u32, snapshot: &StateSnapshot) -> Result<(), ForwardError> {
        self.recurrent.as_mut().ok_or(ForwardError::NoState)?.write(slot as usize, snapshot)
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
        Ok(Box::new(TransformerContext::new(self, n_blocks, None, block_tokens, types)?))
    }

    fn kv_window(&self) -> Option<usize> {
        (self.caches.window > 0).then_some(self.caches.window_len)
    }

    fn recurrent_state_bytes(&self) -> Option<usize> {
        let shapes = &self.caches.recurrent;
        (!shapes.is_empty()).then(|| RecurrentStore::bytes_per_sequence(shapes))
    }

    fn windowed_context(
        self: Arc<Self>,
        n_blocks: usize,
        window_blocks: usize,
        block_tokens: usize,
        types: KvTypes,
    ) -> Result<Box<dyn Context>, BackendError> {
        Ok(Box::new(TransformerContext::new(self, n_blocks, Some(window_blocks), block_tokens, types)?))
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

/// A pass's layouts of its rows: in the paged store (and with the local
/// RoPE's angles), and in the window store if there is one.
struct Layouts<'a, B: Backend> {
    layout: &'a B::Pass,
    local: &'a B::Pass,
    window: Option<&'a B::Pass>,
}

impl<B: Backend> Transformer<B> {
    /// What the blocks of a pass over `rows` rows laid out as `layouts`
    /// say, its sequences' recurrent `runs`, read.
    fn pass<'a>(
        &'a self,
        Layouts { layout, local, window }: Layouts<'a, B>,
        q_temperature: &'a [f32],
        rows: usize,
        lora: &'a PassAdapters,
        runs: &'a [Run],
    ) -> Pass<'a, B> {
        Pass {
            backend: &self.backend,
            layout,
            window_layout: window,
            rows,
            rms_eps: self.hparams.rms_eps,
            rope: &self.rope,
            local_rope: self.local_rope.as_ref().map(|rope| (rope, local)),
            heads: self.heads,
            q_temperature,
            lora,
            adapters: &self.adapters,
            runs,
        }
    }
}

/// Each sequence's blocks in `tables`, with its hidden cells.
fn pass_sequences<'a>(tables: &'a [Vec<u32>], hidden: &'a [Vec<Range<usize>>]) -> Vec<PassSequence<'a>> {
    tables
        .iter()
        .enumerate()
        .map(|(seq, blocks)| PassSequence { blocks, hidden: hidden.get(seq).map_or(&[], Vec::as_slice) })
        .collect()
}

/// Llama 4's query factor at `pos`, as llama.cpp evaluates it: the
/// bucket in f32, the logarithm in f64, rounded to f32 at the end.
fn query_temperature(pos: u32, floor: f32, scale: f32) -> f32 {
    (((pos as f32 / floor).floor() as f64 + 1.0).ln() * scale as f64 + 1.0) as f32
}

/// A pass's stores, and its layout of the window store if there is one.
fn stores<'a, B: Backend>(
    paged: &'a mut B::Kv,
    window: &'a mut Option<WindowStore<B>>,
    recurrent: Option<&'a mut RecurrentStore>,
    n_paged: usize,
) -> (Stores<'a, B>, Option<&'a B::Pass>) {
    match window {
        Some(WindowStore { kv, pass, .. }) => (Stores { paged, window: Some(kv), n_paged, recurrent }, Some(&*pass)),
        None => (Stores { paged, window: None, n_paged, recurrent }, None),
    }
}

/// Log the stores' sizes, per layer kind, in llama.cpp's words (the stores
/// exist, so these products do not overflow).
fn log_stores(paged: &KvShape, window: Option<&KvShape>, caches: &CacheLayout) -> Result<(), BackendError> {
    let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
    let layer_mib = |shape: &KvShape| -> Result<f64, BackendError> {
        let (k, v) = shape.cell_bytes()?;
        Ok(mib(shape.n_blocks * shape.block_tokens * (k + v)))
    };
    let total = paged.bytes()? + window.map_or(Ok(0), KvShape::bytes)?;
    let (k_cell, v_cell) = paged.cell_bytes()?;
    let cells = paged.n_blocks * paged.block_tokens;
    tracing::info!(
        "KV cache: {:.2} MiB ({cells} cells, {} layers), K ({}): {:.2} MiB, V ({}): {:.2} MiB",
        mib(total),
        paged.n_layer,
        paged.types.k,
        mib(cells * paged.n_layer * k_cell),
        paged.types.v,
        mib(cells * paged.n_layer * v_cell),
    );
    if caches.window == 0 {
        return Ok(());
    }
    let full = format!("{} full layers × {:.2} MiB", caches.paged, layer_mib(paged)?);
    match window {
        Some(window) => tracing::info!(
            "KV: {} window layers × {:.2} MiB ({} cells for a window of {}), {full}",
            window.n_layer,
            layer_mib(window)?,
            window.n_blocks * window.block_tokens,
            caches.window_len,
        ),
        None => tracing::info!(
            "KV: {} window layers × {:.2} MiB (every cell kept: --swa-full), {full}",
            caches.window,
            layer_mib(paged)?,
        ),
    }
    Ok(())
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
