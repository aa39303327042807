//! Q2_K and Q3_K against their format description (against GGML's own
//! results in `ggml_rows.rs`). The SIMD levels are held to the
//! reference by the table-driven tests in `quant/tests.rs`, which cover
//! every `DType`.

use half::f16;

use super::{DType, dequantize_row};

/// The value of element `i` of a Q2_K or Q3_K block, spelled out from the
/// format description rather than sharing code with the implementation.
pub(crate) fn documented_value(dtype: DType, b: &[u8], i: usize) -> f32 {
    let h = |off: usize| f16::from_le_bytes([b[off], b[off + 1]]).to_f32();
    // Half, shift step and position within the half's 32 quant bytes.
    let (half, j, l) = (i / 128, (i % 128) / 32, i % 32);
    let group = i / 16;
    match dtype {
        DType::Q2_K => {
            let q = (b[16 + 32 * half + l] >> (2 * j)) & 3;
            let sc = b[group];
            (h(80) * f32::from(sc & 15)) * f32::from(q) - h(82) * f32::from(sc >> 4)
        }
        DType::Q3_K => {
            let low = (b[32 + 32 * half + l] >> (2 * j)) & 3;
            let high_set = b[l] & (1 << (4 * half + j)) != 0;
            let q = i32::from(low) - if high_set { 0 } else { 4 };
            let s = &b[96..108];
            let six = match group {
                0..4 => (s[group] & 15) | ((s[8 + group] & 3) << 4),
                4..8 => (s[group] & 15) | (((s[group + 4] >> 2) & 3) << 4),
                8..12 => (s[group - 8] >> 4) | (((s[group] >> 4) & 3) << 4),
                _ => (s[group - 8] >> 4) | ((s[group - 4] >> 6) << 4),
            };
            (h(108) * (i32::from(six) - 32) as f32) * q as f32
        }
        _ => unreachable!("only Q2_K and Q3_K are described here"),
    }
}

#[test]
fn hand_built_blocks_dequantize_as_described() {
    let half = |v: f32| f16::from_f32(v).to_le_bytes();

    // Q2_K, d = 0.5, dmin = 0.25. Group 0: scale 3, min 2; element 0 is
    // q = 2 (byte 0 bits 0-1), element 32 (shift 2) q = 1. Group 9 (second
    // half, elements 144..160, bytes 32+16..): scale 15, min 1; element 145
    // reads bits 0-1 of qs[32 + 17] = 3.
    let mut b = vec![0u8; 84];
    b[0] = 0x23;
    b[2] = 0x05; // group 2 = elements 32..48: scale 5, min 0
    b[9] = 0x1F;
    b[16] = 0b0110;
    b[16 + 32 + 17] = 0b11;
    b[80..82].copy_from_slice(&half(0.5));
    b[82..84].copy_from_slice(&half(0.25));
    let mut y = vec![0.0; 256];
    dequantize_row(DType::Q2_K, &b, &mut y).expect("one block");
    assert_eq!(y[0], 0.5 * 3.0 * 2.0 - 0.25 * 2.0);
    assert_eq!(y[1], -0.5);
    assert_eq!(y[32], 0.5 * 5.0 * 1.0);
    assert_eq!(y[145], 0.5 * 15.0 * 3.0 - 0.25);

    // Q3_K, d = 2. Scale 0 = 33 (low nibble 1 in byte 0, top bits 0b10 in
    // byte 8): +1. Scale 13 = 0 (high nibble of byte 5 zero, bits 6-7 of byte
    // 9 zero): -32. Element 0: low bits 3, high bit set → 3. Element 1: low
    // bits 0, high bit clear → -4. Element 208 (half 1, j = 2, l = 16, group
    // 13): low bits 1 (qs[32 + 32 + 16] bits 4-5), high bit clear → -3.
    let mut b = vec![0u8; 110];
    b[0] = 0b0000_0001; // hmask[0]: bit 0 (half 0, j 0) set
    b[32] = 0b11;
    b[32 + 32 + 16] = 0b01_0000;
    b[96] = 0x01;
    b[96 + 8] = 0b10;
    b[108..110].copy_from_slice(&half(2.0));
    dequantize_row(DType::Q3_K, &b, &mut y).expect("one block");
    assert_eq!(y[0], 2.0 * 1.0 * 3.0);
    assert_eq!(y[1], 2.0 * 1.0 * -4.0);
    assert_eq!(y[208], 2.0 * -32.0 * -3.0);
    assert_eq!(y[16], 2.0 * -32.0 * -4.0, "scale 1 is 0 - 32");
}
