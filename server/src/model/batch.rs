//! What one forward pass computes: rows of tokens (or embedding rows) from
//! any sequences, each with its KV cell and rotary position.

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
    /// Embedding rows (n_embd each) referenced by `RowInput::Embedding`.
    pub embeddings: Vec<f32>,
    /// Layers whose input hidden states the caller wants (DFlash taps);
    /// `n_layer` means the output of the last layer before the final norm.
    pub taps: Vec<usize>,
    /// Rows of one sequence see each other whatever their order (a DFlash
    /// draft block): each attends to every cell of its sequence up to the
    /// last one in this batch.
    pub bidirectional: bool,
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
}
