//! TQ2_0 and TQ1_0 against their format descriptions (against GGML's
//! own results in `ggml_rows.rs`). The SIMD levels are held
//! to the reference by the table-driven tests in `quant/tests.rs`.

use half::f16;

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
        DType::TQ1_0 => {
            // Which byte and which base-3 digit: trit n of byte m is
            // floor(3 · ((m · 3^n) mod 256) / 256).
            let (byte, n) = match i {
                0..160 => (b[i % 32], i / 32),
                160..240 => (b[32 + (i - 160) % 16], (i - 160) / 16),
                _ => (b[48 + (i - 240) % 4], (i - 240) / 4),
            };
            let fraction = (u32::from(byte) * 3u32.pow(n as u32)) % 256;
            ((3 * fraction / 256) as i32 - 1) as f32 * h(52)
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

#[test]
fn base_3_bytes_give_their_digits() {
    // GGML packs five trits t0..t4 (t0 most significant) as
    // ceil(256 · Σ t_k 3^(4−k) / 243); reading trit n recovers t_n.
    for value in 0..243u32 {
        let digits: Vec<u8> = (0..5).map(|k| ((value / 3u32.pow(4 - k)) % 3) as u8).collect();
        let byte = (value * 256).div_ceil(243) as u8;
        let got: Vec<u8> = (0..5).map(|n| super::ternary::trit(byte, n)).collect();
        assert_eq!(got, digits, "{value}");
    }
}

#[test]
fn hand_built_tq1_0_block_dequantizes_as_described() {
    // d = 2. qs[0] packs trits 2,0,1,1,2 (elements 0, 32, 64, 96, 128);
    // qs[33] packs 1,2,… (elements 161, 177); qh[2] packs 0,0,0,2
    // (elements 242, 246, 250, 254).
    let pack = |t: [u32; 5]| (t.iter().fold(0, |v, &t| 3 * v + t) * 256).div_ceil(243) as u8;
    let mut b = vec![0u8; 54];
    b[0] = pack([2, 0, 1, 1, 2]);
    b[33] = pack([1, 2, 0, 0, 0]);
    b[50] = pack([0, 0, 0, 2, 0]);
    b[52..54].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
    let mut y = vec![0.0; 256];
    dequantize_row(DType::TQ1_0, &b, &mut y).expect("one block");
    assert_eq!([y[0], y[32], y[64], y[96], y[128]], [2.0, -2.0, 0.0, 0.0, 2.0]);
    assert_eq!([y[161], y[177], y[193]], [0.0, 2.0, -2.0]);
    assert_eq!([y[242], y[246], y[250], y[254]], [-2.0, -2.0, -2.0, 2.0]);
}
