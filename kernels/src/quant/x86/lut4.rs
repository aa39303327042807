//! The table formats' kernels (IQ4_NL and MXFP4 against Q8_0S, IQ4_XS
//! against Q8_K; see `quant::lut4`), written once for both x86 levels:
//! [`lut4_kernels!`] is expanded inside each level's module, after the
//! shared helpers it calls (`nibbles`, `signed_dot`, `hsum_i32`, `rows`).
//!
//! A block's 32 nibbles become its signed table values with one byte
//! shuffle (the 16-entry table fills a 128-bit lane, copied into both), and
//! the values meet the activation quants in the signed byte dot the legacy
//! formats use (|w| · a·sign(w), which holds every table value, the largest
//! magnitude being 127). The integer sums are exact; the float steps are
//! the reference's, in its order.

macro_rules! lut4_kernels {
    ($features:literal) => {
        use crate::quant::lut4 as formats4;

        /// A 16-entry table in both 128-bit lanes.
        #[target_feature(enable = $features)]
        #[inline]
        fn lut4_table(values: &[i8; 16]) -> __m256i {
            _mm256_broadcastsi128_si256(load_i8x16(values))
        }

        /// The table values of a 16-byte nibble array, in element order.
        #[target_feature(enable = $features)]
        #[inline]
        fn lut4_values(table: __m256i, qs: &[u8; 16]) -> __m256i {
            _mm256_shuffle_epi8(table, nibbles(qs))
        }

        /// Lane r: the sum of the eight lanes of `v[r]`.
        #[target_feature(enable = $features)]
        #[inline]
        fn lut4_hsum4(v: [__m256i; 4]) -> __m128i {
            let u = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
            _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256::<1>(u))
        }

        /// One row of a 32-element table format against one Q8_0S row;
        /// `parts` gives a block's scale and nibbles.
        #[target_feature(enable = $features)]
        #[inline]
        fn lut4_one<W: bytemuck::Pod>(
            w: &[u8],
            a: &[u8],
            values: &[i8; 16],
            parts: impl Fn(&W) -> (f32, &[u8; 16]),
        ) -> f32 {
            let ([w], [a]) = rows::<W, BlockQ8_0S, 1, 1>([w], [a]);
            let table = lut4_table(values);
            let mut acc = 0.0;
            for (x, y) in w.iter().zip(a) {
                let (d, qs) = parts(x);
                let isum = hsum_i32(signed_dot(lut4_values(table, qs), load_i8x32(&y.qs)));
                acc = scalar::finish_symmetric(acc, d, scalar::half_to_f32(y.d), isum);
            }
            acc
        }

        /// Four rows side by side against one Q8_0S row: each activation
        /// block is loaded once, the four integer sums are reduced
        /// together, and lane r of one vector takes row r's fused step.
        #[target_feature(enable = $features)]
        #[inline]
        fn lut4_four<W: bytemuck::Pod>(
            w: [&[u8]; 4],
            a: &[u8],
            values: &[i8; 16],
            parts: impl Fn(&W) -> (f32, &[u8; 16]),
        ) -> [f32; 4] {
            let (w, [a]) = rows::<W, BlockQ8_0S, 4, 1>(w, [a]);
            let table = lut4_table(values);
            let mut acc = _mm_setzero_ps();
            for (b, y) in a.iter().enumerate() {
                let act = load_i8x32(&y.qs);
                let mut d = [0.0f32; 4];
                let mut sums = [_mm256_setzero_si256(); 4];
                for r in 0..4 {
                    let (dr, qs) = parts(&w[r][b]);
                    d[r] = dr;
                    sums[r] = signed_dot(lut4_values(table, qs), act);
                }
                let scales = _mm_mul_ps(_mm_setr_ps(d[0], d[1], d[2], d[3]), _mm_set1_ps(scalar::half_to_f32(y.d)));
                acc = _mm_fmadd_ps(scales, _mm_cvtepi32_ps(lut4_hsum4(sums)), acc);
            }
            lanes::<4>(acc)
        }

        #[target_feature(enable = $features)]
        fn one_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
            lut4_one(w, a, &formats4::IQ4_VALUES, |x: &crate::quant::blocks::BlockIQ4NL| {
                (scalar::half_to_f32(x.d), &x.qs)
            })
        }

        #[target_feature(enable = $features)]
        fn four_iq4_nl(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            lut4_four(w, a, &formats4::IQ4_VALUES, |x: &crate::quant::blocks::BlockIQ4NL| {
                (scalar::half_to_f32(x.d), &x.qs)
            })
        }

        #[target_feature(enable = $features)]
        fn one_mxfp4(w: &[u8], a: &[u8]) -> f32 {
            lut4_one(w, a, &formats4::FP4_VALUES, |x: &crate::quant::blocks::BlockMXFP4| {
                (formats4::e8m0_half(x.e), &x.qs)
            })
        }

        #[target_feature(enable = $features)]
        fn four_mxfp4(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            lut4_four(w, a, &formats4::FP4_VALUES, |x: &crate::quant::blocks::BlockMXFP4| {
                (formats4::e8m0_half(x.e), &x.qs)
            })
        }

        /// IQ4_XS against Q8_K: per sub-block the byte dot's 16-bit pair
        /// sums (at most 2·127·127, below the saturation of `vpmaddubsw`)
        /// are multiplied by the sub-block's signed scale into 32-bit
        /// lanes, and the block's total takes the reference's one step.
        #[target_feature(enable = $features)]
        fn one_iq4_xs(w: &[u8], a: &[u8]) -> f32 {
            let ([w], [a]) = rows::<crate::quant::blocks::BlockIQ4XS, BlockQ8K, 1, 1>([w], [a]);
            let table = lut4_table(&formats4::IQ4_VALUES);
            let mut acc = 0.0;
            for (x, y) in w.iter().zip(a) {
                let mut sum = _mm256_setzero_si256();
                for (ib, (qs, act)) in x.qs.as_chunks::<16>().0.iter().zip(y.qs.as_chunks::<32>().0).enumerate() {
                    let (q, act) = (lut4_values(table, qs), load_i8x32(act));
                    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(act, q));
                    let scale = _mm256_set1_epi16(formats4::iq4_xs_scale(x, ib) as i16);
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scale));
                }
                acc = scalar::finish_scaled(acc, scalar::half_to_f32(x.d), f32::from_le_bytes(y.d), hsum_i32(sum));
            }
            acc
        }

        /// Row by row, as the K-quants against one activation row.
        #[target_feature(enable = $features)]
        fn four_iq4_xs(w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let mut out = [0.0; 4];
            for (r, w) in w.into_iter().enumerate() {
                out[r] = one_iq4_xs(w, a);
            }
            out
        }
    };
}

pub(super) use lut4_kernels;
