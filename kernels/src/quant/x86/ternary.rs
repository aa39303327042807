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

macro_rules! ternary_kernels {
    ($features:literal) => {
        #[target_feature(enable = $features)]
        #[inline]
        fn ternary_prelude(d: [u8; 2]) -> kquant::Prelude<()> {
            kquant::Prelude { scales: (), sum_weights: _mm256_set1_epi16(1), d: u16::from_le_bytes(d), dmin: 0 }
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
