//! x86-64 kernels at two levels: AVX2 (with FMA and F16C) and AVX-512
//! (F/BW/VL/VNNI on top of those).
//!
//! Both compute each block's integer sums exactly as the scalar reference
//! does and then apply the reference's float steps (`scalar::finish_*`,
//! lane by lane) in the same order, so a level changes speed, never a
//! result. The file-layout dots of the legacy formats stay 256 bits wide
//! at the AVX-512 level: a block is 32 quants, so a wider vector would need
//! a reduction per half anyway; that level gains from VNNI's fused byte
//! and word dots instead, and from 16-wide float dots.
//! The K-quants' 256-quant blocks take two 32-quant sub-blocks per 512-bit
//! vector there, whose halves are added once per block.
//!
//! Every `#[target_feature]` function here is only reachable through
//! [`super::Kernels`], which is only built for a level the CPU supports.

mod activations;
mod grid;
mod iq3;
mod kquant;
mod kquant_low;
mod loads;
mod lut4;
mod packed;
mod packed_low;
mod packed_ops;
mod packed_wide;
mod ternary;

pub(super) use activations::quantize;

use std::arch::x86_64::*;

use half::f16;

use super::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_0S, BlockQ8_1,
    BlockQ8K, QK, QK_K, blocks, blocks_mut, k_scales,
};
use super::entries::{Dot, PackedDot, QuantizeFn, WideDot};
use super::scalar::{self, LANES};
use super::{ActFormat, DType};
use crate::quant::packed as layout;
use loads::{load_f32x8, load_i8x16, load_i8x32, load_u8x16, load_u8x32};

// ---- helpers shared by both levels -----------------------------------------

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The 32 quants of a 16-byte nibble array in element order: low nibbles
/// are elements 0..16, high nibbles 16..32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn nibbles(qs: &[u8; 16]) -> __m256i {
    // Both halves get the 16 bytes; shifting only the upper half by 4 moves
    // its high nibbles down (the bits shifted in from the next byte land in
    // the high nibble, which the mask clears).
    let both = _mm256_broadcastsi128_si256(load_u8x16(qs));
    let shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0xF))
}

/// 0xFF in byte `j` where bit `j` of the little-endian `bits` is set.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn set_bit_bytes(bits: [u8; 4]) -> __m256i {
    // Byte j of the result starts as byte j/8 of `bits` (pshufb works per
    // 128-bit lane, and every lane holds a copy), then tests bit j%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(i32::from_le_bytes(bits)),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// 0x10 in byte `j` where bit `j` of the little-endian `qh` is set.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn fifth_bits(qh: [u8; 4]) -> __m256i {
    _mm256_and_si256(set_bit_bytes(qh), _mm256_set1_epi8(0x10))
}

/// Four pairs of adjacent f16 fields (a scale and an offset, one little-endian
/// word each) as two f32 vectors: the first fields, the second fields.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn half_pairs4(pairs: [u32; 4]) -> (__m128, __m128) {
    let words = _mm_setr_epi32(pairs[0] as i32, pairs[1] as i32, pairs[2] as i32, pairs[3] as i32);
    let split = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(words), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    (_mm256_castps256_ps128(split), _mm256_extractf128_ps::<1>(split))
}

/// An f16 in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn broadcast_half(bits: [u8; 2]) -> __m128 {
    _mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bits)))
}

/// Lanes 0..R.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lanes<const R: usize>(v: __m128) -> [f32; R] {
    let mut all = [0.0f32; 4];
    // SAFETY: stores 4 floats into the 4 floats of `all`.
    unsafe { _mm_storeu_ps(all.as_mut_ptr(), v) };
    std::array::from_fn(|r| all[r])
}

