//! Kernels over packed K-quant groups (`super::super::packed`): eight
//! weight rows, one per 32-bit lane, against `A` activation rows. Written
//! once for both x86 levels: [`packed_kernels!`] is expanded inside each
//! level's module, where the wider level's extra registers let the
//! compiler keep more activation rows' sums in them.
//!
//! Per step, one 32-byte load holds four consecutive quants of each of the
//! eight rows, and each activation row's four matching bytes are broadcast
//! to every lane, so that a byte dot leaves each row's partial sum in its
//! own lane; the level's [`avx2_ops`] or [`avx512_ops`] say how those sums
//! are kept and scaled. After a block, the reference's float step runs
//! lane-wise on the eight rows. No reduction across lanes is left.

use std::arch::x86_64::*;

macro_rules! packed_kernels {
    ($features:literal, $ops:ident) => {
        use packed::$ops as packed_ops;

        /// Activation bytes `4k..4k+4` of `qs` in every 32-bit lane.
        #[target_feature(enable = $features)]
        #[inline]
        fn broadcast4(qs: &[i8; 256], k: usize) -> __m256i {
            _mm256_set1_epi32(bytemuck::cast::<[i8; 4], i32>(qs.as_chunks::<4>().0[k]))
        }

        #[target_feature(enable = $features)]
        #[inline]
        fn load16(b: &[u8], at: usize) -> __m128i {
            let bytes: &[u8; 16] = b[at..at + 16].try_into().unwrap_or(&[0; 16]);
            load_u8x16(bytes)
        }

        #[target_feature(enable = $features)]
        #[inline]
        fn load32(b: &[u8], at: usize) -> __m256i {
            let bytes: &[u8; 32] = b[at..at + 32].try_into().unwrap_or(&[0; 32]);
            load_u8x32(bytes)
        }

        /// `acc` lane-wise plus one block's float step of the reference:
        /// `d` and `dmin` per row, `d_a` the activation block's.
        #[target_feature(enable = $features)]
        #[inline]
        fn block_step(acc: __m256, d: __m256, d_a: f32, isum: __m256i, dmin: Option<(__m256, __m256i)>) -> __m256 {
            let d_a = _mm256_set1_ps(d_a);
            let scaled = _mm256_mul_ps(_mm256_mul_ps(d, d_a), _mm256_cvtepi32_ps(isum));
            match dmin {
                Some((dmin, imin)) => _mm256_add_ps(
                    acc,
                    _mm256_sub_ps(scaled, _mm256_mul_ps(_mm256_mul_ps(dmin, d_a), _mm256_cvtepi32_ps(imin))),
                ),
                None => _mm256_add_ps(acc, scaled),
            }
        }

        /// The eight lanes of each of `A` accumulators.
        #[target_feature(enable = $features)]
        #[inline]
        fn lanes8<const A: usize>(acc: [__m256; A]) -> [[f32; 8]; A] {
            let mut out = [[0.0f32; 8]; A];
            for (o, v) in out.iter_mut().zip(acc) {
                // SAFETY: stores 8 floats into the 8 floats of `o`.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
            }
            out
        }

        /// Sub-block `2p + HALF` of a packed Q4_K block (`HALF` picks the
        /// nibble) against the activation blocks `a`: its scaled sums into
        /// `isum`, its minima's sums into `imin`. A separate function so
        /// that the nibble shift and the word picks are constants.
        #[target_feature(enable = $features)]
        #[inline]
        fn q4_k_sub_block<const A: usize, const HALF: usize>(
            w: &[u8; layout::Q4_K_BLOCK],
            a: [&BlockQ8K; A],
            p: usize,
            isum: &mut [__m256i; A],
            imin: &mut [__m256i; A],
        ) {
            use layout::{Q4_K_MINS, Q4_K_QS, Q4_K_SCALES};
            let j = 2 * p + HALF;
            let mut part = [_mm256_setzero_si256(); A];
            for s in 0..8 {
                let v = load32(w, Q4_K_QS + 32 * (8 * p + s));
                let q = _mm256_and_si256(if HALF == 0 { v } else { _mm256_srli_epi16::<4>(v) }, _mm256_set1_epi8(0xF));
                for i in 0..A {
                    part[i] = packed_ops::byte_dot(part[i], q, broadcast4(&a[i].qs, 8 * j + s));
                }
            }
            let sc = packed_ops::row_scales(load16(w, Q4_K_SCALES + 16 * p), HALF, false);
            let m = packed::row_word(_mm256_cvtepu8_epi16(load16(w, Q4_K_MINS + 16 * p)), HALF);
            for i in 0..A {
                let bsums = _mm256_set1_epi32(bytemuck::cast::<[u8; 4], i32>(a[i].bsums.as_chunks::<4>().0[j]));
                isum[i] = packed_ops::scaled_add(isum[i], part[i], sc);
                imin[i] = _mm256_add_epi32(imin[i], _mm256_madd_epi16(m, bsums));
            }
        }

        /// One packed Q4_K group (eight rows) against `A` activation rows.
        #[target_feature(enable = $features)]
        fn packed_q4_k<const A: usize>(group: &[u8], acts: [&[u8]; A]) -> [[f32; 8]; A] {
            let acts = acts.map(blocks::<BlockQ8K>);
            let mut acc = [_mm256_setzero_ps(); A];
            let (w, _) = group.as_chunks::<{ layout::Q4_K_BLOCK }>();
            let n = acts.iter().map(|row| row.len()).fold(w.len(), usize::min);
            for (b, w) in w[..n].iter().enumerate() {
                let a: [&BlockQ8K; A] = std::array::from_fn(|i| &acts[i][b]);
                let (mut isum, mut imin) = ([_mm256_setzero_si256(); A], [_mm256_setzero_si256(); A]);
                for p in 0..4 {
                    q4_k_sub_block::<A, 0>(w, a, p, &mut isum, &mut imin);
                    q4_k_sub_block::<A, 1>(w, a, p, &mut isum, &mut imin);
                }
                let d = _mm256_cvtph_ps(load16(w, layout::Q4_K_D));
                let dmin = _mm256_cvtph_ps(load16(w, layout::Q4_K_DMIN));
                for i in 0..A {
                    acc[i] = block_step(acc[i], d, f32::from_le_bytes(a[i].d), isum[i], Some((dmin, imin[i])));
                }
            }
            lanes8(acc)
        }

        /// Quarter `Q` of a packed Q6_K block (elements 64·Q..64·Q+64, whose
        /// 16-element group g takes scale 4·Q + g) against the activation
        /// blocks `a`, its scaled sums into `isum`. A separate function so
        /// that the quarter's shifts are constants.
        #[target_feature(enable = $features)]
        #[inline]
        fn q6_k_quarter<const A: usize, const Q: usize>(
            w: &[u8; layout::Q6_K_BLOCK],
            a: [&BlockQ8K; A],
            isum: &mut [__m256i; A],
        ) {
            use layout::{Q6_K_QH, Q6_K_QL, Q6_K_SCALES};
            const STEPS: usize = packed_ops::Q6_K_STEPS;
            for g in 0..4 {
                let scale = 4 * Q + g;
                let sc = packed_ops::row_scales(load16(w, Q6_K_SCALES + 16 * (scale / 2)), scale % 2, true);
                for chunk in 0..4 / STEPS {
                    let mut part = [_mm256_setzero_si256(); A];
                    for step in 0..STEPS {
                        let u = 4 * g + STEPS * chunk + step;
                        let l = load32(w, Q6_K_QL + 32 * (u + 16 * (Q % 2)));
                        let h = load32(w, Q6_K_QH + 32 * u);
                        let (l, h) = match Q {
                            0 => (l, _mm256_slli_epi16::<4>(h)),
                            1 => (l, _mm256_slli_epi16::<2>(h)),
                            2 => (_mm256_srli_epi16::<4>(l), h),
                            _ => (_mm256_srli_epi16::<4>(l), _mm256_srli_epi16::<2>(h)),
                        };
                        let q = _mm256_or_si256(
                            _mm256_and_si256(l, _mm256_set1_epi8(0xF)),
                            _mm256_and_si256(h, _mm256_set1_epi8(0x30)),
                        );
                        for i in 0..A {
                            part[i] = packed_ops::byte_dot(part[i], q, broadcast4(&a[i].qs, 16 * Q + u));
                        }
                    }
                    for i in 0..A {
                        isum[i] = packed_ops::scaled_add(isum[i], part[i], sc);
                    }
                }
            }
        }

        /// One packed Q6_K group (eight rows) against `A` activation rows.
        #[target_feature(enable = $features)]
        fn packed_q6_k<const A: usize>(group: &[u8], acts: [&[u8]; A]) -> [[f32; 8]; A] {
            let acts = acts.map(blocks::<BlockQ8K>);
            let mut acc = [_mm256_setzero_ps(); A];
            let (w, _) = group.as_chunks::<{ layout::Q6_K_BLOCK }>();
            let n = acts.iter().map(|row| row.len()).fold(w.len(), usize::min);
            for (b, w) in w[..n].iter().enumerate() {
                let a: [&BlockQ8K; A] = std::array::from_fn(|i| &acts[i][b]);
                let mut isum = [_mm256_setzero_si256(); A];
                q6_k_quarter::<A, 0>(w, a, &mut isum);
                q6_k_quarter::<A, 1>(w, a, &mut isum);
                q6_k_quarter::<A, 2>(w, a, &mut isum);
                q6_k_quarter::<A, 3>(w, a, &mut isum);
                // The quants carry an offset of 32: Σ_g sc_g · (Σa)_g, times
                // 32, comes off the sum, pairs of groups per word dot.
                let mut offset = [_mm256_setzero_si256(); A];
                for pair in 0..8 {
                    let sc = _mm256_cvtepi8_epi16(load16(w, layout::Q6_K_SCALES + 16 * pair));
                    for i in 0..A {
                        let bsums =
                            _mm256_set1_epi32(bytemuck::cast::<[u8; 4], i32>(a[i].bsums.as_chunks::<4>().0[pair]));
                        offset[i] = _mm256_add_epi32(offset[i], _mm256_madd_epi16(sc, bsums));
                    }
                }
                let d = _mm256_cvtph_ps(load16(w, layout::Q6_K_D));
                for i in 0..A {
                    let isum = _mm256_sub_epi32(isum[i], _mm256_slli_epi32::<5>(offset[i]));
                    acc[i] = block_step(acc[i], d, f32::from_le_bytes(a[i].d), isum, None);
                }
            }
            lanes8(acc)
        }
    };
}

