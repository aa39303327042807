//! What the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) share:
//! their blocks decoded to one form, the dequantization and the scalar
//! reference dot of that form. Each format's file (`iq2.rs`, `iq1.rs`)
//! only decodes its block.
//!
//! Every element of these formats is d · ls · q / 8, where d is the
//! block's f16 scale, ls an odd integer 1..=15 per group of 16 elements
//! (a stored 3- or 4-bit scale s as 2s + 1), and q a small signed integer:
//! a grid magnitude with its sign for IQ2_* (±8, ±25, ±43), eight times a
//! grid value in {−1, 0, 1} plus the group's ±1 for IQ1_* (their ±1/8
//! offset). GGML spells the factors differently (d · (s + ½) · ¼ times the
//! grid value, or d · ls times the value plus ±⅛) but every product is
//! exact in f32 (d has 11 significant bits, ls 4, q 6), so the values are
//! GGML's bits whatever the order.
//!
//! The dot with Q8_K: per block the exact integer Σ_g ls_g · (q·a)_g over
//! the sixteen groups (|sum| < 2^25), Q6_K's float step, and the factor ⅛
//! once at the end of the row, where GGML's reference for the IQ2 types
//! also takes it.

use super::blocks::{BlockQ8K, QK_K};
use super::steps::{dot_blocks, each_block, finish_scaled, idot};

/// A grid format's block, read group by group: element `8g + j` is
/// `d · ls · group(g)[j] / 8` with `ls` the scale of its half sub-block.
pub(crate) trait GridBlock: bytemuck::Pod {
    fn d(&self) -> f32;
    /// The odd scales ls of sub-block `ib`'s two halves of 16 elements.
    fn scales(&self, ib: usize) -> [u8; 2];
    /// The eight integers q of group `g` (0..32).
    fn group(&self, g: usize) -> [i8; 8];
}

/// The IQ2 formats: a group is a grid point of magnitudes with a sign byte.
pub(crate) trait SignedGrid: GridBlock {
    /// Group `g`'s grid entry and sign byte (bit j set: element j negated).
    fn point(&self, g: usize) -> (u64, u8);
}

/// The IQ1 formats: a group is a grid point of values in {−1, 0, 1} and an
/// offset of ±1/8, so q = 8 · value ± 1.
pub(crate) trait OffsetGrid: GridBlock {
    /// Group `g`'s grid entry and whether its offset is −1/8.
    fn point(&self, g: usize) -> (u64, bool);
}

/// Implements [`GridBlock`] for a format whose groups are its points
/// (`SignedGrid` or `OffsetGrid`) through `$values`: `d` and `scales` are
/// given as closures' bodies over the block (and the sub-block).
macro_rules! grid_block {
    ($block:ty, $values:path, |$b:ident| $d:expr, |$s:ident, $ib:ident| $scales:expr) => {
        impl GridBlock for $block {
            fn d(&self) -> f32 {
                let $b = self;
                $d
            }
            #[inline(always)]
            fn scales(&self, $ib: usize) -> [u8; 2] {
                let $s = self;
                $scales
            }
            #[inline(always)]
            fn group(&self, g: usize) -> [i8; 8] {
                $values(self.point(g))
            }
        }
    };
}
pub(crate) use grid_block;

/// The scale of group `g`'s half sub-block.
#[inline(always)]
fn group_scale<B: GridBlock>(b: &B, g: usize) -> u8 {
    b.scales(g / 4)[(g / 2) % 2]
}

/// Eight grid bytes with the signs of `signs` (bit j set: element j
/// negated).
#[inline(always)]
pub(crate) fn signed_grid((entry, signs): (u64, u8)) -> [i8; 8] {
    let mut out = entry.to_le_bytes().map(|m| m as i8);
    for (j, v) in out.iter_mut().enumerate() {
        if signs & (1 << j) != 0 {
            *v = -*v;
        }
    }
    out
}

/// Eight grid values times 8, plus the offset (±1).
#[inline(always)]
pub(crate) fn offset_grid((entry, negative): (u64, bool)) -> [i8; 8] {
    let delta = if negative { -1 } else { 1 };
    entry.to_le_bytes().map(|v| 8 * v as i8 + delta)
}

pub(crate) fn dequantize<B: GridBlock>(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &B, y: &mut [f32; QK_K]| {
        let d = b.d();
        for (g, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
            let ls = i16::from(group_scale(b, g));
            for (y, q) in y.iter_mut().zip(b.group(g)) {
                *y = d * f32::from(ls * i16::from(q)) * 0.125;
            }
        }
    });
}

pub(crate) fn dot<B: GridBlock>(w: &[u8], a: &[u8]) -> f32 {
    let sum = dot_blocks(w, a, |acc, w: &B, a: &BlockQ8K| {
        let mut isum = 0i32;
        for (g, act) in a.qs.as_chunks::<8>().0.iter().enumerate() {
            isum = isum.wrapping_add(i32::from(group_scale(w, g)) * idot(&w.group(g), act));
        }
        finish_scaled(acc, w.d(), f32::from_le_bytes(a.d), isum)
    });
    sum * 0.125
}
