//! Tests of the formats, the reference kernels, and the SIMD levels against
//! the reference.

use half::{bf16, f16};

use super::*;

/// SplitMix64: small, deterministic, and good enough for test data.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub(crate) fn fill(&mut self, bytes: &mut [u8]) {
        for b in bytes {
            *b = self.next_u64() as u8;
        }
    }
}

/// Offsets of the f16 scale fields inside a block.
fn scale_offsets(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::IQ4_XS | DType::IQ3_XXS | DType::IQ3_S => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q6_K => &[208],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::TQ2_0 => &[64],
        DType::TQ1_0 => &[52],
        DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S | DType::IQ1_S => &[0],
        // IQ1_M's scale is spread over four words: see `put_scales`.
        DType::IQ1_M => &[],
        // MXFP4's scale is an exponent byte: see `finite_exponents`.
        DType::F32 | DType::F16 | DType::BF16 | DType::MXFP4 => &[],
    }
}

/// Writes the block's f16 scales, the k-th being `scale(k)`; IQ1_M's one
/// scale goes to the top nibbles of its four scale words.
fn put_scales(dtype: DType, block: &mut [u8], scale: impl Fn(usize) -> f16) {
    for (k, &off) in scale_offsets(dtype).iter().enumerate() {
        block[off..off + 2].copy_from_slice(&scale(k).to_le_bytes());
    }
    if dtype == DType::IQ1_M {
        let bits = scale(0).to_bits();
        for k in 0..4 {
            let hi = &mut block[48 + 2 * k + 1];
            *hi = (*hi & 0x0F) | ((((bits >> (4 * k)) & 0xF) as u8) << 4);
        }
    }
}

/// Caps MXFP4's exponent bytes at 2^15, about the largest f16 scale the
/// other formats get: larger ones (up to 2^127) overflow a dot to infinity
/// on any activations, and GGML's would too.
fn finite_exponents(dtype: DType, row: &mut [u8]) {
    if dtype == DType::MXFP4 {
        for block in row.chunks_exact_mut(dtype.block_bytes()) {
            block[0] = block[0].min(128 + 15);
        }
    }
}

/// A random weight row: random quant bytes with finite scales of modest
/// size (and signs) for the block formats, random values for float types.
pub(crate) fn random_weights(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    let mut row = vec![0u8; dtype.row_bytes(n).expect("test sizes are whole blocks")];
    match dtype {
        DType::F32 => row.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&rng.signed_unit().to_le_bytes())),
        DType::F16 => {
            row.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&f16::from_f32(rng.signed_unit()).to_le_bytes()))
        }
        DType::BF16 => {
            row.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&bf16::from_f32(rng.signed_unit()).to_le_bytes()))
        }
        _ => {
            rng.fill(&mut row);
            for block in row.chunks_exact_mut(dtype.block_bytes()) {
                let count = scale_offsets(dtype).len() + usize::from(dtype == DType::IQ1_M);
                let scales: Vec<f16> = (0..count).map(|_| f16::from_f32(rng.signed_unit() * 0.01)).collect();
                put_scales(dtype, block, |k| scales[k]);
                if dtype == DType::MXFP4 {
                    // 2^-10 .. 2^-3: the values' range, as above.
                    block[0] = 118 + rng.below(8) as u8;
                }
            }
        }
    }
    row
}

/// Activations around unit size, with an occasional outlier as real
/// activations have.
pub(crate) fn random_acts(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| if rng.below(50) == 0 { rng.signed_unit() * 30.0 } else { rng.signed_unit() }).collect()
}

fn quantized(level: SimdLevel, format: ActFormat, x: &[f32]) -> Vec<u8> {
    let kernels = Kernels::new(level).expect("level is supported");
    let mut out = vec![0u8; format.row_bytes(x.len()).expect("whole blocks")];
    kernels.quantize(format, x, &mut out);
    out
}

fn dot_at(level: SimdLevel, dtype: DType, w: &[u8], x: &[f32]) -> f32 {
    let a = quantized(level, dtype.act_format(), x);
    Kernels::new(level).expect("level is supported").dot(dtype).call(w, &a)
}

