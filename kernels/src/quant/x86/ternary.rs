//! The ternary formats' decoders (TQ2_0, TQ1_0; see `quant::ternary`) for
//! the K-quant tile (`kquant.rs`), written once for both x86 levels:
//! [`ternary_kernels!`] is expanded inside each level's module, after
//! `kquant_kernels!` and `low_k_kernels!`, whose tile and 2-bit decoder it
//! uses.
//!
//! A ternary block is a K-quant block with one scale: every sub-block's
//! scale words and every activation sum's multiplier are 1, and the
//! unsigned fields (0..3) carry an offset of 1, which the tile takes off
//! through the activation sums before the reference's one float step.
//!
//! TQ1_0's sub-block s < 5 is trit s of `qs[0..32]`; sub-blocks 5 and 6
//! are trits 0, 1 and 2, 3 of `qs[32..48]` (one per 128-bit lane); sub-block
//! 7 is trit 4 of those bytes, then `qh`'s four trits of its four bytes.

macro_rules! ternary_kernels {
    ($features:literal) => {
        #[target_feature(enable = $features)]
        #[inline]
        fn ternary_prelude(d: [u8; 2]) -> kquant::Prelude<()> {
            kquant::Prelude { scales: (), sum_weights: _mm256_set1_epi16(1), d: u16::from_le_bytes(d), dmin: 0 }
        }

        /// Trit n of each byte of `v`, n given per 16-bit word as 3^n
        /// (`ternary::trit`): a byte moved to the top of its word and
        /// multiplied by 3^n keeps the product modulo 256 there; the high
        /// half of that times 3 is the digit. Even and odd bytes go
        /// separately.
        #[target_feature(enable = $features)]
        #[inline]
        fn trits(v: __m256i, pow: __m256i) -> __m256i {
            let three = _mm256_set1_epi16(3);
            let digit = |top: __m256i| _mm256_mulhi_epu16(_mm256_mullo_epi16(top, pow), three);
            let even = digit(_mm256_slli_epi16::<8>(v));
            let odd = digit(_mm256_and_si256(v, _mm256_set1_epi16(0xFF00u16 as i16)));
            _mm256_or_si256(even, _mm256_slli_epi16::<8>(odd))
        }

        /// TQ1_0's sub-block s (see the file's comment).
        #[target_feature(enable = $features)]
        #[inline]
        fn tq1_0_sub_block(x: &crate::quant::blocks::BlockTQ1_0, s: usize) -> __m256i {
            let pow = |n: usize| 3i16.pow(n as u32);
            let lanes = |low: i16, high: i16| _mm256_set_m128i(_mm_set1_epi16(high), _mm_set1_epi16(low));
            let sixteen = x.qs.as_chunks::<16>().0;
            let tail = load_u8x16(&sixteen[2]);
            match s {
                0..5 => {
                    let head = _mm256_set_m128i(load_u8x16(&sixteen[1]), load_u8x16(&sixteen[0]));
                    trits(head, _mm256_set1_epi16(pow(s)))
                }
                5 | 6 => trits(_mm256_set_m128i(tail, tail), lanes(pow(2 * s - 10), pow(2 * s - 9))),
                _ => {
                    // Words 2n, 2n+1 of the high lane: qh's bytes, times 3^n.
                    let qh = _mm_set1_epi32(i32::from_le_bytes(x.qh));
                    trits(
                        _mm256_set_m128i(qh, tail),
                        _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27),
                    )
                }
            }
        }

        #[target_feature(enable = $features)]
        fn dot_tq1_0<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            kquant_tile::<crate::quant::blocks::BlockTQ1_0, (), R, A, 1>(
                w,
                a,
                #[inline(always)]
                |x| ternary_prelude(x.d),
                #[inline(always)]
                |x, _, p| {
                    let one = _mm256_set1_epi16(1);
                    [(tq1_0_sub_block(x, 2 * p), one), (tq1_0_sub_block(x, 2 * p + 1), one)]
                },
            )
        }

        #[target_feature(enable = $features)]
        fn dot_tq2_0<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            kquant_tile::<crate::quant::blocks::BlockTQ2_0, (), R, A, 1>(
                w,
                a,
                #[inline(always)]
                |x| ternary_prelude(x.d),
                #[inline(always)]
                |x, _, p| {
                    let one = _mm256_set1_epi16(1);
                    [(two_bits(&x.qs, 2 * p), one), (two_bits(&x.qs, 2 * p + 1), one)]
                },
            )
        }
    };
}

pub(super) use ternary_kernels;
