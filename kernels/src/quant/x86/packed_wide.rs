//! Kernels over wide blocks (`crate::quant::packed`, "Wide blocks") and
//! the widenings that make them from packed call blocks, expanded after
//! `packed_kernels!` and `packed_low_kernels!`, whose `packed_k` and
//! unpackings they use, at the levels whose byte dots sum into 32 bits
//! only (`dot_kernels!`'s `wide`).
//!
//! A widening runs the packed kernel's own unpacking once per call and
//! stores what it would have multiplied: a long prompt's passes then cost
//! one load per step, shared by the eight activation rows of a call.

macro_rules! packed_wide_kernels {
    ($features:literal) => {
        /// Wide call blocks against `A` activation rows: per step one load
        /// and a byte dot per row, per run of `SUB` elements one scaled add,
        /// then the corrections' word dots against the activation sums: the
        /// minima's sums where `MINIMA` (Q4_K's float step), else taken off
        /// the integer sum (Q6_K's).
        #[target_feature(enable = $features)]
        fn wide_kernel<const A: usize, const SUB: usize, const MINIMA: bool>(
            groups: &[u8],
            acts: [&[u8]; A],
        ) -> [[f32; 16]; A] {
            use layout::{WIDE_BLOCK, WIDE_CORRECTIONS, WIDE_D, WIDE_DMIN, WIDE_QS, WIDE_SCALES};
            const { assert!(SUB == 16 || SUB == 32) };
            packed_k(
                groups,
                acts,
                WIDE_BLOCK,
                WIDE_D,
                MINIMA.then_some(WIDE_DMIN),
                #[inline(always)]
                |w, a| {
                    let mut isum = [pk::zero(); A];
                    for run in 0..256 / SUB {
                        let mut part = [pk::zero(); A];
                        for t in SUB / 4 * run..SUB / 4 * (run + 1) {
                            let q = pk::load(w, WIDE_QS + 32 * t);
                            for i in 0..A {
                                part[i] = pk::byte_dot(part[i], q, pk::splat4(&a[i].qs, t));
                            }
                        }
                        let sc = pk::load(w, WIDE_SCALES + 32 * run);
                        for i in 0..A {
                            isum[i] = pk::scaled_add(isum[i], part[i], sc);
                        }
                    }
                    let mut corrections = [pk::zero(); A];
                    for pair in 0..8 {
                        let c = pk::load(w, WIDE_CORRECTIONS + 32 * pair);
                        for i in 0..A {
                            corrections[i] = pk::madd(corrections[i], c, bsums_pair(a[i], pair));
                        }
                    }
                    if MINIMA {
                        (isum, corrections)
                    } else {
                        (std::array::from_fn(|i| pk::sub(isum[i], corrections[i])), [pk::zero(); A])
                    }
                },
            )
        }

        /// The packed call blocks of `block` bytes per group in `call`,
        /// each with the wide one it becomes in `wide`, whose per-row `d`
        /// (and `dmin`, at `dmin_at`) halves from `d_at` are copied here.
        #[target_feature(enable = $features)]
        #[inline]
        fn wide_blocks<'a>(
            call: &'a [u8],
            block: usize,
            wide: &'a mut [u8],
            d_at: usize,
            dmin_at: Option<usize>,
        ) -> impl Iterator<Item = (&'a [u8], &'a mut [u8])> {
            use layout::{WIDE_BLOCK, WIDE_D, WIDE_DMIN};
            const G: usize = pk::GROUPS;
            call.chunks_exact(G * block).zip(wide.chunks_exact_mut(G * WIDE_BLOCK)).map(move |(w, out)| {
                out[G * WIDE_D..G * (WIDE_D + 16)].copy_from_slice(&w[G * d_at..G * (d_at + 16)]);
                if let Some(at) = dmin_at {
                    out[G * WIDE_DMIN..G * (WIDE_DMIN + 16)].copy_from_slice(&w[G * at..G * (at + 16)]);
                }
                (w, out)
            })
        }

        /// Packed IQ4_XS call blocks widened: the table's values plus 128
        /// (the byte dot's unsigned side), each sub-block's scale, and 128
        /// times it as the correction of both its 16-element halves.
        #[target_feature(enable = $features)]
        fn widen_iq4_xs(call: &[u8], wide: &mut [u8]) {
            use layout::{IQ4_XS_BLOCK, IQ4_XS_D, IQ4_XS_QS, IQ4_XS_SCALES, WIDE_CORRECTIONS, WIDE_QS, WIDE_SCALES};
            let table = pk::table16(&crate::quant::lut4::IQ4_VALUES.map(|v| v ^ i8::MIN));
            for (w, out) in wide_blocks(call, IQ4_XS_BLOCK, wide, IQ4_XS_D, None) {
                for c in 0..32 {
                    // Chunk c's low nibbles are step t's quants, its high
                    // ones step t + 4's.
                    let t = 8 * (c / 4) + c % 4;
                    let v = pk::load(w, IQ4_XS_QS + 32 * c);
                    pk::store(out, WIDE_QS + 32 * t, pk::lookup(table, pk::and_bytes(v, 0xF)));
                    let high = pk::and_bytes(pk::shr16::<4>(v), 0xF);
                    pk::store(out, WIDE_QS + 32 * (t + 4), pk::lookup(table, high));
                }
                for j in 0..8 {
                    pk::store(out, WIDE_SCALES + 32 * j, pk::row_scales_wide(w, IQ4_XS_SCALES + 16 * j, 0));
                    let scales = pk::words(w, IQ4_XS_SCALES + 16 * j, true);
                    pk::store(out, WIDE_CORRECTIONS + 32 * j, pk::shl16::<7>(scales));
                }
            }
        }

        /// Sub-block `2P + HALF` of a packed Q5_K block widened: its quants,
        /// its scale and its minimum, the correction of both halves.
        #[target_feature(enable = $features)]
        #[inline]
        fn widen_q5_k_sub_block<const P: usize, const HALF: usize>(w: &[u8], out: &mut [u8]) {
            use layout::{Q4_K_MINS, Q4_K_SCALES, WIDE_CORRECTIONS, WIDE_QS, WIDE_SCALES};
            let j = 2 * P + HALF;
            for s in 0..8 {
                pk::store(out, WIDE_QS + 32 * (8 * j + s), q5_k_quants::<P, HALF>(w, s));
            }
            pk::store(out, WIDE_SCALES + 32 * j, pk::row_scales(w, Q4_K_SCALES + 16 * P, HALF, false));
            pk::store(out, WIDE_CORRECTIONS + 32 * j, pk::row_words(w, Q4_K_MINS + 16 * P, HALF));
        }

        /// Packed Q5_K call blocks widened.
        #[target_feature(enable = $features)]
        fn widen_q5_k(call: &[u8], wide: &mut [u8]) {
            use layout::{Q4_K_D, Q4_K_DMIN, Q5_K_BLOCK};
            for (w, out) in wide_blocks(call, Q5_K_BLOCK, wide, Q4_K_D, Some(Q4_K_DMIN)) {
                widen_q5_k_sub_block::<0, 0>(w, out);
                widen_q5_k_sub_block::<0, 1>(w, out);
                widen_q5_k_sub_block::<1, 0>(w, out);
                widen_q5_k_sub_block::<1, 1>(w, out);
                widen_q5_k_sub_block::<2, 0>(w, out);
                widen_q5_k_sub_block::<2, 1>(w, out);
                widen_q5_k_sub_block::<3, 0>(w, out);
                widen_q5_k_sub_block::<3, 1>(w, out);
            }
        }

        /// Quarter `Q` of a packed Q6_K block's quants widened (offset
        /// 32).
        #[target_feature(enable = $features)]
        #[inline]
        fn widen_q6_k_quarter<const Q: usize>(w: &[u8], out: &mut [u8]) {
            for u in 0..16 {
                pk::store(out, layout::WIDE_QS + 32 * (16 * Q + u), q6_k_quants::<Q>(w, u));
            }
        }

        /// The sixteen signed group scales of a Q6_K or Q3_K block (their
        /// shared layout, at `at`) widened, and each group's correction:
        /// the quants' offset, `1 << OFFSET_BITS`, times its scale.
        #[target_feature(enable = $features)]
        #[inline]
        fn widen_group_scales<const OFFSET_BITS: u32>(w: &[u8], at: usize, out: &mut [u8]) {
            use layout::{WIDE_CORRECTIONS, WIDE_SCALES};
            for group in 0..16 {
                pk::store(out, WIDE_SCALES + 32 * group, pk::row_scales(w, at + 16 * (group / 2), group % 2, true));
            }
            for pair in 0..8 {
                let corrections = pk::shl16::<OFFSET_BITS>(pk::words(w, at + 16 * pair, true));
                pk::store(out, WIDE_CORRECTIONS + 32 * pair, corrections);
            }
        }

        /// Packed Q6_K call blocks widened (offset 32).
        #[target_feature(enable = $features)]
        fn widen_q6_k(call: &[u8], wide: &mut [u8]) {
            use layout::{Q6_K_BLOCK, Q6_K_D, Q6_K_SCALES};
            for (w, out) in wide_blocks(call, Q6_K_BLOCK, wide, Q6_K_D, None) {
                widen_q6_k_quarter::<0>(w, out);
                widen_q6_k_quarter::<1>(w, out);
                widen_q6_k_quarter::<2>(w, out);
                widen_q6_k_quarter::<3>(w, out);
                widen_group_scales::<5>(w, Q6_K_SCALES, out);
            }
        }

        /// Steps `32H + 8S ..` (eight) of a packed Q3_K block widened.
        #[target_feature(enable = $features)]
        #[inline]
        fn widen_q3_k_steps<const H: usize, const S: usize>(w: &[u8], out: &mut [u8]) {
            for t in 0..8 {
                pk::store(out, layout::WIDE_QS + 32 * (32 * H + 8 * S + t), two_bit_quants::<H, S, true>(w, t));
            }
        }

        /// Packed Q3_K call blocks widened: the quants unsigned (0..8),
        /// their offset 4 (Q6_K's steps with a smaller offset).
        #[target_feature(enable = $features)]
        fn widen_q3_k(call: &[u8], wide: &mut [u8]) {
            use layout::{Q3_K_BLOCK, Q3_K_D, Q3_K_SCALES};
            for (w, out) in wide_blocks(call, Q3_K_BLOCK, wide, Q3_K_D, None) {
                widen_q3_k_steps::<0, 0>(w, out);
                widen_q3_k_steps::<0, 1>(w, out);
                widen_q3_k_steps::<0, 2>(w, out);
                widen_q3_k_steps::<0, 3>(w, out);
                widen_q3_k_steps::<1, 0>(w, out);
                widen_q3_k_steps::<1, 1>(w, out);
                widen_q3_k_steps::<1, 2>(w, out);
                widen_q3_k_steps::<1, 3>(w, out);
                widen_group_scales::<2>(w, Q3_K_SCALES, out);
            }
        }
    };
}

pub(super) use packed_wide_kernels;
