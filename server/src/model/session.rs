//! One sequence run straight on a model, without the scheduler: used by
//! `sluice generate`, benchmarks and tests.

use std::sync::Arc;

use sluice_kernels::backend::{BackendError, KvTypes};

use super::batch::{Batch, BatchRow, Position, RowInput, text_position};
use super::{Context, ForwardError, ForwardOutput, Model};

/// KV cells are grouped in blocks of this many tokens.
pub const BLOCK_TOKENS: usize = 16;

/// A single sequence with its own KV store.
pub struct Session {
    context: Box<dyn Context>,
    table: Vec<u32>,
    /// Cells written so far.
    cells: u32,
    /// The rotary position of the next text token.
    next_pos: u32,
}

impl Session {
    /// A session with room for `capacity` tokens, its KV cache f16.
    pub fn new(model: Arc<dyn Model>, capacity: usize) -> Result<Self, BackendError> {
        Self::with_kv_types(model, capacity, KvTypes::default())
    }

    /// A session with room for `capacity` tokens, its keys and values
    /// stored as `types` says.
    pub fn with_kv_types(model: Arc<dyn Model>, capacity: usize, types: KvTypes) -> Result<Self, BackendError> {
        let n_blocks = capacity.div_ceil(BLOCK_TOKENS).max(1);
        Ok(Session {
            context: model.context(n_blocks, BLOCK_TOKENS, types)?,
            table: (0..n_blocks as u32).collect(),
            cells: 0,
            next_pos: 0,
        })
    }

    /// Tokens (or embedding rows) processed so far.
    pub fn len(&self) -> usize {
        self.cells as usize
    }

    pub fn is_empty(&self) -> bool {
        self.cells == 0
    }

    /// Process `tokens` in chunks of at most `chunk`; return the logits of
    /// the last one.
    pub fn prefill(&mut self, tokens: &[u32], chunk: usize) -> Result<Vec<f32>, ForwardError> {
        let mut logits = Vec::new();
        for (index, piece) in tokens.chunks(chunk.max(1)).enumerate() {
            let last = (index + 1) * chunk.max(1) >= tokens.len();
            let rows = piece.iter().map(|&token| (RowInput::Token(token), None)).collect::<Vec<_>>();
            logits = self.run(&rows, &[], last)?.logits;
        }
        Ok(logits)
    }

    /// Process one token; return its logits.
    pub fn decode(&mut self, token: u32) -> Result<Vec<f32>, ForwardError> {
        Ok(self.run(&[(RowInput::Token(token), None)], &[], true)?.logits)
    }

    /// Process an embedding segment of `nx × ny` rows (row-major, n_embd
    /// each) positioned as an image; return the logits of its last row.
    pub fn embed_image(&mut self, embeddings: &[f32], nx: u32, ny: u32) -> Result<Vec<f32>, ForwardError> {
        let (positions, next) = super::batch::image_positions(self.next_pos, nx, ny);
        let rows = positions
            .iter()
            .enumerate()
            .map(|(index, pos)| (RowInput::Embedding(index), Some(*pos)))
            .collect::<Vec<_>>();
        let logits = self.run(&rows, embeddings, true)?.logits;
        self.next_pos = next;
        Ok(logits)
    }

    /// Run rows on consecutive cells; text rows (position `None`) take
    /// consecutive text positions.
    fn run(
        &mut self,
        rows: &[(RowInput, Option<Position>)],
        embeddings: &[f32],
        last_logits: bool,
    ) -> Result<ForwardOutput, ForwardError> {
        let mut next_pos = self.next_pos;
        let batch_rows = rows
            .iter()
            .enumerate()
            .map(|(index, &(input, pos))| {
                let pos = pos.unwrap_or_else(|| {
                    next_pos += 1;
                    text_position(next_pos - 1)
                });
                BatchRow {
                    input,
                    seq: 0,
                    cell: self.cells + index as u32,
                    pos,
                    logits: last_logits && index + 1 == rows.len(),
                }
            })
            .collect();
        let batch = Batch {
            rows: batch_rows,
            block_tables: vec![self.table.clone()],
            embeddings: embeddings.to_vec(),
            ..Batch::default()
        };
        let output = self.context.forward(&batch)?;
        self.cells += rows.len() as u32;
        self.next_pos = next_pos;
        Ok(output)
    }
}
