//! x86-64 kernels at two levels: AVX2 (with FMA and F16C) and AVX-512
//! (F/BW/VL/VNNI on top of those).
//!
//! Both compute each block's integer sums exactly as the scalar reference
//! does and then apply the reference's float steps (`scalar::finish_*`, of
//! which the `finish_*4` functions are lane-wise twins) in the same order,
//! so a level changes speed, never a result. The quantized dots stay
//! 256 bits wide at the AVX-512 level: a block is 32 quants, so a wider
//! vector would need a reduction per half anyway; that level gains from
//! VNNI's fused byte and word dots instead, and from 16-wide float dots.
//!
//! Every `#[target_feature]` function here is only reachable through
//! [`super::Kernels`], which is only built for a level the CPU supports.

mod activations;

pub(super) use activations::quantize;

use std::arch::x86_64::*;

use half::f16;

use super::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K, QK, QK_K,
    blocks, blocks_mut, k_scales,
};
use super::scalar::{self, LANES};
use super::{ActFormat, DType, Dot4Fn, Dot4x2Fn, Dot4x4Fn, DotFn, QuantizeFn};

// ---- helpers shared by both levels -----------------------------------------

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_u8x16(b: &[u8; 16]) -> __m128i {
    // SAFETY: reads the 16 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_i8x16(b: &[i8; 16]) -> __m128i {
    // SAFETY: reads the 16 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_u8x32(b: &[u8; 32]) -> __m256i {
    // SAFETY: reads the 32 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_i8x32(b: &[i8; 32]) -> __m256i {
    // SAFETY: reads the 32 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_f32x8(x: &[f32; 8]) -> __m256 {
    // SAFETY: reads the 8 floats of `x`; unaligned loads have no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

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

/// 0x10 in byte `j` where bit `j` of the little-endian `qh` is set.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn fifth_bits(qh: [u8; 4]) -> __m256i {
    // Byte j of the result starts as byte j/8 of qh (pshufb works per 128-bit
    // lane, and every lane holds a copy of qh), then tests bit j%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(i32::from_le_bytes(qh)),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Lane r: the sum of the eight lanes of `v[r]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum4(v: [__m256i; 4]) -> __m128i {
    // Per 128-bit half, hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3]; twice
    // more gives each vector's half-sum in its own lane.
    let t = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t))
}

/// Four f16 values as f32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn halves4(bits: [u16; 4]) -> __m128 {
    let packed = u64::from(bits[0]) | u64::from(bits[1]) << 16 | u64::from(bits[2]) << 32 | u64::from(bits[3]) << 48;
    _mm_cvtph_ps(_mm_cvtsi64_si128(packed as i64))
}

/// Two adjacent f16 fields (a scale and an offset) as one word.
#[inline(always)]
fn half_pair(first: [u8; 2], second: [u8; 2]) -> u32 {
    u32::from_le_bytes([first[0], first[1], second[0], second[1]])
}

/// Four [`half_pair`]s as two f32 vectors: the first fields, the second fields.
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