/// Every row through the four-row kernel, as the rows of one call (lanes
/// repeat the last row when fewer than four are given).
fn dot4_at(level: SimdLevel, dtype: DType, rows: &[Vec<u8>], x: &[f32]) -> Vec<f32> {
    let a = quantized(level, dtype.act_format(), x);
    let dot = Kernels::new(level).expect("level is supported").dot(dtype);
    rows.chunks(4)
        .flat_map(|group| {
            let lanes: [&[u8]; 4] = std::array::from_fn(|r| group[r.min(group.len() - 1)].as_slice());
            dot.call4(lanes, &a)[..group.len()].to_vec()
        })
        .collect()
}

fn simd_levels() -> Vec<SimdLevel> {
    let levels: Vec<_> =
        [SimdLevel::Avx2, SimdLevel::Avx512].into_iter().filter(|&l| Family::Quant.supports(l)).collect();
    if levels.is_empty() {
        eprintln!("no SIMD level is supported here; only the scalar reference was tested");
    }
    levels
}

fn dequantized(dtype: DType, w: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    dequantize_row(dtype, w, &mut out).expect("valid row");
    out
}

// ---- formats ----------------------------------------------------------------

#[test]
fn ggml_ids_names_and_sizes() {
    let table = [
        (0, "F32", 1, 4),
        (1, "F16", 1, 2),
        (2, "Q4_0", 32, 18),
        (3, "Q4_1", 32, 20),
        (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24),
        (8, "Q8_0", 32, 34),
        (12, "Q4_K", 256, 144),
        (13, "Q5_K", 256, 176),
        (14, "Q6_K", 256, 210),
        (20, "IQ4_NL", 32, 18),
        (23, "IQ4_XS", 256, 136),
        (10, "Q2_K", 256, 84),
        (11, "Q3_K", 256, 110),
        (16, "IQ2_XXS", 256, 66),
        (17, "IQ2_XS", 256, 74),
        (22, "IQ2_S", 256, 82),
        (19, "IQ1_S", 256, 50),
        (29, "IQ1_M", 256, 56),
        (30, "BF16", 1, 2),
        (39, "MXFP4", 32, 17),
        (35, "TQ2_0", 256, 66),
        (34, "TQ1_0", 256, 54),
        (18, "IQ3_XXS", 256, 98),
        (21, "IQ3_S", 256, 110),
    ];
    for (id, name, elems, bytes) in table {
        let dtype = DType::from_ggml(id).expect("known id");
        assert_eq!((dtype.name(), dtype.block_elems(), dtype.block_bytes()), (name, elems, bytes));
        assert_eq!(dtype.to_string(), name);
    }
    for id in [4, 5, 9, 15, 31, 1000] {
        assert_eq!(DType::from_ggml(id), None, "id {id}");
    }
    assert_eq!(DType::ALL.len(), table.len());
}

#[test]
fn row_bytes_refuses_partial_blocks_and_overflow() {
    assert_eq!(DType::Q4_0.row_bytes(64), Some(36));
    assert_eq!(DType::Q6_K.row_bytes(512), Some(420));
    assert_eq!(DType::F16.row_bytes(3), Some(6));
    assert_eq!(DType::Q4_0.row_bytes(33), None);
    assert_eq!(DType::Q4_K.row_bytes(32), None);
    assert_eq!(DType::F32.row_bytes(usize::MAX), None);
    assert_eq!(DType::Q8_0.row_bytes(usize::MAX / 32 * 32), None);
    assert_eq!(ActFormat::Q8_K.row_bytes(256), Some(292));
    assert_eq!(ActFormat::Q8_1.row_bytes(64), Some(72));
}

#[test]
fn checked_entry_points_refuse_bad_lengths() {
    let mut out = vec![0.0; 48];
    let err = dequantize_row(DType::Q4_0, &[0; 36], &mut out).expect_err("48 is not a multiple of 32");
    assert_eq!(err, KernelError::PartialBlock { format: "Q4_0", n: 48, block: 32 });
    assert!(err.to_string().contains("48"), "{err}");
    let mut out = vec![0.0; 64];
    let err = dequantize_row(DType::Q4_0, &[0; 35], &mut out).expect_err("short source");
    assert_eq!(err, KernelError::Length { what: "the source row (bytes)", got: 35, expected: 36 });

    let err = quantize_act_row(ActFormat::Q8_0, &[0.0; 64], &mut [0; 60]).expect_err("short destination");
    assert!(matches!(err, KernelError::Length { got: 60, expected: 68, .. }), "{err}");

    let w = vec![0u8; 36];
    let a = vec![0u8; 72];
    assert_eq!(try_vec_dot(DType::Q4_0, &w, &a, 64), Ok(0.0));
    assert!(try_vec_dot(DType::Q4_0, &w, &a[..71], 64).is_err());
    assert!(try_vec_dot(DType::Q4_0, &w[..18], &a, 64).is_err());
    assert!(try_vec_dot(DType::Q4_0, &w, &a, 65).is_err());
}

