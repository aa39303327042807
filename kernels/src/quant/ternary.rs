//! The ternary formats TQ2_0 and TQ1_0 (weights −1, 0, +1 under one f16
//! scale per 256-element block): their decoding into unsigned trits and
//! their scalar reference (dequantization and the dot with Q8_K
//! activations).
//!
//! Both store each weight as a field q in 0..3 standing for q − 1: TQ2_0
//! as 2-bit fields in Q2_K's layout, TQ1_0 as base-3 digits. A block's dot
//! is the exact integer Σ q·a minus the activations' sum (Q8_K's `bsums`),
//! then one scale: Q6_K's float step ([`steps::finish_scaled`]), the
//! arithmetic of GGML's own dots for these types.

use super::blocks::{BlockQ8K, BlockTQ1_0, BlockTQ2_0, QK_K};
use super::steps::{self, bsum, dot_blocks, each_block, half_to_f32, idot, two_bit_quants};

pub(crate) fn tq2_0_quants(b: &BlockTQ2_0) -> [u8; QK_K] {
    two_bit_quants(&b.qs)
}

/// Trit `n` of a base-3 byte: the byte times 3^n keeps, modulo 256, the
/// fraction below digit `n` (bytes hold the trits scaled by 256/243,
/// rounded up), and three times that fraction over 256 is the digit.
#[inline(always)]
pub(crate) fn trit(byte: u8, n: u32) -> u8 {
    ((u16::from(byte.wrapping_mul(3u8.pow(n))) * 3) >> 8) as u8
}

/// TQ1_0's trits in element order: five passes over the first 32 bytes
/// of `qs` (trit n of byte m is element 32n + m), five over the next 16
/// (element 160 + 16n + m), then four over `qh` (element 240 + 4n + j).
pub(crate) fn tq1_0_quants(b: &BlockTQ1_0) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    let passes = [(&b.qs[..32], 5), (&b.qs[32..], 5), (&b.qh[..], 4)];
    let mut i = 0;
    for (bytes, count) in passes {
        for n in 0..count {
            for &byte in bytes {
                q[i] = trit(byte, n);
                i += 1;
            }
        }
    }
    q
}

/// `d · (q − 1)` per element, as GGML computes it (the difference first,
/// exact, then one product).
fn dequantize_ternary(q: &[u8; QK_K], d: f32, y: &mut [f32; QK_K]) {
    for (y, &q) in y.iter_mut().zip(q) {
        *y = f32::from(q as i8 - 1) * d;
    }
}

/// Σ (q − 1)·a over the block, with the offset taken off through the
/// activation sums.
fn ternary_isum(q: &[u8; QK_K], a: &BlockQ8K) -> i32 {
    let sum_a = (0..16).fold(0i32, |s, g| s.wrapping_add(bsum(a, g)));
    idot(q, &a.qs).wrapping_sub(sum_a)
}

/// A ternary block: its fields in element order and its f16 scale.
pub(crate) trait Ternary: bytemuck::Pod {
    fn quants(&self) -> [u8; QK_K];
    fn d(&self) -> [u8; 2];
}

impl Ternary for BlockTQ2_0 {
    fn quants(&self) -> [u8; QK_K] {
        tq2_0_quants(self)
    }

    fn d(&self) -> [u8; 2] {
        self.d
    }
}

impl Ternary for BlockTQ1_0 {
    fn quants(&self) -> [u8; QK_K] {
        tq1_0_quants(self)
    }

    fn d(&self) -> [u8; 2] {
        self.d
    }
}

pub(crate) fn dequantize<B: Ternary>(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &B, y: &mut [f32; QK_K]| dequantize_ternary(&b.quants(), half_to_f32(b.d()), y));
}

pub(crate) fn dot<B: Ternary>(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &B, a: &BlockQ8K| {
        steps::finish_scaled(acc, half_to_f32(w.d()), f32::from_le_bytes(a.d), ternary_isum(&w.quants(), a))
    })
}
