//! The 1-bit i-quants read as grid formats (`grid.rs`, which gives their
//! dequantization and dots): each group of eight elements is a point of a
//! grid of values in {−1, 0, 1} (`iq1_grid.rs`) shifted by ±1/8.

use half::f16;

use super::blocks::{BlockIQ1M, BlockIQ1S};
use super::grid::{GridBlock, OffsetGrid, grid_block, offset_grid};
use super::iq1_grid::IQ1S_GRID;
use super::steps::half_to_f32;

/// IQ1_S sub-block ib's word of index tops, scale and offset sign.
#[inline(always)]
fn iq1_s_word(b: &BlockIQ1S, ib: usize) -> u16 {
    u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]])
}

grid_block!(BlockIQ1S, offset_grid, |b| half_to_f32(b.d), |b, ib| {
    let ls = 2 * ((iq1_s_word(b, ib) >> 12) & 7) as u8 + 1;
    [ls, ls]
});

impl OffsetGrid for BlockIQ1S {
    #[inline(always)]
    fn point(&self, g: usize) -> (u64, bool) {
        let word = iq1_s_word(self, g / 4);
        let high = usize::from((word >> (3 * (g % 4))) & 7);
        (IQ1S_GRID[usize::from(self.qs[g]) | (high << 8)], word & 0x8000 != 0)
    }
}

/// IQ1_M's four scale words.
#[inline(always)]
fn iq1_m_words(b: &BlockIQ1M) -> [u16; 4] {
    std::array::from_fn(|k| u16::from_le_bytes([b.scales[2 * k], b.scales[2 * k + 1]]))
}

// The f16 `d` is spread over the words' top nibbles, word k's as bits
// 4k..4k+4.
grid_block!(
    BlockIQ1M,
    offset_grid,
    |b| {
        let words = iq1_m_words(b);
        f16::from_bits(words.iter().enumerate().fold(0u16, |d, (k, w)| d | ((w >> 12) << (4 * k)))).to_f32()
    },
    |b, ib| {
        let field = iq1_m_words(b)[ib / 2] >> (6 * (ib % 2));
        [2 * (field & 7) as u8 + 1, 2 * ((field >> 3) & 7) as u8 + 1]
    }
);

impl OffsetGrid for BlockIQ1M {
    /// Group g's nibble of `qh`: bits 0..2 the index's top, bit 3 the
    /// offset's sign.
    #[inline(always)]
    fn point(&self, g: usize) -> (u64, bool) {
        let nibble = usize::from(self.qh[g / 2] >> (4 * (g % 2)));
        (IQ1S_GRID[usize::from(self.qs[g]) | ((nibble & 7) << 8)], nibble & 8 != 0)
    }
}