/// R weight rows and A activation rows as blocks, cut to the blocks all of
/// them have (they are the same length when the caller validated them).
#[inline(always)]
fn rows<'a, W: bytemuck::Pod, Act: bytemuck::Pod, const R: usize, const A: usize>(
    w: [&'a [u8]; R],
    a: [&'a [u8]; A],
) -> ([&'a [W]; R], [&'a [Act]; A]) {
    const { assert!(R >= 1 && R <= 4 && A >= 1) };
    let w = w.map(blocks::<W>);
    let a = a.map(blocks::<Act>);
    let n = w.iter().map(|row| row.len()).chain(a.iter().map(|row| row.len())).min().unwrap_or(0);
    (w.map(|row| &row[..n]), a.map(|row| &row[..n]))
}

/// The scale fields of an offset legacy weight block as 4 bytes: `d` then
/// `m`.
trait ScaleBytes {
    fn scale_bytes(&self) -> [u8; 4];
}

macro_rules! scale_bytes {
    ($($block:ty => |$x:ident| $bytes:expr),* $(,)?) => {
        $(impl ScaleBytes for $block {
            #[inline(always)]
            fn scale_bytes(&self) -> [u8; 4] {
                let $x = self;
                $bytes
            }
        })*
    };
}

scale_bytes! {
    BlockQ4_1 => |x| [x.d[0], x.d[1], x.m[0], x.m[1]],
    BlockQ5_1 => |x| [x.d[0], x.d[1], x.m[0], x.m[1]],
}

/// Lane `r` of `v` in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn spread_lane(v: __m128, r: usize) -> __m256 {
    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(r as i32))
}

/// The reference's reduction of the eight legacy lanes
/// ([`scalar::reduce_legacy_lanes`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn reduce_legacy_lanes(v: __m256) -> f32 {
    let half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)))
}

// ---- per-level primitives --------------------------------------------------

/// Without VNNI, byte dots go through i16 pair sums (`vpmaddubsw`), which
/// saturate at ±32767; no valid block gets there, because weight quants
/// stay within ±128 and activation quants within ±127.
mod avx2_ops {
    use std::arch::x86_64::*;

    use super::{load_i8x32, load_u8x32};

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn dot_u8i8(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn madd_i16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }

    /// A K-quant sub-block pair's i32 sums: one vector takes both (the
    /// order of exact integer sums is free), so that eight of them fit
    /// AVX2's sixteen registers beside the operands.
    pub(super) type PairSum = __m256i;

