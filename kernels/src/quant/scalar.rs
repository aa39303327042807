//! The scalar reference: it defines the value of every kernel.
//!
//! SIMD paths must compute the same integer sums (integer arithmetic here
//! wraps, so any summation order gives the same result) and then apply the
//! same float steps in the same order:
//! - the legacy formats without an offset (Q4_0, Q5_0, Q8_0) add one float
//!   per block in block order, `(d_w · d_a) · isum` fused
//!   ([`dot_symmetric`]): the arithmetic of GGML's repacked and GEMM prompt
//!   kernels, which lets a packed kernel keep one weight row per lane;
//! - the legacy formats with an offset (Q4_1, Q5_1) keep eight lanes, lane
//!   `k` taking the integer dot of elements `4k..4k+4` of every block,
//!   scaled by `d_w · d_a` with a fused multiply-add ([`dot_legacy`]) — the
//!   steps of GGML's 256-bit decoding loops, so that the default model
//!   (Q4_1) computes llama.cpp's hidden states bit for bit;
//! - the K-quants add one float per block, the `finish_*` functions below,
//!   in block order;
//! - float weight rows accumulate into [`LANES`] interleaved lanes with fused
//!   multiply-adds and reduce them by halving, which is what a 16-wide (or
//!   2 × 8-wide) vector loop does.

use half::{bf16, f16};

use super::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_0S, BlockQ8_1,
    BlockQ8K, QK, QK_K, blocks, blocks_mut, k_scales,
};
pub(crate) use super::steps::{
    bsum, dot_blocks, each_block, finish_kquant, finish_scaled, finish_symmetric, half_to_f32, idot,
};
use super::{DType, lut4};

/// Interleaved accumulators of the float-weight dot products.
pub(crate) const LANES: usize = 16;

/// Accumulators of the legacy-format dot products.
pub(crate) const LEGACY_LANES: usize = 8;

// ---- float steps shared with the SIMD paths --------------------------------

/// Reduces the eight legacy lanes: lane `k` plus lane `k + 4`, then
/// `(0 + 2) + (1 + 3)` of those four.
#[inline(always)]
pub(crate) fn reduce_legacy_lanes(acc: [f32; LEGACY_LANES]) -> f32 {
    let half: [f32; 4] = std::array::from_fn(|k| acc[k] + acc[k + 4]);
    (half[0] + half[2]) + (half[1] + half[3])
}

/// Reduces the float-dot lanes by adding the upper half onto the lower one
/// until one lane is left, the order a vector reduction takes.
#[inline(always)]
pub(crate) fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// Adds `w[i] * a[i]` into lane `i % LANES`. Vector paths call it for the
/// tail that does not fill a vector, which starts at a multiple of `LANES`.
pub(crate) fn accumulate_float<const B: usize>(
    acc: &mut [f32; LANES],
    w: &[u8],
    a: &[u8],
    convert: impl Fn([u8; B]) -> f32,
) {
    for (i, (wv, av)) in w.as_chunks::<B>().0.iter().zip(a.as_chunks::<4>().0).enumerate() {
        let lane = &mut acc[i % LANES];
        *lane = convert(*wv).mul_add(f32::from_le_bytes(*av), *lane);
    }
}

pub(crate) fn f32_value(b: [u8; 4]) -> f32 {
    f32::from_le_bytes(b)
}

pub(crate) fn bf16_value(b: [u8; 2]) -> f32 {
    bf16::from_le_bytes(b).to_f32()
}

// ---- weight quants ---------------------------------------------------------

fn q4_0_quants(b: &BlockQ4_0) -> [i8; QK] {
    let mut q = [0i8; QK];
    for (j, &byte) in b.qs.iter().enumerate() {
        q[j] = (byte & 0xF) as i8 - 8;
        q[j + 16] = (byte >> 4) as i8 - 8;
    }
    q
}

fn q4_1_quants(b: &BlockQ4_1) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (j, &byte) in b.qs.iter().enumerate() {
        q[j] = byte & 0xF;
        q[j + 16] = byte >> 4;
    }
    q
}

