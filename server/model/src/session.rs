//! Sequences run straight on a model, without the scheduler: used by
//! `sluice generate`, benchmarks and tests.

use std::sync::Arc;

use sluice_kernels::backend::{BackendError, KvTypes};

use super::batch::{Batch, BatchRow, Position, RowInput, text_position};
use super::window::{WindowPool, WindowTable};
use super::{Context, ForwardError, ForwardOutput, Model};

/// KV cells are grouped in blocks of this many tokens.
pub const BLOCK_TOKENS: usize = 16;

/// The most rows a pass gives one sequence of a model with window layers:
/// longer prefills run in passes of this many (which changes no result),
/// so that the window store holds a window and one pass per sequence.
pub const WINDOW_PASS_ROWS: usize = 512;

/// Sequences with their own KV store: one for generation and tests,
/// several for measuring batched decode. The window layers of a model
/// that has them keep only their window's cells (see [`crate::window`]).
pub struct Session {
    context: Box<dyn Context>,
    sequences: Vec<Sequence>,
    /// The window layers' blocks, where they have a store of their own.
    window: Option<WindowPool>,
}

struct Sequence {
    table: Vec<u32>,
    window: WindowTable,
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
        Self::with_sequences(model, capacity, 1, types)
    }

    /// `n_seq` sequences (at least one) of room for `capacity` tokens each
    /// in one KV store. The single-sequence methods work on the first.
    pub fn with_sequences(
        model: Arc<dyn Model>,
        capacity: usize,
        n_seq: usize,
        types: KvTypes,
    ) -> Result<Self, BackendError> {
        Self::build(model, capacity, n_seq, types, true)
    }

    /// [`Session::new`] whose window layers keep every cell, as the other
    /// layers do (llama.cpp's `--swa-full`): the baseline that freeing
    /// must not change.
    pub fn keeping_every_cell(model: Arc<dyn Model>, capacity: usize) -> Result<Self, BackendError> {
        Self::build(model, capacity, 1, KvTypes::default(), false)
    }

    fn build(
        model: Arc<dyn Model>,
        capacity: usize,
        n_seq: usize,
        types: KvTypes,
        free_windows: bool,
    ) -> Result<Self, BackendError> {
        let (per_seq, n_seq) = (capacity.div_ceil(BLOCK_TOKENS).max(1), n_seq.max(1));
        let too_many = || BackendError::Unsupported(format!("{n_seq} sequences of {capacity} tokens"));
        let n_blocks = per_seq.checked_mul(n_seq).ok_or_else(too_many)?;
        let sequences = (0..n_seq)
            .map(|seq| Sequence {
                table: (seq * per_seq..(seq + 1) * per_seq).map(|block| block as u32).collect(),
                window: WindowTable::default(),
                cells: 0,
                next_pos: 0,
            })
            .collect();
        let Some(window) = model.kv_window().filter(|_| free_windows) else {
            return Ok(Session { context: model.context(n_blocks, BLOCK_TOKENS, types)?, sequences, window: None });
        };
        let rows = WINDOW_PASS_ROWS.min(capacity);
        let window_blocks =
            WindowPool::blocks_per_sequence(window, BLOCK_TOKENS, rows).checked_mul(n_seq).ok_or_else(too_many)?;
        Ok(Session {
            context: model.windowed_context(n_blocks, window_blocks, BLOCK_TOKENS, types)?,
            sequences,
            window: Some(WindowPool::new(window_blocks, BLOCK_TOKENS, window)),
        })
    }

    /// Window blocks the sequences hold now, if the window layers have a
    /// store of their own.
    pub fn window_blocks_used(&self) -> Option<usize> {
        self.window.as_ref().map(WindowPool::used)
    }

    /// Tokens (or embedding rows) the first sequence has processed.
    pub fn len(&self) -> usize {
        self.sequences[0].cells as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Process `tokens` in chunks of at most `chunk`; return the logits of
    /// the last one.
    pub fn prefill(&mut self, tokens: &[u32], chunk: usize) -> Result<Vec<f32>, ForwardError> {
        self.prefill_sequence(0, tokens, chunk)
    }

    /// [`Session::prefill`] of sequence `seq`.
    pub fn prefill_sequence(&mut self, seq: usize, tokens: &[u32], chunk: usize) -> Result<Vec<f32>, ForwardError> {
        let chunk = match self.window {
            Some(_) => chunk.clamp(1, WINDOW_PASS_ROWS),
            None => chunk.max(1),
        };
        let mut logits = Vec::new();
        for (index, piece) in tokens.chunks(chunk).enumerate() {
            let last = (index + 1) * chunk >= tokens.len();
            let rows = piece.iter().map(|&token| (RowInput::Token(token), None)).collect::<Vec<_>>();
            logits = self.run(seq, &rows, &[], last)?.logits;
        }
        Ok(logits)
    }

    /// Process one token; return its logits.
    pub fn decode(&mut self, token: u32) -> Result<Vec<f32>, ForwardError> {
        Ok(self.run(0, &[(RowInput::Token(token), None)], &[], true)?.logits)
    }

    /// One token for each of the first `tokens.len()` sequences (tokens
    /// past the last sequence are ignored), in one pass; their logits in
    /// sequence order.
    pub fn decode_each(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        for seq in 0..tokens.len().min(self.sequences.len()) {
            self.reserve_window(seq, 1)?;
        }
        let rows = self
            .sequences
            .iter()
            .zip(tokens)
            .enumerate()
            .map(|(seq, (sequence, &token))| BatchRow {
                input: RowInput::Token(token),
                seq,
                cell: sequence.cells,
                pos: text_position(sequence.next_pos),
                logits: true,
            })
            .collect();
        let output = self.context.forward(&self.batch(rows, Vec::new()))?;
        for seq in 0..tokens.len().min(self.sequences.len()) {
            let sequence = &mut self.sequences[seq];
            sequence.cells += 1;
            sequence.next_pos += 1;
            self.slide_window(seq);
        }
        Ok(output.logits)
    }

    /// A batch of `rows` with every sequence's tables, so that a row's
    /// `seq` indexes them.
    fn batch(&self, rows: Vec<BatchRow>, embeddings: Vec<f32>) -> Batch {
        Batch {
            rows,
            block_tables: self.sequences.iter().map(|sequence| sequence.table.clone()).collect(),
            window_tables: self.sequences.iter().map(|sequence| sequence.window.table.clone()).collect(),
            embeddings,
            // Each sequence carries its recurrent state in the slot of its
            // own index.
            states: (0..self.sequences.len() as u32).collect(),
            ..Batch::default()
        }
    }

    /// Give sequence `seq`'s window blocks for its next `rows` cells.
    fn reserve_window(&mut self, seq: usize, rows: usize) -> Result<(), ForwardError> {
        let (Some(pool), Some(sequence)) = (&mut self.window, self.sequences.get_mut(seq)) else { return Ok(()) };
        let cells = sequence.cells as usize;
        pool.reserve(&mut sequence.window, cells + rows).map_err(|_| ForwardError::Cell {
            row: rows.saturating_sub(1),
            cell: (cells + rows).saturating_sub(1) as u32,
        })
    }

    /// Return the window blocks sequence `seq` no longer reads.
    fn slide_window(&mut self, seq: usize) {
        if let (Some(pool), Some(sequence)) = (&mut self.window, self.sequences.get_mut(seq)) {
            pool.slide(&mut sequence.window, sequence.cells as usize);
        }
    }

    /// Process an embedding segment of `nx × ny` rows (row-major, n_embd
    /// each) positioned as an image; return the logits of its last row.
    pub fn embed_image(&mut self, embeddings: &[f32], nx: u32, ny: u32) -> Result<Vec<f32>, ForwardError> {
        let (positions, next) = super::batch::image_positions(self.sequences[0].next_pos, nx, ny);
        let rows = positions
            .iter()
            .enumerate()
            .map(|(index, pos)| (RowInput::Embedding(index), Some(*pos)))
            .collect::<Vec<_>>();
        let logits = self.run(0, &rows, embeddings, true)?.logits;
        self.sequences[0].next_pos = next;
        Ok(logits)
    }

    /// Run rows of sequence `seq` on its next cells; text rows (position
    /// `None`) take consecutive text positions.
    fn run(
        &mut self,
        seq: usize,
        rows: &[(RowInput, Option<Position>)],
        embeddings: &[f32],
        last_logits: bool,
    ) -> Result<ForwardOutput, ForwardError> {
        self.reserve_window(seq, rows.len())?;
        let sequence = self.sequences.get(seq).ok_or(ForwardError::Sequence { row: 0, seq })?;
        let mut next_pos = sequence.next_pos;
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
                    seq,
                    cell: sequence.cells + index as u32,
                    pos,
                    logits: last_logits && index + 1 == rows.len(),
                }
            })
            .collect();
        let output = self.context.forward(&self.batch(batch_rows, embeddings.to_vec()))?;
        if let Some(sequence) = self.sequences.get_mut(seq) {
            sequence.cells += rows.len() as u32;
            sequence.next_pos = next_pos;
        }
        self.slide_window(seq);
        Ok(output)
    }
}