// ---- dequantization, against the formats as documented ---------------------

/// The value of element `i` of a block, spelled out from the format
/// description rather than sharing code with the implementation.
fn documented_value(dtype: DType, b: &[u8], i: usize) -> f32 {
    let h = |off: usize| f16::from_le_bytes([b[off], b[off + 1]]).to_f32();
    let nibble = |qs: &[u8], i: usize| if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 };
    let k_scale_min = |s: &[u8], j: usize| {
        if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        }
    };
    match dtype {
        DType::Q4_0 => h(0) * (f32::from(nibble(&b[2..], i)) - 8.0),
        DType::Q4_1 => h(0) * f32::from(nibble(&b[4..], i)) + h(2),
        DType::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let q = i32::from(nibble(&b[6..], i)) | (((qh >> i) & 1) << 4) as i32;
            h(0) * (q - 16) as f32
        }
        DType::Q5_1 => {
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            let q = u32::from(nibble(&b[8..], i)) | (((qh >> i) & 1) << 4);
            h(0) * q as f32 + h(2)
        }
        DType::Q8_0 => h(0) * f32::from(b[2 + i] as i8),
        DType::Q4_K | DType::Q5_K => {
            let (j, l) = (i / 32, i % 32);
            let qs = if dtype == DType::Q4_K { &b[16..144] } else { &b[48..176] };
            let byte = qs[32 * (j / 2) + l];
            let mut q = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
            if dtype == DType::Q5_K {
                q |= ((b[16 + l] >> j) & 1) << 4;
            }
            let (sc, m) = k_scale_min(&b[4..16], j);
            h(0) * f32::from(sc) * f32::from(q) - h(2) * f32::from(m)
        }
        DType::Q6_K => {
            let (half, within) = (i / 128, i % 128);
            let (ql, qh, sc) = (&b[64 * half..], &b[128 + 32 * half..], &b[192 + 8 * half..]);
            let (k, l) = (within / 32, within % 32);
            let low = if k % 2 == 0 { ql[l] } else { ql[l + 32] };
            let low = if k < 2 { low & 0xF } else { low >> 4 };
            let q = i32::from(low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            h(208) * f32::from(sc[l / 16 + 2 * k] as i8) * q as f32
        }
        DType::IQ4_NL => h(0) * f32::from(lut4::IQ4_VALUES[usize::from(nibble(&b[2..], i))]),
        DType::IQ4_XS => {
            let (ib, l) = (i / 32, i % 32);
            let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
            let high = (u16::from_le_bytes([b[2], b[3]]) >> (2 * ib)) & 3;
            let scale = i32::from(low) + 16 * i32::from(high) - 32;
            h(0) * scale as f32 * f32::from(lut4::IQ4_VALUES[usize::from(nibble(&b[8 + 16 * ib..], l))])
        }
        DType::MXFP4 => {
            let scale = 2f64.powi(i32::from(b[0]) - 128) as f32;
            f32::from(lut4::FP4_VALUES[usize::from(nibble(&b[1..], i))]) * scale
        }
        DType::Q2_K | DType::Q3_K => super::low_k_tests::documented_value(dtype, b, i),
        DType::TQ2_0 | DType::TQ1_0 => super::ternary_tests::documented_value(dtype, b, i),
        DType::IQ3_XXS | DType::IQ3_S => super::iq3_tests::documented_value(dtype, b, i),
        DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S => super::iq2_tests::documented_value(dtype, b, i),
        DType::IQ1_S | DType::IQ1_M => super::iq1_tests::documented_value(dtype, b, i),
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => h(0),
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
    }
}

