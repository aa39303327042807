//! The IQ3 formats' decoders (IQ3_XXS, IQ3_S; see `quant::iq3`) for the
//! K-quant tile (`kquant.rs`), written once for both x86 levels:
//! [`iq3_kernels!`] is expanded inside each level's module, after
//! `kquant_kernels!`.
//!
//! A sub-block's eight grid entries are looked up one by one (the grids
//! are tables of 32-bit words) into one vector of 32 magnitudes, negated
//! where the weight's sign bit is set. The tile takes unsigned bytes, so
//! the signed values (±62 at most) go in with a bias of 64, which the tile
//! takes off through the activation sums, each weighted by its sub-block's
//! scale: exact integers, the reference's sums. IQ3_XXS's row totals are
//! then quartered, as the reference's.

macro_rules! iq3_kernels {
    ($features:literal) => {
        use crate::quant::blocks::{BlockIQ3S, BlockIQ3XXS};
        use crate::quant::iq3 as formats3;
        use crate::quant::iq3_grids::{IQ3S_GRID, IQ3XXS_GRID};

        /// 32 signed grid magnitudes plus 64: `entries` in element order,
        /// bit j of `signs` negating weight j.
        #[target_feature(enable = $features)]
        #[inline]
        fn iq3_biased(entries: [u32; 8], signs: u32) -> __m256i {
            let e = entries.map(|v| v as i32);
            let magnitudes = _mm256_setr_epi32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]);
            let sign = _mm256_or_si256(set_bit_bytes(signs.to_le_bytes()), _mm256_set1_epi8(1));
            _mm256_add_epi8(_mm256_sign_epi8(magnitudes, sign), _mm256_set1_epi8(64))
        }

        /// The sub-blocks' scales `2s + 1` as words, and as multipliers of
        /// the sixteen activation sums (two per sub-block).
        #[target_feature(enable = $features)]
        #[inline]
        fn iq3_prelude(s: [u32; 8], d: [u8; 2]) -> kquant::Prelude<[i16; 8]> {
            let scales = s.map(|s| 2 * s as i16 + 1);
            let mut groups = [0i16; 16];
            for (g, w) in groups.iter_mut().enumerate() {
                *w = scales[g / 2];
            }
            // SAFETY: reads the 32 bytes of `groups`.
            let sum_weights = unsafe { _mm256_loadu_si256(groups.as_ptr().cast()) };
            kquant::Prelude { scales, sum_weights, d: u16::from_le_bytes(d), dmin: 0 }
        }

        #[target_feature(enable = $features)]
        #[inline]
        fn iq3_xxs_quants(x: &BlockIQ3XXS, ib: usize) -> __m256i {
            let aux = formats3::iq3_xxs_aux(x, ib);
            let signs = u32::from_le_bytes([0, 1, 2, 3].map(|l| crate::quant::iq_signs::ksign(aux >> (7 * l))));
            iq3_biased(std::array::from_fn(|k| IQ3XXS_GRID[usize::from(x.qs[8 * ib + k])]), signs)
        }

        #[target_feature(enable = $features)]
        #[inline]
        fn iq3_s_quants(x: &BlockIQ3S, ib: usize) -> __m256i {
            let signs = u32::from_le_bytes([0, 1, 2, 3].map(|g| x.signs[4 * ib + g]));
            iq3_biased(std::array::from_fn(|k| IQ3S_GRID[formats3::iq3_s_index(x, ib, k) & 511]), signs)
        }

        /// The tile over a format's sub-blocks (`quants`) and scale fields.
        #[target_feature(enable = $features)]
        #[inline]
        fn iq3_tile<W: bytemuck::Pod, const R: usize, const A: usize>(
            w: [&[u8]; R],
            a: [&[u8]; A],
            prelude: impl Fn(&W) -> kquant::Prelude<[i16; 8]>,
            quants: impl Fn(&W, usize) -> __m256i,
        ) -> [[f32; R]; A] {
            kquant_tile::<W, [i16; 8], R, A, 64>(
                w,
                a,
                prelude,
                #[inline(always)]
                |x, scales, p| {
                    let (k0, k1) = (2 * p, 2 * p + 1);
                    [(quants(x, k0), _mm256_set1_epi16(scales[k0])), (quants(x, k1), _mm256_set1_epi16(scales[k1]))]
                },
            )
        }

        #[target_feature(enable = $features)]
        fn dot_iq3_xxs<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            let sums = iq3_tile::<BlockIQ3XXS, R, A>(
                w,
                a,
                #[inline(always)]
                |x| iq3_prelude(std::array::from_fn(|ib| formats3::iq3_xxs_aux(x, ib) >> 28), x.d),
                #[inline(always)]
                |x, ib| iq3_xxs_quants(x, ib),
            );
            sums.map(|row| row.map(|sum| 0.25 * sum))
        }

        #[target_feature(enable = $features)]
        fn dot_iq3_s<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            iq3_tile::<BlockIQ3S, R, A>(
                w,
                a,
                #[inline(always)]
                |x| iq3_prelude(std::array::from_fn(|ib| u32::from((x.scales[ib / 2] >> (4 * (ib % 2))) & 0xF)), x.d),
                #[inline(always)]
                |x, ib| iq3_s_quants(x, ib),
            )
        }
    };
}

pub(super) use iq3_kernels;
