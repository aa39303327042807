//! The width operations of the packed kernels (`packed.rs`,
//! `packed_low.rs`, `packed_wide.rs`): one module per x86 level, each the
//! same names over its vector width.

/// One group per 256-bit vector. Without VNNI the partial sums stay in 16
/// bits over the steps that cannot overflow them (a Q4_K sub-block's eight
/// steps reach at most 8 · 2 · 15 · 128 = 30720; two Q6_K steps at most
/// 2 · 2 · 63 · 128 = 32256), widened by one word dot against the row's
/// scale.
pub(super) mod avx2_ops {
    use std::arch::x86_64::*;

    use crate::quant::x86::loads::{byte_picks, load_i8x16, load_u8x16, load_u8x32, load16, load32, word_picks};

    pub(crate) type I = __m256i;
    pub(crate) type F = __m256;
    pub(crate) const Q6_K_STEPS: usize = 2;
    pub(crate) const Q5_K_STEPS: usize = 4;
    pub(crate) const GROUPS: usize = 1;
    /// Whether a call takes eight activation rows: their 24 sums would
    /// spill from AVX2's 16 registers (four rows per call measured 20 %
    /// faster than eight on a Q4_K prompt).
    pub(crate) const EIGHT_ACTS: bool = false;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn load(w: &[u8], at: usize) -> I {
        load_u8x32(load32(w, at))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn and_bytes(v: I, mask: i8) -> I {
        _mm256_and_si256(v, _mm256_set1_epi8(mask))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn or(a: I, b: I) -> I {
        _mm256_or_si256(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn shr16<const N: i32>(v: I) -> I {
        _mm256_srli_epi16::<N>(v)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn shl16<const N: i32>(v: I) -> I {
        _mm256_slli_epi16::<N>(v)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn shl32<const N: i32>(v: I) -> I {
        _mm256_slli_epi32::<N>(v)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn sub(a: I, b: I) -> I {
        _mm256_sub_epi32(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn zero() -> I {
        _mm256_setzero_si256()
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn splat_i32(x: i32) -> I {
        _mm256_set1_epi32(x)
    }

    /// Activation bytes `4k..4k+4` of `qs` in every lane.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn splat4<const N: usize>(qs: &[i8; N], k: usize) -> I {
        splat_i32(bytemuck::cast::<[i8; 4], i32>(qs.as_chunks::<4>().0[k]))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn byte_dot(part: I, q: I, a: I) -> I {
        _mm256_add_epi16(part, _mm256_maddubs_epi16(q, a))
    }

    /// `acc` plus the 16-bit partial sums of [`byte_dot`], widened.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn widen_add(acc: I, part: I) -> I {
        madd(acc, part, _mm256_set1_epi16(1))
    }

    /// Q8_0's bias: signed quants go through |q| and a with q's sign, whose
    /// pair sums (at most 2 · 128 · 127) fit 16 bits one step at a time.
    pub(crate) const SIGNED_BIAS: i32 = 0;

    /// `acc` plus the dot of the signed bytes `q` with `a`, per lane.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn signed_dot(acc: I, q: I, a: I) -> I {
        widen_add(acc, _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(a, q)))
    }

    /// The group's 16 bytes at `at` as words.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn words(w: &[u8], at: usize, signed: bool) -> I {
        let bytes = load_u8x16(load16(w, at));
        if signed { _mm256_cvtepi8_epi16(bytes) } else { _mm256_cvtepu8_epi16(bytes) }
    }

    /// Byte `j` of each row's (unsigned) pair at `at`, as a word in both
    /// halves of the row's lane.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn row_words(w: &[u8], at: usize, j: usize) -> I {
        pick_words(words(w, at, false), j)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn pick_words(words: I, j: usize) -> I {
        let [a, b, c, d] = word_picks(j);
        _mm256_shuffle_epi8(words, _mm256_setr_epi32(a, b, c, d, a, b, c, d))
    }

    /// Scale `j` of each row's pair at `at`, as [`scaled_add`] takes it.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn row_scales(w: &[u8], at: usize, j: usize, signed: bool) -> I {
        pick_words(words(w, at, signed), j)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn scaled_add(acc: I, part: I, scales: I) -> I {
        madd(acc, part, scales)
    }

    /// Scale `j` of each row's pair at `at` for [`scaled_add_narrow`]:
    /// [`row_scales`], the partial sums being 16-bit here.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn row_scales_narrow(w: &[u8], at: usize, j: usize, signed: bool) -> I {
        row_scales(w, at, j, signed)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn scaled_add_narrow(acc: I, part: I, scales: I) -> I {
        scaled_add(acc, part, scales)
    }

    /// Signed scale `j` of each row's pair at `at`, as a 32-bit lane, for
    /// [`scaled_add_wide`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn row_scales_wide(w: &[u8], at: usize, j: usize) -> I {
        let picked = _mm_shuffle_epi8(load_u8x16(load16(w, at)), _mm_set1_epi64x(byte_picks(j)));
        _mm256_cvtepi8_epi32(picked)
    }

    /// `acc` plus 32-bit partial sums (those of [`signed_dot`]) times
    /// their scales.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn scaled_add_wide(acc: I, part: I, scales: I) -> I {
        _mm256_add_epi32(acc, _mm256_mullo_epi32(part, scales))
    }

    /// A 16-entry byte table in each 128-bit lane, for [`lookup`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn table16(values: &[i8; 16]) -> I {
        _mm256_broadcastsi128_si256(load_i8x16(values))
    }

    /// The table's entries at the indices (0..16) in each byte.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn lookup(table: I, indices: I) -> I {
        _mm256_shuffle_epi8(table, indices)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn madd(acc: I, a: I, b: I) -> I {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }

    /// The eight f16 at `at`, as floats.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn halves(w: &[u8], at: usize) -> F {
        _mm256_cvtph_ps(load_u8x16(load16(w, at)))
    }

    /// The eight bf16 at `at`, as floats (exactly: their bits moved up).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn bf16s(w: &[u8], at: usize) -> F {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load_u8x16(load16(w, at)))))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn zero_f() -> F {
        _mm256_setzero_ps()
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn splat_f(x: f32) -> F {
        _mm256_set1_ps(x)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn to_f(v: I) -> F {
        _mm256_cvtepi32_ps(v)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn mul_f(a: F, b: F) -> F {
        _mm256_mul_ps(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn add_f(a: F, b: F) -> F {
        _mm256_add_ps(a, b)
    }

    /// `acc + a · b`, fused.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn fma_f(acc: F, a: F, b: F) -> F {
        _mm256_fmadd_ps(a, b, acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn sub_f(a: F, b: F) -> F {
        _mm256_sub_ps(a, b)
    }

    /// The eight rows' values, then eight zeros.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn lanes(v: F) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        // SAFETY: stores 8 floats into the first 8 of the 16 floats of `out`.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    }
}

/// Two groups side by side in a 512-bit vector (rows 0–7 of the first,
/// then of the second), so that one instruction serves sixteen rows. With
/// VNNI, one `vpdpbusd` per step adds the byte dot into 32-bit partial
/// sums, which no K-quant sub-block can overflow, and one 32-bit multiply
/// per sub-block applies its scale: per Q4_K sub-block and activation row,
/// 10 instructions where the 16-bit route takes 18.
pub(super) mod avx512_ops {
    use std::arch::x86_64::*;

    use crate::quant::x86::loads::{byte_picks, load_i8x16, load_u8x32, load32, load64, word_picks};

    pub(crate) type I = __m512i;
    pub(crate) type F = __m512;
    pub(crate) const Q6_K_STEPS: usize = 4;
    pub(crate) const Q5_K_STEPS: usize = 8;
    pub(crate) const GROUPS: usize = 2;
    /// Eight activation rows' sums fit AVX-512's 32 registers (four per
    /// call made a Q6_K prompt 10 % slower).
    pub(crate) const EIGHT_ACTS: bool = true;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn load(w: &[u8], at: usize) -> I {
        let both = load64(w, 2 * at);
        // SAFETY: an unaligned load of the 64 bytes of `both`.
        unsafe { _mm512_loadu_si512(both.as_ptr().cast()) }
    }

    /// `v` into the 64 bytes at `2 · at` of `out`, where [`load`] reads
    /// (panics past its end).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn store(out: &mut [u8], at: usize, v: I) {
        let dst = &mut out[2 * at..2 * at + 64];
        // SAFETY: an unaligned store of 64 bytes into the 64 of `dst`.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn and_bytes(v: I, mask: i8) -> I {
        _mm512_and_si512(v, _mm512_set1_epi8(mask))
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn or(a: I, b: I) -> I {
        _mm512_or_si512(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn shr16<const N: u32>(v: I) -> I {
        _mm512_srli_epi16::<N>(v)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn shl16<const N: u32>(v: I) -> I {
        _mm512_slli_epi16::<N>(v)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn shl32<const N: u32>(v: I) -> I {
        _mm512_slli_epi32::<N>(v)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn sub(a: I, b: I) -> I {
        _mm512_sub_epi32(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn zero() -> I {
        _mm512_setzero_si512()
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn splat_i32(x: i32) -> I {
        _mm512_set1_epi32(x)
    }

    /// Activation bytes `4k..4k+4` of `qs` in every lane.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn splat4<const N: usize>(qs: &[i8; N], k: usize) -> I {
        splat_i32(bytemuck::cast::<[i8; 4], i32>(qs.as_chunks::<4>().0[k]))
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn byte_dot(part: I, q: I, a: I) -> I {
        _mm512_dpbusd_epi32(part, q, a)
    }

    /// `acc` plus the 32-bit partial sums of [`byte_dot`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn widen_add(acc: I, part: I) -> I {
        _mm512_add_epi32(acc, part)
    }

    /// Q8_0's bias: the quants with their sign bit flipped are the quants
    /// plus 128, as unsigned bytes.
    pub(crate) const SIGNED_BIAS: i32 = 128;

    /// `acc` plus the dot of the signed bytes `q`, biased by
    /// [`SIGNED_BIAS`], with `a`, per lane.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn signed_dot(acc: I, q: I, a: I) -> I {
        _mm512_dpbusd_epi32(acc, _mm512_xor_si512(q, _mm512_set1_epi8(-128)), a)
    }

    /// Each group's 16 bytes at `at`, the first group's in the low half.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    fn bytes16(w: &[u8], at: usize) -> __m256i {
        load_u8x32(load32(w, 2 * at))
    }

    /// Each group's 16 bytes at `at` as words.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn words(w: &[u8], at: usize, signed: bool) -> I {
        let bytes = bytes16(w, at);
        if signed { _mm512_cvtepi8_epi16(bytes) } else { _mm512_cvtepu8_epi16(bytes) }
    }

    /// Byte `j` of each row's (unsigned) pair at `at`, as a word in both
    /// halves of the row's lane.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn row_words(w: &[u8], at: usize, j: usize) -> I {
        let [a, b, c, d] = word_picks(j);
        _mm512_shuffle_epi8(words(w, at, false), _mm512_broadcast_i32x4(_mm_setr_epi32(a, b, c, d)))
    }

    /// Scale `j` of each row's pair at `at`, as a 32-bit lane.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn row_scales(w: &[u8], at: usize, j: usize, signed: bool) -> I {
        let picked = _mm256_shuffle_epi8(bytes16(w, at), _mm256_set1_epi64x(byte_picks(j)));
        // Each group's eight bytes lead its 128-bit half: join them.
        let joined = _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(picked));
        if signed { _mm512_cvtepi8_epi32(joined) } else { _mm512_cvtepu8_epi32(joined) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn scaled_add(acc: I, part: I, scales: I) -> I {
        _mm512_add_epi32(acc, _mm512_mullo_epi32(part, scales))
    }

    /// Scale `j` of each row's pair at `at` as a word in the low half of
    /// its lane and zero above, for [`scaled_add_narrow`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn row_scales_narrow(w: &[u8], at: usize, j: usize, signed: bool) -> I {
        _mm512_and_si512(row_scales(w, at, j, signed), _mm512_set1_epi32(0xFFFF))
    }

    /// `acc` plus partial sums within ±2¹⁵ times their scales (from
    /// [`row_scales_narrow`]) in one word dot: a lane's low word is the
    /// sum, its high word the sum's sign, which meets the scale's zero.
    /// One instruction where [`scaled_add`] takes a two-µop 32-bit multiply
    /// and an add: a Q3_K prompt spends most of its time in these loops.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn scaled_add_narrow(acc: I, part: I, scales: I) -> I {
        _mm512_dpwssd_epi32(acc, part, scales)
    }

    /// Signed scale `j` of each row's pair at `at`: [`row_scales`] (the
    /// partial sums are 32-bit here whichever dot made them).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn row_scales_wide(w: &[u8], at: usize, j: usize) -> I {
        row_scales(w, at, j, true)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn scaled_add_wide(acc: I, part: I, scales: I) -> I {
        scaled_add(acc, part, scales)
    }

    /// A 16-entry byte table in each 128-bit lane, for [`lookup`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn table16(values: &[i8; 16]) -> I {
        _mm512_broadcast_i32x4(load_i8x16(values))
    }

    /// The table's entries at the indices (0..16) in each byte.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn lookup(table: I, indices: I) -> I {
        _mm512_shuffle_epi8(table, indices)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn madd(acc: I, a: I, b: I) -> I {
        _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
    }

    /// Each group's eight f16 at `at`, as floats.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn halves(w: &[u8], at: usize) -> F {
        _mm512_cvtph_ps(bytes16(w, at))
    }

    /// Each group's eight bf16 at `at`, as floats (exactly: their bits
    /// moved up).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn bf16s(w: &[u8], at: usize) -> F {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bytes16(w, at))))
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn zero_f() -> F {
        _mm512_setzero_ps()
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn splat_f(x: f32) -> F {
        _mm512_set1_ps(x)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn to_f(v: I) -> F {
        _mm512_cvtepi32_ps(v)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn mul_f(a: F, b: F) -> F {
        _mm512_mul_ps(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn add_f(a: F, b: F) -> F {
        _mm512_add_ps(a, b)
    }

    /// `acc + a · b`, fused.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn fma_f(acc: F, a: F, b: F) -> F {
        _mm512_fmadd_ps(a, b, acc)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn sub_f(a: F, b: F) -> F {
        _mm512_sub_ps(a, b)
    }

    /// The sixteen rows' values.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(crate) fn lanes(v: F) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        // SAFETY: one 16-float store into the 16 floats of `out`.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out
    }
}