fn documented_row(dtype: DType, w: &[u8], n: usize) -> Vec<f32> {
    let per_block = dtype.block_elems();
    (0..n).map(|i| documented_value(dtype, &w[i / per_block * dtype.block_bytes()..], i % per_block)).collect()
}

#[test]
fn dequantize_matches_the_documented_layouts() {
    let mut rng = Rng::new(1);
    for dtype in DType::ALL {
        for n in [256, 512] {
            let w = random_weights(&mut rng, dtype, n);
            let got = dequantized(dtype, &w, n);
            let want = documented_row(dtype, &w, n);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "{dtype} element {i}: {g} vs {e}");
            }
        }
    }
}

#[test]
fn dequantize_hand_built_blocks() {
    let half = |v: f32| f16::from_f32(v).to_le_bytes();

    // Q4_0, d = 0.5: byte j holds j (element j) and 15 - j (element j + 16).
    let mut b = half(0.5).to_vec();
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = dequantized(DType::Q4_0, &b, 32);
    assert_eq!(&y[..4], &[-4.0, -3.5, -3.0, -2.5]);
    assert_eq!(y[15], 3.5);
    assert_eq!(&y[16..18], &[3.5, 3.0]);
    assert_eq!(y[31], -4.0);

    // Q4_1, d = 0.25, m = -1: element = 0.25 q - 1.
    let mut b = [half(0.25), half(-1.0)].concat();
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = dequantized(DType::Q4_1, &b, 32);
    assert_eq!(&y[..3], &[-1.0, -0.75, -0.5]);
    assert_eq!(y[16], 2.75);

    // Q5_0, d = 2: only element 0 and element 17 have their fifth bit.
    let mut b = half(2.0).to_vec();
    b.extend((1u32 | (1 << 17)).to_le_bytes());
    b.extend([0x31u8; 16]);
    let y = dequantized(DType::Q5_0, &b, 32);
    assert_eq!((y[0], y[1], y[16], y[17]), (2.0 * (1.0 + 16.0 - 16.0), 2.0 * -15.0, 2.0 * -13.0, 2.0 * 3.0));

    // Q5_1, d = 1, m = 0.5: all fifth bits set, all nibbles 0xF → q = 31.
    let mut b = [half(1.0), half(0.5)].concat();
    b.extend(u32::MAX.to_le_bytes());
    b.extend([0xFFu8; 16]);
    assert!(dequantized(DType::Q5_1, &b, 32).iter().all(|&v| v == 31.5));

    // Q8_0, d = 0.125.
    let mut b = half(0.125).to_vec();
    b.extend((0..32).map(|i: i32| (i * 8 - 128) as i8 as u8));
    let y = dequantized(DType::Q8_0, &b, 32);
    assert_eq!((y[0], y[16], y[31]), (-16.0, 0.0, 15.0));

    // Q4_K, d = 1, dmin = 0.5; sub-block 0: sc 3, m 2; sub-block 5: sc 63
    // (low nibble 0xF in byte 9, top bits 0b11 in byte 1), m 1 (byte 9 high
    // nibble 1, byte 5 top bits 0).
    let mut b = [half(1.0), half(0.5)].concat();
    let mut scales = [0u8; 12];
    scales[0] = 3;
    scales[4] = 2;
    scales[1] = 0b1100_0000;
    scales[9] = 0x1F;
    b.extend(scales);
    let mut qs = [0u8; 128];
    qs[0] = 0x07; // sub-block 0 element 0 = 7, sub-block 1 element 0 = 0
    qs[64 + 3] = 0xA0; // sub-block 5 element 3 = 10
    b.extend(qs);
    let y = dequantized(DType::Q4_K, &b, 256);
    assert_eq!(y[0], 1.0 * 3.0 * 7.0 - 0.5 * 2.0);
    assert_eq!(y[1], -1.0);
    assert_eq!(y[5 * 32 + 3], 63.0 * 10.0 - 0.5);

    // Q5_K: the same block with the fifth bit of sub-block 5 element 3 set.
    let mut b5 = b[..16].to_vec();
    let mut qh = [0u8; 32];
    qh[3] = 1 << 5;
    b5.extend(qh);
    b5.extend(qs);
    let y = dequantized(DType::Q5_K, &b5, 256);
    assert_eq!(y[5 * 32 + 3], 63.0 * 26.0 - 0.5);
    assert_eq!(y[0], 20.0);

    // Q6_K, d = 0.5, scale -3 for elements 16..32 of the first half: element
    // 17 (l = 17, ql low nibble 5, qh bits 0-1 = 2) is q = 37 - 32 = 5.
    let mut b = vec![0u8; 210];
    b[17] = 0x05;
    b[128 + 17] = 0b10;
    b[192 + 1] = (-3i8) as u8;
    b[208..].copy_from_slice(&half(0.5));
    let y = dequantized(DType::Q6_K, &b, 256);
    assert_eq!(y[17], 0.5 * -3.0 * 5.0);
    assert_eq!(y[0], 0.0, "scale 0");

    let y = dequantized(DType::F16, &[half(1.5), half(-2.0)].concat(), 2);
    assert_eq!(y, [1.5, -2.0]);
    let y =
        dequantized(DType::BF16, &[bf16::from_f32(3.0).to_le_bytes(), bf16::from_f32(-0.5).to_le_bytes()].concat(), 2);
    assert_eq!(y, [3.0, -0.5]);
    let y = dequantized(DType::F32, &[1.25f32.to_le_bytes(), (-7.0f32).to_le_bytes()].concat(), 2);
    assert_eq!(y, [1.25, -7.0]);
}

