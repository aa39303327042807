//! The 2-bit i-quants against their format description (against GGML's
//! own results in `ggml_rows.rs`). The SIMD levels are held to the reference by the table-driven
//! tests in `quant/tests.rs`, which cover every `DType`.

use half::f16;

use super::iq2_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use super::{DType, dequantize_row};

/// The value of element `i` of a block as GGML's description of the
/// format computes it: (d · (s + ½) · ¼) · magnitude, negated by the sign
/// bit (IQ2_XXS and IQ2_XS store seven, the eighth being their parity).
pub(crate) fn documented_value(dtype: DType, b: &[u8], i: usize) -> f32 {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let (ib, l, j) = (i / 32, (i % 32) / 8, i % 8);
    let sign_of = |seven: u32| if j < 7 { (seven >> j) & 1 } else { seven.count_ones() & 1 };
    let byte = |entry: u64| f32::from((entry >> (8 * j)) as u8);
    let signed = |bit: u32| if bit == 1 { -1.0 } else { 1.0 };
    // IQ2_XS and IQ2_S: the sub-block's scale byte, low nibble for groups
    // 0 and 1.
    let nibble_db = |scales: &[u8]| {
        let s = if l < 2 { scales[ib] & 15 } else { scales[ib] >> 4 };
        d * (0.5 + f32::from(s)) * 0.25
    };
    match dtype {
        DType::IQ2_XXS => {
            let sub = &b[2 + 8 * ib..2 + 8 * ib + 8];
            let aux = u32::from_le_bytes([sub[4], sub[5], sub[6], sub[7]]);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            db * byte(IQ2XXS_GRID[usize::from(sub[l])]) * signed(sign_of((aux >> (7 * l)) & 127))
        }
        DType::IQ2_XS => {
            let at = 2 + 2 * (4 * ib + l);
            let word = u16::from_le_bytes([b[at], b[at + 1]]);
            nibble_db(&b[66..74]) * byte(IQ2XS_GRID[usize::from(word & 511)]) * signed(sign_of(u32::from(word >> 9)))
        }
        DType::IQ2_S => {
            let index = usize::from(b[2 + 4 * ib + l]) | ((usize::from(b[66 + ib]) << (8 - 2 * l)) & 0x300);
            let sign = u32::from((b[34 + 4 * ib + l] >> j) & 1);
            nibble_db(&b[74..82]) * byte(IQ2S_GRID[index]) * signed(sign)
        }
        _ => unreachable!("only the 2-bit i-quants are described here"),
    }
}

#[test]
fn hand_built_iq2_xxs_block_dequantizes_as_described() {
    // d = 2. Sub-block 0: scale 3 → 2 · 3.5 / 4 = 1.75; groups 0 and 1 take
    // grid points 0 (all 8) and 1 (element 0 is 43); group 0's sign field
    // 0b0000011 negates elements 0, 1 (parity even: element 7 positive),
    // group 1's 0b0000001 negates element 0 and, for parity, element 7.
    let mut b = vec![0u8; 66];
    b[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
    b[2 + 1] = 1;
    let aux: u32 = (3 << 28) | 0b0000011 | (0b0000001 << 7);
    b[2 + 4..2 + 8].copy_from_slice(&aux.to_le_bytes());
    let mut y = vec![0.0; 256];
    dequantize_row(DType::IQ2_XXS, &b, &mut y).expect("one block");
    assert_eq!(&y[..3], &[-14.0, -14.0, 14.0]);
    assert_eq!(y[7], 14.0);
    assert_eq!(y[8], -1.75 * 43.0);
    assert_eq!(y[15], -14.0);
    assert_eq!(y[14], 14.0);
    // Sub-block 1: scale 0 → 2 · 0.5 / 4 = 0.25, grid point 0.
    assert_eq!(y[32], 0.25 * 8.0);
}
