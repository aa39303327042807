//! Q2_K and Q3_K against their format description and against GGML's own
//! results (fixtures made with llama.cpp b11434's libraries, see
//! kernels/tests/fixtures/README.md; the fixture checks are shared with the
//! other Q8_K formats' tests). The SIMD levels are held to the
//! reference by the table-driven tests in `quant/tests.rs`, which cover
//! every `DType`.

use half::f16;

use super::{ActFormat, DType, dequantize_row, try_vec_dot};

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

/// A fixture from kernels/tests/fixtures (ggml-<type>.bin, see its
/// README): `rows` rows of `n` elements, quantized by GGML, with GGML's
/// dequantization, activation rows (one per weight row), their Q8_K
/// quantization and GGML's dot of each pair.
struct Fixture {
    rows: usize,
    n: usize,
    weights: Vec<Vec<u8>>,
    dequantized: Vec<Vec<u32>>,
    acts: Vec<Vec<f32>>,
    acts_q8_k: Vec<Vec<u8>>,
    dots: Vec<f32>,
}

impl Fixture {
    fn parse(dtype: DType, bytes: &[u8]) -> Fixture {
        let mut at = 0;
        let mut take = |len: usize| {
            let part = &bytes[at..at + len];
            at += len;
            part
        };
        let word = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let (rows, n) = (word(take(4)) as usize, word(take(4)) as usize);
        let row_bytes = dtype.row_bytes(n).expect("whole blocks");
        let act_bytes = ActFormat::Q8_K.row_bytes(n).expect("whole blocks");
        let weights = (0..rows).map(|_| take(row_bytes).to_vec()).collect();
        let dequantized = (0..rows).map(|_| take(4 * n).chunks_exact(4).map(word).collect()).collect();
        let acts = (0..rows).map(|_| take(4 * n).chunks_exact(4).map(|b| f32::from_bits(word(b))).collect()).collect();
        let acts_q8_k = (0..rows).map(|_| take(act_bytes).to_vec()).collect();
        let dots = take(4 * rows).chunks_exact(4).map(|b| f32::from_bits(word(b))).collect();
        assert_eq!(at, bytes.len(), "{dtype}: trailing bytes");
        Fixture { rows, n, weights, dequantized, acts, acts_q8_k, dots }
    }
}

/// The bytes of kernels/tests/fixtures/ggml-<name>.bin.
macro_rules! ggml_fixture {
    ($name:literal) => {
        include_bytes!(concat!("../../tests/fixtures/ggml-", $name, ".bin"))
    };
}
pub(crate) use ggml_fixture;

/// Sluice's dequantization of a fixture's rows gives GGML's bits.
pub(crate) fn assert_dequantization_equals_ggml(dtype: DType, bytes: &[u8]) {
    let f = Fixture::parse(dtype, bytes);
    for (r, (w, want)) in f.weights.iter().zip(&f.dequantized).enumerate() {
        let mut got = vec![0.0; f.n];
        dequantize_row(dtype, w, &mut got).expect("valid row");
        for (i, (g, &e)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.to_bits(), e, "{dtype} row {r} element {i}: {g} vs {}", f32::from_bits(e));
        }
    }
}

/// Against GGML's own Q8_K rows (GGML signs its Q8_K scale after the
/// block's largest value, sluice keeps it positive, so the bytes differ
/// while the values agree), sluice's dot is GGML's to a few ulps of the
/// terms' magnitude (`tolerance` of Σ|w·x|): GGML's x86 kernels add the
/// blocks' terms in eight float lanes, sluice in one, block by block (see
/// `scalar.rs`).
pub(crate) fn assert_dots_match_ggml(dtype: DType, bytes: &[u8], tolerance: f32) {
    let f = Fixture::parse(dtype, bytes);
    assert_eq!(f.rows, 4);
    for r in 0..f.rows {
        let got = try_vec_dot(dtype, &f.weights[r], &f.acts_q8_k[r], f.n).expect("valid lengths");
        let want = f.dots[r];
        let mut w = vec![0.0; f.n];
        dequantize_row(dtype, &f.weights[r], &mut w).expect("valid row");
        let magnitude: f32 = w.iter().zip(&f.acts[r]).map(|(w, x)| (w * x).abs()).sum();
        assert!((got - want).abs() <= tolerance * magnitude, "{dtype} row {r}: {got} vs GGML's {want}");
    }
}

#[test]
fn dequantization_equals_ggml_bit_for_bit() {
    assert_dequantization_equals_ggml(DType::Q2_K, ggml_fixture!("q2_k"));
    assert_dequantization_equals_ggml(DType::Q3_K, ggml_fixture!("q3_k"));
}

#[test]
fn dots_match_ggml_on_its_q8_k_rows() {
    assert_dots_match_ggml(DType::Q2_K, ggml_fixture!("q2_k"), 1e-6);
    assert_dots_match_ggml(DType::Q3_K, ggml_fixture!("q3_k"), 1e-6);
}