// ---- activation quantization -----------------------------------------------

#[test]
fn activation_quantization_rounds_ties_to_even_and_fills_sums() {
    // amax 127 gives d = 1, so quants are the values rounded.
    let mut x = vec![0.0f32; 256];
    x[..8].copy_from_slice(&[127.0, 2.5, -3.5, 0.5, -0.5, 1.5, -126.6, 3.49]);
    let q = quantized(SimdLevel::Scalar, ActFormat::Q8_0, &x);
    assert_eq!(f16::from_le_bytes([q[0], q[1]]).to_f32(), 1.0);
    assert_eq!(q[2..10].iter().map(|&b| b as i8).collect::<Vec<_>>(), [127, 2, -4, 0, 0, 2, -127, 3]);

    let q = quantized(SimdLevel::Scalar, ActFormat::Q8_1, &x);
    // d times the sum of the quants above, as f16.
    assert_eq!(f16::from_le_bytes([q[2], q[3]]).to_f32(), 3.0);

    let q = quantized(SimdLevel::Scalar, ActFormat::Q8_0S, &x);
    // The sum itself, then the Q8_0 block's quants.
    assert_eq!(i16::from_le_bytes([q[2], q[3]]), 3);
    assert_eq!(q[4..12].iter().map(|&b| b as i8).collect::<Vec<_>>(), [127, 2, -4, 0, 0, 2, -127, 3]);

    let q = quantized(SimdLevel::Scalar, ActFormat::Q8_K, &x);
    assert_eq!(f32::from_le_bytes([q[0], q[1], q[2], q[3]]), 1.0);
    assert_eq!(i16::from_le_bytes([q[260], q[261]]), 3);
    assert_eq!(i16::from_le_bytes([q[262], q[263]]), 0);

    // All-zero and subnormal blocks quantize to zeros.
    for x in [vec![0.0f32; 256], vec![1e-40f32; 256]] {
        let q = quantized(SimdLevel::Scalar, ActFormat::Q8_K, &x);
        assert!(q[4..].iter().all(|&b| b == 0));
    }
}

/// Activation rows that stress rounding and range: ties, zeros, subnormals,
/// one spike among tiny values, and magnitudes near the f16 scale limit.
fn adversarial_acts(n: usize) -> Vec<Vec<f32>> {
    let ties: Vec<f32> = (0..n).map(|i| if i % 32 == 0 { 127.0 } else { (i % 7) as f32 - 2.5 }).collect();
    let spike: Vec<f32> = (0..n).map(|i| if i % 97 == 3 { 1000.0 } else { 1e-6 * i as f32 }).collect();
    let big: Vec<f32> = (0..n).map(|i| if i % 2 == 0 { 8.0e6 } else { -8.0e6 }).collect();
    let negative: Vec<f32> = vec![-1.0; n];
    vec![vec![0.0; n], vec![1e-41; n], ties, spike, big, negative]
}

