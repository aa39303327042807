//! The grid i-quants' kernels against Q8_K (see `quant::grid`), written
//! once for both x86 levels: [`grid_kernels!`] is expanded inside each
//! level's module, after the shared helpers it calls (`set_bit_bytes`,
//! `hsum_i32`, `rows`).
//!
//! A sub-block of 32 elements becomes its 32 signed integers q in one
//! vector: four grid entries (eight bytes each) looked up by the
//! reference's index decoding, then the format's signs or offsets applied
//! bytewise. The byte dot with the
//! activations gives 16-bit sums of pairs (|q| ≤ 43, so at most 2·43·127,
//! far from saturating), which the two 16-element groups' scales multiply
//! into 32-bit lanes; the block's total is the reference's integer, and
//! the float steps are the reference's, in its order. The AVX-512 level
//! runs the same 256-bit code: a sub-block is one 256-bit vector, and the
//! gathers, not the arithmetic, bound the speed.

macro_rules! grid_kernels {
    ($features:literal) => {
        use crate::quant::blocks::{BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
        use crate::quant::grid::{GridBlock, OffsetGrid, SignedGrid};

        /// `q` with the bytes whose bit is set in `signs` (bit j of byte
        /// j/8) negated: (q ^ m) − m with m = −1 there.
        #[target_feature(enable = $features)]
        #[inline]
        fn with_signs(q: __m256i, signs: [u8; 4]) -> __m256i {
            let m = set_bit_bytes(signs);
            _mm256_sub_epi8(_mm256_xor_si256(q, m), m)
        }

        /// Sub-block ib of an IQ2 format: four grid points, their signs.
        #[target_feature(enable = $features)]
        #[inline]
        fn signed_sub<B: SignedGrid>(x: &B, ib: usize) -> __m256i {
            let points: [(u64, u8); 4] = std::array::from_fn(|l| x.point(4 * ib + l));
            let e = points.map(|(entry, _)| entry as i64);
            with_signs(_mm256_set_epi64x(e[3], e[2], e[1], e[0]), points.map(|(_, signs)| signs))
        }

        /// Sub-block ib of an IQ1 format: four grid points of −1, 0, 1 as
        /// 8 · value (the sign of 8 by the value), plus each group's ±1.
        #[target_feature(enable = $features)]
        #[inline]
        fn offset_sub<B: OffsetGrid>(x: &B, ib: usize) -> __m256i {
            let points: [(u64, bool); 4] = std::array::from_fn(|l| x.point(4 * ib + l));
            let e = points.map(|(entry, _)| entry as i64);
            let d = points.map(|(_, negative)| if negative { -1 } else { 0x0101_0101_0101_0101 });
            let eight = _mm256_sign_epi8(_mm256_set1_epi8(8), _mm256_set_epi64x(e[3], e[2], e[1], e[0]));
            _mm256_add_epi8(eight, _mm256_set_epi64x(d[3], d[2], d[1], d[0]))
        }

        /// Σ ls·(q·a) over one sub-block, in eight 32-bit lanes: `ls` is the
        /// scale of elements 0..16 and 16..32.
        #[target_feature(enable = $features)]
        #[inline]
        fn grid_sub_dot(q: __m256i, act: &[i8; 32], ls: [u8; 2]) -> __m256i {
            let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(load_i8x32(act), q));
            let scales = _mm256_set_m128i(_mm_set1_epi16(i16::from(ls[1])), _mm_set1_epi16(i16::from(ls[0])));
            _mm256_madd_epi16(pairs, scales)
        }

        /// One row against one Q8_K row; `sub` gives sub-block ib's 32
        /// integers q.
        #[target_feature(enable = $features)]
        #[inline]
        fn grid_one<B: GridBlock>(w: &[u8], a: &[u8], sub: impl Fn(&B, usize) -> __m256i) -> f32 {
            let ([w], [a]) = rows::<B, BlockQ8K, 1, 1>([w], [a]);
            let mut acc = 0.0;
            for (x, y) in w.iter().zip(a) {
                let mut sum = _mm256_setzero_si256();
                for (ib, act) in y.qs.as_chunks::<32>().0.iter().enumerate() {
                    sum = _mm256_add_epi32(sum, grid_sub_dot(sub(x, ib), act, x.scales(ib)));
                }
                acc = scalar::finish_scaled(acc, x.d(), f32::from_le_bytes(y.d), hsum_i32(sum));
            }
            acc * 0.125
        }

        /// An IQ2 format's row against one Q8_K row.
        #[target_feature(enable = $features)]
        fn one_signed<B: SignedGrid>(w: &[u8], a: &[u8]) -> f32 {
            grid_one(
                w,
                a,
                #[inline(always)]
                |x: &B, ib| signed_sub(x, ib),
            )
        }

        /// An IQ1 format's row against one Q8_K row.
        #[target_feature(enable = $features)]
        fn one_offset<B: OffsetGrid>(w: &[u8], a: &[u8]) -> f32 {
            grid_one(
                w,
                a,
                #[inline(always)]
                |x: &B, ib| offset_sub(x, ib),
            )
        }
    };
}

pub(super) use grid_kernels;
