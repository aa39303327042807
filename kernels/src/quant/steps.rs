//! The steps every weight format's scalar reference is made of (a leaf the
//! reference and the per-format files share): a block's float step after
//! its exact integer sum, the walk over a row's blocks, and the f16 scale.

use half::f16;

use super::blocks::{BlockQ8K, QK_K, blocks};

#[inline(always)]
pub(crate) fn half_to_f32(bits: [u8; 2]) -> f32 {
    f16::from_le_bytes(bits).to_f32()
}

#[inline(always)]
pub(crate) fn bsum(y: &BlockQ8K, group: usize) -> i32 {
    i32::from(i16::from_le_bytes([y.bsums[2 * group], y.bsums[2 * group + 1]]))
}

/// One block of a weight format whose value is `d * q`.
#[inline(always)]
pub(crate) fn finish_scaled(acc: f32, d_w: f32, d_a: f32, isum: i32) -> f32 {
    acc + (d_w * d_a) * isum as f32
}

/// One Q4_K/Q5_K block: `isum` is Σ sc·(q·a) and `isum_min` Σ m·(Σa) over
/// the sub-blocks.
#[inline(always)]
pub(crate) fn finish_kquant(acc: f32, d: f32, dmin: f32, d_a: f32, isum: i32, isum_min: i32) -> f32 {
    acc + ((d * d_a) * isum as f32 - (dmin * d_a) * isum_min as f32)
}

pub(crate) fn each_block<B: bytemuck::Pod, const E: usize>(src: &[u8], dst: &mut [f32], f: impl Fn(&B, &mut [f32; E])) {
    for (b, y) in blocks::<B>(src).iter().zip(dst.as_chunks_mut::<E>().0) {
        f(b, y);
    }
}

pub(crate) fn idot<Q: Copy + Into<i32>>(q: &[Q], a: &[i8]) -> i32 {
    q.iter().zip(a).fold(0i32, |s, (&q, &a)| s.wrapping_add(q.into() * i32::from(a)))
}

pub(crate) fn dot_blocks<W: bytemuck::Pod, A: bytemuck::Pod>(
    w: &[u8],
    a: &[u8],
    step: impl Fn(f32, &W, &A) -> f32,
) -> f32 {
    blocks::<W>(w).iter().zip(blocks::<A>(a)).fold(0.0, |acc, (w, a)| step(acc, w, a))
}

/// One block of Q4_0, Q5_0 or Q8_0 into `acc`: the exact integer dot of its
/// quants, times `d_w · d_a`, fused.
#[inline(always)]
pub(crate) fn finish_symmetric(acc: f32, d_w: f32, d_a: f32, isum: i32) -> f32 {
    (d_w * d_a).mul_add(isum as f32, acc)
}

/// The 2-bit fields of Q2_K's and TQ2_0's quant bytes in element order:
/// element `128h + 32j + l` is bits `2j, 2j+1` of `qs[32h + l]`.
pub(crate) fn two_bit_quants(qs: &[u8; 64]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (half, bytes) in qs.as_chunks::<32>().0.iter().enumerate() {
        for j in 0..4 {
            for (l, &byte) in bytes.iter().enumerate() {
                q[128 * half + 32 * j + l] = (byte >> (2 * j)) & 3;
            }
        }
    }
    q
}
