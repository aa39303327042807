//! The 3-bit grid formats IQ3_XXS and IQ3_S: their sub-block decoding and
//! scalar reference (dequantization and the dot with Q8_K activations).
//!
//! A block is eight sub-blocks of 32 weights under one f16 `d`. A
//! sub-block is eight grid entries (four unsigned magnitudes each, from
//! `iq3_grids`) with one sign bit per weight and an odd integer scale
//! `2s + 1`:
//! - IQ3_XXS: bytes `8ib ..` of `qs` are the entries' 8-bit indices; word
//!   `ib` of the 32 bytes after them holds `s` in its top four bits and
//!   four 7-bit sign fields ([`ksign`]) for the groups of eight. A weight
//!   is `d · (s + ½) · ½ · (±m)`, `(2s + 1)/4 · d`.
//! - IQ3_S: the indices take a ninth bit, bit k of `qh[ib]` for entry k;
//!   `signs[4ib ..]` are the sign bytes; `s` is nibble `ib % 2` of
//!   `scales[ib / 2]`. A weight is `d · (2s + 1) · (±m)`.
//!
//! A block's dot is the exact integer Σ_ib (2s + 1)·(v·a)_ib over the signed
//! values, then Q6_K's float step ([`steps::finish_scaled`]); IQ3_XXS's row
//! total is then multiplied by ¼, both as GGML's own dots do.

use super::blocks::{BlockIQ3S, BlockIQ3XXS, BlockQ8K, QK, QK_K};
use super::iq_signs::ksign;
use super::iq3_grids::{IQ3S_GRID, IQ3XXS_GRID};
use super::steps::{self, dot_blocks, each_block, half_to_f32, idot};

/// A sub-block's scale field `s` (its integer scale is `2s + 1`) and its
/// 32 signed values.
pub(crate) struct SubBlock {
    pub(crate) s: u32,
    pub(crate) values: [i8; QK],
}

/// Eight grid entries (`entry(k)` is entry k's packed magnitudes) signed
/// by four sign bytes (bit j of byte g: weight 8g + j).
#[inline(always)]
fn signed_entries(entry: impl Fn(usize) -> u32, signs: [u8; 4]) -> [i8; QK] {
    let mut values = [0i8; QK];
    for (k, out) in values.as_chunks_mut::<4>().0.iter_mut().enumerate() {
        for (j, (out, m)) in out.iter_mut().zip(entry(k).to_le_bytes()).enumerate() {
            let e = 4 * k + j;
            // Magnitudes are below 64.
            *out = if (signs[e / 8] >> (e % 8)) & 1 != 0 { -(m as i8) } else { m as i8 };
        }
    }
    values
}

/// The sign word and scale field of IQ3_XXS's sub-block `ib`.
#[inline(always)]
pub(crate) fn iq3_xxs_aux(b: &BlockIQ3XXS, ib: usize) -> u32 {
    let at = 64 + 4 * ib;
    u32::from_le_bytes([b.qs[at], b.qs[at + 1], b.qs[at + 2], b.qs[at + 3]])
}

pub(crate) fn iq3_xxs_sub_block(b: &BlockIQ3XXS, ib: usize) -> SubBlock {
    let aux = iq3_xxs_aux(b, ib);
    let signs = [0, 1, 2, 3].map(|l| ksign(aux >> (7 * l)));
    let values = signed_entries(|k| IQ3XXS_GRID[usize::from(b.qs[8 * ib + k])], signs);
    SubBlock { s: aux >> 28, values }
}

/// Entry k's 9-bit index: `qs[8ib + k]` with bit k of `qh[ib]` above.
#[inline(always)]
pub(crate) fn iq3_s_index(b: &BlockIQ3S, ib: usize, k: usize) -> usize {
    usize::from(b.qs[8 * ib + k]) | (usize::from((b.qh[ib] >> k) & 1) << 8)
}

pub(crate) fn iq3_s_sub_block(b: &BlockIQ3S, ib: usize) -> SubBlock {
    let signs = [0, 1, 2, 3].map(|g| b.signs[4 * ib + g]);
    let values = signed_entries(|k| IQ3S_GRID[iq3_s_index(b, ib, k)], signs);
    SubBlock { s: u32::from((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xF), values }
}

/// Each sub-block's values times `db(s)`, GGML's order: the sub-block's
/// scale first, then one product per weight.
fn dequantize_grid(y: &mut [f32; QK_K], sub_block: impl Fn(usize) -> SubBlock, db: impl Fn(u32) -> f32) {
    for (ib, y) in y.as_chunks_mut::<QK>().0.iter_mut().enumerate() {
        let sb = sub_block(ib);
        let db = db(sb.s);
        for (y, &v) in y.iter_mut().zip(&sb.values) {
            *y = db * f32::from(v);
        }
    }
}

pub(crate) fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockIQ3XXS, y: &mut [f32; QK_K]| {
        let d = half_to_f32(b.d);
        dequantize_grid(y, |ib| iq3_xxs_sub_block(b, ib), |s| d * (0.5 + s as f32) * 0.5);
    });
}

pub(crate) fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockIQ3S, y: &mut [f32; QK_K]| {
        let d = half_to_f32(b.d);
        dequantize_grid(y, |ib| iq3_s_sub_block(b, ib), |s| d * (2 * s + 1) as f32);
    });
}

/// Σ_ib scale_ib · (v·a)_ib over a block's sub-blocks.
#[inline(always)]
fn grid_isum(a: &BlockQ8K, sub_block: impl Fn(usize) -> SubBlock) -> i32 {
    a.qs.as_chunks::<QK>().0.iter().enumerate().fold(0i32, |sum, (ib, act)| {
        let sb = sub_block(ib);
        sum.wrapping_add((2 * sb.s as i32 + 1).wrapping_mul(idot(&sb.values, act)))
    })
}

pub(crate) fn dot_iq3_xxs(w: &[u8], a: &[u8]) -> f32 {
    let sum = dot_blocks(w, a, |acc, w: &BlockIQ3XXS, a: &BlockQ8K| {
        let isum = grid_isum(a, |ib| iq3_xxs_sub_block(w, ib));
        steps::finish_scaled(acc, half_to_f32(w.d), f32::from_le_bytes(a.d), isum)
    });
    0.25 * sum
}

pub(crate) fn dot_iq3_s(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockIQ3S, a: &BlockQ8K| {
        let isum = grid_isum(a, |ib| iq3_s_sub_block(w, ib));
        steps::finish_scaled(acc, half_to_f32(w.d), f32::from_le_bytes(a.d), isum)
    })
}
