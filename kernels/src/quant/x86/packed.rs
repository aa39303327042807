//! Kernels over packed groups (`crate::quant::packed`): eight weight rows
//! per group, one per 32-bit lane, against `A` activation rows.
//! Written once: [`packed_kernels!`] is expanded inside each level's module
//! with that level's width operations, [`avx2_ops`] (one group per 256-bit
//! vector) or [`avx512_ops`] (two groups side by side in a 512-bit vector).
//!
//! Per step, one load holds four consecutive quants of each row, and each
//! activation row's four matching bytes are broadcast to every lane, so
//! that a byte dot leaves each row's partial sum in its own lane; the
//! width operations say how those sums are kept and scaled. After a block,
//! the reference's float step runs lane-wise on the rows. No reduction
//! across lanes is left.
//!
//! The legacy formats without an offset (Q4_0, Q5_0, Q8_0) are signed; the
//! byte dots take their weights as unsigned bytes, the quant plus a bias
//! (8, 16, and for Q8_0 at the VNNI level 128), and each block's sum starts
//! from minus the bias times the activation block's quant sum.

macro_rules! packed_kernels {
    ($features:literal, $width:ident) => {
        use packed::$width as pk;

        /// `acc` lane-wise plus one block's float step of the reference:
        /// `d` and `dmin` per row, `d_a` the activation block's.
        #[target_feature(enable = $features)]
        #[inline]
        fn block_step(acc: pk::F, d: pk::F, d_a: f32, isum: pk::I, dmin: Option<(pk::F, pk::I)>) -> pk::F {
            let d_a = pk::splat_f(d_a);
            let scaled = pk::mul_f(pk::mul_f(d, d_a), pk::to_f(isum));
            match dmin {
                Some((dmin, imin)) => {
                    pk::add_f(acc, pk::sub_f(scaled, pk::mul_f(pk::mul_f(dmin, d_a), pk::to_f(imin))))
                }
                None => pk::add_f(acc, scaled),
            }
        }

        /// The four bytes of activation bsums pair `k` in every lane.
        #[target_feature(enable = $features)]
        #[inline]
        fn bsums_pair(a: &BlockQ8K, k: usize) -> pk::I {
            pk::splat_i32(bytemuck::cast::<[u8; 4], i32>(a.bsums.as_chunks::<4>().0[k]))
        }

        /// Σ_g v_g · (Σa)_g over the sixteen 16-element groups of each
        /// activation block, `v` the eight 16-byte groups of pairs at `at`
        /// (Q6_K's and Q3_K's scales, signed, for their offsets; Q2_K's
        /// minima), a pair of groups per word dot.
        #[target_feature(enable = $features)]
        #[inline]
        fn group_sums<const A: usize>(w: &[u8], a: [&BlockQ8K; A], at: usize, signed: bool) -> [pk::I; A] {
            let mut sums = [pk::zero(); A];
            for pair in 0..8 {
                let v = pk::words(w, at + 16 * pair, signed);
                for i in 0..A {
                    sums[i] = pk::madd(sums[i], v, bsums_pair(a[i], pair));
                }
            }
            sums
        }

        /// Sub-block `2p + HALF` of a packed Q4_K block (`HALF` picks the
        /// nibble) against the activation blocks `a`: its scaled sums into
        /// `isum`, its minima's sums into `imin`. A separate function so
        /// that the nibble shift and the word picks are constants.
        #[target_feature(enable = $features)]
        #[inline]
        fn q4_k_sub_block<const A: usize, const HALF: usize>(
            w: &[u8],
            a: [&BlockQ8K; A],
            p: usize,
            isum: &mut [pk::I; A],
            imin: &mut [pk::I; A],
        ) {
            use layout::{Q4_K_MINS, Q4_K_QS, Q4_K_SCALES};
            let j = 2 * p + HALF;
            let mut part = [pk::zero(); A];
            for s in 0..8 {
                let v = pk::load(w, Q4_K_QS + 32 * (8 * p + s));
                let q = pk::and_bytes(if HALF == 0 { v } else { pk::shr16::<4>(v) }, 0xF);
                for i in 0..A {
                    part[i] = pk::byte_dot(part[i], q, pk::splat4(&a[i].qs, 8 * j + s));
                }
            }
            let sc = pk::row_scales(w, Q4_K_SCALES + 16 * p, HALF, false);
            let m = pk::row_words(w, Q4_K_MINS + 16 * p, HALF);
            for i in 0..A {
                isum[i] = pk::scaled_add(isum[i], part[i], sc);
                imin[i] = pk::madd(imin[i], m, bsums_pair(a[i], j));
            }
        }

        /// The packed Q4_K groups in `groups` (as many as the level takes
        /// per call; a missing second one is stood in for by the first)
        /// against `A` activation rows.
        #[target_feature(enable = $features)]
        fn packed_q4_k<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            let acts = acts.map(blocks::<BlockQ8K>);
            let mut acc = [pk::zero_f(); A];
            let blocks = packed::call_blocks(groups, layout::Q4_K_BLOCK, pk::GROUPS, &acts);
            for (b, w) in blocks.enumerate() {
                let a = acts.map(|row| &row[b]);
                let (mut isum, mut imin) = ([pk::zero(); A], [pk::zero(); A]);
                for p in 0..4 {
                    q4_k_sub_block::<A, 0>(w, a, p, &mut isum, &mut imin);
                    q4_k_sub_block::<A, 1>(w, a, p, &mut isum, &mut imin);
                }
                let (d, dmin) = (pk::halves(w, layout::Q4_K_D), pk::halves(w, layout::Q4_K_DMIN));
                for i in 0..A {
                    acc[i] = block_step(acc[i], d, f32::from_le_bytes(a[i].d), isum[i], Some((dmin, imin[i])));
                }
            }
            acc.map(|v| pk::lanes(v))
        }

        /// Quarter `Q` of a packed Q6_K block (elements 64·Q..64·Q+64, whose
        /// 16-element group g takes scale 4·Q + g) against the activation
        /// blocks `a`, its scaled sums into `isum`, a pair of groups at a
        /// time.
        #[target_feature(enable = $features)]
        #[inline]
        fn q6_k_quarter<const A: usize, const Q: usize>(w: &[u8], a: [&BlockQ8K; A], isum: &mut [pk::I; A]) {
            for pair in 0..2 {
                q6_k_group::<A, Q, 0>(w, a, pair, isum);
                q6_k_group::<A, Q, 1>(w, a, pair, isum);
            }
        }

        /// Group `2 · pair + J` of quarter `Q` (see [`q6_k_quarter`]). A
        /// separate function so that the shifts and the scale's byte picks
        /// are constants (picked at run time, they took scalar work and
        /// registers in the inner loop); a quarter's four groups unrolled
        /// spilled vector registers and ran a Q6_K prompt 1.7× slower.
        #[target_feature(enable = $features)]
        #[inline]
        fn q6_k_group<const A: usize, const Q: usize, const J: usize>(
            w: &[u8],
            a: [&BlockQ8K; A],
            pair: usize,
            isum: &mut [pk::I; A],
        ) {
            use layout::{Q6_K_SCALES, q6_k_qh, q6_k_ql};
            const STEPS: usize = pk::Q6_K_STEPS;
            let g = 2 * pair + J;
            let sc = pk::row_scales(w, Q6_K_SCALES + 16 * (2 * Q + pair), J, true);
            for chunk in 0..4 / STEPS {
                let mut part = [pk::zero(); A];
                for step in 0..STEPS {
                    let u = 4 * g + STEPS * chunk + step;
                    let l = pk::load(w, q6_k_ql(u + 16 * (Q % 2)));
                    let h = pk::load(w, q6_k_qh(u));
                    let (l, h) = match Q {
                        0 => (l, pk::shl16::<4>(h)),
                        1 => (l, pk::shl16::<2>(h)),
                        2 => (pk::shr16::<4>(l), h),
                        _ => (pk::shr16::<4>(l), pk::shr16::<2>(h)),
                    };
                    let q = pk::or(pk::and_bytes(l, 0xF), pk::and_bytes(h, 0x30));
                    for i in 0..A {
                        part[i] = pk::byte_dot(part[i], q, pk::splat4(&a[i].qs, 16 * Q + u));
                    }
                }
                for i in 0..A {
                    isum[i] = pk::scaled_add(isum[i], part[i], sc);
                }
            }
        }

        /// Nibble pair `H` (elements 4H+k and 16+4H+k of each row) of a
        /// packed Q4_0 or Q5_0 block (`fifth`: with Q5_0's fifth bits),
        /// into the low and high halves' partial sums.
        #[target_feature(enable = $features)]
        #[inline]
        fn symmetric_nibbles<const A: usize, const H: usize>(
            w: &[u8],
            a: [&BlockQ8_0S; A],
            fifth: bool,
            low: &mut [pk::I; A],
            high: &mut [pk::I; A],
        ) {
            let v = pk::load(w, layout::LEGACY_QS + 32 * H);
            let (mut lo, mut hi) = (pk::and_bytes(v, 0xF), pk::and_bytes(pk::shr16::<4>(v), 0xF));
            if fifth {
                // Bit i of each byte is element 4i+k's: bit H to 0x10 for
                // the low nibbles, bit 4+H for the high ones.
                let qh = pk::load(w, layout::Q5_0_QH);
                let (lo_bit, hi_bit) = match H {
                    0 => (pk::shl16::<4>(qh), qh),
                    1 => (pk::shl16::<3>(qh), pk::shr16::<1>(qh)),
                    2 => (pk::shl16::<2>(qh), pk::shr16::<2>(qh)),
                    _ => (pk::shl16::<1>(qh), pk::shr16::<3>(qh)),
                };
                lo = pk::or(lo, pk::and_bytes(lo_bit, 0x10));
                hi = pk::or(hi, pk::and_bytes(hi_bit, 0x10));
            }
            for i in 0..A {
                low[i] = pk::byte_dot(low[i], lo, pk::splat4(&a[i].qs, H));
                high[i] = pk::byte_dot(high[i], hi, pk::splat4(&a[i].qs, 4 + H));
            }
        }

        /// The packed groups of a legacy format without an offset
        /// (`FORMAT`: [`packed::Q8_0`], [`packed::Q4_0`] or
        /// [`packed::Q5_0`], `BLOCK` bytes per packed block) against `A`
        /// activation rows.
        #[target_feature(enable = $features)]
        #[inline]
        fn packed_symmetric<const A: usize, const FORMAT: u8, const BLOCK: usize>(
            groups: &[u8],
            acts: [&[u8]; A],
        ) -> [[f32; 16]; A] {
            let acts = acts.map(blocks::<BlockQ8_0S>);
            let mut acc = [pk::zero_f(); A];
            let bias = match FORMAT {
                packed::Q8_0 => pk::SIGNED_BIAS,
                packed::Q4_0 => 8,
                _ => 16,
            };
            let blocks = packed::call_blocks(groups, BLOCK, pk::GROUPS, &acts);
            for (b, w) in blocks.enumerate() {
                let a = acts.map(|row| &row[b]);
                let mut isum = a.map(|a| pk::splat_i32(-bias * i32::from(i16::from_le_bytes(a.sum))));
                if FORMAT == packed::Q8_0 {
                    for s in 0..8 {
                        let q = pk::load(w, layout::LEGACY_QS + 32 * s);
                        for i in 0..A {
                            isum[i] = pk::signed_dot(isum[i], q, pk::splat4(&a[i].qs, s));
                        }
                    }
                } else {
                    let fifth = FORMAT == packed::Q5_0;
                    let (mut low, mut high) = ([pk::zero(); A], [pk::zero(); A]);
                    symmetric_nibbles::<A, 0>(w, a, fifth, &mut low, &mut high);
                    symmetric_nibbles::<A, 1>(w, a, fifth, &mut low, &mut high);
                    symmetric_nibbles::<A, 2>(w, a, fifth, &mut low, &mut high);
                    symmetric_nibbles::<A, 3>(w, a, fifth, &mut low, &mut high);
                    for i in 0..A {
                        isum[i] = pk::widen_add(pk::widen_add(isum[i], low[i]), high[i]);
                    }
                }
                let d = pk::halves(w, layout::LEGACY_D);
                for i in 0..A {
                    let d_a = pk::splat_f(scalar::half_to_f32(a[i].d));
                    acc[i] = pk::fma_f(acc[i], pk::mul_f(d, d_a), pk::to_f(isum[i]));
                }
            }
            acc.map(|v| pk::lanes(v))
        }

        #[target_feature(enable = $features)]
        fn packed_q8_0<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            packed_symmetric::<A, { packed::Q8_0 }, { layout::Q8_0_BLOCK }>(groups, acts)
        }

        #[target_feature(enable = $features)]
        fn packed_q4_0<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            packed_symmetric::<A, { packed::Q4_0 }, { layout::Q4_0_BLOCK }>(groups, acts)
        }

        #[target_feature(enable = $features)]
        fn packed_q5_0<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            packed_symmetric::<A, { packed::Q5_0 }, { layout::Q5_0_BLOCK }>(groups, acts)
        }

        /// The packed Q6_K groups in `groups`, as [`packed_q4_k`] takes them.
        #[target_feature(enable = $features)]
        fn packed_q6_k<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            let acts = acts.map(blocks::<BlockQ8K>);
            let mut acc = [pk::zero_f(); A];
            let blocks = packed::call_blocks(groups, layout::Q6_K_BLOCK, pk::GROUPS, &acts);
            for (b, w) in blocks.enumerate() {
                let a = acts.map(|row| &row[b]);
                let mut isum = [pk::zero(); A];
                q6_k_quarter::<A, 0>(w, a, &mut isum);
                q6_k_quarter::<A, 1>(w, a, &mut isum);
                q6_k_quarter::<A, 2>(w, a, &mut isum);
                q6_k_quarter::<A, 3>(w, a, &mut isum);
                // The quants carry an offset of 32: Σ_g sc_g · (Σa)_g, times
                // 32, comes off the sum.
                let offset = group_sums(w, a, layout::Q6_K_SCALES, true);
                let d = pk::halves(w, layout::Q6_K_D);
                for i in 0..A {
                    let isum = pk::sub(isum[i], pk::shl32::<5>(offset[i]));
                    acc[i] = block_step(acc[i], d, f32::from_le_bytes(a[i].d), isum, None);
                }
            }
            acc.map(|v| pk::lanes(v))
        }
    };
}

pub(super) use packed_kernels;

/// The `FORMAT`s of `packed_symmetric`.
pub(super) const Q8_0: u8 = 0;
pub(super) const Q4_0: u8 = 1;
pub(super) const Q5_0: u8 = 2;

/// The blocks of the call's groups in `groups` (`per_call` of them: one
/// call block holds their blocks, see `place_block`) that the activation
/// rows `acts` reach.
pub(super) fn call_blocks<'a, T>(
    groups: &'a [u8],
    block: usize,
    per_call: usize,
    acts: &[&[T]],
) -> std::iter::Take<std::slice::ChunksExact<'a, u8>> {
    let blocks = groups.chunks_exact(block * per_call);
    let n = acts.iter().map(|row| row.len()).fold(blocks.len(), usize::min);
    blocks.take(n)
}

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
