//! KV storage: per layer, a pool of fixed-size blocks of f16 keys and
//! values. Which blocks a sequence uses (its block table), sharing and
//! eviction are the engine's business; this is only the memory.

use half::f16;

/// Blocks of K and V for every layer.
pub struct KvStore {
    block_tokens: usize,
    n_blocks: usize,
    kv_dim: usize,
    /// Per layer: (keys, values), each `n_blocks * block_tokens * kv_dim`.
    layers: Vec<(Vec<f16>, Vec<f16>)>,
}

impl KvStore {
    /// Storage for `n_blocks` blocks of `block_tokens` cells.
    pub fn new(n_layer: usize, kv_dim: usize, n_blocks: usize, block_tokens: usize) -> Self {
        let len = n_blocks * block_tokens * kv_dim;
        let layers = (0..n_layer).map(|_| (vec![f16::ZERO; len], vec![f16::ZERO; len])).collect();
        KvStore { block_tokens, n_blocks, kv_dim, layers }
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    fn block_len(&self) -> usize {
        self.block_tokens * self.kv_dim
    }

    /// Where cell `cell` of a sequence with `table` lives: (block, offset of
    /// its first element within the layer buffer).
    pub(crate) fn cell_offset(&self, table: &[u32], cell: usize) -> Option<usize> {
        let block = *table.get(cell / self.block_tokens)? as usize;
        (block < self.n_blocks).then(|| block * self.block_len() + (cell % self.block_tokens) * self.kv_dim)
    }

    pub(crate) fn layer_mut(&mut self, layer: usize) -> (&mut [f16], &mut [f16]) {
        let (keys, values) = &mut self.layers[layer];
        (keys, values)
    }

    pub(crate) fn layer(&self, layer: usize) -> (&[f16], &[f16]) {
        let (keys, values) = &self.layers[layer];
        (keys, values)
    }

    /// Copy a block's contents (every layer) into another block: the
    /// copy-on-write of a shared partial block.
    pub fn copy_block(&mut self, from: u32, to: u32) {
        let block_len = self.block_len();
        let (from, to) = (from as usize * block_len, to as usize * block_len);
        for (keys, values) in &mut self.layers {
            keys.copy_within(from..from + block_len, to);
            values.copy_within(from..from + block_len, to);
        }
    }
}