pub(super) use packed_kernels;

/// The 16-bit words `j` of a pair of bytes per row in every word of the
/// row's lane: rows 0–3 in the low 128 bits, 4–7 in the high, as the words
/// were widened (`j` is 0 or 1).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn row_word(words: __m256i, j: usize) -> __m256i {
    let pick = |row: usize| {
        let lo = (4 * row + 2 * j) as u32;
        (lo | (lo + 1) << 8 | lo << 16 | (lo + 1) << 24) as i32
    };
    _mm256_shuffle_epi8(
        words,
        _mm256_setr_epi32(pick(0), pick(1), pick(2), pick(3), pick(0), pick(1), pick(2), pick(3)),
    )
}

/// Without VNNI: partial sums in 16 bits, over the steps that cannot
/// overflow them (a Q4_K sub-block's eight steps reach at most
/// 8 · 2 · 15 · 128 = 30720; two Q6_K steps at most 2 · 2 · 63 · 128 =
/// 32256), widened by one word dot against the row's scale.
pub(super) mod avx2_ops {
    use std::arch::x86_64::*;

    pub(in super::super) const Q6_K_STEPS: usize = 2;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(in super::super) fn byte_dot(part: __m256i, q: __m256i, a: __m256i) -> __m256i {
        _mm256_add_epi16(part, _mm256_maddubs_epi16(q, a))
    }

