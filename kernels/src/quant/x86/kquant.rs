//! The K-quant kernels (Q4_K, Q5_K, Q6_K against Q8_K activations), written
//! once for both x86 levels: [`kquant_kernels!`] is expanded inside each
//! level's module.
//!
//! Q2_K and Q3_K plug their decoders into the same tile (`kquant_low.rs`).
//!
//! A call takes `R` weight rows and `A` activation rows (`R · A ≤ 8`). A
//! block's 256 quants are decoded one 32-quant sub-block at a time, and
//! each sub-block meets every activation row while it is in a register, so
//! the registers need hold only the `R · A` integer sums, one or two decoded
//! sub-blocks and their scales (a whole decoded block per weight row, as
//! the kernel before this one held, spilled). After the block, one transposing
//! reduction turns the `R · A` sums into the lanes of one vector, and one
//! float step per lane applies the reference's `finish_*`. Integer sums are
//! exact, so their order is free; the float steps are the reference's, in
//! its order, lane by lane.

/// What a K-quant format's decoder gives per block and weight row, before
/// its sub-blocks: the sub-blocks' scales as 16-bit words (in the layout
/// its `pair` step reads), the multipliers of the block's 16 activation
/// sums (the minima, or the scales of a format whose quants carry an
/// offset), and its `d` and `dmin` bits (`dmin` 0 where there are no
/// minima).
#[derive(Clone, Copy)]
pub(super) struct Prelude<S: Copy> {
    pub(super) scales: S,
    pub(super) sum_weights: std::arch::x86_64::__m256i,
    pub(super) d: u16,
    pub(super) dmin: u16,
}