/// Unsigned 5-bit quants: nibbles plus bit `j` of `qh` as bit 4 of element `j`.
fn five_bit_quants(qh: [u8; 4], qs: &[u8; 16]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = (byte & 0xF) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (byte >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

fn q5_0_quants(b: &BlockQ5_0) -> [i8; QK] {
    five_bit_quants(b.qh, &b.qs).map(|q| q as i8 - 16)
}

fn q5_1_quants(b: &BlockQ5_1) -> [u8; QK] {
    five_bit_quants(b.qh, &b.qs)
}

/// Q4_K/Q5_K quants in element order, the 5th bit included when `qh` is given.
fn k_quants(qs: &[u8; 128], qh: Option<&[u8; 32]>) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (pair, chunk) in qs.as_chunks::<32>().0.iter().enumerate() {
        let (lo, hi) = (2 * pair, 2 * pair + 1);
        for (l, &byte) in chunk.iter().enumerate() {
            let high = |j: usize| qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
            q[32 * lo + l] = (byte & 0xF) | high(lo);
            q[32 * hi + l] = (byte >> 4) | high(hi);
        }
    }
    q
}

/// Q6_K quants in element order, unsigned (the value uses `q - 32`).
pub(crate) fn q6_k_quants(b: &BlockQ6K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let (ql, qh, out) = (&b.ql[64 * half..], &b.qh[32 * half..], &mut q[128 * half..]);
        for l in 0..32 {
            out[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            out[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

// ---- dequantization --------------------------------------------------------

/// Lengths were validated by the caller: `dst` holds whole blocks that `src` covers.
pub(crate) fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => each_value(src, dst, f32_value),
        DType::F16 => each_value(src, dst, half_to_f32),
        DType::BF16 => each_value(src, dst, bf16_value),
        DType::Q4_0 => each_block(src, dst, |b: &BlockQ4_0, y: &mut [f32; QK]| {
            let d = half_to_f32(b.d);
            for (y, q) in y.iter_mut().zip(q4_0_quants(b)) {
                *y = d * f32::from(q);
            }
        }),
        DType::Q4_1 => each_block(src, dst, |b: &BlockQ4_1, y: &mut [f32; QK]| {
            let (d, m) = (half_to_f32(b.d), half_to_f32(b.m));
            for (y, q) in y.iter_mut().zip(q4_1_quants(b)) {
                *y = d * f32::from(q) + m;
            }
        }),
        DType::Q5_0 => each_block(src, dst, |b: &BlockQ5_0, y: &mut [f32; QK]| {
            let d = half_to_f32(b.d);
            for (y, q) in y.iter_mut().zip(q5_0_quants(b)) {
                *y = d * f32::from(q);
            }
        }),
        DType::Q5_1 => each_block(src, dst, |b: &BlockQ5_1, y: &mut [f32; QK]| {
            let (d, m) = (half_to_f32(b.d), half_to_f32(b.m));
            for (y, q) in y.iter_mut().zip(q5_1_quants(b)) {
                *y = d * f32::from(q) + m;
            }
        }),
        DType::Q8_0 => each_block(src, dst, |b: &BlockQ8_0, y: &mut [f32; QK]| {
            let d = half_to_f32(b.d);
            for (y, &q) in y.iter_mut().zip(&b.qs) {
                *y = d * f32::from(q);
            }
        }),
        DType::Q4_K => each_block(src, dst, |b: &BlockQ4K, y: &mut [f32; QK_K]| {
            dequantize_k(b.d, b.dmin, &b.scales, &k_quants(&b.qs, None), y);
        }),
        DType::Q5_K => each_block(src, dst, |b: &BlockQ5K, y: &mut [f32; QK_K]| {
            dequantize_k(b.d, b.dmin, &b.scales, &k_quants(&b.qs, Some(&b.qh)), y);
        }),
        DType::Q2_K => super::low_k::dequantize_q2_k(src, dst),
        DType::Q3_K => super::low_k::dequantize_q3_k(src, dst),
        DType::IQ2_XXS => super::grid::dequantize::<super::blocks::BlockIQ2XXS>(src, dst),
        DType::IQ2_XS => super::grid::dequantize::<super::blocks::BlockIQ2XS>(src, dst),
        DType::IQ2_S => super::grid::dequantize::<super::blocks::BlockIQ2S>(src, dst),
        DType::IQ1_S => super::grid::dequantize::<super::blocks::BlockIQ1S>(src, dst),
        DType::IQ1_M => super::grid::dequantize::<super::blocks::BlockIQ1M>(src, dst),
        DType::Q6_K => each_block(src, dst, |b: &BlockQ6K, y: &mut [f32; QK_K]| {
            let d = half_to_f32(b.d);
            for (i, (y, q)) in y.iter_mut().zip(q6_k_quants(b)).enumerate() {
                // Element l + 32k of a half uses scale l/16 + 2k of that half,
                // which is the same as one scale per 16 consecutive elements.
                *y = d * f32::from(b.scales[i / 16]) * f32::from(q as i8 - 32);
            }
        }),
        DType::IQ4_NL => lut4::dequantize_iq4_nl(src, dst),
        DType::IQ4_XS => lut4::dequantize_iq4_xs(src, dst),
        DType::MXFP4 => lut4::dequantize_mxfp4(src, dst),
        DType::TQ2_0 => super::ternary::dequantize::<super::blocks::BlockTQ2_0>(src, dst),
        DType::TQ1_0 => super::ternary::dequantize::<super::blocks::BlockTQ1_0>(src, dst),
        DType::IQ3_XXS => super::iq3::dequantize_iq3_xxs(src, dst),
        DType::IQ3_S => super::iq3::dequantize_iq3_s(src, dst),
    }
}

fn each_value<const B: usize>(src: &[u8], dst: &mut [f32], convert: fn([u8; B]) -> f32) {
    for (y, v) in dst.iter_mut().zip(src.as_chunks::<B>().0) {
        *y = convert(*v);
    }
}

fn dequantize_k(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], q: &[u8; QK_K], y: &mut [f32; QK_K]) {
    let (d, dmin) = (half_to_f32(d), half_to_f32(dmin));
    let (sc, m) = k_scales(scales);
    for (j, (y, q)) in y.as_chunks_mut::<32>().0.iter_mut().zip(q.as_chunks::<32>().0).enumerate() {
        let (scale, min) = (d * f32::from(sc[j]), dmin * f32::from(m[j]));
        for (y, &q) in y.iter_mut().zip(q) {
            *y = scale * f32::from(q) - min;
        }
    }
}

// ---- activation quantization -----------------------------------------------

/// The scale of an activation block and its reciprocal. Blocks whose scale
/// is zero or subnormal quantize to zeros: 1/d would overflow there, and the
/// values are far below anything a model's activations carry.
#[inline(always)]
pub(crate) fn act_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    // 127/amax, not 1/d: the two differ in the last bit for about a third
    // of blocks, which flips a quant now and then; GGML computes 127/amax.
    (d, if d.is_normal() { 127.0 / amax } else { 0.0 })
}

/// Largest magnitude of a block. Callers pass finite values; NaN handling
/// differs between this and the vector paths.
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Rounds ties to even, which is what the vector conversion instructions do.
fn quantize_into(x: &[f32], id: f32, q: &mut [i8]) -> i32 {
    let mut sum = 0;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += i32::from(*q);
    }
    sum
}

