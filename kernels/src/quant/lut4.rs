//! The 4-bit formats whose quants index a 16-entry table of signed values
//! instead of standing for themselves: GGML's non-linear IQ4_NL and IQ4_XS,
//! and MXFP4 (OCP microscaling FP4, values stored as twice their E2M1
//! value with the factor ½ folded into the block scale). Their blocks,
//! tables, dequantization and scalar reference dots.
//!
//! Dot partners, chosen so that every block's dot is an exact integer sum
//! of table value × activation quant followed by one float step:
//! - IQ4_NL and MXFP4 (blocks of 32) pair with Q8_0S, like Q4_0: the same
//!   block of 32 under one scale, so the float step is Q4_0's
//!   ([`scalar::finish_symmetric`], the arithmetic of GGML's repacked
//!   kernels for these two types), and a matmul mixing them with Q4_0 or
//!   Q8_0 quantizes its activations once. The sum Q8_0S carries is unused
//!   by the file-layout dots; it is there for a packed kernel that biases
//!   the table values to unsigned bytes.
//! - IQ4_XS (blocks of 256 with eight 6-bit sub-block scales) pairs with
//!   Q8_K, as in GGML: the signed sub-block scales multiply the integer
//!   sub-block dots, so the whole block's sum stays an integer and takes
//!   Q6_K's float step ([`scalar::finish_scaled`]).

use bytemuck::{Pod, Zeroable};

use super::blocks::{BlockQ8_0S, BlockQ8K, QK, QK_K};
use super::scalar::{self, dot_blocks, each_block, half_to_f32, idot};

/// IQ4_NL's and IQ4_XS's values, GGML's `kvalues_iq4nl` table (a fact of
/// the file format).
pub(crate) const IQ4_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's values: the E2M1 numbers doubled, GGML's `kvalues_mxfp4` (the
/// OCP MX format's element encoding: bit 3 the sign, then exponent and
/// mantissa).
pub(crate) const FP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// IQ4_NL: f16 `d`, then 32 table indices as nibbles (low nibbles are
/// elements 0..16, high nibbles 16..32).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ4NL {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}

/// IQ4_XS: f16 `d`, the top two bits of the eight sub-block scales
/// (little-endian u16, two bits per sub-block), their low four bits (two
/// per byte, low nibble first), then eight sub-blocks of 16 nibble bytes
/// laid out as IQ4_NL's.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ4XS {
    pub d: [u8; 2],
    pub scales_h: [u8; 2],
    pub scales_l: [u8; 4],
    pub qs: [u8; 128],
}

/// MXFP4: an E8M0 exponent byte, then 32 table indices as IQ4_NL's. The
/// block is 17 bytes, so rows and blocks have no alignment.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; 16],
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockIQ4NL>() == 18);
    assert!(size_of::<BlockIQ4XS>() == 136);
    assert!(size_of::<BlockMXFP4>() == 17);
};

/// The 32 table values of a block's nibbles, in element order.
#[inline(always)]
pub(crate) fn lookup(table: &[i8; 16], qs: &[u8; 16]) -> [i8; QK] {
    let mut q = [0i8; QK];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = table[usize::from(byte & 0xF)];
        q[j + 16] = table[usize::from(byte >> 4)];
    }
    q
}

/// An MXFP4 block's scale: 2^(e − 128), the E8M0 value 2^(e − 127) halved
/// to undo the doubled table values. e = 0 and 1 give the subnormals 2^−128
/// and 2^−127; every byte gives a finite power of two (2^127 at most).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// Sub-block `ib`'s signed scale, the 6-bit field minus 32.
#[inline(always)]
pub(crate) fn iq4_xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = (u16::from_le_bytes(b.scales_h) >> (2 * ib)) & 3;
    (i32::from(low) | (i32::from(high) << 4)) - 32
}

// ---- dequantization --------------------------------------------------------

pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockIQ4NL, y: &mut [f32; QK]| {
        let d = half_to_f32(b.d);
        for (y, q) in y.iter_mut().zip(lookup(&IQ4_VALUES, &b.qs)) {
            *y = d * f32::from(q);
        }
    });
}

pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockIQ4XS, y: &mut [f32; QK_K]| {
        let d = half_to_f32(b.d);
        for (ib, (y, qs)) in y.as_chunks_mut::<QK>().0.iter_mut().zip(b.qs.as_chunks::<16>().0).enumerate() {
            let dl = d * iq4_xs_scale(b, ib) as f32;
            for (y, q) in y.iter_mut().zip(lookup(&IQ4_VALUES, qs)) {
                *y = dl * f32::from(q);
            }
        }
    });
}

pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    each_block(src, dst, |b: &BlockMXFP4, y: &mut [f32; QK]| {
        let d = e8m0_half(b.e);
        for (y, q) in y.iter_mut().zip(lookup(&FP4_VALUES, &b.qs)) {
            *y = f32::from(q) * d;
        }
    });
}

// ---- dot products ----------------------------------------------------------

pub(crate) fn dot_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockIQ4NL, a: &BlockQ8_0S| {
        let isum = idot(&lookup(&IQ4_VALUES, &w.qs), &a.qs);
        scalar::finish_symmetric(acc, half_to_f32(w.d), half_to_f32(a.d), isum)
    })
}

