//! What one forward pass computes: rows of tokens (or embedding rows) from
//! any sequences, each with its KV cell and rotary position; the
//! [`Context`] that runs it; and what it gives back ([`ForwardOutput`]) or
//! why it refused ([`ForwardError`]).

use sluice_kernels::backend::{BackendError, KvBlockFormat};

/// A rotary position: `[t, h, w, e]`. Text at position p is `[p, p, p, 0]`;
/// one-dimensional architectures read only `t`.
pub type Position = [u32; 4];

/// Text position p as an M-RoPE position.
pub fn text_position(p: u32) -> Position {
    [p, p, p, 0]
}

/// The positions of an image of `nx × ny` embedding rows starting at
/// `pos0` (row-major), and the position of the first token after it.
pub fn image_positions(pos0: u32, nx: u32, ny: u32) -> (Vec<Position>, u32) {
    let positions = (0..nx * ny).map(|i| [pos0, pos0 + i / nx, pos0 + i % nx, 0]).collect();
    (positions, pos0 + nx.max(ny))
}

/// An image segment of a sequence: `nx × ny` embedding rows from cell
/// `start` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSpan {
    pub start: usize,
    pub nx: u32,
    pub ny: u32,
}

impl ImageSpan {
    pub fn cells(&self) -> std::ops::Range<usize> {
        self.start..self.start + (self.nx * self.ny) as usize
    }
}

/// Where each cell of a sequence sits: text advances one position per cell;
/// an image pins `t` at its first position, spreads its rows over `h` and
/// `w`, and moves the text after it on by `max(nx, ny)` (not `nx × ny`), so
/// positions may jump ahead of cells.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// In cell order, not overlapping.
    images: Vec<ImageSpan>,
}

impl Layout {
    /// A layout with these image segments; `None` if they overlap, are
    /// empty or out of order.
    pub fn new(images: Vec<ImageSpan>) -> Option<Self> {
        let ordered = images.windows(2).all(|pair| pair[0].cells().end <= pair[1].start);
        (ordered && images.iter().all(|image| image.nx > 0 && image.ny > 0)).then_some(Layout { images })
    }

    pub fn images(&self) -> &[ImageSpan] {
        &self.images
    }

    /// The cell ranges of the images.
    pub fn image_cells(&self) -> Vec<std::ops::Range<usize>> {
        self.images.iter().map(ImageSpan::cells).collect()
    }

    pub fn is_image(&self, cell: usize) -> bool {
        self.images.iter().any(|image| image.cells().contains(&cell))
    }

    /// The position of `cell`.
    pub fn position(&self, cell: usize) -> Position {
        // Cells the images took beyond the positions they advanced.
        let mut shift = 0;
        for image in &self.images {
            let cells = image.cells();
            if cell < cells.start {
                break;
            }
            let pos0 = (cells.start - shift) as u32;
            if cells.contains(&cell) {
                let row = (cell - cells.start) as u32;
                return [pos0, pos0 + row / image.nx, pos0 + row % image.nx, 0];
            }
            shift += cells.len() - image.nx.max(image.ny) as usize;
        }
        text_position((cell - shift) as u32)
    }
}

/// The input of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowInput {
    /// A token id (looked up in the embedding table).
    Token(u32),
    /// Row `index` of the batch's `embeddings` (an embedding segment).
    Embedding(usize),
}

/// One row of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRow {
    pub input: RowInput,
    /// Index into the batch's `block_tables`: the sequence this row extends.
    pub seq: usize,
    /// The KV cell this row writes: its index in the sequence. The row
    /// attends to cells `0..=cell` of its sequence.
    pub cell: u32,
    /// Its rotary position.
    pub pos: Position,
    /// Whether the caller wants this row's logits.
    pub logits: bool,
}

/// Rows for one forward pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub rows: Vec<BatchRow>,
    /// Per sequence: the KV blocks holding its cells, in order.
    pub block_tables: Vec<Vec<u32>>,
    /// Per sequence, in a context whose window layers have a store of
    /// their own: its window blocks ([`crate::window::WindowTable`]).
    pub window_tables: Vec<Vec<u32>>,
    /// Embedding rows (n_embd each) referenced by `RowInput::Embedding`.
    pub embeddings: Vec<f32>,
    /// Layers whose input hidden states the caller wants (DFlash taps);
    /// `n_layer` means the output of the last layer before the final norm.
    pub taps: Vec<usize>,
    /// Rows of one sequence see each other whatever their order (a DFlash
    /// draft block): each attends to every cell of its sequence up to the
    /// last one in this batch.
    pub bidirectional: bool,
    /// Per sequence (absent = none): cells its rows do not attend to, such
    /// as image rows a DFlash draft never received.
    pub hidden: Vec<Vec<std::ops::Range<usize>>>,
    /// Per sequence (absent = none): the LoRA adapters its rows use, as
    /// (adapter id, scale).
    pub adapters: Vec<Vec<(u32, f32)>>,
    /// Per sequence, in a context of a model with recurrent layers: the
    /// state slot that carries its recurrent state from pass to pass
    /// (see the `recurrent` module).
    pub states: Vec<u32>,
}