#[test]
fn simd_activation_quantization_equals_scalar() {
    let mut rng = Rng::new(2);
    for level in simd_levels() {
        let mut rows = adversarial_acts(512);
        rows.extend((0..20).map(|_| random_acts(&mut rng, 512)));
        for x in &rows {
            for format in [ActFormat::F32, ActFormat::Q8_0, ActFormat::Q8_0S, ActFormat::Q8_1, ActFormat::Q8_K] {
                assert_eq!(
                    quantized(level, format, x),
                    quantized(SimdLevel::Scalar, format, x),
                    "{level:?} {format:?}"
                );
            }
        }
    }
}

// ---- dot products -----------------------------------------------------------

/// Weight rows built to hit the integer extremes of each format: zeros,
/// every quant byte 0xFF (maximal nibbles, fifth bits and 6-bit scales),
/// every quant byte 0x80 (−128 for Q8_0, minimal Q6_K scale), and random
/// quants under scales of ±65504, the largest finite f16.
fn adversarial_weights(rng: &mut Rng, dtype: DType, n: usize) -> Vec<Vec<u8>> {
    let len = dtype.row_bytes(n).expect("whole blocks");
    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        let big = match dtype {
            DType::F32 => f32::MAX.sqrt().to_le_bytes().to_vec(),
            DType::F16 => f16::MAX.to_le_bytes().to_vec(),
            _ => bf16::from_f32(1e18).to_le_bytes().to_vec(),
        };
        return vec![vec![0; len], big.repeat(n)];
    }
    let mut rows = Vec::new();
    for fill in [0x00u8, 0xFF, 0x80] {
        for scale in [1.0f32, -65504.0] {
            let mut row = vec![fill; len];
            for block in row.chunks_exact_mut(dtype.block_bytes()) {
                put_scales(dtype, block, |_| f16::from_f32(scale));
            }
            finite_exponents(dtype, &mut row);
            rows.push(row);
        }
    }
    let mut row = random_weights(rng, dtype, n);
    for block in row.chunks_exact_mut(dtype.block_bytes()) {
        put_scales(dtype, block, |k| if k == 0 { f16::MAX } else { f16::MIN });
    }
    rows.push(row);
    rows
}