// Lane-wise twins of the reference's float steps: same operations, same order.

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn finish_scaled4(acc: __m128, d_w: __m128, d_a: __m128, isum: __m128i) -> __m128 {
    _mm_add_ps(acc, _mm_mul_ps(_mm_mul_ps(d_w, d_a), _mm_cvtepi32_ps(isum)))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn finish_kquant4(acc: __m128, d: __m128, dmin: __m128, d_a: __m128, isum: __m128i, isum_min: __m128i) -> __m128 {
    let t = _mm_sub_ps(
        _mm_mul_ps(_mm_mul_ps(d, d_a), _mm_cvtepi32_ps(isum)),
        _mm_mul_ps(_mm_mul_ps(dmin, d_a), _mm_cvtepi32_ps(isum_min)),
    );
    _mm_add_ps(acc, t)
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

/// Four floats as a vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_f32x4(x: &[f32; 4]) -> __m128 {
    // SAFETY: loads the 4 floats of `x`.
    unsafe { _mm_loadu_ps(x.as_ptr()) }
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

/// The scale fields of a legacy weight block as 4 bytes: `d` then `m` (zero
/// for formats without an offset).
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
    BlockQ4_0 => |x| [x.d[0], x.d[1], 0, 0],
    BlockQ5_0 => |x| [x.d[0], x.d[1], 0, 0],
    BlockQ8_0 => |x| [x.d[0], x.d[1], 0, 0],
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

    use super::load_u8x32;

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

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(super) fn madd_i16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
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
// reduced together, and lane r of every float vector follows row r
// through the reference's float steps. Each lane therefore equals the
// single-row reference, whatever R and A.

/// A float-weight dot: whole 16-element chunks in vectors, then the tail
/// into the same lanes and the reference reduction.
macro_rules! float_dot {
    ($features:literal, $name:ident, $bytes:literal, $load:path, $convert:path) => {
        #[target_feature(enable = $features)]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            let (wv, av) = (w.as_chunks::<{ 16 * $bytes }>().0, a.as_chunks::<64>().0);
            let mut acc = ops::zero16();
            for (w, a) in wv.iter().zip(av) {
                acc = ops::fma16(acc, $load(w), ops::load16_f32(a));
            }
            let done = wv.len().min(av.len());
            let mut lanes = ops::lanes16(acc);
            scalar::accumulate_float(&mut lanes, &w[16 * $bytes * done..], &a[64 * done..], $convert);
            scalar::reduce_lanes(lanes)
        }
    };
}

/// The one-row and four-row entry points of an R×A kernel (`A` = 1).
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

/// The entry points of a K-quant kernel: one weight row at a time, against
/// one activation row or against `A` at once. Sharing activation loads
/// between weight rows, as the legacy kernels do, does not pay for 256-value
/// blocks: four rows' decoded quants and scales overflow the registers,
/// and on a 2-core EPYC the four-row kernels decoded a 1B model at 0.6× the
/// speed of these.
macro_rules! kquant_entries {
    ($features:literal, $one:ident, $by_row:ident, $kernel:ident) => {
        #[target_feature(enable = $features)]
        fn $one(w: &[u8], a: &[u8]) -> f32 {
            let [value] = $kernel::<1>(w, [a]);
            value
        }

        #[target_feature(enable = $features)]
        fn $by_row<const A: usize>(w: [&[u8]; 4], a: [&[u8]; A]) -> [[f32; 4]; A] {
            let mut out = [[0.0; 4]; A];
            for (r, w) in w.into_iter().enumerate() {
                for (i, value) in $kernel::<A>(w, a).into_iter().enumerate() {
                    out[i][r] = value;
                }
            }
            out
        }
    };
}

/// A kernel for the legacy block formats (one scale, maybe an offset, per
/// 32 weights) against `A` activation rows at once: each weight block is
/// decoded once and dotted with every activation row, while each (weight
/// row, activation row) pair goes through exactly the steps of the
/// reference's `dot_legacy`, so results do not depend on `R` or `A`.
/// `$weights` decodes block `$x` into 32 quants in element order, `$dot`
/// multiplies them with an activation block into eight lanes of four
/// products each, and `$s_a` is activation block `$y`'s scaled sum for the
/// formats with an offset (`$offset`).
macro_rules! legacy_kernel {
    ($features:literal, $name:ident, $wblock:ty, $ablock:ty, |$x:ident| $weights:expr, $dot:ident, $offset:literal, |$y:ident| $s_a:expr) => {
        #[target_feature(enable = $features)]
        fn $name<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            let (w, a) = rows::<$wblock, $ablock, R, A>(w, a);
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
                    let $y = &a[i][b];
                    av[i] = load_i8x32(&$y.qs);
                    scales[i] = _mm_mul_ps(d_w, broadcast_half($y.d));
                    if $offset {
                        offsets[i] = _mm_fmadd_ps(m_w, $s_a, offsets[i]);
                    }
                }
                for r in 0..R {
                    let $x = &w[r][b];
                    let q = $weights;
                    for i in 0..A {
                        let products = _mm256_cvtepi32_ps($dot(q, av[i]));
                        acc[i][r] = _mm256_fmadd_ps(spread_lane(scales[i], r), products, acc[i][r]);
                    }
                }
            }
            std::array::from_fn(|i| {
                let offsets: [f32; 4] = lanes(offsets[i]);
                std::array::from_fn(|r| {
                    let total = reduce_legacy_lanes(acc[i][r]);
                    if $offset { total + offsets[r] } else { total }
                })
            })
        }
    };
}

