//! IQ4_NL, IQ4_XS and MXFP4 against GGML's own results and their format
//! descriptions.

use bytemuck::Zeroable;

use super::blocks::BlockIQ4XS;
use super::lut4::*;
use super::{DType, dequantize_row, quantize_act_row, try_vec_dot};

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
