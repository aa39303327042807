//! `draft-simple`: a small model of the target's family and vocabulary
//! drafts greedily, one batched pass per draft depth.

use std::sync::Arc;

use sluice_kernels::backend::{BackendError, KvTypes};

use super::{DraftError, DraftRequest, DraftSettings, Drafter, most_likely};
use sluice_model::batch::{Batch, BatchRow, RowInput};
use sluice_model::{Context, Model};

pub struct SimpleDrafter {
    n_vocab: usize,
    context: Box<dyn Context>,
}

impl SimpleDrafter {
    /// A drafter whose KV store mirrors the target's (`n_blocks` blocks of
    /// `block_tokens` cells), f16 whatever the target's types (llama.cpp's
    /// `-ctkd`/`-ctvd` choose the draft's, and sluice takes only f16 there).
    pub fn new(model: Arc<dyn Model>, n_blocks: usize, block_tokens: usize) -> Result<Self, BackendError> {
        let n_vocab = model.hparams().n_vocab;
        Ok(SimpleDrafter { n_vocab, context: model.context(n_blocks, block_tokens, KvTypes::default())? })
    }
}

impl Drafter for SimpleDrafter {
    fn kind(&self) -> &'static str {
        "draft-simple"
    }

    fn draft(&mut self, requests: &mut [DraftRequest<'_>], settings: &DraftSettings) -> Result<(), DraftError> {
        // Requests still drafting; the first pass also catches the draft
        // up on everything the target has (the prompt, accepted drafts).
        // Image rows are the target's embeddings, which a separate draft
        // model cannot read: sequences with images get no drafts.
        let mut drafting: Vec<usize> = (0..requests.len())
            .filter(|&index| requests[index].n_max > 0 && requests[index].layout.images().is_empty())
            .collect();
        let mut depth = 0;
        while !drafting.is_empty() {
            let mut batch = Batch::default();
            for (seq, &index) in drafting.iter().enumerate() {
                let request = &requests[index];
                batch.block_tables.push(request.table.to_vec());
                let next_cell = request.cells() + depth;
                let first_cell = if depth == 0 { request.state.cells.min(request.cells()) } else { next_cell };
                for cell in first_cell..=next_cell {
                    let token = if cell <= request.cells() { request.tokens[cell] } else { request.drafts[depth - 1] };
                    batch.rows.push(BatchRow {
                        input: RowInput::Token(token),
                        seq,
                        cell: cell as u32,
                        pos: request.layout.position(cell),
                        logits: cell == next_cell,
                    });
                }
            }
            let output = self.context.forward(&batch)?;
            let n_vocab = self.n_vocab;
            let mut still = Vec::with_capacity(drafting.len());
            for (out, &index) in drafting.iter().enumerate() {
                let request = &mut requests[index];
                request.state.cells = request.cells() + depth + 1;
                let (token, prob) = most_likely(&output.logits[out * n_vocab..(out + 1) * n_vocab]);
                if prob < settings.p_min {
                    continue;
                }
                request.drafts.push(token);
                if request.drafts.len() < request.n_max {
                    still.push(index);
                }
            }
            drafting = still;
            depth += 1;
        }
        Ok(())
    }

    fn copy_block(&mut self, from: u32, to: u32) {
        self.context.copy_block(from, to);
    }
}
