//! DFlash: the target's hidden states at a few layers are fused and
//! injected as the draft's KV context; one bidirectional pass over the block
//! `[sampled token, MASK × (B-1)]` drafts B-1 tokens at once. Embeddings and
//! the LM head are the target's unless the draft has its own (the draft was
//! loaded as the target's sibling, which lends them).

use std::sync::Arc;

use sluice_kernels::backend::{BackendError, KvTypes};

use super::{CommittedRows, DraftError, DraftRequest, DraftSettings, Drafter, most_likely};
use sluice_model::batch::{Batch, BatchRow, RowInput};
use sluice_model::dflash::DflashParams;
use sluice_model::{Context, ForwardError, Model};

pub struct DflashDrafter {
    draft: Arc<dyn Model>,
    params: DflashParams,
    /// Token that fills the block after the sampled one.
    mask_token: u32,
    /// For a reduced-vocabulary head: the target token of each head row.
    d2t: Option<Vec<u32>>,
    /// The draft's KV store and buffers.
    context: Box<dyn Context>,
}

impl DflashDrafter {
    /// A drafter for a draft paired with its target (`startup::pair`),
    /// whose KV store mirrors the target's (`n_blocks` blocks of
    /// `block_tokens` cells), f16 as `SimpleDrafter`'s.
    pub fn new(
        draft: Arc<dyn Model>,
        params: DflashParams,
        mask_token: u32,
        d2t: Option<Vec<u32>>,
        n_blocks: usize,
        block_tokens: usize,
    ) -> Result<Self, BackendError> {
        let context = Arc::clone(&draft).context(n_blocks, block_tokens, KvTypes::default())?;
        Ok(DflashDrafter { draft, params, mask_token, d2t, context })
    }
}

impl Drafter for DflashDrafter {
    fn kind(&self) -> &'static str {
        "dflash"
    }

    fn taps(&self) -> &[usize] {
        &self.params.target_layers
    }

    fn commit(&mut self, rows: &mut [CommittedRows<'_>], taps: &[Vec<f32>]) -> Result<(), DraftError> {
        // The target's hidden size too (checked at pairing).
        let n_embd = self.draft.hparams().n_embd;
        if taps.len() != self.params.target_layers.len() {
            return Err(ForwardError::Kernel(format!(
                "{} taps for {} target layers",
                taps.len(),
                self.params.target_layers.len()
            ))
            .into());
        }
        // Features of every committed row, taps concatenated per row.
        let mut features = Vec::new();
        let mut batch = Batch::default();
        for committed in rows.iter() {
            // Context must stay contiguous: rows after a gap (a sequence the
            // drafter missed) are not injected and the sequence gets no drafts.
            if committed.state.cells < committed.first_cell {
                continue;
            }
            batch.block_tables.push(committed.table.to_vec());
            for (offset, row) in committed.batch_rows.clone().enumerate() {
                // Image rows are not injected (as in the reference): the
                // draft's context is the text, and its attention skips the
                // image's cells.
                let cell = committed.first_cell + offset;
                if committed.layout.is_image(cell) {
                    continue;
                }
                for tap in taps {
                    features.extend_from_slice(&tap[row * n_embd..(row + 1) * n_embd]);
                }
                batch.rows.push(BatchRow {
                    input: RowInput::Embedding(batch.rows.len()),
                    seq: batch.block_tables.len() - 1,
                    cell: cell as u32,
                    pos: committed.layout.position(cell),
                    logits: false,
                });
            }
        }
        if !batch.rows.is_empty() {
            batch.embeddings = self.draft.fuse(&features, batch.rows.len())?;
            self.context.inject(&batch)?;
        }
        for committed in rows.iter_mut().filter(|committed| committed.state.cells >= committed.first_cell) {
            committed.state.cells = committed.first_cell + committed.batch_rows.len();
        }
        Ok(())
    }

    fn draft(&mut self, requests: &mut [DraftRequest<'_>], settings: &DraftSettings) -> Result<(), DraftError> {
        let mut batch = Batch { bidirectional: !self.params.causal, ..Batch::default() };
        let mut drafting = Vec::new();
        for (index, request) in requests.iter().enumerate() {
            // The block needs the whole context injected.
            let block = (request.n_max + 1).min(self.params.block_size);
            if block < 2 || request.state.cells != request.cells() {
                continue;
            }
            batch.block_tables.push(request.table.to_vec());
            batch.hidden.push(request.layout.image_cells());
            for offset in 0..block {
                let token = if offset == 0 { request.tokens[request.cells()] } else { self.mask_token };
                let cell = request.cells() + offset;
                batch.rows.push(BatchRow {
                    input: RowInput::Token(token),
                    seq: batch.block_tables.len() - 1,
                    cell: cell as u32,
                    pos: request.layout.position(cell),
                    logits: offset > 0,
                });
            }
            drafting.push((index, block - 1));
        }
        if drafting.is_empty() {
            return Ok(());
        }
        let output = self.context.forward(&batch)?;
        let logits = output.logits;
        let n_vocab = logits.len() / output.logit_rows.len().max(1);
        let mut row = 0;
        for (index, n_rows) in drafting {
            let request = &mut requests[index];
            for offset in 0..n_rows {
                // Scattering a reduced head into the target vocabulary with
                // -inf elsewhere changes neither the argmax nor its
                // probability: map the winner instead.
                let (best, prob) = most_likely(&logits[(row + offset) * n_vocab..(row + offset + 1) * n_vocab]);
                if prob < settings.p_min {
                    break;
                }
                let token = self.d2t.as_ref().map_or(Some(best), |d2t| d2t.get(best as usize).copied());
                let Some(token) = token else { break };
                request.drafts.push(token);
            }
            row += n_rows;
            // The block's KV is dropped: only injected context is valid.
            request.state.cells = request.cells();
        }
        Ok(())
    }

    fn copy_block(&mut self, from: u32, to: u32) {
        self.context.copy_block(from, to);
    }
}