macro_rules! dot_kernels {
    ($level:ident, $ops:ident, $features:literal) => {
        pub(super) mod $level {
            use super::$ops as ops;
            use super::*;

            /// The single-row kernel of `dtype`, its four-row kernel where
            /// there is one (float weights run row by row), and its kernels
            /// for four weight rows against two and against four activation
            /// rows where there are some (the legacy block formats).
            pub(in super::super) fn kernels(
                dtype: DType,
            ) -> (DotFn, Option<Dot4Fn>, Option<Dot4x2Fn>, Option<Dot4x4Fn>) {
                match dtype {
                    DType::F32 => (dot_f32, None, None, None),
                    DType::F16 => (dot_f16, None, None, None),
                    DType::BF16 => (dot_bf16, None, None, None),
                    DType::Q4_0 => (one_q4_0, Some(four_q4_0), Some(dot_q4_0::<4, 2>), Some(dot_q4_0::<4, 4>)),
                    DType::Q4_1 => (one_q4_1, Some(four_q4_1), Some(dot_q4_1::<4, 2>), Some(dot_q4_1::<4, 4>)),
                    DType::Q5_0 => (one_q5_0, Some(four_q5_0), Some(dot_q5_0::<4, 2>), Some(dot_q5_0::<4, 4>)),
                    DType::Q5_1 => (one_q5_1, Some(four_q5_1), Some(dot_q5_1::<4, 2>), Some(dot_q5_1::<4, 4>)),
                    DType::Q8_0 => (one_q8_0, Some(four_q8_0), Some(dot_q8_0::<4, 2>), Some(dot_q8_0::<4, 4>)),
                    DType::Q4_K => (one_q4_k, None, Some(by_row_q4_k::<2>), Some(by_row_q4_k::<4>)),
                    DType::Q5_K => (one_q5_k, None, Some(by_row_q5_k::<2>), Some(by_row_q5_k::<4>)),
                    DType::Q6_K => (one_q6_k, None, Some(by_row_q6_k::<2>), Some(by_row_q6_k::<4>)),
                }
            }

            float_dot!($features, dot_f32, 4, ops::load16_f32, scalar::f32_value);
            float_dot!($features, dot_f16, 2, ops::load16_f16, scalar::half_to_f32);
            float_dot!($features, dot_bf16, 2, ops::load16_bf16, scalar::bf16_value);
            legacy_entries!($features, one_q4_0, four_q4_0, dot_q4_0);
            legacy_entries!($features, one_q4_1, four_q4_1, dot_q4_1);
            legacy_entries!($features, one_q5_0, four_q5_0, dot_q5_0);
            legacy_entries!($features, one_q5_1, four_q5_1, dot_q5_1);
            legacy_entries!($features, one_q8_0, four_q8_0, dot_q8_0);
            kquant_entries!($features, one_q4_k, by_row_q4_k, dot_q4_k);
            kquant_entries!($features, one_q5_k, by_row_q5_k, dot_q5_k);
            kquant_entries!($features, one_q6_k, by_row_q6_k, dot_q6_k);

            /// Signed × signed bytes through the unsigned × signed dot: |w| and
            /// a with w's sign. |−128| reads as 128 unsigned, so every i8
            /// weight works; activations must not hold −128.
            #[target_feature(enable = $features)]
            #[inline]
            fn signed_dot(w: __m256i, a: __m256i) -> __m256i {
                ops::dot_u8i8(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(a, w))
            }

            legacy_kernel!(
                $features,
                dot_q4_0,
                BlockQ4_0,
                BlockQ8_0,
                |x| _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8)),
                signed_dot,
                false,
                |y| _mm_setzero_ps()
            );
            legacy_kernel!($features, dot_q4_1, BlockQ4_1, BlockQ8_1, |x| nibbles(&x.qs), unsigned_dot, true, |y| {
                broadcast_half(y.s)
            });
            legacy_kernel!(
                $features,
                dot_q5_0,
                BlockQ5_0,
                BlockQ8_0,
                |x| _mm256_sub_epi8(_mm256_or_si256(nibbles(&x.qs), fifth_bits(x.qh)), _mm256_set1_epi8(16)),
                signed_dot,
                false,
                |y| _mm_setzero_ps()
            );
            legacy_kernel!(
                $features,
                dot_q5_1,
                BlockQ5_1,
                BlockQ8_1,
                |x| _mm256_or_si256(nibbles(&x.qs), fifth_bits(x.qh)),
                unsigned_dot,
                true,
                |y| broadcast_half(y.s)
            );
            legacy_kernel!($features, dot_q8_0, BlockQ8_0, BlockQ8_0, |x| load_i8x32(&x.qs), signed_dot, false, |y| {
                _mm_setzero_ps()
            });

            #[target_feature(enable = $features)]
            #[inline]
            fn unsigned_dot(w: __m256i, a: __m256i) -> __m256i {
                ops::dot_u8i8(_mm256_setzero_si256(), w, a)
            }

            /// A Q4_K/Q5_K block's scales and minima, decoded once for
            /// every activation row: each sub-block's scale in all lanes, and
            /// the minima spread so that each multiplies the two 16-element
            /// activation sums of its sub-block.
            #[target_feature(enable = $features)]
            #[inline]
            fn kquant_scales(scales: &[u8; 12]) -> ([__m256i; 8], __m256i) {
                let (sc, m) = k_scales(scales);
                let m = _mm_cvtsi64_si128(i64::from_le_bytes(m));
                (sc.map(|sc| _mm256_set1_epi16(i16::from(sc))), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)))
            }

            /// Unreduced Σ_j sc_j·(q·a)_j and Σ_j m_j·(Σa)_j of a Q4_K/Q5_K
            /// block whose eight sub-blocks of unsigned quants are `q`.
            #[target_feature(enable = $features)]
            #[inline]
            fn kquant_sums(sc: &[__m256i; 8], mins: __m256i, q: &[__m256i; 8], a: &BlockQ8K) -> (__m256i, __m256i) {
                let mut sums = _mm256_setzero_si256();
                for ((q, a), sc) in q.iter().zip(a.qs.as_chunks::<32>().0).zip(sc) {
                    let pairs = _mm256_maddubs_epi16(*q, load_i8x32(a));
                    sums = ops::madd_i16(sums, pairs, *sc);
                }
                (sums, _mm256_madd_epi16(load_u8x32(&a.bsums), mins))
            }

            /// The Q4_K/Q5_K kernel around a block decoder: one weight row
            /// against `A` activation rows (at most four), each weight block
            /// decoded once for all of them. Lane i of the float steps
            /// follows activation row i through the reference's steps.
            #[target_feature(enable = $features)]
            #[inline]
            fn kquant_rows<W: bytemuck::Pod, const A: usize>(
                w: &[u8],
                a: [&[u8]; A],
                decode: impl Fn(&W) -> (&[u8; 12], u32, [__m256i; 8]),
            ) -> [f32; A] {
                let ([w], a) = rows::<W, BlockQ8K, 1, A>([w], a);
                let mut acc = _mm_setzero_ps();
                for (b, x) in w.iter().enumerate() {
                    let (scales, d_dmin, q) = decode(x);
                    let (sc, m) = kquant_scales(scales);
                    let (mut sums, mut mins, mut d_a) =
                        ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4], [0.0f32; 4]);
                    for i in 0..A {
                        (sums[i], mins[i]) = kquant_sums(&sc, m, &q, &a[i][b]);
                        d_a[i] = f32::from_le_bytes(a[i][b].d);
                    }
                    let (d, dmin) = half_pairs4([d_dmin; 4]);
                    acc = finish_kquant4(acc, d, dmin, load_f32x4(&d_a), hsum4(sums), hsum4(mins));
                }
                lanes(acc)
            }

            #[target_feature(enable = $features)]
            fn dot_q4_k<const A: usize>(w: &[u8], a: [&[u8]; A]) -> [f32; A] {
                let low = _mm256_set1_epi8(0xF);
                kquant_rows::<BlockQ4K, A>(
                    w,
                    a,
                    #[inline(always)]
                    |x| {
                        let mut q = [_mm256_setzero_si256(); 8];
                        for (pair, qs) in x.qs.as_chunks::<32>().0.iter().enumerate() {
                            let v = load_u8x32(qs);
                            q[2 * pair] = _mm256_and_si256(v, low);
                            q[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                        }
                        (&x.scales, half_pair(x.d, x.dmin), q)
                    },
                )
            }

            #[target_feature(enable = $features)]
            fn dot_q5_k<const A: usize>(w: &[u8], a: [&[u8]; A]) -> [f32; A] {
                let (low, bit4) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x10));
                kquant_rows::<BlockQ5K, A>(
                    w,
                    a,
                    #[inline(always)]
                    |x| {
                        let mut q = [_mm256_setzero_si256(); 8];
                        // Bits 2i and 2i+1 of each qh byte belong to sub-blocks 2i
                        // and 2i+1; shifting by two per pair brings them to bits 0
                        // and 1. The 16-bit shifts move bits across bytes only
                        // above the bits read, which the 0x10 masks drop.
                        let mut h = load_u8x32(&x.qh);
                        for (pair, qs) in x.qs.as_chunks::<32>().0.iter().enumerate() {
                            let v = load_u8x32(qs);
                            let hi_lo = _mm256_and_si256(_mm256_slli_epi16::<4>(h), bit4);
                            let hi_hi = _mm256_and_si256(_mm256_slli_epi16::<3>(h), bit4);
                            q[2 * pair] = _mm256_or_si256(_mm256_and_si256(v, low), hi_lo);
                            q[2 * pair + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), low), hi_hi);
                            h = _mm256_srli_epi16::<2>(h);
                        }
                        (&x.scales, half_pair(x.d, x.dmin), q)
                    },
                )
            }

            /// Q6_K's eight vectors of 32 unsigned quants (elements l, l+32,
            /// l+64, l+96 of each 128-element half: a nibble and two bits of
            /// qh moved to bits 4 and 5), in activation order, with the
            /// scale pair of each vector's two 16-element halves.
            #[target_feature(enable = $features)]
            #[inline]
            fn q6_k_decode(x: &BlockQ6K) -> ([__m256i; 8], [__m256i; 8]) {
                let (low, two) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
                let scales = load_i8x16(&x.scales);
                let (ql, qh) = (x.ql.as_chunks::<32>().0, x.qh.as_chunks::<32>().0);
                let (mut q, mut sc) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
                for half in 0..2 {
                    let (l0, l1) = (load_u8x32(&ql[2 * half]), load_u8x32(&ql[2 * half + 1]));
                    let h = load_u8x32(&qh[half]);
                    let bits =
                        |l: __m256i, h: __m256i| _mm256_or_si256(_mm256_and_si256(l, low), _mm256_and_si256(h, two));
                    q[4 * half] = bits(l0, _mm256_slli_epi16::<4>(h));
                    q[4 * half + 1] = bits(l1, _mm256_slli_epi16::<2>(h));
                    q[4 * half + 2] = bits(_mm256_srli_epi16::<4>(l0), h);
                    q[4 * half + 3] = bits(_mm256_srli_epi16::<4>(l1), _mm256_srli_epi16::<2>(h));
                    for k in 0..4 {
                        // Scales g and g+1 for the two 16-element halves of the vector.
                        let g = (8 * half + 2 * k) as i64;
                        let pick = _mm_set_epi64x((g + 1) * 0x0101_0101_0101_0101, g * 0x0101_0101_0101_0101);
                        sc[4 * half + k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
                    }
                }
                (q, sc)
            }

            #[target_feature(enable = $features)]
            fn dot_q6_k<const A: usize>(w: &[u8], a: [&[u8]; A]) -> [f32; A] {
                let ([w], a) = rows::<BlockQ6K, BlockQ8K, 1, A>([w], a);
                let mut acc = _mm_setzero_ps();
                for (b, x) in w.iter().enumerate() {
                    let (q, sc) = q6_k_decode(x);
                    let scales = _mm256_cvtepi8_epi16(load_i8x16(&x.scales));
                    let (mut isums, mut d_a) = ([_mm256_setzero_si256(); 4], [0.0f32; 4]);
                    for i in 0..A {
                        let y = &a[i][b];
                        let mut sums = _mm256_setzero_si256();
                        for ((q, sc), aq) in q.iter().zip(&sc).zip(y.qs.as_chunks::<32>().0) {
                            sums = ops::madd_i16(sums, _mm256_maddubs_epi16(*q, load_i8x32(aq)), *sc);
                        }
                        // The quants are unsigned; the offset of 32 goes through
                        // the activation sums: Σ sc·(q·a) − 32·Σ sc·(Σa).
                        let offset = _mm256_madd_epi16(load_u8x32(&y.bsums), scales);
                        isums[i] = _mm256_sub_epi32(sums, _mm256_slli_epi32::<5>(offset));
                        d_a[i] = f32::from_le_bytes(y.d);
                    }
                    let d = halves4([u16::from_le_bytes(x.d); 4]);
                    acc = finish_scaled4(acc, d, load_f32x4(&d_a), hsum4(isums));
                }
                lanes(acc)
            }
        }
    };
}

dot_kernels!(avx2, avx2_ops, "avx2,fma,f16c");
dot_kernels!(avx512, avx512_ops, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