    /// Scale `j` (0 or 1) of each row's pair in `pairs`, as words.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(in super::super) fn row_scales(pairs: __m128i, j: usize, signed: bool) -> __m256i {
        super::row_word(if signed { _mm256_cvtepi8_epi16(pairs) } else { _mm256_cvtepu8_epi16(pairs) }, j)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(in super::super) fn scaled_add(acc: __m256i, part: __m256i, scales: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(part, scales))
    }
}

/// With VNNI: one `vpdpbusd` per step adds the byte dot into 32-bit
/// partial sums, which no K-quant sub-block can overflow, and one 32-bit
/// multiply per sub-block applies its scale: per Q4_K sub-block and
/// activation row, 10 instructions where the 16-bit route takes 18.
pub(super) mod avx512_ops {
    use std::arch::x86_64::*;

    pub(in super::super) const Q6_K_STEPS: usize = 4;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(in super::super) fn byte_dot(part: __m256i, q: __m256i, a: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(part, q, a)
    }

    /// Scale `j` (0 or 1) of each row's pair in `pairs`, as 32-bit lanes.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(in super::super) fn row_scales(pairs: __m128i, j: usize, signed: bool) -> __m256i {
        let j = j as i8;
        let picked = _mm_shuffle_epi8(
            pairs,
            _mm_setr_epi8(j, 2 + j, 4 + j, 6 + j, 8 + j, 10 + j, 12 + j, 14 + j, -1, -1, -1, -1, -1, -1, -1, -1),
        );
        if signed { _mm256_cvtepi8_epi32(picked) } else { _mm256_cvtepu8_epi32(picked) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    pub(in super::super) fn scaled_add(acc: __m256i, part: __m256i, scales: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_mullo_epi32(part, scales))
    }
}
