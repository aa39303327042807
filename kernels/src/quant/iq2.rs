//! The 2-bit i-quants read as grid formats (`grid.rs`, which gives their
//! dequantization and dots): each group of eight elements is a point of a
//! grid of unsigned magnitudes (`iq2_grids.rs`) with its own signs.

use super::blocks::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use super::grid::{GridBlock, SignedGrid, grid_block, signed_grid};
use super::iq_signs::ksign;
use super::iq2_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use super::steps::half_to_f32;

/// IQ2_XXS sub-block ib's scale and sign word (the last four of its bytes).
#[inline(always)]
fn iq2_xxs_aux(b: &BlockIQ2XXS, ib: usize) -> u32 {
    let at = 8 * ib + 4;
    u32::from_le_bytes([b.qs[at], b.qs[at + 1], b.qs[at + 2], b.qs[at + 3]])
}

/// The odd scales 2s + 1 of a byte's two 4-bit fields (low nibble first).
#[inline(always)]
fn odd_nibbles(byte: u8) -> [u8; 2] {
    [2 * (byte & 0xF) + 1, 2 * (byte >> 4) + 1]
}

grid_block!(BlockIQ2XXS, signed_grid, |b| half_to_f32(b.d), |b, ib| {
    let ls = 2 * (iq2_xxs_aux(b, ib) >> 28) as u8 + 1;
    [ls, ls]
});
grid_block!(BlockIQ2XS, signed_grid, |b| half_to_f32(b.d), |b, ib| odd_nibbles(b.scales[ib]));
grid_block!(BlockIQ2S, signed_grid, |b| half_to_f32(b.d), |b, ib| odd_nibbles(b.scales[ib]));

impl SignedGrid for BlockIQ2XXS {
    #[inline(always)]
    fn point(&self, g: usize) -> (u64, u8) {
        let (ib, l) = (g / 4, g % 4);
        let field = (iq2_xxs_aux(self, ib) >> (7 * l)) & 127;
        (IQ2XXS_GRID[usize::from(self.qs[8 * ib + l])], ksign(field))
    }
}

impl SignedGrid for BlockIQ2XS {
    /// Low nine bits of group g's word index the grid, the high seven are
    /// its sign field.
    #[inline(always)]
    fn point(&self, g: usize) -> (u64, u8) {
        let word = u16::from_le_bytes([self.qs[2 * g], self.qs[2 * g + 1]]);
        (IQ2XS_GRID[usize::from(word & 511)], ksign(u32::from(word >> 9)))
    }
}

impl SignedGrid for BlockIQ2S {
    /// A 10-bit index: the group's byte, bits 2l, 2l+1 of its sub-block's
    /// `qh` byte on top; the signs stored whole.
    #[inline(always)]
    fn point(&self, g: usize) -> (u64, u8) {
        let high = (usize::from(self.qh[g / 4]) >> (2 * (g % 4))) & 3;
        (IQ2S_GRID[usize::from(self.qs[g]) | (high << 8)], self.signs[g])
    }
}
