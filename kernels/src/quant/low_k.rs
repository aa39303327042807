//! The 2- and 3-bit K-quants, Q2_K and Q3_K: their block layouts and their
//! scalar reference (dequantization and the dot with Q8_K activations).
//!
//! Both cut a 256-element block into sixteen groups of 16 consecutive
//! elements with one scale each, and both store their 2-bit quant fields
//! the same way: element `128h + 32j + l` (half `h`, `j` = 0..4, `l` =
//! 0..32) is bits `2j, 2j+1` of `qs[32h + l]`. Q3_K adds a third bit, bit
//! `4h + j` of `hmask[l]`, and its values are `q − 4`; Q2_K's are
//! `d·sc·q − dmin·m`.
//!
//! The dots follow the other K-quants (see `scalar.rs`): exact integer sums
//! per block, then one float step per block in block order — Q2_K's that of
//! Q4_K (scales and minima), Q3_K's that of Q6_K (one signed scale, the
//! offset of 4 taken off through the activation sums).

use super::blocks::{BlockQ2K, BlockQ3K, BlockQ8K, QK_K, blocks};
use super::steps::{bsum, dot_blocks, finish_kquant, finish_scaled, half_to_f32, idot, two_bit_quants};

pub(crate) fn q2_k_quants(b: &BlockQ2K) -> [u8; QK_K] {
    two_bit_quants(&b.qs)
}

/// Q3_K's quants in element order, unsigned (0..8; the value uses `q − 4`):
/// the 2-bit field with the element's high bit as bit 2.
pub(crate) fn q3_k_quants(b: &BlockQ3K) -> [u8; QK_K] {
    let mut q = two_bit_quants(&b.qs);
    for (i, q) in q.iter_mut().enumerate() {
        // Element i's high bit: bit i / 32 of hmask[i % 32].
        *q |= ((b.hmask[i % 32] >> (i / 32)) & 1) << 2;
    }
    q
}

/// Q3_K's sixteen scales, signed (the stored 6-bit value minus 32). Bytes
/// 0..8 hold the low nibbles (scales 0..8 low, 8..16 high nibbles), bytes
/// 8..12 the top two bits, of scale `k` at bits `2·(k / 4)` of byte
/// `8 + k % 4`. Working on the little-endian words decodes four scales per
/// operation.
pub(crate) fn q3_k_scales(s: &[u8; 12]) -> [i8; 16] {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (lo0, lo1, top) = (word(0), word(1), word(2));
    let (nibbles, pairs) = (0x0f0f_0f0f, 0x0303_0303);
    let words = [
        (lo0 & nibbles) | ((top & pairs) << 4),
        (lo1 & nibbles) | (((top >> 2) & pairs) << 4),
        ((lo0 >> 4) & nibbles) | (((top >> 4) & pairs) << 4),
        ((lo1 >> 4) & nibbles) | (((top >> 6) & pairs) << 4),
    ];
    let mut out = [0i8; 16];
    for (out, word) in out.as_chunks_mut::<4>().0.iter_mut().zip(words) {
        *out = word.to_le_bytes().map(|v| v as i8 - 32);
    }
    out
}

/// Lengths were validated by the caller: `dst` holds whole blocks that `src` covers.
pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockQ2K>(src).iter().zip(dst.as_chunks_mut::<QK_K>().0) {
        let (d, dmin) = (half_to_f32(b.d), half_to_f32(b.dmin));
        let q = q2_k_quants(b);
        for ((y, q), &sc) in y.as_chunks_mut::<16>().0.iter_mut().zip(q.as_chunks::<16>().0).zip(&b.scales) {
            // GGML's order: the group's scale and minimum first, then one
            // product and one difference per element.
            let (scale, min) = (d * f32::from(sc & 0xF), dmin * f32::from(sc >> 4));
            for (y, &q) in y.iter_mut().zip(q) {
                *y = scale * f32::from(q) - min;
            }
        }
    }
}

pub(crate) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockQ3K>(src).iter().zip(dst.as_chunks_mut::<QK_K>().0) {
        let d = half_to_f32(b.d);
        let q = q3_k_quants(b);
        for ((y, q), sc) in y.as_chunks_mut::<16>().0.iter_mut().zip(q.as_chunks::<16>().0).zip(q3_k_scales(&b.scales))
        {
            let scale = d * f32::from(sc);
            for (y, &q) in y.iter_mut().zip(q) {
                *y = scale * f32::from(q as i8 - 4);
            }
        }
    }
}

/// Σ_g sc_g·(q·a)_g and Σ_g m_g·(Σa)_g over the sixteen groups, then
/// Q4_K's float step.
pub(crate) fn dot_q2_k(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockQ2K, a: &BlockQ8K| {
        let q = q2_k_quants(w);
        let (mut isum, mut isum_min) = (0i32, 0i32);
        for (g, &sc) in w.scales.iter().enumerate() {
            let dot = idot(&q[16 * g..16 * g + 16], &a.qs[16 * g..16 * g + 16]);
            isum = isum.wrapping_add(i32::from(sc & 0xF) * dot);
            isum_min = isum_min.wrapping_add(i32::from(sc >> 4) * bsum(a, g));
        }
        finish_kquant(acc, half_to_f32(w.d), half_to_f32(w.dmin), f32::from_le_bytes(a.d), isum, isum_min)
    })
}

/// Σ_g sc_g·(q·a)_g − 4·Σ_g sc_g·(Σa)_g with the unsigned quants, then
/// Q6_K's float step.
pub(crate) fn dot_q3_k(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockQ3K, a: &BlockQ8K| {
        let q = q3_k_quants(w);
        let (mut isum, mut isum_offset) = (0i32, 0i32);
        for (g, sc) in q3_k_scales(&w.scales).into_iter().enumerate() {
            let sc = i32::from(sc);
            isum = isum.wrapping_add(sc * idot(&q[16 * g..16 * g + 16], &a.qs[16 * g..16 * g + 16]));
            isum_offset = isum_offset.wrapping_add(sc * bsum(a, g));
        }
        finish_scaled(acc, half_to_f32(w.d), f32::from_le_bytes(a.d), isum.wrapping_sub(isum_offset.wrapping_mul(4)))
    })
}