    /// 64 bytes: two 32-byte sub-blocks.
    pub(super) type PairBytes = [__m256i; 2];

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn pair_bytes(first: __m256i, second: __m256i) -> PairBytes {
        [first, second]
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn load_pair(b: &[i8; 64]) -> PairBytes {
        let (halves, _) = b.as_chunks::<32>();
        [load_i8x32(&halves[0]), load_i8x32(&halves[1])]
    }

    /// `acc` plus the word-weighted byte dots of both sub-blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn madd_pair(acc: PairSum, q: PairBytes, act: PairBytes, scales: PairBytes) -> PairSum {
        let acc = madd_i16(acc, _mm256_maddubs_epi16(q[0], act[0]), scales[0]);
        madd_i16(acc, _mm256_maddubs_epi16(q[1], act[1]), scales[1])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn zero_pair_sum() -> PairSum {
        _mm256_setzero_si256()
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn narrow(sum: PairSum) -> __m256i {
        sum
    }

    /// The 16 float-dot lanes as two vectors: lanes 0..8 and 8..16.
    pub(super) type F32x16 = [__m256; 2];

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn zero16() -> F32x16 {
        [_mm256_setzero_ps(); 2]
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn fma16(acc: F32x16, w: F32x16, x: F32x16) -> F32x16 {
        [_mm256_fmadd_ps(w[0], x[0], acc[0]), _mm256_fmadd_ps(w[1], x[1], acc[1])]
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn load16_f32(b: &[u8; 64]) -> F32x16 {
        // SAFETY: reads the 64 bytes of `b` as two unaligned 32-byte loads.
        unsafe { [_mm256_loadu_ps(b.as_ptr().cast()), _mm256_loadu_ps(b.as_ptr().add(32).cast())] }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn load16_f16(b: &[u8; 32]) -> F32x16 {
        let v = load_u8x32(b);
        [_mm256_cvtph_ps(_mm256_castsi256_si128(v)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(v))]
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn load16_bf16(b: &[u8; 32]) -> F32x16 {
        let v = load_u8x32(b);
        let widen = |h: __m128i| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
        [widen(_mm256_castsi256_si128(v)), widen(_mm256_extracti128_si256::<1>(v))]
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn lanes16(v: F32x16) -> [f32; 16] {
        let mut out = [0.0; 16];
        // SAFETY: two 8-float stores into the 16 floats of `out`.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), v[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), v[1]);
        }
        out
    }
}

/// VNNI accumulates byte and word dots straight into i32 without
/// saturation.
mod avx512_ops {
    use std::arch::x86_64::*;

    use super::load_u8x32;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn dot_u8i8(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }

    /// A K-quant sub-block pair in one 512-bit vector: the first sub-block
    /// in the low half, the second in the high half; halves the byte and
    /// word dots per activation row against two 256-bit steps.
    pub(super) type PairSum = __m512i;

    pub(super) type PairBytes = __m512i;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn pair_bytes(first: __m256i, second: __m256i) -> PairBytes {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn load_pair(b: &[i8; 64]) -> PairBytes {
        // SAFETY: reads the 64 bytes of `b`; unaligned loads have no alignment requirement.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn madd_pair(acc: PairSum, q: PairBytes, act: PairBytes, scales: PairBytes) -> PairSum {
        _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, act), scales)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn zero_pair_sum() -> PairSum {
        _mm512_setzero_si512()
    }

    /// The two halves' sums added lane by lane (exact integers).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn narrow(sum: PairSum) -> __m256i {
        _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64::<1>(sum))
    }

    pub(super) type F32x16 = __m512;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn zero16() -> F32x16 {
        _mm512_setzero_ps()
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn fma16(acc: F32x16, w: F32x16, x: F32x16) -> F32x16 {
        _mm512_fmadd_ps(w, x, acc)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn load16_f32(b: &[u8; 64]) -> F32x16 {
        // SAFETY: reads the 64 bytes of `b`; unaligned loads have no alignment requirement.
        unsafe { _mm512_loadu_ps(b.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn load16_f16(b: &[u8; 32]) -> F32x16 {
        _mm512_cvtph_ps(load_u8x32(b))
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn load16_bf16(b: &[u8; 32]) -> F32x16 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(load_u8x32(b))))
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn lanes16(v: F32x16) -> [f32; 16] {
        let mut out = [0.0; 16];
        // SAFETY: one 16-float store into the 16 floats of `out`.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out
    }
}

// ---- dot kernels, written once for both levels -----------------------------
//
// The quantized kernels take R weight rows against A activation rows: a
// weight block is decoded once for all A rows (and, in the legacy kernels,
// an activation block loaded once for all R rows), the integer sums are
// reduced together, and each lane of the float vectors follows one (weight
// row, activation row) pair through the reference's float steps (legacy:
// lane r of activation row i's vector is weight row r; K-quants: lane
// i·R + r of one vector). Each lane therefore equals the single-row
// reference, whatever R and A.

/// A float-weight dot: whole 16-element chunks in vectors, then the tail
/// into the same lanes and the reference reduction. `$tile` takes R weight
/// rows against A activation rows with one accumulator per pair, each fed
/// the same FMAs in the same order as `$name`'s one, so its bits are
/// `$name`'s; R × A independent chains keep the FMA units busy where one
/// chain waits out each FMA's latency (3.5× on a vision tower's f32
/// matrices).
macro_rules! float_dot {
    ($features:literal, $name:ident, $tile:ident, $bytes:literal, $load:path, $convert:path) => {
        #[target_feature(enable = $features)]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            let [[value]] = $tile::<1, 1>([w], [a]);
            value
        }

        #[target_feature(enable = $features)]
        fn $tile<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            let wv = w.map(|w| w.as_chunks::<{ 16 * $bytes }>().0);
            let av = a.map(|a| a.as_chunks::<64>().0);
            let done = wv.iter().map(|w| w.len()).chain(av.iter().map(|a| a.len())).min().unwrap_or(0);
            let mut acc = [[ops::zero16(); R]; A];
            for k in 0..done {
                let x: [_; A] = std::array::from_fn(|i| ops::load16_f32(&av[i][k]));
                for r in 0..R {
                    let weights = $load(&wv[r][k]);
                    for i in 0..A {
                        acc[i][r] = ops::fma16(acc[i][r], weights, x[i]);
                    }
                }
            }
            // Plain loops, not closures, so that the accumulators stay
            // registers: a closure borrowing them kept them in memory,
            // stored back on every step of the loop above (half the speed).
            let mut out = [[0.0; R]; A];
            for i in 0..A {
                for r in 0..R {
                    let mut lanes = ops::lanes16(acc[i][r]);
                    scalar::accumulate_float(&mut lanes, &w[r][16 * $bytes * done..], &a[i][64 * done..], $convert);
                    out[i][r] = scalar::reduce_lanes(lanes);
                }
            }
            out
        }
    };
}

/// The one-row and four-row entry points of an R×A kernel (`A` = 1); the
/// four-row entry reads the rows side by side, sharing each activation
/// block.
macro_rules! legacy_entries {
    ($features:literal, $one:ident, $four:ident, $kernel:ident) => {
        #[target_feature(enable = $features)]
        fn $one(w: &[u8], a: &[u8]) -> f32 {
            let [[value]] = $kernel::<1, 1>([w], [a]);
            value
        }

        #[target_feature(enable = $features)]
        fn $four(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let [values] = $kernel::<4, 1>(w, [a]);
            values
        }
    };
}

/// The entry points of a K-quant kernel ([`kquant`]), as R × A calls with
/// R · A = 8 where there are enough rows (the lanes of the per-block float
/// step), at most two weight rows read side by side. Against one
/// activation row (decoding) the weight rows go one at a time: four read
/// side by side, block by block, decoded a 1B Q6_K model at half the speed
/// on a 2-core EPYC.
macro_rules! kquant_entries {
    ($features:literal, $kernel:ident, $one:ident, $four:ident, $two_pairs:ident, $four_by_eight:ident) => {
        #[target_feature(enable = $features)]
        fn $one(w: &[u8], a: &[u8]) -> f32 {
            let [[value]] = $kernel::<1, 1>([w], [a]);
            value
        }

        #[target_feature(enable = $features)]
        fn $four(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let mut out = [0.0; 4];
            for (r, w) in w.into_iter().enumerate() {
                let [[value]] = $kernel::<1, 1>([w], [a]);
                out[r] = value;
            }
            out
        }

        /// Four weight rows as two pairs, each read side by side, against
        /// `A` (2 or 4) activation rows.
        #[target_feature(enable = $features)]
        fn $two_pairs<const A: usize>(w: [&[u8]; 4], a: [&[u8]; A]) -> [[f32; 4]; A] {
            let (first, second) = ($kernel::<2, A>([w[0], w[1]], a), $kernel::<2, A>([w[2], w[3]], a));
            std::array::from_fn(|i| [first[i][0], first[i][1], second[i][0], second[i][1]])
        }

        #[target_feature(enable = $features)]
        fn $four_by_eight(w: [&[u8]; 4], a: [&[u8]; 8]) -> [[f32; 4]; 8] {
            let mut out = [[0.0; 4]; 8];
            for (r, w) in w.into_iter().enumerate() {
                for (i, [value]) in $kernel::<1, 8>([w], a).into_iter().enumerate() {
                    out[i][r] = value;
                }
            }
            out
        }
    };
}

/// A kernel for the legacy block formats with an offset (a scale and an
/// offset per 32 weights) against `A` activation rows at once: each weight
/// block is decoded once and dotted with every activation row, while each
/// (weight row, activation row) pair goes through exactly the steps of the
/// reference's `dot_legacy`, so results do not depend on `R` or `A`.
/// `$weights` decodes block `$x` into 32 unsigned quants in element order.
macro_rules! legacy_kernel {
    ($features:literal, $name:ident, $wblock:ty, |$x:ident| $weights:expr) => {
        #[target_feature(enable = $features)]
        fn $name<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            let (w, a) = rows::<$wblock, BlockQ8_1, R, A>(w, a);
            let mut acc = [[_mm256_setzero_ps(); R]; A];
            // Lane r: the sum of row r's offsets, for the formats with one.
            let mut offsets = [_mm_setzero_ps(); A];
            for b in 0..a[0].len() {
                let mut scale_fields = [0u32; 4];
                for r in 0..R {
                    scale_fields[r] = u32::from_le_bytes(w[r][b].scale_bytes());
                }
                let (d_w, m_w) = half_pairs4(scale_fields);
                let mut av = [_mm256_setzero_si256(); A];
                let mut scales = [_mm_setzero_ps(); A];
                for i in 0..A {
                    let y = &a[i][b];
                    av[i] = load_i8x32(&y.qs);
                    scales[i] = _mm_mul_ps(d_w, broadcast_half(y.d));
                    offsets[i] = _mm_fmadd_ps(m_w, broadcast_half(y.s), offsets[i]);
                }
                for r in 0..R {
                    let $x = &w[r][b];
                    let q = $weights;
                    for i in 0..A {
                        let products = _mm256_cvtepi32_ps(unsigned_dot(q, av[i]));
                        acc[i][r] = _mm256_fmadd_ps(spread_lane(scales[i], r), products, acc[i][r]);
                    }
                }
            }
            std::array::from_fn(|i| {
                let offsets: [f32; 4] = lanes(offsets[i]);
                std::array::from_fn(|r| reduce_legacy_lanes(acc[i][r]) + offsets[r])
            })
        }
    };
}

/// The one-row dot of a legacy format without an offset (Q4_0, Q5_0,
/// Q8_0), for rows that are not packed: `$weights` decodes block `$x` into
/// its 32 signed quants in element order; each block's integer sum is
/// reduced and takes the reference's float step.
macro_rules! symmetric_dot {
    ($features:literal, $name:ident, $wblock:ty, |$x:ident| $weights:expr) => {
        #[target_feature(enable = $features)]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            let ([w], [a]) = rows::<$wblock, BlockQ8_0S, 1, 1>([w], [a]);
            let mut acc = 0.0;
            for ($x, y) in w.iter().zip(a) {
                let isum = hsum_i32(signed_dot($weights, load_i8x32(&y.qs)));
                acc = scalar::finish_symmetric(acc, scalar::half_to_f32($x.d), scalar::half_to_f32(y.d), isum);
            }
            acc
        }
    };
}

/// `$width`: `wide` where the level runs the wide kernels
/// (`packed_wide.rs`), `narrow` where it does not (and never compiles them).
macro_rules! dot_kernels {
    ($level:ident, $ops:ident, $features:literal, $width:ident) => {
        pub(super) mod $level {
            use super::$ops as ops;
            // From the crate, not `super::*`: `cargo xtask module-cycles`
            // reads macros as text and would take that `super` for this
            // file's parent rather than this file.
            use crate::quant::x86::*;

            /// The kernels of `dtype`: float weights run row by row; the
            /// legacy block formats take four weight rows against one, two
            /// or four activation rows; the K-quants also against eight.
            pub(in super::super) fn kernels(dtype: DType) -> Dot {
                macro_rules! legacy {
                    ($one:ident, $four:ident, $kernel:ident) => {
                        Dot {
                            one: $one,
                            four: Some($four),
                            four_by_two: Some($kernel::<4, 2>),
                            four_by_four: Some($kernel::<4, 4>),
                            four_by_eight: None,
                            packed: None,
                        }
                    };
                }
                macro_rules! kquant {
                    ($one:ident, $four:ident, $two_pairs:ident, $by_eight:ident, $packed:expr) => {
                        Dot {
                            one: $one,
                            four: Some($four),
                            four_by_two: Some($two_pairs::<2>),
                            four_by_four: Some($two_pairs::<4>),
                            four_by_eight: Some($by_eight),
                            packed: $packed,
                        }
                    };
                }
                // Four by four needs 16 accumulators: AVX-512's 32 registers
                // hold them, AVX2's 16 (two per 16-lane vector) would spill.
                let wide = $features.contains("avx512f");
                macro_rules! float {
                    ($one:ident, $tile:ident) => {
                        Dot {
                            one: $one,
                            four: None,
                            four_by_two: Some($tile::<4, 2>),
                            four_by_four: if wide { Some($tile::<4, 4>) } else { None },
                            four_by_eight: None,
                            packed: None,
                        }
                    };
                }
                let symmetric = |one, packed| Dot {
                    one,
                    four: None,
                    four_by_two: None,
                    four_by_four: None,
                    four_by_eight: None,
                    packed: Some(packed),
                };
                // One and four weight rows against one activation row;
                // more activation rows repeat the four-row kernel.
                let row_major = |one, four, packed| Dot {
                    one,
                    four: Some(four),
                    four_by_two: None,
                    four_by_four: None,
                    four_by_eight: None,
                    packed,
                };
                // Every row on its own (the grid i-quants: their grid
                // lookups, not the activation loads, bound the speed).
                let row_by_row = |one| Dot {
                    one,
                    four: None,
                    four_by_two: None,
                    four_by_four: None,
                    four_by_eight: None,
                    packed: None,
                };
                macro_rules! packed {
                    ($kernel:ident) => {
                        packed!($kernel, None)
                    };
                    ($kernel:ident, $wide:expr) => {
                        PackedDot {
                            groups: pk::GROUPS,
                            one: $kernel::<1>,
                            four: $kernel::<4>,
                            eight: pk::EIGHT_ACTS.then_some($kernel::<8>),
                            wide: $wide,
                        }
                    };
                }
                // A widening and the wide kernel for runs of `$sub` elements
                // (with minima or not), where the level runs them.
                macro_rules! wide {
                    ($widen:ident, $sub:literal, $minima:literal) => {
                        with_width!($width, Some(WideDot {
                            widen: $widen,
                            one: wide_kernel::<1, $sub, $minima>,
                            four: wide_kernel::<4, $sub, $minima>,
                            eight: wide_kernel::<8, $sub, $minima>,
                        }), None)
                    };
                }
                match dtype {
                    DType::F32 => float!(dot_f32, tile_f32),
                    DType::F16 => float!(dot_f16, tile_f16),
                    DType::BF16 => float!(dot_bf16, tile_bf16),
                    DType::Q4_0 => symmetric(dot_q4_0, packed!(packed_q4_0)),
                    DType::Q4_1 => legacy!(one_q4_1, four_q4_1, dot_q4_1),
                    DType::Q5_0 => symmetric(dot_q5_0, packed!(packed_q5_0)),
                    DType::Q5_1 => legacy!(one_q5_1, four_q5_1, dot_q5_1),
                    DType::Q8_0 => symmetric(dot_q8_0, packed!(packed_q8_0)),
                    DType::Q4_K => {
                        kquant!(one_q4_k, four_q4_k, two_pairs_q4_k, four_by_eight_q4_k, Some(packed!(packed_q4_k)))
                    }
                    DType::Q5_K => {
                        let wide = wide!(widen_q5_k, 32, true);
                        kquant!(
                            one_q5_k,
                            four_q5_k,
                            two_pairs_q5_k,
                            four_by_eight_q5_k,
                            Some(packed!(packed_q5_k, wide))
                        )
                    }
                    DType::Q6_K => {
                        let wide = wide!(widen_q6_k, 16, false);
                        kquant!(
                            one_q6_k,
                            four_q6_k,
                            two_pairs_q6_k,
                            four_by_eight_q6_k,
                            Some(packed!(packed_q6_k, wide))
                        )
                    }
                    DType::IQ4_NL => row_major(one_iq4_nl, four_iq4_nl, None),
                    DType::IQ4_XS => {
                        row_major(one_iq4_xs, four_iq4_xs, Some(packed!(packed_iq4_xs, wide!(widen_iq4_xs, 32, false))))
                    }
                    DType::MXFP4 => row_major(one_mxfp4, four_mxfp4, Some(packed!(packed_mxfp4))),
                    DType::Q2_K => {
                        kquant!(one_q2_k, four_q2_k, two_pairs_q2_k, four_by_eight_q2_k, Some(packed!(packed_q2_k)))
                    }
                    DType::Q3_K => {
                        let wide = wide!(widen_q3_k, 16, false);
                        kquant!(one_q3_k, four_q3_k, two_pairs_q3_k, four_by_eight_q3_k, Some(packed!(packed_q3_k, wide)))
                    }
                    DType::TQ2_0 => kquant!(one_tq2_0, four_tq2_0, two_pairs_tq2_0, four_by_eight_tq2_0, None),
                    DType::TQ1_0 => kquant!(one_tq1_0, four_tq1_0, two_pairs_tq1_0, four_by_eight_tq1_0, None),
                    DType::IQ3_XXS => {
                        kquant!(one_iq3_xxs, four_iq3_xxs, two_pairs_iq3_xxs, four_by_eight_iq3_xxs, None)
                    }
                    DType::IQ3_S => kquant!(one_iq3_s, four_iq3_s, two_pairs_iq3_s, four_by_eight_iq3_s, None),
                    DType::IQ2_XXS => row_by_row(one_signed::<BlockIQ2XXS>),
                    DType::IQ2_XS => row_by_row(one_signed::<BlockIQ2XS>),
                    DType::IQ2_S => row_by_row(one_signed::<BlockIQ2S>),
                    DType::IQ1_S => row_by_row(one_offset::<BlockIQ1S>),
                    DType::IQ1_M => row_by_row(one_offset::<BlockIQ1M>),
                }
            }

            float_dot!($features, dot_f32, tile_f32, 4, ops::load16_f32, scalar::f32_value);
            float_dot!($features, dot_f16, tile_f16, 2, ops::load16_f16, scalar::half_to_f32);
            float_dot!($features, dot_bf16, tile_bf16, 2, ops::load16_bf16, scalar::bf16_value);
            legacy_entries!($features, one_q4_1, four_q4_1, dot_q4_1);
            legacy_entries!($features, one_q5_1, four_q5_1, dot_q5_1);
            kquant_entries!($features, dot_q4_k, one_q4_k, four_q4_k, two_pairs_q4_k, four_by_eight_q4_k);
            kquant_entries!($features, dot_q5_k, one_q5_k, four_q5_k, two_pairs_q5_k, four_by_eight_q5_k);
            kquant_entries!($features, dot_q6_k, one_q6_k, four_q6_k, two_pairs_q6_k, four_by_eight_q6_k);
            kquant_entries!($features, dot_q2_k, one_q2_k, four_q2_k, two_pairs_q2_k, four_by_eight_q2_k);
            kquant_entries!($features, dot_q3_k, one_q3_k, four_q3_k, two_pairs_q3_k, four_by_eight_q3_k);
            kquant_entries!($features, dot_tq2_0, one_tq2_0, four_tq2_0, two_pairs_tq2_0, four_by_eight_tq2_0);
            kquant_entries!($features, dot_tq1_0, one_tq1_0, four_tq1_0, two_pairs_tq1_0, four_by_eight_tq1_0);
            kquant_entries!(
                $features,
                dot_iq3_xxs,
                one_iq3_xxs,
                four_iq3_xxs,
                two_pairs_iq3_xxs,
                four_by_eight_iq3_xxs
            );
            kquant_entries!($features, dot_iq3_s, one_iq3_s, four_iq3_s, two_pairs_iq3_s, four_by_eight_iq3_s);

            /// Signed × signed bytes through the unsigned × signed dot: |w| and
            /// a with w's sign. |−128| reads as 128 unsigned, so every i8
            /// weight works; activations must not hold −128.
            #[target_feature(enable = $features)]
            #[inline]
            fn signed_dot(w: __m256i, a: __m256i) -> __m256i {
                ops::dot_u8i8(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(a, w))
            }

            symmetric_dot!($features, dot_q4_0, BlockQ4_0, |x| _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8)));
            legacy_kernel!($features, dot_q4_1, BlockQ4_1, |x| nibbles(&x.qs));
            symmetric_dot!($features, dot_q5_0, BlockQ5_0, |x| {
                _mm256_sub_epi8(_mm256_or_si256(nibbles(&x.qs), fifth_bits(x.qh)), _mm256_set1_epi8(16))
            });
            legacy_kernel!($features, dot_q5_1, BlockQ5_1, |x| _mm256_or_si256(nibbles(&x.qs), fifth_bits(x.qh)));
            symmetric_dot!($features, dot_q8_0, BlockQ8_0, |x| load_i8x32(&x.qs));

            #[target_feature(enable = $features)]
            #[inline]
            fn unsigned_dot(w: __m256i, a: __m256i) -> __m256i {
                ops::dot_u8i8(_mm256_setzero_si256(), w, a)
            }

            kquant::kquant_kernels!($features);
            lut4::lut4_kernels!($features);
            kquant_low::low_k_kernels!($features);
            ternary::ternary_kernels!($features);
            iq3::iq3_kernels!($features);
            grid::grid_kernels!($features);
            packed::packed_kernels!($features, $ops);
            packed_low::packed_low_kernels!($features);
            with_width!($width, items { packed_wide::packed_wide_kernels!($features); });
        }
    };
}

/// `$wide` at a `wide` level, `$narrow` at a `narrow` one; `items { … }`
/// only at a `wide` level.
macro_rules! with_width {
    (wide, items { $($items:tt)* }) => {
        $($items)*
    };
    (narrow, items { $($items:tt)* }) => {};
    (wide, $wide:expr, $narrow:expr) => {
        $wide
    };
    (narrow, $wide:expr, $narrow:expr) => {
        $narrow
    };
}

// Without VNNI a byte dot's pair sums are 16-bit, which the wide kernels'
// unsigned quants (up to 255) can overflow.
dot_kernels!(avx2, avx2_ops, "avx2,fma,f16c", narrow);
dot_kernels!(avx512, avx512_ops, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", wide);
