//! Activation quantization: the same AVX2 code serves both x86 levels.

use super::*;

pub(in super::super) fn quantize(format: ActFormat) -> QuantizeFn {
    match format {
        ActFormat::F32 => scalar::quantize_f32,
        ActFormat::Q8_0 => quantize_q8_0,
        ActFormat::Q8_0S => quantize_q8_0s,
        ActFormat::Q8_1 => quantize_q8_1,
        ActFormat::Q8_K => quantize_q8_k,
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_f32x32(x: &[f32; 32]) -> [__m256; 4] {
    let x = x.as_chunks::<8>().0;
    [load_f32x8(&x[0]), load_f32x8(&x[1]), load_f32x8(&x[2]), load_f32x8(&x[3])]
}

/// Largest magnitude of the 32 values; exact for finite values, like the
/// reference fold.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn amax32(v: &[__m256; 4]) -> __m256 {
    let abs = |x: __m256| _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
    _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// Quantizes 32 values with reciprocal scale `id` into `q`, rounding ties
/// to even (the default MXCSR mode, which Rust code never changes), and
/// returns the quants as i32 vectors of 8.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn quantize32(v: &[__m256; 4], id: f32, q: &mut [i8; 32]) -> [__m256i; 4] {
    let id = _mm256_set1_ps(id);
    let i = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
    // The packs interleave 128-bit lanes: dword k of the result holds the
    // quants 4k..4k+4 of vector k%4 (k<4) or of its upper half (k>=4).
    let packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: stores 32 bytes into the 32 bytes of `q`.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), ordered) };
    i
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK>().0.iter().zip(blocks_mut::<BlockQ8_0>(dst)) {
        let v = load_f32x32(x);
        let (d, id) = scalar::act_scale(hmax(amax32(&v)));
        y.d = f16::from_f32(d).to_le_bytes();
        quantize32(&v, id, &mut y.qs);
    }
}

/// The sum of the 32 quants [`quantize32`] returned.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn quant_sum(i: [__m256i; 4]) -> i32 {
    hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_0s(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK>().0.iter().zip(blocks_mut::<BlockQ8_0S>(dst)) {
        let v = load_f32x32(x);
        let (d, id) = scalar::act_scale(hmax(amax32(&v)));
        let i = quantize32(&v, id, &mut y.qs);
        y.d = f16::from_f32(d).to_le_bytes();
        y.sum = (quant_sum(i) as i16).to_le_bytes();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_1(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK>().0.iter().zip(blocks_mut::<BlockQ8_1>(dst)) {
        let v = load_f32x32(x);
        let (d, id) = scalar::act_scale(hmax(amax32(&v)));
        let sum = quant_sum(quantize32(&v, id, &mut y.qs));
        y.d = f16::from_f32(d).to_le_bytes();
        y.s = f16::from_f32(d * sum as f32).to_le_bytes();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    for (x, y) in x.as_chunks::<QK_K>().0.iter().zip(blocks_mut::<BlockQ8K>(dst)) {
        let chunks = x.as_chunks::<QK>().0;
        let amax = chunks.iter().fold(_mm256_setzero_ps(), |m, c| _mm256_max_ps(m, amax32(&load_f32x32(c))));
        let (d, id) = scalar::act_scale(hmax(amax));
        y.d = d.to_le_bytes();
        let (qs, bsums) = (y.qs.as_chunks_mut::<QK>().0, y.bsums.as_chunks_mut::<4>().0);
        for ((c, q), bsum) in chunks.iter().zip(qs).zip(bsums) {
            let i = quantize32(&load_f32x32(c), id, q);
            let lo = hsum_i32(_mm256_add_epi32(i[0], i[1])) as i16;
            let hi = hsum_i32(_mm256_add_epi32(i[2], i[3])) as i16;
            bsum[..2].copy_from_slice(&lo.to_le_bytes());
            bsum[2..].copy_from_slice(&hi.to_le_bytes());
        }
    }
}

const _: () = assert!(LANES == 16);