/// A copy of one sequence's recurrent state (every recurrent layer's),
/// which holds its first `cells` cells: a prefix cache's snapshot or a
/// slot file's.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSnapshot {
    pub cells: u32,
    pub values: Vec<f32>,
}

/// A model's KV store and working buffers.
pub trait Context: Send {
    /// Run the rows of `batch`, writing their K/V into this context.
    fn forward(&mut self, batch: &Batch) -> Result<ForwardOutput, ForwardError>;

    /// DFlash context injection: write K/V for rows of fused features (in
    /// embedding row i for row i) without running attention or the
    /// feed-forward.
    fn inject(&mut self, batch: &Batch) -> Result<(), ForwardError>;

    /// Copy a KV block (copy-on-write of a shared partial block).
    fn copy_block(&mut self, from: u32, to: u32);

    /// How [`Context::read_block`] lays out a block.
    fn block_format(&self) -> KvBlockFormat;

    /// A KV block's raw bytes, every layer (a saved slot).
    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError>;

    /// Put back bytes [`Context::read_block`] gave, into any block.
    fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), BackendError>;

    /// State slot `slot`'s recurrent state (see `Batch::states`); `None`
    /// in a model without recurrent layers, for a slot never run, and
    /// after a pass that failed part-way.
    fn read_state(&self, slot: u32) -> Option<StateSnapshot>;

    /// Put a state [`Context::read_state`] gave into `slot`: the slot's
    /// sequence goes on from the snapshot's cells.
    fn write_state(&mut self, slot: u32, snapshot: &StateSnapshot) -> Result<(), ForwardError>;
}

/// Run `batch` in consecutive parts of at most `max_rows` rows (llama.cpp's
/// micro-batches, `-ub`), which bounds a pass's activation memory. Each
/// part's K/V is stored before the next part runs and a row's result does
/// not depend on the rows beside it, so the output is the whole batch's.
/// A bidirectional batch (its rows see each other) runs whole.
pub fn forward_in_parts(
    context: &mut dyn Context,
    batch: &Batch,
    max_rows: usize,
    n_embd: usize,
) -> Result<ForwardOutput, ForwardError> {
    forward_with_stops(context, batch, max_rows, n_embd, &[], &mut |_, _| {})
}

/// [`forward_in_parts`] that also ends a part before each row in `stops`
/// (ascending; `rows.len()` for the end) and then calls `at_stop` with the
/// context and that row: the context then holds exactly the rows before it
/// (a recurrent state to copy, say). A bidirectional batch runs whole,
/// with no stops.
pub fn forward_with_stops(
    context: &mut dyn Context,
    batch: &Batch,
    max_rows: usize,
    n_embd: usize,
    stops: &[usize],
    at_stop: &mut dyn FnMut(&dyn Context, usize),
) -> Result<ForwardOutput, ForwardError> {
    let n = batch.rows.len();
    let stops: Vec<usize> = stops.iter().copied().filter(|&stop| stop > 0 && stop <= n).collect();
    if batch.bidirectional || stops.is_empty() && (max_rows == 0 || n <= max_rows) {
        return context.forward(batch);
    }
    let max_rows = if max_rows == 0 { n } else { max_rows };
    let mut output = ForwardOutput { taps: vec![Vec::new(); batch.taps.len()], ..ForwardOutput::default() };
    let mut first = 0;
    let mut next_stop = stops.iter().peekable();
    while first < n {
        while next_stop.next_if(|&&stop| stop <= first).is_some() {}
        let end = next_stop.peek().map_or(n, |&&stop| stop).min(first + max_rows).min(n);
        let ForwardOutput { logits, logit_rows, taps } = context.forward(&batch.part(first..end, n_embd))?;
        output.logits.extend(logits);
        output.logit_rows.extend(logit_rows.into_iter().map(|row| first + row));
        for (all, part) in output.taps.iter_mut().zip(taps) {
            all.extend(part);
        }
        if next_stop.peek() == Some(&&end) {
            at_stop(&*context, end);
        }
        first = end;
    }
    Ok(output)
}