pub(crate) fn quantize_f32(x: &[f32], dst: &mut [u8]) {
    for (d, v) in dst.as_chunks_mut::<4>().0.iter_mut().zip(x) {
        *d = v.to_le_bytes();
    }
}

pub(crate) fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK>().0.iter().zip(blocks_mut::<BlockQ8_0>(dst)) {
        let (d, id) = act_scale(amax(x));
        y.d = f16::from_f32(d).to_le_bytes();
        quantize_into(x, id, &mut y.qs);
    }
}

pub(crate) fn quantize_q8_0s(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK>().0.iter().zip(blocks_mut::<BlockQ8_0S>(dst)) {
        let (d, id) = act_scale(amax(x));
        let sum = quantize_into(x, id, &mut y.qs) as i16;
        y.d = f16::from_f32(d).to_le_bytes();
        y.sum = sum.to_le_bytes();
    }
}

pub(crate) fn quantize_q8_1(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK>().0.iter().zip(blocks_mut::<BlockQ8_1>(dst)) {
        let (d, id) = act_scale(amax(x));
        let sum = quantize_into(x, id, &mut y.qs);
        y.d = f16::from_f32(d).to_le_bytes();
        y.s = f16::from_f32(d * sum as f32).to_le_bytes();
    }
}

pub(crate) fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK_K>().0.iter().zip(blocks_mut::<BlockQ8K>(dst)) {
        let (d, id) = act_scale(amax(x));
        y.d = d.to_le_bytes();
        for (g, (x, q)) in x.chunks_exact(16).zip(y.qs.chunks_exact_mut(16)).enumerate() {
            let sum = quantize_into(x, id, q) as i16;
            y.bsums[2 * g..2 * g + 2].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

// ---- dot products ----------------------------------------------------------

pub(crate) fn dot_float<const B: usize>(w: &[u8], a: &[u8], convert: fn([u8; B]) -> f32) -> f32 {
    let mut acc = [0.0; LANES];
    accumulate_float(&mut acc, w, a, convert);
    reduce_lanes(acc)
}

/// What one block of Q4_1/Q5_1 contributes: the weight and activation
/// scales of its lane sums, and the offset pair `(m_w, s_a)`, `s_a` being
/// the activation block's scaled sum `d · Σq` (see `BlockQ8_1`).
struct LegacyBlock {
    d_w: f32,
    d_a: f32,
    lanes: [i32; LEGACY_LANES],
    offset: (f32, f32),
}

/// Lane `k`: the integer dot of elements `4k..4k+4`.
fn lane_sums<Q: Copy + Into<i32>>(q: &[Q; QK], a: &[i8; QK]) -> [i32; LEGACY_LANES] {
    std::array::from_fn(|k| idot(&q[4 * k..4 * k + 4], &a[4 * k..4 * k + 4]))
}

/// The lanes take `(d_w · d_a) · lane` fused, block by block; the offsets `m_w · s_a`
/// are summed apart, fused too, and added after the lanes are reduced.
fn dot_legacy<W: bytemuck::Pod>(w: &[u8], a: &[u8], block: impl Fn(&W, &BlockQ8_1) -> LegacyBlock) -> f32 {
    let mut acc = [0.0f32; LEGACY_LANES];
    let mut offsets = 0.0f32;
    for (w, a) in blocks::<W>(w).iter().zip(blocks::<BlockQ8_1>(a)) {
        let b = block(w, a);
        let scale = b.d_w * b.d_a;
        for (acc, lane) in acc.iter_mut().zip(b.lanes) {
            *acc = scale.mul_add(lane as f32, *acc);
        }
        offsets = b.offset.0.mul_add(b.offset.1, offsets);
    }
    reduce_legacy_lanes(acc) + offsets
}

fn dot_symmetric<W: bytemuck::Pod>(w: &[u8], a: &[u8], quants: impl Fn(&W) -> ([u8; 2], [i8; QK])) -> f32 {
    dot_blocks(w, a, |acc, w: &W, a: &BlockQ8_0S| {
        let (d, q) = quants(w);
        finish_symmetric(acc, half_to_f32(d), half_to_f32(a.d), idot(&q, &a.qs))
    })
}

pub(crate) fn dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    dot_symmetric(w, a, |w: &BlockQ4_0| (w.d, q4_0_quants(w)))
}

pub(crate) fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    dot_legacy(w, a, |w: &BlockQ4_1, a| LegacyBlock {
        d_w: half_to_f32(w.d),
        d_a: half_to_f32(a.d),
        lanes: lane_sums(&q4_1_quants(w), &a.qs),
        offset: (half_to_f32(w.m), half_to_f32(a.s)),
    })
}