#[test]
fn simd_dots_equal_scalar_on_random_rows() {
    let mut rng = Rng::new(3);
    for level in simd_levels() {
        for dtype in DType::ALL {
            let sizes: &[usize] = if dtype.block_elems() == 1 { &[1, 15, 16, 77, 768] } else { &[256, 768] };
            for &n in sizes {
                for _ in 0..10 {
                    let w = random_weights(&mut rng, dtype, n);
                    let x = random_acts(&mut rng, n);
                    let (got, want) = (dot_at(level, dtype, &w, &x), dot_at(SimdLevel::Scalar, dtype, &w, &x));
                    assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {dtype} n={n}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn simd_dots_equal_scalar_on_adversarial_rows() {
    let mut rng = Rng::new(4);
    let n = 512;
    for level in simd_levels() {
        for dtype in DType::ALL {
            for w in adversarial_weights(&mut rng, dtype, n) {
                for x in adversarial_acts(n).into_iter().chain([random_acts(&mut rng, n)]) {
                    let (got, want) = (dot_at(level, dtype, &w, &x), dot_at(SimdLevel::Scalar, dtype, &w, &x));
                    assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {dtype}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn four_row_kernels_equal_the_reference_lane_by_lane() {
    let mut rng = Rng::new(8);
    let n = 512;
    for level in SimdLevel::ALL.into_iter().filter(|&l| Family::Quant.supports(l)) {
        for dtype in DType::ALL {
            // Adversarial and random rows side by side in one call, in
            // several arrangements.
            let mut rows = adversarial_weights(&mut rng, dtype, n);
            rows.extend((0..5).map(|_| random_weights(&mut rng, dtype, n)));
            for shift in 0..3 {
                rows.rotate_left(shift);
                for x in [random_acts(&mut rng, n), adversarial_acts(n).swap_remove(3)] {
                    let got = dot4_at(level, dtype, &rows, &x);
                    for (row, got) in rows.iter().zip(got) {
                        let want = dot_at(SimdLevel::Scalar, dtype, row, &x);
                        assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {dtype}: {got} vs {want}");
                    }
                }
            }
        }
    }
}

#[test]
fn multi_activation_row_kernels_equal_the_reference_for_every_row() {
    let mut rng = Rng::new(9);
    let n = 512;
    for level in SimdLevel::ALL.into_iter().filter(|&l| Family::Quant.supports(l)) {
        let kernels = Kernels::new(level).expect("level is supported");
        for dtype in DType::ALL {
            let mut rows = adversarial_weights(&mut rng, dtype, n);
            rows.extend((0..5).map(|_| random_weights(&mut rng, dtype, n)));
            // Every adversarial row (zeros, subnormals, ties, a spike, ±8e6,
            // all −127) among random ones, so each reaches the lanes of the
            // multi-row kernels.
            let [zeros, tiny, ties, spike, big, negative]: [Vec<f32>; 6] =
                adversarial_acts(n).try_into().expect("six adversarial rows");
            let xs = [random_acts(&mut rng, n), spike, zeros, ties, big, tiny, negative, random_acts(&mut rng, n)];
            let acts = xs.each_ref().map(|x| quantized(level, dtype.act_format(), x));
            let dot = kernels.dot(dtype);
            for group in rows.chunks(4) {
                let lanes: [&[u8]; 4] = std::array::from_fn(|r| group[r.min(group.len() - 1)].as_slice());
                let pair = dot.call4x2(lanes, [&acts[0], &acts[1]]);
                let quad = dot.call4x4(lanes, std::array::from_fn(|i| acts[i + 4].as_slice()));
                let eight = dot.call4x8(lanes, acts.each_ref().map(Vec::as_slice));
                let results = pair.iter().zip(&xs).chain(quad.iter().zip(&xs[4..])).chain(eight.iter().zip(&xs));
                for (got, x) in results {
                    for (row, got) in group.iter().zip(got) {
                        let want = dot_at(SimdLevel::Scalar, dtype, row, x);
                        assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {dtype}: {got} vs {want}");
                    }
                }
            }
        }
    }
}

#[test]
fn packed_kernels_equal_the_reference_for_every_row_and_activation_row() {
    let mut rng = Rng::new(10);
    let n = 512;
    // More threads than groups: one packs nothing.
    let pool = crate::pool::ThreadPool::new(3);
    for level in simd_levels() {
        let kernels = Kernels::new(level).expect("level is supported");
        for dtype in [
            DType::Q4_K,
            DType::Q6_K,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q5_0,
            DType::Q5_K,
            DType::Q2_K,
            DType::Q3_K,
            DType::IQ4_XS,
            DType::MXFP4,
        ] {
            let dot = kernels.dot(dtype);
            assert!(dot.packs(), "{level:?} {dtype}");
            // Adversarial rows (extreme quants and scales) and random ones,
            // three groups of eight in several arrangements: where the level
            // takes two groups per call, the third is a lone last group.
            let mut rows = adversarial_weights(&mut rng, dtype, n);
            rows.extend((0..24 - rows.len()).map(|_| random_weights(&mut rng, dtype, n)));
            let mut xs = adversarial_acts(n);
            xs.extend((0..7).map(|_| random_acts(&mut rng, n)));
            let acts: Vec<Vec<u8>> = xs.iter().map(|x| quantized(level, dtype.act_format(), x)).collect();
            let per_call = dot.packed_groups();
            for shift in [0, 5] {
                rows.rotate_left(shift);
                let data = rows.concat();
                let packed = PackedRows::new(dtype, &data, rows.len(), n, per_call, &pool).expect("whole groups");
                assert_eq!(packed.n_groups(), 3);
                // Every count of activation rows, so that each of the
                // kernels' widths (eight, four, one) and their mixes run,
                // on each call's groups.
                let group_bytes = packed.group_bytes();
                for count in 1..=acts.len() {
                    let acts: Vec<&[u8]> = acts[..count].iter().map(Vec::as_slice).collect();
                    for g in (0..3).step_by(per_call) {
                        let n = per_call.min(3 - g);
                        let mut seen = 0;
                        let bytes = &packed.bytes()[g * group_bytes..(g + per_call) * group_bytes];
                        let check = |kind: &str, i: usize, values: &[f32]| {
                            assert_eq!(values.len(), 8 * n);
                            for (r, got) in values.iter().enumerate() {
                                let want = dot.call(&rows[8 * g + r], acts[i]);
                                assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {dtype} {kind} row {r} act {i}");
                            }
                        };
                        dot.call_packed(bytes, n, &acts, |i, values| {
                            seen += 1;
                            check("packed", i, values);
                        });
                        assert_eq!(seen, count);
                        // The wide copy of the same call, where the level widens.
                        if dot.widens() {
                            let mut wide = vec![0u8; per_call * packed.wide_group_bytes()];
                            dot.widen(bytes, &mut wide);
                            let mut seen = 0;
                            dot.call_wide(&wide, n, &acts, |i, values| {
                                seen += 1;
                                check("wide", i, values);
                            });
                            assert_eq!(seen, count);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn extreme_finite_scales_give_finite_dots() {
    let mut rng = Rng::new(5);
    let n = 512;
    for dtype in DType::ALL {
        for w in adversarial_weights(&mut rng, dtype, n) {
            for x in adversarial_acts(n) {
                let got = dot_at(Family::Quant.level(), dtype, &w, &x);
                assert!(got.is_finite(), "{dtype}: {got}");
            }
        }
    }
}

/// |vec_dot − Σ w·x| stays within the error the activation quantization
/// allows. Per element of a block with largest magnitude `amax`, the
/// quantized activation is off by at most half a step (amax/254) plus the
/// f16 rounding of the scale (amax·2⁻¹¹ over the whole range, Q8_0/Q8_1
/// only). A further 1e-5 relative to Σ|w·x| covers f32 accumulation.
#[test]
fn dots_are_within_the_quantization_bound_of_the_exact_dot() {
    let mut rng = Rng::new(6);
    let n = 1024;
    for dtype in DType::ALL {
        for _ in 0..20 {
            let w = random_weights(&mut rng, dtype, n);
            // Without outliers, so that the bound is tight enough to test much.
            let x: Vec<f32> = (0..n).map(|_| rng.signed_unit()).collect();
            let wf = dequantized(dtype, &w, n);
            let exact: f64 = wf.iter().zip(&x).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum();
            let magnitude: f64 = wf.iter().zip(&x).map(|(&w, &x)| f64::from(w * x).abs()).sum();
            let format = dtype.act_format();
            let block = format.block_elems();
            let mut bound = 1e-5 * magnitude + 1e-30;
            if format != ActFormat::F32 {
                for (wb, xb) in wf.chunks(block).zip(x.chunks(block)) {
                    let amax = f64::from(xb.iter().fold(0.0f32, |m, v| m.max(v.abs())));
                    let f16_scale = if format == ActFormat::Q8_K { 0.0 } else { 2f64.powi(-11) };
                    let per_elem = amax * (1.0 / 254.0 + f16_scale);
                    bound += wb.iter().map(|&w| f64::from(w).abs()).sum::<f64>() * per_elem;
                }
            }
            let got = f64::from(vec_dot(dtype, &w, &quantized(Family::Quant.level(), format, &x), n));
            assert!((got - exact).abs() <= bound, "{dtype}: {got} vs {exact} (bound {bound}, magnitude {magnitude})");
            assert!(bound < 0.02 * magnitude, "{dtype}: bound {bound} vs magnitude {magnitude}");
        }
    }
}

#[test]
fn the_current_level_is_supported_and_public_entry_points_use_it() {
    let level = Family::Quant.level();
    assert!(Family::Quant.supports(level));
    let mut rng = Rng::new(7);
    let w = random_weights(&mut rng, DType::Q4_1, 64);
    let x = random_acts(&mut rng, 64);
    let mut a = vec![0u8; ActFormat::Q8_1.row_bytes(64).expect("whole blocks")];
    quantize_act_row(ActFormat::Q8_1, &x, &mut a).expect("valid lengths");
    assert_eq!(a, quantized(level, ActFormat::Q8_1, &x));
    assert_eq!(vec_dot(DType::Q4_1, &w, &a, 64).to_bits(), dot_at(level, DType::Q4_1, &w, &x).to_bits());
}