impl Batch {
    /// The batch of rows `rows` alone, with the embedding rows they use.
    fn part(&self, rows: std::ops::Range<usize>, n_embd: usize) -> Batch {
        let mut embeddings = Vec::new();
        let rows = self.rows[rows]
            .iter()
            .map(|row| {
                let input = match row.input {
                    RowInput::Embedding(at) => match at
                        .checked_mul(n_embd)
                        .and_then(|start| self.embeddings.get(start..start.checked_add(n_embd)?))
                    {
                        Some(values) => {
                            embeddings.extend_from_slice(values);
                            RowInput::Embedding(embeddings.len() / n_embd.max(1) - 1)
                        }
                        // Past the batch's embeddings, so past the part's:
                        // the part's pass refuses it.
                        None => RowInput::Embedding(at),
                    },
                    token => token,
                };
                BatchRow { input, ..row.clone() }
            })
            .collect();
        Batch {
            rows,
            block_tables: self.block_tables.clone(),
            window_tables: self.window_tables.clone(),
            embeddings,
            taps: self.taps.clone(),
            bidirectional: false,
            hidden: self.hidden.clone(),
            adapters: self.adapters.clone(),
            states: self.states.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_positions_follow_the_spec() {
        let (positions, next) = image_positions(10, 3, 2);
        assert_eq!(
            positions,
            vec![[10, 10, 10, 0], [10, 10, 11, 0], [10, 10, 12, 0], [10, 11, 10, 0], [10, 11, 11, 0], [10, 11, 12, 0]]
        );
        assert_eq!(next, 13);
        assert_eq!(text_position(7), [7, 7, 7, 0]);
    }

    #[test]
    fn layouts_place_images_and_jump_after_them() {
        // Text 0..10, a 4 × 3 image at cell 10 (position 10), text after it
        // at position 10 + max(4, 3) = 14; then a 2 × 2 image.
        let layout = Layout::new(vec![ImageSpan { start: 10, nx: 4, ny: 3 }, ImageSpan { start: 25, nx: 2, ny: 2 }])
            .expect("valid");
        let (image, next) = image_positions(10, 4, 3);
        assert_eq!((10..22).map(|cell| layout.position(cell)).collect::<Vec<_>>(), image);
        assert_eq!(layout.position(9), [9, 9, 9, 0]);
        assert_eq!(layout.position(22), text_position(next));
        assert_eq!(next, 14);
        // Cells 22..25 are text at 14..17; the second image starts at 17.
        assert_eq!(layout.position(24), [16, 16, 16, 0]);
        assert_eq!(layout.position(25), [17, 17, 17, 0]);
        assert_eq!(layout.position(28), [17, 18, 18, 0]);
        assert_eq!(layout.position(29), text_position(19));
        assert!(layout.is_image(21) && !layout.is_image(22));
        assert_eq!(Layout::default().position(5), text_position(5));
        assert!(
            Layout::new(vec![ImageSpan { start: 0, nx: 2, ny: 2 }, ImageSpan { start: 3, nx: 1, ny: 1 }]).is_none()
        );
    }
}

/// Why a forward pass was refused (nothing is computed or written) or
/// failed on the device.
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
    #[error("row {0}: this model has no LM head of its own")]
    NoLmHead(usize),
    #[error("row {0}: this model scales its token embeddings and takes no embedding rows")]
    ScaledEmbeddings(usize),
    #[error("this model fuses no features (it is not a DFlash draft)")]
    NoFusion,
    #[error("row {row}: LoRA adapter {id} is not loaded ({n_adapters} are)")]
    Adapter { row: usize, id: u32, n_adapters: usize },
    #[error("row {row}: the scale of LoRA adapter {id} is not finite")]
    AdapterScale { row: usize, id: u32 },
    #[error("row {row}: sequence {seq} has no recurrent state slot")]
    State { row: usize, seq: usize },
    #[error("row {row}: cell {cell} does not follow its recurrent state, which holds cells 0..{expected}")]
    StateCell { row: usize, cell: u32, expected: u32 },
    #[error("a recurrent state of {values} values was given where this model's hold {expected}")]
    StateSize { values: usize, expected: usize },
    #[error("this model has no recurrent layers to take a state")]
    NoState,
    #[error("row {row}: recurrent state slot {slot} is named by two sequences of the pass")]
    SharedState { row: usize, slot: usize },
    #[error("kernel: {0}")]
    Kernel(String),
}

impl From<BackendError> for ForwardError {
    fn from(error: BackendError) -> Self {
        ForwardError::Kernel(error.to_string())
    }
}

/// Per-row outputs of a forward pass, on the host.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ForwardOutput {
    /// Logits of the rows that asked for them, in row order, one LM-head
    /// row count each.
    pub logits: Vec<f32>,
    /// Row index of each logits row.
    pub logit_rows: Vec<usize>,
    /// Per requested tap (in `Batch::taps` order): n_rows × n_embd.
    pub taps: Vec<Vec<f32>>,
}
