//! The 1-bit i-quants against their format description (against GGML's
//! own results in `ggml_rows.rs`). The SIMD levels are held to the reference by the table-driven
//! tests in `quant/tests.rs`, which cover every `DType`.

use half::f16;

use super::iq1_grid::IQ1S_GRID;
use super::{DType, dequantize_row};

/// The value of element `i` of a block as GGML's description of the
/// format computes it: (d · (2s + 1)) · (grid value ± 1/8).
pub(crate) fn documented_value(dtype: DType, b: &[u8], i: usize) -> f32 {
    let (ib, l, j) = (i / 32, (i % 32) / 8, i % 8);
    let value = |index: usize| f32::from((IQ1S_GRID[index] >> (8 * j)) as u8 as i8);
    match dtype {
        DType::IQ1_S => {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]);
            let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
            let delta = if qh & 0x8000 != 0 { -0.125 } else { 0.125 };
            let index = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            dl * (value(index) + delta)
        }
        DType::IQ1_M => {
            let sc = |k: usize| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]);
            let bits = (sc(0) >> 12) | ((sc(1) >> 8) & 0x00F0) | ((sc(2) >> 4) & 0x0F00) | (sc(3) & 0xF000);
            let d = f16::from_bits(bits).to_f32();
            let shift = 6 * (ib % 2) + if l < 2 { 0 } else { 3 };
            let dl = d * f32::from(2 * ((sc(ib / 2) >> shift) & 7) + 1);
            let qh = b[32 + 2 * ib + l / 2];
            let (top, negative) = if l % 2 == 0 { (qh & 7, qh & 0x08 != 0) } else { ((qh >> 4) & 7, qh & 0x80 != 0) };
            let delta = if negative { -0.125 } else { 0.125 };
            dl * (value(usize::from(b[4 * ib + l]) | (usize::from(top) << 8)) + delta)
        }
        _ => unreachable!("only the 1-bit i-quants are described here"),
    }
}

#[test]
fn hand_built_iq1_blocks_dequantize_as_described() {
    // IQ1_S, d = 0.5. Sub-block 0: scale 2 (ls 5), offset −1/8; group 0
    // takes grid point 0 (all −1), group 1 point 0x100 (index top 1 in bits
    // 3..6 of the word).
    let mut b = vec![0u8; 50];
    b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    let word: u16 = 0x8000 | (2 << 12) | (1 << 3);
    b[34..36].copy_from_slice(&word.to_le_bytes());
    let mut y = vec![0.0; 256];
    dequantize_row(DType::IQ1_S, &b, &mut y).expect("one block");
    assert_eq!(y[0], 2.5 * (-1.0 - 0.125));
    let point = IQ1S_GRID[0x100].to_le_bytes().map(|v| f32::from(v as i8));
    assert_eq!(y[8..16], point.map(|v| 2.5 * (v - 0.125)));
    // Sub-block 1: word 0 → ls 1, offset +1/8, point 0.
    assert_eq!(y[32], 0.5 * (-1.0 + 0.125));

    // IQ1_M, d = 2 (f16 0x4000: top nibble of word 3 is 4). Sub-block 1:
    // scales at bits 6..12 of word 0: 3 (ls 7) for groups 0–1, 1 (ls 3)
    // for groups 2–3; group 1 (qh byte 2, high nibble 0b1000) has offset
    // −1/8 and point 0.
    let mut b = vec![0u8; 56];
    let w0: u16 = (3 << 6) | (1 << 9);
    b[48..50].copy_from_slice(&w0.to_le_bytes());
    b[55] = 0x40;
    b[32 + 2] = 0x80;
    dequantize_row(DType::IQ1_M, &b, &mut y).expect("one block");
    assert_eq!(y[32], 14.0 * (-1.0 + 0.125));
    assert_eq!(y[40], 14.0 * (-1.0 - 0.125));
    assert_eq!(y[48], 6.0 * (-1.0 + 0.125));
}
