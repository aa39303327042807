//! The 4-bit formats whose quants index a 16-entry table of signed values
//! instead of standing for themselves: GGML's non-linear IQ4_NL and IQ4_XS,
//! and MXFP4 (OCP microscaling FP4, values stored as twice their E2M1
//! value with the factor ½ folded into the block scale). Their blocks,
//! tables, dequantization and scalar reference dots.
//!
//! Dot partners, chosen so that every block's dot is an exact integer sum
//! of table value × activation quant followed by one float step:
//! - IQ4_NL and MXFP4 (blocks of 32) pair with Q8_0S, like Q4_0: the same
//!   block of 32 under one scale, so the float step is Q4_0's
//!   ([`steps::finish_symmetric`], the arithmetic of GGML's repacked
//!   kernels for these two types), and a matmul mixing them with Q4_0 or
//!   Q8_0 quantizes its activations once. The sum Q8_0S carries is unused
//!   by the file-layout dots; it is there for a packed kernel that biases
//!   the table values to unsigned bytes.
//! - IQ4_XS (blocks of 256 with eight 6-bit sub-block scales) pairs with
//!   Q8_K, as in GGML: the signed sub-block scales multiply the integer
//!   sub-block dots, so the whole block's sum stays an integer and takes
//!   Q6_K's float step ([`steps::finish_scaled`]).

use super::blocks::{BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ8_0S, BlockQ8K, QK, QK_K};
use super::steps::{self, dot_blocks, each_block, half_to_f32, idot};

/// IQ4_NL's and IQ4_XS's values, GGML's `kvalues_iq4nl` table (a fact of
/// the file format).
pub(crate) const IQ4_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's values: the E2M1 numbers doubled, GGML's `kvalues_mxfp4` (the
/// OCP MX format's element encoding: bit 3 the sign, then exponent and
/// mantissa).
pub(crate) const FP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The 32 table values of a block's nibbles, in element order.
#[inline(always)]
pub(crate) fn lookup(table: &[i8; 16], qs: &[u8; 16]) -> [i8; QK] {
    let mut q = [0i8; QK];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = table[usize::from(byte & 0xF)];
        q[j + 16] = table[usize::from(byte >> 4)];
    }
    q
}

/// An MXFP4 block's scale: 2^(e − 128), the E8M0 value 2^(e − 127) halved
/// to undo the doubled table values. e = 0 and 1 give the subnormals 2^−128
/// and 2^−127; every byte gives a finite power of two (2^127 at most).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// Sub-block `ib`'s signed scale, the 6-bit field minus 32.
#[inline(always)]
pub(crate) fn iq4_xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = (u16::from_le_bytes(b.scales_h) >> (2 * ib)) & 3;
    (i32::from(low) | (i32::from(high) << 4)) - 32
}

// ---- dequantization --------------------------------------------------------

pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockIQ4NL, y: &mut [f32; QK]| {
        let d = half_to_f32(b.d);
        for (y, q) in y.iter_mut().zip(lookup(&IQ4_VALUES, &b.qs)) {
            *y = d * f32::from(q);
        }
    });
}

pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockIQ4XS, y: &mut [f32; QK_K]| {
        let d = half_to_f32(b.d);
        for (ib, (y, qs)) in y.as_chunks_mut::<QK>().0.iter_mut().zip(b.qs.as_chunks::<16>().0).enumerate() {
            let dl = d * iq4_xs_scale(b, ib) as f32;
            for (y, q) in y.iter_mut().zip(lookup(&IQ4_VALUES, qs)) {
                *y = dl * f32::from(q);
            }
        }
    });
}

pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockMXFP4, y: &mut [f32; QK]| {
        let d = e8m0_half(b.e);
        for (y, q) in y.iter_mut().zip(lookup(&FP4_VALUES, &b.qs)) {
            *y = f32::from(q) * d;
        }
    });
}

// ---- dot products ----------------------------------------------------------

pub(crate) fn dot_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockIQ4NL, a: &BlockQ8_0S| {
        let isum = idot(&lookup(&IQ4_VALUES, &w.qs), &a.qs);
        steps::finish_symmetric(acc, half_to_f32(w.d), half_to_f32(a.d), isum)
    })
}

pub(crate) fn dot_mxfp4(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockMXFP4, a: &BlockQ8_0S| {
        let isum = idot(&lookup(&FP4_VALUES, &w.qs), &a.qs);
        steps::finish_symmetric(acc, e8m0_half(w.e), half_to_f32(a.d), isum)
    })
}

/// Σ_ib scale_ib · (q·a)_ib over the eight sub-blocks of 32, then one scale.
pub(crate) fn dot_iq4_xs(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockIQ4XS, a: &BlockQ8K| {
        let mut isum = 0i32;
        for (ib, (qs, act)) in w.qs.as_chunks::<16>().0.iter().zip(a.qs.as_chunks::<QK>().0).enumerate() {
            isum = isum.wrapping_add(iq4_xs_scale(w, ib).wrapping_mul(idot(&lookup(&IQ4_VALUES, qs), act)));
        }
        steps::finish_scaled(acc, half_to_f32(w.d), f32::from_le_bytes(a.d), isum)
    })
}
