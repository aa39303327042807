//! Kernels over packed groups of Q2_K, Q3_K, Q5_K and IQ4_XS (their
//! layouts: `crate::quant::packed`), written once for both x86
//! levels: [`packed_low_kernels!`] is expanded inside each level's module
//! after `packed_kernels!`, whose width operations (`pk`), `block_step` and
//! `group_sums` it uses.
//!
//! Q2_K and Q3_K keep four 2-bit fields in a byte: one load of a quant
//! chunk serves the four steps that shift it by 0, 2, 4 and 6 bits, each a
//! byte dot against the activation's four matching bytes, as the other
//! packed K-quants do; Q3_K's third bits come from a chunk of `hmask`
//! bytes, one shift, mask and or per step. Q5_K is Q4_K with each step's fifth bits from a
//! chunk of `qh` bytes, one shift and mask per step. IQ4_XS's nibbles become table values with one byte
//! shuffle and meet the activations in the signed dot Q8_0 uses. The
//! integer sums are exact and each block takes the reference's float step,
//! so every output keeps the bits of the row-by-row kernels.

macro_rules! packed_low_kernels {
    ($features:literal) => {
        /// The 2-bit fields at shift `2S` of a quant chunk.
        #[target_feature(enable = $features)]
        #[inline]
        fn two_bit_fields<const S: usize>(v: pk::I) -> pk::I {
            let shifted = match S {
                0 => v,
                1 => pk::shr16::<2>(v),
                2 => pk::shr16::<4>(v),
                _ => pk::shr16::<6>(v),
            };
            pk::and_bytes(shifted, 3)
        }

        /// Bit `4H + S` of each byte of an `hmask` chunk, as bit 2: the
        /// third bits of elements `128H + 32S ..`.
        #[target_feature(enable = $features)]
        #[inline]
        fn third_bits<const H: usize, const S: usize>(v: pk::I) -> pk::I {
            let shifted = match 4 * H + S {
                0 => pk::shl16::<2>(v),
                1 => pk::shl16::<1>(v),
                2 => v,
                3 => pk::shr16::<1>(v),
                4 => pk::shr16::<2>(v),
                5 => pk::shr16::<3>(v),
                6 => pk::shr16::<4>(v),
                _ => pk::shr16::<5>(v),
            };
            pk::and_bytes(shifted, 4)
        }

        /// Where a packed Q2_K block's (`Q3` false) or Q3_K block's 2-bit
        /// fields, scales and third bits start, and whether its scales are
        /// signed: constants in each function taking `Q3` as a parameter.
        #[inline(always)]
        fn two_bit_layout<const Q3: bool>() -> (usize, usize, bool, Option<usize>) {
            use layout::{Q2_K_QS, Q2_K_SCALES, Q3_K_HMASK, Q3_K_QS, Q3_K_SCALES};
            if Q3 { (Q3_K_QS, Q3_K_SCALES, true, Some(Q3_K_HMASK)) } else { (Q2_K_QS, Q2_K_SCALES, false, None) }
        }

        /// Each row's quants `128H + 32S + 4t ..` (four) of a packed Q2_K
        /// or Q3_K block, unsigned.
        #[target_feature(enable = $features)]
        #[inline]
        fn two_bit_quants<const H: usize, const S: usize, const Q3: bool>(w: &[u8], t: usize) -> pk::I {
            let (qs, _, _, hmask) = two_bit_layout::<Q3>();
            let q = two_bit_fields::<S>(pk::load(w, qs + 32 * (8 * H + t)));
            match hmask {
                // Element 128H + 32S + 4t + k's third bit is bit 4H + S of
                // hmask[4t + k].
                Some(hmask) => pk::or(q, third_bits::<H, S>(pk::load(w, hmask + 32 * t))),
                None => q,
            }
        }

        /// Groups `8H + 2S` and `8H + 2S + 1` (elements `128H + 32S ..
        /// 128H + 32S + 32`) of a packed Q2_K or Q3_K block against the
        /// activation blocks `a`: each group's sum times its scale into
        /// `isum`. A separate function so that the shifts are constants.
        #[target_feature(enable = $features)]
        #[inline]
        fn two_bit_groups<const A: usize, const H: usize, const S: usize, const Q3: bool>(
            w: &[u8],
            a: [&BlockQ8K; A],
            isum: &mut [pk::I; A],
        ) {
            let (_, scales, signed, _) = two_bit_layout::<Q3>();
            for half in 0..2 {
                let mut part = [pk::zero(); A];
                for t in 4 * half..4 * half + 4 {
                    let q = two_bit_quants::<H, S, Q3>(w, t);
                    for i in 0..A {
                        part[i] = pk::byte_dot(part[i], q, pk::splat4(&a[i].qs, 32 * H + 8 * S + t));
                    }
                }
                // A group's sum is within 16 · 7 · 127 in magnitude (Q3_K;
                // Q2_K's quants are below 4).
                let sc = pk::row_scales_narrow(w, scales + 16 * (4 * H + S), half, signed);
                for i in 0..A {
                    isum[i] = pk::scaled_add_narrow(isum[i], part[i], sc);
                }
            }
        }

        /// All sixteen groups of a packed Q2_K or Q3_K block, in order.
        #[target_feature(enable = $features)]
        #[inline]
        fn two_bit_block<const A: usize, const Q3: bool>(w: &[u8], a: [&BlockQ8K; A]) -> [pk::I; A] {
            let mut isum = [pk::zero(); A];
            two_bit_groups::<A, 0, 0, Q3>(w, a, &mut isum);
            two_bit_groups::<A, 0, 1, Q3>(w, a, &mut isum);
            two_bit_groups::<A, 0, 2, Q3>(w, a, &mut isum);
            two_bit_groups::<A, 0, 3, Q3>(w, a, &mut isum);
            two_bit_groups::<A, 1, 0, Q3>(w, a, &mut isum);
            two_bit_groups::<A, 1, 1, Q3>(w, a, &mut isum);
            two_bit_groups::<A, 1, 2, Q3>(w, a, &mut isum);
            two_bit_groups::<A, 1, 3, Q3>(w, a, &mut isum);
            isum
        }

        /// The packed Q2_K groups in `groups`, as `packed_q4_k` takes them:
        /// Q4_K's float step with the minima's sums.
        #[target_feature(enable = $features)]
        fn packed_q2_k<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            use layout::{Q2_K_BLOCK, Q2_K_D, Q2_K_DMIN, Q2_K_MINS};
            packed_k(
                groups,
                acts,
                Q2_K_BLOCK,
                Q2_K_D,
                Some(Q2_K_DMIN),
                #[inline(always)]
                |w, a| {
                    // The minima first, as the block stores them before the
                    // quants: read after, they broke the stream, and decoding
                    // a Q2_K file ran 0.7× as fast on a 2-core Zen 4.
                    let imin = group_sums(w, a, Q2_K_MINS, false);
                    (two_bit_block::<A, false>(w, a), imin)
                },
            )
        }

        /// The packed Q3_K groups in `groups`: the quants unsigned (0..8),
        /// the offset of 4 taken off through the activation sums, then
        /// Q6_K's float step.
        #[target_feature(enable = $features)]
        fn packed_q3_k<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            use layout::{Q3_K_BLOCK, Q3_K_D, Q3_K_SCALES};
            packed_k(
                groups,
                acts,
                Q3_K_BLOCK,
                Q3_K_D,
                None,
                #[inline(always)]
                |w, a| {
                    // The scales' sums first, in the block's order (see Q2_K).
                    let offset = group_sums(w, a, Q3_K_SCALES, true);
                    let isum = two_bit_block::<A, true>(w, a);
                    (std::array::from_fn(|i| pk::sub(isum[i], pk::shl32::<2>(offset[i]))), [pk::zero(); A])
                },
            )
        }

        /// Bit `2P + HALF` of each byte of a Q5_K `qh` chunk, as bit 4. A
        /// 16-bit shift carries bits across the bytes of a word; they land
        /// in bits 0–3 of the upper byte (left shifts by at most 4) or 5–7
        /// of the lower (right shifts by at most 3), which the mask drops.
        #[target_feature(enable = $features)]
        #[inline]
        fn q5_k_fifth_bits<const P: usize, const HALF: usize>(v: pk::I) -> pk::I {
            let moved = match 2 * P + HALF {
                0 => pk::shl16::<4>(v),
                1 => pk::shl16::<3>(v),
                2 => pk::shl16::<2>(v),
                3 => pk::shl16::<1>(v),
                4 => v,
                5 => pk::shr16::<1>(v),
                6 => pk::shr16::<2>(v),
                _ => pk::shr16::<3>(v),
            };
            pk::and_bytes(moved, 0x10)
        }

        /// Step `s` (0..8) of sub-block `2P + HALF` of a packed Q5_K
        /// block: each row's quants `4s .. 4s + 4` of the sub-block, nibble
        /// and fifth bit.
        #[target_feature(enable = $features)]
        #[inline]
        fn q5_k_quants<const P: usize, const HALF: usize>(w: &[u8], s: usize) -> pk::I {
            use layout::{Q4_K_QS, Q5_K_QH};
            let v = pk::load(w, Q4_K_QS + 32 * (8 * P + s));
            let low = pk::and_bytes(if HALF == 0 { v } else { pk::shr16::<4>(v) }, 0xF);
            pk::or(low, q5_k_fifth_bits::<P, HALF>(pk::load(w, Q5_K_QH + 32 * s)))
        }

        /// Sub-block `2P + HALF` of a packed Q5_K block against the
        /// activation blocks `a`: its scaled sums into `isum`, its minima's
        /// into `imin`, as Q4_K's, the steps in runs that keep AVX2's
        /// 16-bit sums from overflowing (4 · 2 · 31 · 128 < 2¹⁵).
        #[target_feature(enable = $features)]
        #[inline]
        fn q5_k_sub_block<const A: usize, const P: usize, const HALF: usize>(
            w: &[u8],
            a: [&BlockQ8K; A],
            isum: &mut [pk::I; A],
            imin: &mut [pk::I; A],
        ) {
            use layout::{Q4_K_MINS, Q4_K_SCALES};
            const STEPS: usize = pk::Q5_K_STEPS;
            let j = 2 * P + HALF;
            let sc = pk::row_scales(w, Q4_K_SCALES + 16 * P, HALF, false);
            for run in 0..8 / STEPS {
                let mut part = [pk::zero(); A];
                for s in STEPS * run..STEPS * run + STEPS {
                    let q = q5_k_quants::<P, HALF>(w, s);
                    for i in 0..A {
                        part[i] = pk::byte_dot(part[i], q, pk::splat4(&a[i].qs, 8 * j + s));
                    }
                }
                for i in 0..A {
                    isum[i] = pk::scaled_add(isum[i], part[i], sc);
                }
            }
            let m = pk::row_words(w, Q4_K_MINS + 16 * P, HALF);
            for i in 0..A {
                imin[i] = pk::madd(imin[i], m, bsums_pair(a[i], j));
            }
        }

        /// The packed Q5_K groups in `groups`: Q4_K's float step.
        #[target_feature(enable = $features)]
        fn packed_q5_k<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            use layout::{Q4_K_D, Q4_K_DMIN, Q5_K_BLOCK};
            packed_k(
                groups,
                acts,
                Q5_K_BLOCK,
                Q4_K_D,
                Some(Q4_K_DMIN),
                #[inline(always)]
                |w, a| {
                    let (mut isum, mut imin) = ([pk::zero(); A], [pk::zero(); A]);
                    q5_k_sub_block::<A, 0, 0>(w, a, &mut isum, &mut imin);
                    q5_k_sub_block::<A, 0, 1>(w, a, &mut isum, &mut imin);
                    q5_k_sub_block::<A, 1, 0>(w, a, &mut isum, &mut imin);
                    q5_k_sub_block::<A, 1, 1>(w, a, &mut isum, &mut imin);
                    q5_k_sub_block::<A, 2, 0>(w, a, &mut isum, &mut imin);
                    q5_k_sub_block::<A, 2, 1>(w, a, &mut isum, &mut imin);
                    q5_k_sub_block::<A, 3, 0>(w, a, &mut isum, &mut imin);
                    q5_k_sub_block::<A, 3, 1>(w, a, &mut isum, &mut imin);
                    (isum, imin)
                },
            )
        }

        /// Sub-block `j` (elements `32j .. 32j + 32`) of a packed IQ4_XS
        /// block against the activation blocks `a`, times its scale, into
        /// `isum`.
        #[target_feature(enable = $features)]
        #[inline]
        fn iq4_xs_sub_block<const A: usize>(
            w: &[u8],
            a: [&BlockQ8K; A],
            table: pk::I,
            j: usize,
            isum: &mut [pk::I; A],
        ) {
            let mut part = [pk::zero(); A];
            for s in 0..4 {
                let v = pk::load(w, layout::IQ4_XS_QS + 32 * (4 * j + s));
                let low = pk::lookup(table, pk::and_bytes(v, 0xF));
                let high = pk::lookup(table, pk::and_bytes(pk::shr16::<4>(v), 0xF));
                for i in 0..A {
                    part[i] = pk::signed_dot(part[i], low, pk::splat4(&a[i].qs, 8 * j + s));
                    part[i] = pk::signed_dot(part[i], high, pk::splat4(&a[i].qs, 8 * j + 4 + s));
                }
            }
            let sc = pk::row_scales_wide(w, layout::IQ4_XS_SCALES + 16 * j, 0);
            for i in 0..A {
                isum[i] = pk::scaled_add_wide(isum[i], part[i], sc);
            }
        }

        /// The packed IQ4_XS groups in `groups`: Q6_K's float step.
        #[target_feature(enable = $features)]
        fn packed_iq4_xs<const A: usize>(groups: &[u8], acts: [&[u8]; A]) -> [[f32; 16]; A] {
            use layout::{IQ4_XS_BLOCK, IQ4_XS_D, IQ4_XS_SCALES};
            let table = pk::table16(&crate::quant::lut4::IQ4_VALUES);
            packed_k(
                groups,
                acts,
                IQ4_XS_BLOCK,
                IQ4_XS_D,
                None,
                #[inline(always)]
                |w, a| {
                    let mut isum = [pk::zero(); A];
                    for j in 0..8 {
                        iq4_xs_sub_block(w, a, table, j, &mut isum);
                    }
                    // The signed dot's bias times each sub-block's
                    // activation sum, times its scale, comes off: one word
                    // dot per pair of 16-value groups (each scale is stored
                    // twice for this).
                    const { assert!(pk::SIGNED_BIAS == 0 || pk::SIGNED_BIAS == 1 << 7) };
                    if pk::SIGNED_BIAS != 0 {
                        let excess = group_sums(w, a, IQ4_XS_SCALES, true);
                        for i in 0..A {
                            isum[i] = pk::sub(isum[i], pk::shl32::<7>(excess[i]));
                        }
                    }
                    (isum, [pk::zero(); A])
                },
            )
        }
    };
}

pub(super) use packed_low_kernels;