pub(crate) fn dot_mxfp4(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockMXFP4, a: &BlockQ8_0S| {
        let isum = idot(&lookup(&FP4_VALUES, &w.qs), &a.qs);
        scalar::finish_symmetric(acc, e8m0_half(w.e), half_to_f32(a.d), isum)
    })
}

/// Σ_ib scale_ib · (q·a)_ib over the eight sub-blocks of 32, then one scale.
pub(crate) fn dot_iq4_xs(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(w, a, |acc, w: &BlockIQ4XS, a: &BlockQ8K| {
        let mut isum = 0i32;
        for (ib, (qs, act)) in w.qs.as_chunks::<16>().0.iter().zip(a.qs.as_chunks::<QK>().0).enumerate() {
            isum = isum.wrapping_add(iq4_xs_scale(w, ib).wrapping_mul(idot(&lookup(&IQ4_VALUES, qs), act)));
        }
        scalar::finish_scaled(acc, half_to_f32(w.d), f32::from_le_bytes(a.d), isum)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{DType, dequantize_row, quantize_act_row, try_vec_dot};

    /// What GGML (llama.cpp b11434) made of four rows of 512 values for
    /// each format: its quantized bytes, its dequantized floats, and its
    /// CPU dots with four activation rows (tests/fixtures/lut4/README.md).
    struct Ggml {
        dtype: DType,
        weights: &'static [u8],
        floats: &'static [u8],
        dots: &'static [u8],
    }

    macro_rules! ggml_fixture {
        ($dtype:ident, $name:literal) => {
            Ggml {
                dtype: DType::$dtype,
                weights: include_bytes!(concat!("../../tests/fixtures/lut4/", $name, ".weights")),
                floats: include_bytes!(concat!("../../tests/fixtures/lut4/", $name, ".f32")),
                dots: include_bytes!(concat!("../../tests/fixtures/lut4/", $name, ".dots")),
            }
        };
    }

    const ROWS: usize = 4;
    const N: usize = 512;

    fn ggml_fixtures() -> [Ggml; 3] {
        [ggml_fixture!(IQ4_NL, "iq4_nl"), ggml_fixture!(IQ4_XS, "iq4_xs"), ggml_fixture!(MXFP4, "mxfp4")]
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes.as_chunks::<4>().0.iter().map(|b| f32::from_le_bytes(*b)).collect()
    }

    #[test]
    fn dequantize_equals_ggml_bit_for_bit() {
        for f in ggml_fixtures() {
            let row_bytes = f.dtype.row_bytes(N).expect("whole blocks");
            assert_eq!(f.weights.len(), ROWS * row_bytes, "{}", f.dtype);
            let want = floats(f.floats);
            for (r, (w, want)) in f.weights.chunks_exact(row_bytes).zip(want.chunks_exact(N)).enumerate() {
                let mut got = vec![0.0f32; N];
                dequantize_row(f.dtype, w, &mut got).expect("valid row");
                for (i, (g, e)) in got.iter().zip(want).enumerate() {
                    assert_eq!(g.to_bits(), e.to_bits(), "{} row {r} element {i}: {g} vs {e}", f.dtype);
                }
            }
        }
    }

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(131), 8.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
    }

    #[test]
    fn iq4_xs_scales_join_four_low_and_two_high_bits() {
        let mut b = BlockIQ4XS::zeroed();
        // Sub-block 3: low nibble 0xA (high nibble of byte 1), high bits
        // 0b10 (bits 6–7 of scales_h) → 42 − 32.
        b.scales_l[1] = 0xA0;
        b.scales_h = (0b10u16 << 6).to_le_bytes();
        assert_eq!(iq4_xs_scale(&b, 3), 10);
        assert_eq!(iq4_xs_scale(&b, 2), -32);
        b.scales_l = [0xFF; 4];
        b.scales_h = [0xFF; 2];
        assert!((0..8).all(|ib| iq4_xs_scale(&b, ib) == 31));
    }

    /// GGML's CPU dots on the same rows: equal up to the order of the
    /// float steps (theirs keeps eight partial sums per row; measured on
    /// these rows, 0 to 26 ulp apart), far inside 1e-6 of Σ|w·x|, which
    /// any difference in the values or scales would exceed.
    #[test]
    fn dots_agree_with_ggml_up_to_the_float_order() {
        let acts = floats(include_bytes!("../../tests/fixtures/lut4/acts.f32"));
        for f in ggml_fixtures() {
            let row_bytes = f.dtype.row_bytes(N).expect("whole blocks");
            let format = f.dtype.act_format();
            let (values, dots) = (floats(f.floats), floats(f.dots));
            let rows = f.weights.chunks_exact(row_bytes).zip(acts.chunks_exact(N)).zip(values.chunks_exact(N));
            for (r, ((w, x), values)) in rows.enumerate() {
                let mut a = vec![0u8; format.row_bytes(N).expect("whole blocks")];
                quantize_act_row(format, x, &mut a).expect("valid lengths");
                let got = try_vec_dot(f.dtype, w, &a, N).expect("valid lengths");
                let magnitude: f32 = values.iter().zip(x).map(|(w, x)| (w * x).abs()).sum();
                let want = dots[r];
                assert!((got - want).abs() <= 1e-6 * magnitude, "{} row {r}: {got} vs GGML's {want}", f.dtype);
            }
        }
    }
}
