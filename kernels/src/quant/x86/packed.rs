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
        use packed_ops::$width as pk;

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

        /// The packed groups in `groups` of a K-quant format (`block` bytes
        /// per call block, as many groups as the level takes per call; a
        /// missing second one is stood in for by the first) against `A`
        /// activation rows: `sums` gives a call block's integer sums and
        /// its minima's (ignored without `dmin_at`), then each takes the
        /// reference's float step with the per-row `d` (and `dmin`) halves
        /// at `d_at` (`dmin_at`).
        #[target_feature(enable = $features)]
        #[inline]
        fn packed_k<const A: usize>(
            groups: &[u8],
            acts: [&[u8]; A],
            block: usize,
            d_at: usize,
            dmin_at: Option<usize>,
            sums: impl Fn(&[u8], [&BlockQ8K; A]) -> ([pk::I; A], [pk::I; A]),
        ) -> [[f32; 16]; A] {
            let acts = acts.map(blocks::<BlockQ8K>);
            let mut acc = [pk::zero_f(); A];
            for (b, w) in packed::call_blocks(groups, block, pk::GROUPS, &acts).enumerate() {
                let a = acts.map(|row| &row[b]);
                let (isum, imin) = sums(w, a);
                let d = pk::halves(w, d_at);
                let dmin = dmin_at.map(|at| pk::halves(w, at));
                for i in 0..A {
                    let minima = dmin.map(|dmin| (dmin, imin[i]));
                    acc[i] = block_step(acc[i], d, f32::from_le_bytes(a[i].d), isum[i], minima);
                }
            }
            acc.map(|v| pk::lanes(v))
        }

        /// The packed Q4_K groups in `groups` against `A` activation rows.
        #[target_feature(enable = $features)]
        fn packed_q4_k<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            use layout::{Q4_K_BLOCK, Q4_K_D, Q4_K_DMIN};
            packed_k(
                groups,
                acts,
                Q4_K_BLOCK,
                Q4_K_D,
                Some(Q4_K_DMIN),
                #[inline(always)]
                |w, a| {
                    let (mut isum, mut imin) = ([pk::zero(); A], [pk::zero(); A]);
                    for p in 0..4 {
                        q4_k_sub_block::<A, 0>(w, a, p, &mut isum, &mut imin);
                        q4_k_sub_block::<A, 1>(w, a, p, &mut isum, &mut imin);
                    }
                    (isum, imin)
                },
            )
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

        /// Step `u` (0..16) of quarter `Q` of a packed Q6_K block: each
        /// row's unsigned quants `64Q + 4u .. 64Q + 4u + 4`, the activation's
        /// step `16Q + u`.
        #[target_feature(enable = $features)]
        #[inline]
        fn q6_k_quants<const Q: usize>(w: &[u8], u: usize) -> pk::I {
            use layout::{q6_k_qh, q6_k_ql};
            let l = pk::load(w, q6_k_ql(u + 16 * (Q % 2)));
            let h = pk::load(w, q6_k_qh(u));
            let (l, h) = match Q {
                0 => (l, pk::shl16::<4>(h)),
                1 => (l, pk::shl16::<2>(h)),
                2 => (pk::shr16::<4>(l), h),
                _ => (pk::shr16::<4>(l), pk::shr16::<2>(h)),
            };
            pk::or(pk::and_bytes(l, 0xF), pk::and_bytes(h, 0x30))
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
            use layout::Q6_K_SCALES;
            const STEPS: usize = pk::Q6_K_STEPS;
            let g = 2 * pair + J;
            let sc = pk::row_scales(w, Q6_K_SCALES + 16 * (2 * Q + pair), J, true);
            for chunk in 0..4 / STEPS {
                let mut part = [pk::zero(); A];
                for step in 0..STEPS {
                    let u = 4 * g + STEPS * chunk + step;
                    let q = q6_k_quants::<Q>(w, u);
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
                packed::Q8_0 | packed::MXFP4 => pk::SIGNED_BIAS,
                packed::Q4_0 => 8,
                _ => 16,
            };
            let table = pk::table16(&crate::quant::lut4::FP4_VALUES);
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
                } else if FORMAT == packed::MXFP4 {
                    // Each nibble indexes the doubled E2M1 values, signed
                    // bytes dotted as Q8_0's quants are.
                    for h in 0..4 {
                        let v = pk::load(w, layout::LEGACY_QS + 32 * h);
                        let low = pk::lookup(table, pk::and_bytes(v, 0xF));
                        let high = pk::lookup(table, pk::and_bytes(pk::shr16::<4>(v), 0xF));
                        for i in 0..A {
                            isum[i] = pk::signed_dot(isum[i], low, pk::splat4(&a[i].qs, h));
                            isum[i] = pk::signed_dot(isum[i], high, pk::splat4(&a[i].qs, 4 + h));
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
                // MXFP4's power-of-two scales are packed as bf16, which
                // holds every one of them exactly.
                let d = if FORMAT == packed::MXFP4 {
                    pk::bf16s(w, layout::LEGACY_D)
                } else {
                    pk::halves(w, layout::LEGACY_D)
                };
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

        #[target_feature(enable = $features)]
        fn packed_mxfp4<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            packed_symmetric::<A, { packed::MXFP4 }, { layout::Q4_0_BLOCK }>(groups, acts)
        }

        /// The packed Q6_K groups in `groups`, as [`packed_q4_k`] takes them.
        #[target_feature(enable = $features)]
        fn packed_q6_k<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            use layout::{Q6_K_BLOCK, Q6_K_D, Q6_K_SCALES};
            packed_k(
                groups,
                acts,
                Q6_K_BLOCK,
                Q6_K_D,
                None,
                #[inline(always)]
                |w, a| {
                    let mut isum = [pk::zero(); A];
                    q6_k_quarter::<A, 0>(w, a, &mut isum);
                    q6_k_quarter::<A, 1>(w, a, &mut isum);
                    q6_k_quarter::<A, 2>(w, a, &mut isum);
                    q6_k_quarter::<A, 3>(w, a, &mut isum);
                    // The quants carry an offset of 32: Σ_g sc_g · (Σa)_g,
                    // times 32, comes off the sum.
                    let offset = group_sums(w, a, Q6_K_SCALES, true);
                    (std::array::from_fn(|i| pk::sub(isum[i], pk::shl32::<5>(offset[i]))), [pk::zero(); A])
                },
            )
        }
    };
}

pub(super) use packed_kernels;

/// The `FORMAT`s of `packed_symmetric`.
pub(super) const Q8_0: u8 = 0;
pub(super) const Q4_0: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const MXFP4: u8 = 3;

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
