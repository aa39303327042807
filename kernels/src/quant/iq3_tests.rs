//! IQ3_XXS and IQ3_S against their format descriptions (against GGML's
//! own results in `ggml_rows.rs`). The SIMD levels are held
//! to the reference by the table-driven tests in `quant/tests.rs`.

use half::f16;

use super::iq3_grids::{IQ3S_GRID, IQ3XXS_GRID};
use super::{DType, dequantize_row};

/// The value of element `i` of an IQ3 block, spelled out from the format
/// description rather than sharing code with the implementation (the
/// grids are the format's data).
pub(crate) fn documented_value(dtype: DType, b: &[u8], i: usize) -> f32 {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    // Sub-block, grid entry within it, byte of the entry, weight within
    // the sub-block.
    let (ib, k, j, within) = (i / 32, (i % 32) / 4, i % 4, i % 32);
    let magnitude = |entry: u32| ((entry >> (8 * j)) & 0xFF) as f32;
    match dtype {
        DType::IQ3_XXS => {
            let qs = &b[2..];
            let aux = u32::from_le_bytes([qs[64 + 4 * ib], qs[65 + 4 * ib], qs[66 + 4 * ib], qs[67 + 4 * ib]]);
            let field = (aux >> (7 * (within / 8))) & 127;
            // The eighth sign makes the number of negative weights even.
            let sign_byte = field | ((field.count_ones() % 2) << 7);
            let sign = if (sign_byte >> (within % 8)) & 1 == 1 { -1.0 } else { 1.0 };
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            db * magnitude(IQ3XXS_GRID[usize::from(qs[8 * ib + k])]) * sign
        }
        DType::IQ3_S => {
            let index = usize::from(b[2 + 8 * ib + k]) | (usize::from((b[66 + ib] >> k) & 1) << 8);
            let sign = if (b[74 + 4 * ib + within / 8] >> (within % 8)) & 1 == 1 { -1.0 } else { 1.0 };
            let s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF;
            let db = d * f32::from(1 + 2 * s);
            db * magnitude(IQ3S_GRID[index]) * sign
        }
        _ => unreachable!("only the IQ3 formats are described here"),
    }
}

#[test]
fn hand_built_iq3_xxs_block_dequantizes_as_described() {
    // d = 2. Sub-block 0: s = 3 (db = 2 · 3.5 · 0.5 = 3.5); entries 0 and 1
    // are grid entries 1 (magnitudes 20, 4, 4, 4) and 0 (all 4); sign field
    // 0b0000001 for group 0 (an odd count: the eighth weight negative too).
    let mut b = vec![0u8; 98];
    b[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
    b[2] = 1;
    b[2 + 64..2 + 68].copy_from_slice(&((3u32 << 28) | 0b1).to_le_bytes());
    let mut y = vec![0.0; 256];
    dequantize_row(DType::IQ3_XXS, &b, &mut y).expect("one block");
    assert_eq!(&y[..8], &[-70.0, 14.0, 14.0, 14.0, 14.0, 14.0, 14.0, -14.0]);
    // Sub-block 1: s = 0 (db = 0.5), entries 0, signs 0.
    assert_eq!(y[32], 2.0);
}

#[test]
fn hand_built_iq3_s_block_dequantizes_as_described() {
    // d = 0.5. Sub-block 1 (elements 32..64): scale nibble 2 (high nibble
    // of scales[0]) → db = 2.5; entry 1 has low index byte 5 and ninth bit
    // 1 (bit 1 of qh[1]) → grid entry 261; weight 33 negative (sign byte 4,
    // bit 1).
    let mut b = vec![0u8; 110];
    b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[2 + 8 + 1] = 5;
    b[66 + 1] = 0b10;
    b[74 + 4] = 0b10;
    b[106] = 0x20;
    let mut y = vec![0.0; 256];
    dequantize_row(DType::IQ3_S, &b, &mut y).expect("one block");
    let entry = IQ3S_GRID[261].to_le_bytes().map(|m| 2.5 * f32::from(m));
    assert_eq!(&y[36..40], &entry);
    assert_eq!(y[33], -2.5 * f32::from(IQ3S_GRID[0].to_le_bytes()[1]));
    assert_eq!(y[0], 0.5, "scale nibble 0 → db = d, grid entry 0 = 1s");
}
