//! Batch assembly: the work a decision granted, as one forward pass's rows
//! (prefill chunks, then each decoding slot's sampled token and drafts).

use super::request::IMAGE_ROW;
use super::slot::Active;
use sluice_model::batch::{Batch, BatchRow, RowInput};

/// What a slot does in the batch being built.
pub(super) enum Work {
    Prefill {
        slot: usize,
        start: usize,
        tokens: usize,
    },
    /// Run the slot's sampled token, then its drafts (if any) for
    /// verification; first, the `replay` tokens before it that its
    /// recurrent state lacks (see `Active::replay`).
    Decode {
        slot: usize,
        drafts: Vec<u32>,
        replay: usize,
    },
}

impl Work {
    pub fn slot(&self) -> usize {
        match *self {
            Work::Prefill { slot, .. } | Work::Decode { slot, .. } => slot,
        }
    }

    /// Batch rows this work takes.
    pub fn rows(&self) -> usize {
        match self {
            Work::Prefill { tokens, .. } => *tokens,
            Work::Decode { drafts, replay, .. } => replay + 1 + drafts.len(),
        }
    }
}

/// A batch and the tokens it processes.
pub(super) struct Assembled {
    pub batch: Batch,
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
}

/// The rows of `work` over `slots`, with hidden-state `taps` requested.
/// Image placeholders become embedding rows of the model's width `n_embd`.
pub(super) fn assemble(work: &[Work], slots: &[Option<Active>], taps: &[usize], n_embd: usize) -> Assembled {
    let mut batch = Batch { taps: taps.to_vec(), ..Batch::default() };
    let mut prefill_tokens = 0;
    let mut decode_tokens = 0;
    for item in work {
        let Some(active) = slots[item.slot()].as_ref() else { continue };
        let (start, inputs, logits_from): (usize, Vec<u32>, usize) = match item {
            Work::Prefill { start, tokens, .. } => {
                prefill_tokens += tokens;
                let done = start + tokens == active.request.prompt.len();
                (
                    *start,
                    active.request.prompt[*start..start + tokens].to_vec(),
                    if done { tokens - 1 } else { *tokens },
                )
            }
            Work::Decode { drafts, replay, .. } => {
                decode_tokens += 1 + drafts.len();
                let start = active.cells - replay;
                let mut inputs = active.tokens[start..=active.cells].to_vec();
                inputs.extend_from_slice(drafts);
                // Verification needs the logits after every row but those
                // replayed.
                (start, inputs, *replay)
            }
        };
        batch.block_tables.push(active.blocks.table.clone());
        batch.window_tables.push(active.blocks.window_table().to_vec());
        batch.adapters.push(active.request.lora.clone());
        // A slot's sequence carries its recurrent state in the slot's own.
        batch.states.push(item.slot() as u32);
        for (offset, token) in inputs.into_iter().enumerate() {
            let cell = start + offset;
            let image_row = (token & IMAGE_ROW != 0).then(|| active.request.image_row(cell, n_embd)).flatten();
            let input = match image_row {
                Some(row) => {
                    batch.embeddings.extend_from_slice(row);
                    RowInput::Embedding(batch.embeddings.len() / n_embd - 1)
                }
                None => RowInput::Token(token),
            };
            batch.rows.push(BatchRow {
                input,
                seq: batch.block_tables.len() - 1,
                cell: cell as u32,
                pos: active.layout.position(cell),
                logits: offset >= logits_from,
            });
        }
    }
    Assembled { batch, prefill_tokens, decode_tokens }
}
