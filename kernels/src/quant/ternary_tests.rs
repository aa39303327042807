//! TQ2_0 and TQ1_0 against their format descriptions and against GGML's
//! own results (kernels/tests/fixtures/README.md). The SIMD levels are held
//! to the reference by the table-driven tests in `quant/tests.rs`.

use half::f16;

use super::low_k_tests::{assert_dequantization_equals_ggml, assert_dots_match_ggml, ggml_fixture};
use super::{DType, dequantize_row};

/// The value of element `i` of a ternary block, spelled out from the
/// format description rather than sharing code with the implementation.
pub(crate) fn documented_value(dtype: DType, b: &[u8], i: usize) -> f32 {
    let h = |off: usize| f16::from_le_bytes([b[off], b[off + 1]]).to_f32();
    match dtype {
        DType::TQ2_0 => {
            // Chunk of 128 (32 bytes), pass l, byte m within the chunk.
            let (chunk, l, m) = (i / 128, (i % 128) / 32, i % 32);
            let q = (b[32 * chunk + m] >> (2 * l)) & 3;
            (i32::from(q) - 1) as f32 * h(64)
        }
        _ => unreachable!("only the ternary formats are described here"),
    }
}

#[test]
fn hand_built_tq2_0_block_dequantizes_as_described() {
    // d = 0.5. Byte 0 = 0b11_10_01_00: elements 0, 32, 64, 96 are the
    // fields 0, 1, 2, 3 → −1, 0, 1, 2 (times d). Byte 33 bits 4-5 = 2:
    // element 128 + 64 + 1 → +1.
    let mut b = vec![0u8; 66];
    b[0] = 0b1110_0100;
    b[33] = 0b10_0000;
    b[64..66].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    let mut y = vec![0.0; 256];
    dequantize_row(DType::TQ2_0, &b, &mut y).expect("one block");
    assert_eq!([y[0], y[32], y[64], y[96]], [-0.5, 0.0, 0.5, 1.0]);
    assert_eq!(y[193], 0.5);
    assert_eq!(y[1], -0.5, "a zero field is −1");
}

/// GGML's x86 ternary dots convert eight lane sums of the unsigned fields
/// (the offset of 1 not yet taken off) to floats, so their rounding scales
/// with Σ q·|a| rather than Σ|w·x|: on these rows up to 1.1e-6 of the
/// latter away from the exact value (sluice's is within 4e-8 of it).
const TERNARY_TOLERANCE: f32 = 4e-6;

#[test]
fn tq2_0_equals_ggml() {
    assert_dequantization_equals_ggml(DType::TQ2_0, ggml_fixture!("tq2_0"));
    assert_dots_match_ggml(DType::TQ2_0, ggml_fixture!("tq2_0"), TERNARY_TOLERANCE);
}
