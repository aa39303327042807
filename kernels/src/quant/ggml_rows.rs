//! GGML's own results on rows it quantized (kernels/tests/fixtures/ggml-*.bin,
//! made with llama.cpp b11434's libraries, see the README there: Q2_K,
//! Q3_K, the ternary formats and the grid i-quants), and sluice's dequantization and dots
//! against them.

use super::{ActFormat, DType, dequantize_row, try_vec_dot};

/// A fixture from kernels/tests/fixtures: `rows` rows of `n` elements,
/// quantized by GGML, with GGML's dequantization, activation rows (one per
/// weight row), their Q8_K quantization and GGML's dot of each pair.
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

/// How far GGML's dots may be from sluice's, as a share of Σ|w·x|: a few
/// ulps, GGML's x86 kernels adding the blocks' terms in eight float lanes
/// and sluice in one, block by block.
const ULPS: f32 = 1e-6;
/// GGML's x86 ternary dots convert eight lane sums of the unsigned fields
/// (the offset of 1 not yet taken off) to floats, so their rounding scales
/// with Σ q·|a| rather than Σ|w·x|: on these rows up to 1.1e-6 of the
/// latter away from the exact value (sluice's is within 4e-8 of it).
const TERNARY: f32 = 4e-6;

/// Every format with a fixture, its bytes and its dots' tolerance.
const FIXTURES: [(DType, &[u8], f32); 11] = [
    (DType::Q2_K, include_bytes!("../../tests/fixtures/ggml-q2_k.bin"), ULPS),
    (DType::Q3_K, include_bytes!("../../tests/fixtures/ggml-q3_k.bin"), ULPS),
    (DType::TQ2_0, include_bytes!("../../tests/fixtures/ggml-tq2_0.bin"), TERNARY),
    (DType::TQ1_0, include_bytes!("../../tests/fixtures/ggml-tq1_0.bin"), TERNARY),
    (DType::IQ3_XXS, include_bytes!("../../tests/fixtures/ggml-iq3_xxs.bin"), ULPS),
    (DType::IQ3_S, include_bytes!("../../tests/fixtures/ggml-iq3_s.bin"), ULPS),
    (DType::IQ2_XXS, include_bytes!("../../tests/fixtures/ggml-iq2_xxs.bin"), ULPS),
    (DType::IQ2_XS, include_bytes!("../../tests/fixtures/ggml-iq2_xs.bin"), ULPS),
    (DType::IQ2_S, include_bytes!("../../tests/fixtures/ggml-iq2_s.bin"), ULPS),
    (DType::IQ1_S, include_bytes!("../../tests/fixtures/ggml-iq1_s.bin"), ULPS),
    (DType::IQ1_M, include_bytes!("../../tests/fixtures/ggml-iq1_m.bin"), ULPS),
];

fn fixtures() -> impl Iterator<Item = (DType, Fixture, f32)> {
    FIXTURES.into_iter().map(|(dtype, bytes, tolerance)| (dtype, Fixture::parse(dtype, bytes), tolerance))
}

#[test]
fn dequantization_equals_ggml_bit_for_bit() {
    for (dtype, f, _) in fixtures() {
        for (r, (w, want)) in f.weights.iter().zip(&f.dequantized).enumerate() {
            let mut got = vec![0.0; f.n];
            dequantize_row(dtype, w, &mut got).expect("valid row");
            for (i, (g, &e)) in got.iter().zip(want).enumerate() {
                assert_eq!(g.to_bits(), e, "{dtype} row {r} element {i}: {g} vs {}", f32::from_bits(e));
            }
        }
    }
}

/// Against GGML's own Q8_K rows (GGML signs its Q8_K scale after the
/// block's largest value, sluice keeps it positive, so the bytes differ
/// while the values agree), sluice's dot is GGML's to within the format's
/// tolerance of the terms' magnitude.
#[test]
fn dots_match_ggml_on_its_q8_k_rows() {
    for (dtype, f, tolerance) in fixtures() {
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
}
