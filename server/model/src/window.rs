//! The blocks of sliding-window layers. A window layer's row at cell `c`
//! reads cells `c + 1 - window ..= c` only, so a sequence that has written
//! `c` cells (and may still go on from there) needs no block lying wholly
//! before cell `c + 1 - window`: those go back to the pool as it grows.
//! Window layers keep their cells in a store of their own, in blocks
//! numbered apart from the paged layers', and each sequence has a window
//! table beside its block table.
//!
//! Freeing follows the cells a sequence *keeps*, never the cells a pass
//! wrote ahead: draft tokens that verification rejects roll the sequence
//! back to where it was, whose window is still whole.

/// A sequence's window blocks: entry `i` holds its cells
/// `i × block_tokens ..`. Entries before `live` went back to the pool and
/// name block 0, which no row reads (attention reads a window row's cells
/// from the window's first on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowTable {
    pub table: Vec<u32>,
    live: usize,
}

impl WindowTable {
    /// Blocks it holds now.
    pub fn live_blocks(&self) -> usize {
        self.table.len() - self.live
    }
}

/// The window layers' blocks: which are free.
#[derive(Debug, Clone)]
pub struct WindowPool {
    window: usize,
    block_tokens: usize,
    n_blocks: usize,
    free: Vec<u32>,
}

/// No window block left: the pool was sized for fewer sequences or longer
/// passes than asked of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the sliding-window KV store is full ({n_blocks} blocks all in use)")]
pub struct NoWindowBlock {
    pub n_blocks: usize,
}

impl WindowPool {
    /// A pool of `n_blocks` blocks of `block_tokens` cells for layers of a
    /// `window`-position window.
    pub fn new(n_blocks: usize, block_tokens: usize, window: usize) -> Self {
        WindowPool { window, block_tokens: block_tokens.max(1), n_blocks, free: (0..n_blocks as u32).rev().collect() }
    }

    /// Blocks one sequence holds at most when each pass gives it at most
    /// `rows` rows: those from the one holding its window's first cell to
    /// the one holding the pass's last (the bound is reached with a window
    /// starting at a block's last cell).
    pub fn blocks_per_sequence(window: usize, block_tokens: usize, rows: usize) -> usize {
        (window + rows.max(1)).div_ceil(block_tokens.max(1)) + 1
    }

    pub fn window(&self) -> usize {
        self.window
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Blocks some sequence holds.
    pub fn used(&self) -> usize {
        self.n_blocks - self.free.len()
    }

    /// Make `table` reach cell `cells - 1`.
    pub fn reserve(&mut self, table: &mut WindowTable, cells: usize) -> Result<(), NoWindowBlock> {
        while table.table.len() * self.block_tokens < cells {
            let block = self.free.pop().ok_or(NoWindowBlock { n_blocks: self.n_blocks })?;
            table.table.push(block);
        }
        Ok(())
    }

    /// Return the blocks a sequence that keeps `cells` cells no longer
    /// reads: those wholly before cell `cells + 1 - window`.
    pub fn slide(&mut self, table: &mut WindowTable, cells: usize) {
        let first_read = (cells + 1).saturating_sub(self.window);
        let unread = (first_read / self.block_tokens).min(table.table.len());
        while table.live < unread {
            self.free.push(std::mem::replace(&mut table.table[table.live], 0));
            table.live += 1;
        }
    }

    /// End a sequence: all its blocks go back.
    pub fn release(&mut self, table: WindowTable) {
        self.free.extend_from_slice(&table.table[table.live..]);
    }
}

#[cfg(test)]
mod tests;
