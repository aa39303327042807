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