macro_rules! kquant_kernels {
    ($features:literal) => {
        /// Lane k: the sum of the eight lanes of `v[k]`. Two rounds of
        /// pairwise adds leave each vector's half-sums in one 128-bit lane
        /// each; adding the two lanes finishes them.
        #[target_feature(enable = $features)]
        #[inline]
        fn hsum8(v: [__m256i; 8]) -> __m256i {
            let t = [
                _mm256_hadd_epi32(v[0], v[1]),
                _mm256_hadd_epi32(v[2], v[3]),
                _mm256_hadd_epi32(v[4], v[5]),
                _mm256_hadd_epi32(v[6], v[7]),
            ];
            let (u0, u1) = (_mm256_hadd_epi32(t[0], t[1]), _mm256_hadd_epi32(t[2], t[3]));
            _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(u0, u1), _mm256_permute2x128_si256::<0x31>(u0, u1))
        }

        /// `f(0)` to `f(3)`, each call with a constant once inlined.
        #[target_feature(enable = $features)]
        #[inline]
        fn unroll4(mut f: impl FnMut(usize)) {
            f(0);
            f(1);
            f(2);
            f(3);
        }

        /// Lane k: the f16 `v[k % R]` (R divides 4).
        #[target_feature(enable = $features)]
        #[inline]
        fn spread_halves<const R: usize>(v: [u16; R]) -> __m256 {
            let mut packed = 0u64;
            for l in 0..4 {
                packed |= u64::from(v[l % R]) << (16 * l);
            }
            let four = _mm_cvtph_ps(_mm_cvtsi64_si128(packed as i64));
            _mm256_set_m128(four, four)
        }

        /// The K-quant kernel around a format's decoder. `prelude` decodes
        /// a weight block's scales once; `pair(block, scales, p)` gives
        /// sub-blocks 2p and 2p+1 as 32 unsigned quants each, in activation
        /// order, with the 16-bit multipliers of their 16 pair sums.
        /// A non-zero `OFFSET` selects the finish of the formats whose
        /// unsigned quants carry that offset (Q6_K 32, Q3_K 4): the
        /// activation sums times the scales, times `OFFSET`, come off the
        /// integer sum, then one scale; with 0 the minima's term is a float
        /// step of its own, as Q4_K's, Q5_K's and Q2_K's references take it.
        #[target_feature(enable = $features)]
        #[inline]
        fn kquant_tile<W: bytemuck::Pod, S: Copy, const R: usize, const A: usize, const OFFSET: i32>(
            w: [&[u8]; R],
            a: [&[u8]; A],
            prelude: impl Fn(&W) -> kquant::Prelude<S>,
            pair: impl Fn(&W, &S, usize) -> [(__m256i, __m256i); 2],
        ) -> [[f32; R]; A] {
            const { assert!(R * A <= 8 && 4 % R == 0) };
            let (w, a) = rows::<W, BlockQ8K, R, A>(w, a);
            let (mut acc, mut single) = (_mm256_setzero_ps(), 0.0f32);
            for b in 0..a[0].len() {
                // One weight row at a time, so that only its scales are
                // live (four rows of Q6_K's would fill half the registers).
                let (mut sum_weights, mut d, mut dmin) = ([_mm256_setzero_si256(); R], [0u16; R], [0u16; R]);
                let mut sums = [[ops::zero_pair_sum(); R]; A];
                for r in 0..R {
                    let row = prelude(&w[r][b]);
                    // Called with constants, so that each pair's shifts and
                    // shuffles are fixed (a loop over p is not unrolled).
                    unroll4(
                        #[inline(always)]
                        |p| {
                            let [(q0, sc0), (q1, sc1)] = pair(&w[r][b], &row.scales, p);
                            let (q, sc) = (ops::pair_bytes(q0, q1), ops::pair_bytes(sc0, sc1));
                            for i in 0..A {
                                let act = ops::load_pair(&a[i][b].qs.as_chunks::<64>().0[p]);
                                sums[i][r] = ops::madd_pair(sums[i][r], q, act, sc);
                            }
                        },
                    );
                    (sum_weights[r], d[r], dmin[r]) = (row.sum_weights, row.d, row.dmin);
                }
                if R * A == 1 {
                    // One weight row against one activation row (decoding):
                    // both integer totals from one reduction, then the
                    // reference's own scalar step, with no lanes to fill.
                    let iact = _mm256_madd_epi16(load_u8x32(&a[0][b].bsums), sum_weights[0]);
                    let both = _mm256_hadd_epi32(ops::narrow(sums[0][0]), iact);
                    let both = _mm_add_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256::<1>(both));
                    let both = _mm_hadd_epi32(both, both);
                    let (isum, iact) = (_mm_cvtsi128_si32(both), _mm_extract_epi32::<1>(both));
                    let scales = _mm_cvtph_ps(_mm_cvtsi32_si128((u32::from(d[0]) | u32::from(dmin[0]) << 16) as i32));
                    let (d, dmin) = (_mm_cvtss_f32(scales), _mm_cvtss_f32(_mm_movehdup_ps(scales)));
                    let d_a = f32::from_le_bytes(a[0][b].d);
                    single = if OFFSET != 0 {
                        scalar::finish_scaled(single, d, d_a, isum.wrapping_sub(iact.wrapping_mul(OFFSET)))
                    } else {
                        scalar::finish_kquant(single, d, dmin, d_a, isum, iact)
                    };
                    continue;
                }
                let (mut isum, mut iact) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
                for i in 0..A {
                    let bsums = load_u8x32(&a[i][b].bsums);
                    for r in 0..R {
                        isum[i * R + r] = ops::narrow(sums[i][r]);
                        iact[i * R + r] = _mm256_madd_epi16(bsums, sum_weights[r]);
                    }
                }
                let (isum, iact) = (hsum8(isum), hsum8(iact));
                let mut d_a = [0.0f32; 8];
                for k in 0..R * A {
                    d_a[k] = f32::from_le_bytes(a[k / R][b].d);
                }
                let d = spread_halves::<R>(d);
                let d_a = _mm256_setr_ps(d_a[0], d_a[1], d_a[2], d_a[3], d_a[4], d_a[5], d_a[6], d_a[7]);
                acc = if OFFSET != 0 {
                    let isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(iact, _mm256_set1_epi32(OFFSET)));
                    _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, d_a), _mm256_cvtepi32_ps(isum)))
                } else {
                    let dmin = spread_halves::<R>(dmin);
                    let t = _mm256_sub_ps(
                        _mm256_mul_ps(_mm256_mul_ps(d, d_a), _mm256_cvtepi32_ps(isum)),
                        _mm256_mul_ps(_mm256_mul_ps(dmin, d_a), _mm256_cvtepi32_ps(iact)),
                    );
                    _mm256_add_ps(acc, t)
                };
            }
            let mut lanes = [single; 8];
            if R * A > 1 {
                // SAFETY: stores 8 floats into the 8 floats of `lanes`.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
            }
            std::array::from_fn(|i| std::array::from_fn(|r| lanes[i * R + r]))
        }

        /// Q4_K/Q5_K scales: the eight 6-bit scales as words in both 128-bit
        /// lanes (sub-block j's scale is word j), and the minima doubled so
        /// that each multiplies the two 16-element activation sums of its
        /// sub-block.
        #[target_feature(enable = $features)]
        #[inline]
        fn k_prelude(scales: &[u8; 12], d: [u8; 2], dmin: [u8; 2]) -> kquant::Prelude<__m256i> {
            let (sc, m) = k_scales(scales);
            let sc = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(sc)));
            let m = _mm_cvtsi64_si128(i64::from_le_bytes(m));
            kquant::Prelude {
                scales: _mm256_broadcastsi128_si256(sc),
                sum_weights: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)),
                d: u16::from_le_bytes(d),
                dmin: u16::from_le_bytes(dmin),
            }
        }

        /// Word j of `scales` in every word.
        #[target_feature(enable = $features)]
        #[inline]
        fn k_scale(scales: __m256i, j: usize) -> __m256i {
            let pick = ((2 * j + 1) << 8 | 2 * j) as i16;
            _mm256_shuffle_epi8(scales, _mm256_set1_epi16(pick))
        }

        #[target_feature(enable = $features)]
        fn dot_q4_k<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            let low = _mm256_set1_epi8(0xF);
            kquant_tile::<BlockQ4K, __m256i, R, A, 0>(
                w,
                a,
                #[inline(always)]
                |x| k_prelude(&x.scales, x.d, x.dmin),
                #[inline(always)]
                |x, &scales, p| {
                    let v = load_u8x32(&x.qs.as_chunks::<32>().0[p]);
                    [
                        (_mm256_and_si256(v, low), k_scale(scales, 2 * p)),
                        (_mm256_and_si256(_mm256_srli_epi16::<4>(v), low), k_scale(scales, 2 * p + 1)),
                    ]
                },
            )
        }

        /// Bit j of each qh byte (sub-block j's fifth bits) as 0x10. A
        /// 16-bit shift moves it to bit 4 of its byte; the bits it carries
        /// across the bytes of a word land in bits 0–3 of the upper byte
        /// (left shifts) or 5–7 of the lower one (right shifts), which the
        /// mask drops.
        #[target_feature(enable = $features)]
        #[inline]
        fn q5_k_fifth(h: __m256i, j: usize) -> __m256i {
            let moved = if j <= 4 {
                _mm256_sll_epi16(h, _mm_cvtsi32_si128((4 - j) as i32))
            } else {
                _mm256_srl_epi16(h, _mm_cvtsi32_si128((j - 4) as i32))
            };
            _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
        }

        #[target_feature(enable = $features)]
        fn dot_q5_k<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            let low = _mm256_set1_epi8(0xF);
            kquant_tile::<BlockQ5K, __m256i, R, A, 0>(
                w,
                a,
                #[inline(always)]
                |x| k_prelude(&x.scales, x.d, x.dmin),
                #[inline(always)]
                |x, &scales, p| {
                    let v = load_u8x32(&x.qs.as_chunks::<32>().0[p]);
                    let h = load_u8x32(&x.qh);
                    let (j0, j1) = (2 * p, 2 * p + 1);
                    [
                        (_mm256_or_si256(_mm256_and_si256(v, low), q5_k_fifth(h, j0)), k_scale(scales, j0)),
                        (
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), low), q5_k_fifth(h, j1)),
                            k_scale(scales, j1),
                        ),
                    ]
                },
            )
        }

        /// Sixteen scales of 16-element groups (words, in order) as the
        /// first eight in both 128-bit lanes, then the last eight in both:
        /// a vector of 32 quants takes scale g for its first 16 and g+1 for
        /// its last 16, and byte shuffles stay inside a lane.
        #[target_feature(enable = $features)]
        #[inline]
        fn group_scale_words(words: __m256i) -> [__m256i; 2] {
            [_mm256_permute4x64_epi64::<0x44>(words), _mm256_permute4x64_epi64::<0xEE>(words)]
        }

        /// The scale words of sub-block k (0..8) from [`group_scale_words`]:
        /// scales 2k (low lane) and 2k+1 (high lane), words 2(k%4) and
        /// 2(k%4)+1 of each lane's copy of its eight.
        #[target_feature(enable = $features)]
        #[inline]
        fn group_scales(scales: &[__m256i; 2], k: usize) -> __m256i {
            let word = |g: usize| ((2 * g + 1) << 8 | 2 * g) as i16;
            let j = k % 4;
            let pick = _mm256_set_m128i(_mm_set1_epi16(word(2 * j + 1)), _mm_set1_epi16(word(2 * j)));
            _mm256_shuffle_epi8(scales[k / 4], pick)
        }

        /// Q6_K's sixteen signed scales ([`group_scale_words`]); its
        /// activation sums are weighted by the scales in their own order.
        #[target_feature(enable = $features)]
        #[inline]
        fn q6_k_prelude(x: &BlockQ6K) -> kquant::Prelude<[__m256i; 2]> {
            signed_prelude(&x.scales, x.d)
        }

        /// A block with sixteen signed scales (Q6_K's, Q3_K's decoded ones)
        /// and no minimum: the scale words weight the activation sums too.
        #[target_feature(enable = $features)]
        #[inline]
        fn signed_prelude(scales: &[i8; 16], d: [u8; 2]) -> kquant::Prelude<[__m256i; 2]> {
            let words = _mm256_cvtepi8_epi16(load_i8x16(scales));
            kquant::Prelude { scales: group_scale_words(words), sum_weights: words, d: u16::from_le_bytes(d), dmin: 0 }
        }

        /// Q6_K's vectors 2p and 2p+1 of 32 quants (elements l, l+32, l+64,
        /// l+96 of each 128-element half: a nibble of ql and two bits of qh
        /// moved to bits 4 and 5), with their scale words.
        #[target_feature(enable = $features)]
        #[inline]
        fn q6_k_pair(x: &BlockQ6K, scales: &[__m256i; 2], p: usize) -> [(__m256i, __m256i); 2] {
            let (low, two) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
            let (half, upper) = (p / 2, p % 2 == 1);
            let (ql, qh) = (x.ql.as_chunks::<32>().0, x.qh.as_chunks::<32>().0);
            let (l0, l1, h) = (load_u8x32(&ql[2 * half]), load_u8x32(&ql[2 * half + 1]), load_u8x32(&qh[half]));
            let bits = |l: __m256i, h: __m256i| _mm256_or_si256(_mm256_and_si256(l, low), _mm256_and_si256(h, two));
            let (q0, q1) = if upper {
                (bits(_mm256_srli_epi16::<4>(l0), h), bits(_mm256_srli_epi16::<4>(l1), _mm256_srli_epi16::<2>(h)))
            } else {
                (bits(l0, _mm256_slli_epi16::<4>(h)), bits(l1, _mm256_slli_epi16::<2>(h)))
            };
            [(q0, group_scales(scales, 2 * p)), (q1, group_scales(scales, 2 * p + 1))]
        }

        #[target_feature(enable = $features)]
        fn dot_q6_k<const R: usize, const A: usize>(w: [&[u8]; R], a: [&[u8]; A]) -> [[f32; R]; A] {
            kquant_tile::<BlockQ6K, [__m256i; 2], R, A, 32>(
                w,
                a,
                #[inline(always)]
                |x| q6_k_prelude(x),
                #[inline(always)]
                |x, scales, p| q6_k_pair(x, scales, p),
            )
        }
    };
}

pub(super) use kquant_kernels;
