//! The Q2_K and Q3_K decoders for the K-quant tile (`kquant.rs`), written
//! once for both x86 levels: [`low_k_kernels!`] is expanded inside each
//! level's module, after `kquant_kernels!`, whose tile and scale helpers
//! it uses.
//!
//! Both formats have a scale per 16-element group, as Q6_K has, so their
//! scales go through the same two-vector layout (`group_scale_words`). A
//! pair of sub-blocks (64 elements) is the 2-bit fields at two adjacent
//! shifts of one 32-byte half of `qs`: sub-block k = 4h + j takes bits
//! 2j, 2j+1 of `qs[32h..32h+32]` in element order. Q3_K adds bit k of each
//! `hmask` byte as bit 2; its quants stay unsigned (0..8) and the tile takes
//! the offset of 4 off through the activation sums, as Q6_K's 32.

macro_rules! low_k_kernels {
    ($features:literal) => {
        /// Sub-block k's 2-bit fields: bits 2(k%4), 2(k%4)+1 of each byte
        /// of its half's 32 quant bytes.
        #[target_feature(enable = $features)]
        #[inline]
        fn two_bits(qs: &[u8; 64], k: usize) -> __m256i {
            let v = load_u8x32(&qs.as_chunks::<32>().0[k / 4]);
            // A 16-bit shift carries the upper byte's low bits into the
            // lower byte's top, which the mask drops.
            let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (k % 4) as i32));
            _mm256_and_si256(shifted, _mm256_set1_epi8(3))
        }

        #[target_feature(enable = $features)]
        #[inline]
        fn q2_k_prelude(x: &crate::quant::blocks::BlockQ2K) -> kquant::Prelude<[__m256i; 2]> {
            let v = load_u8x16(&x.scales);
            let low = _mm_set1_epi8(0xF);
            let scales = _mm256_cvtepu8_epi16(_mm_and_si128(v, low));
            kquant::Prelude {
                scales: group_scale_words(scales),
                sum_weights: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(v), low)),
                d: u16::from_le_bytes(x.d),
                dmin: u16::from_le_bytes(x.dmin),
            }
        }

        #[target_feature(enable = $features)]
        fn dot_q2_k<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            kquant_tile::<crate::quant::blocks::BlockQ2K, [__m256i; 2], R, A, 0>(
                w,
                a,
                #[inline(always)]
                |x| q2_k_prelude(x),
                #[inline(always)]
                |x, scales, p| {
                    let (k0, k1) = (2 * p, 2 * p + 1);
                    [(two_bits(&x.qs, k0), group_scales(scales, k0)), (two_bits(&x.qs, k1), group_scales(scales, k1))]
                },
            )
        }

        /// Q3_K's scales, signed, decoded as the reference decodes them;
        /// they also weight the activation sums (the offset of 4).
        #[target_feature(enable = $features)]
        #[inline]
        fn q3_k_prelude(x: &crate::quant::blocks::BlockQ3K) -> kquant::Prelude<[__m256i; 2]> {
            signed_prelude(&crate::quant::low_k::q3_k_scales(&x.scales), x.d)
        }

        /// Sub-block k's quants: its 2-bit fields with bit k of each hmask
        /// byte as bit 2. A 16-bit shift moves that bit to bit 2 of its
        /// byte; what it carries across the bytes of a word lands in bits
        /// 3–7 of the lower byte (right shifts by at most 5) or 0–1 of the
        /// upper one (left shifts by 1 or 2), which the mask drops.
        #[target_feature(enable = $features)]
        #[inline]
        fn q3_k_quants(x: &crate::quant::blocks::BlockQ3K, k: usize) -> __m256i {
            let h = load_u8x32(&x.hmask);
            let moved = if k >= 2 {
                _mm256_srl_epi16(h, _mm_cvtsi32_si128((k - 2) as i32))
            } else {
                _mm256_sll_epi16(h, _mm_cvtsi32_si128((2 - k) as i32))
            };
            _mm256_or_si256(two_bits(&x.qs, k), _mm256_and_si256(moved, _mm256_set1_epi8(4)))
        }

        #[target_feature(enable = $features)]
        fn dot_q3_k<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            kquant_tile::<crate::quant::blocks::BlockQ3K, [__m256i; 2], R, A, 4>(
                w,
                a,
                #[inline(always)]
                |x| q3_k_prelude(x),
                #[inline(always)]
                |x, scales, p| {
                    let (k0, k1) = (2 * p, 2 * p + 1);
                    [(q3_k_quants(x, k0), group_scales(scales, k0)), (q3_k_quants(x, k1), group_scales(scales, k1))]
                },
            )
        }
    };
}

pub(super) use low_k_kernels;
