//! Unaligned vector loads from byte, quant and float arrays, a leaf that
//! the file-layout kernels (`mod.rs`) and the packed ones (`packed.rs`)
//! both read through.

use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load_u8x16(b: &[u8; 16]) -> __m128i {
    // SAFETY: reads the 16 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load_i8x16(b: &[i8; 16]) -> __m128i {
    // SAFETY: reads the 16 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load_u8x32(b: &[u8; 32]) -> __m256i {
    // SAFETY: reads the 32 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load_i8x32(b: &[i8; 32]) -> __m256i {
    // SAFETY: reads the 32 bytes of `b`; unaligned loads have no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load_f32x8(x: &[f32; 8]) -> __m256 {
    // SAFETY: reads the 8 floats of `x`; unaligned loads have no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// In a group's 16 bytes holding each row's pair of bytes, the byte
/// indices of the pair's word `j` (0 or 1) for rows 0–3, each twice, as
/// widened words: row `r`'s lane then holds the word in both halves.
pub(super) fn word_picks(j: usize) -> [i32; 4] {
    std::array::from_fn(|row| {
        let lo = (4 * row + 2 * j) as u32;
        (lo | (lo + 1) << 8 | lo << 16 | (lo + 1) << 24) as i32
    })
}

/// In a group's 16 bytes holding each row's pair of bytes, the indices
/// of byte `j` (0 or 1) of rows 0–7, as one 64-bit shuffle pattern.
pub(super) fn byte_picks(j: usize) -> i64 {
    bytemuck::cast::<[i8; 8], i64>(std::array::from_fn(|row| (2 * row + j) as i8))
}

/// Bytes `at..at + N` of `b` as an array (zeros past its end, which the
/// callers' bounds rule out).
pub(super) fn load16(b: &[u8], at: usize) -> &[u8; 16] {
    b[at..at + 16].try_into().unwrap_or(&[0; 16])
}

pub(super) fn load32(b: &[u8], at: usize) -> &[u8; 32] {
    b[at..at + 32].try_into().unwrap_or(&[0; 32])
}

pub(super) fn load64(b: &[u8], at: usize) -> &[u8; 64] {
    b[at..at + 64].try_into().unwrap_or(&[0; 64])
}