pub(crate) fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    dot_symmetric(w, a, |w: &BlockQ5_0| (w.d, q5_0_quants(w)))
}

pub(crate) fn dot_q5_1(w: &[u8], a: &[u8]) -> f32 {
    dot_legacy(w, a, |w: &BlockQ5_1, a| LegacyBlock {
        d_w: half_to_f32(w.d),
        d_a: half_to_f32(a.d),
        lanes: lane_sums(&q5_1_quants(w), &a.qs),
        offset: (half_to_f32(w.m), half_to_f32(a.s)),
    })
}

pub(crate) fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    dot_symmetric(w, a, |w: &BlockQ8_0| (w.d, w.qs))
}

/// Q4_K and Q5_K: Σ_j sc_j·(q·a)_j and Σ_j m_j·(Σa)_j over the eight sub-blocks.
fn kquant_sums(scales: &[u8; 12], q: &[u8; QK_K], a: &BlockQ8K) -> (i32, i32) {
    let (sc, m) = k_scales(scales);
    let (mut isum, mut isum_min) = (0i32, 0i32);
    for j in 0..8 {
        let dot = idot(&q[32 * j..32 * j + 32], &a.qs[32 * j..32 * j + 32]);
        isum = isum.wrapping_add(i32::from(sc[j]).wrapping_mul(dot));
        isum_min = isum_min.wrapping_add(i32::from(m[j]) * (bsum(a, 2 * j) + bsum(a, 2 * j + 1)));
    }
    (isum, isum_min)
}

pub(crate) fn dot_q4_k(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockQ4K, a: &BlockQ8K| {
        let (isum, isum_min) = kquant_sums(&w.scales, &k_quants(&w.qs, None), a);
        finish_kquant(acc, half_to_f32(w.d), half_to_f32(w.dmin), f32::from_le_bytes(a.d), isum, isum_min)
    })
}

pub(crate) fn dot_q5_k(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockQ5K, a: &BlockQ8K| {
        let (isum, isum_min) = kquant_sums(&w.scales, &k_quants(&w.qs, Some(&w.qh)), a);
        finish_kquant(acc, half_to_f32(w.d), half_to_f32(w.dmin), f32::from_le_bytes(a.d), isum, isum_min)
    })
}

/// Σ_g sc_g·(q·a)_g − 32·Σ_g sc_g·(Σa)_g over the sixteen 16-element groups,
/// with unsigned quants: the offset of 32 goes through the activation sums.
pub(crate) fn dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockQ6K, a: &BlockQ8K| {
        let q = q6_k_quants(w);
        let (mut isum, mut isum_offset) = (0i32, 0i32);
        for g in 0..16 {
            let sc = i32::from(w.scales[g]);
            isum = isum.wrapping_add(sc.wrapping_mul(idot(&q[16 * g..16 * g + 16], &a.qs[16 * g..16 * g + 16])));
            isum_offset = isum_offset.wrapping_add(sc * bsum(a, g));
        }
        let isum = isum.wrapping_sub(isum_offset.wrapping_mul(32));
        finish_scaled(acc, half_to_f32(w.d), f32::from_le_bytes(a.d), isum)
    })
}
