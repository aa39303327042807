//! The element types of weight rows ([`DType`]) and the formats activation
//! rows are quantized to ([`ActFormat`]), with their block sizes: a leaf
//! that the kernels and `mod.rs` import.

use std::fmt;

use super::blocks::{self, QK, QK_K};
use super::error::KernelError;

/// The element types of weight tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    Q2_K,
    Q3_K,
    TQ2_0,
    TQ1_0,
    IQ3_XXS,
    IQ3_S,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ1_S,
    IQ1_M,
}

impl DType {
    pub const ALL: [DType; 25] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
        DType::Q2_K,
        DType::Q3_K,
        DType::TQ2_0,
        DType::TQ1_0,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ1_S,
        DType::IQ1_M,
    ];

    /// The type for a GGML/GGUF tensor type id; `None` for types sluice does
    /// not read.
    pub fn from_ggml(type_id: u32) -> Option<DType> {
        Some(match type_id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            12 => DType::Q4_K,
            13 => DType::Q5_K,
            14 => DType::Q6_K,
            20 => DType::IQ4_NL,
            23 => DType::IQ4_XS,
            10 => DType::Q2_K,
            11 => DType::Q3_K,
            16 => DType::IQ2_XXS,
            17 => DType::IQ2_XS,
            22 => DType::IQ2_S,
            19 => DType::IQ1_S,
            29 => DType::IQ1_M,
            30 => DType::BF16,
            39 => DType::MXFP4,
            35 => DType::TQ2_0,
            34 => DType::TQ1_0,
            18 => DType::IQ3_XXS,
            21 => DType::IQ3_S,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q8_0 => "Q8_0",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
            DType::IQ4_NL => "IQ4_NL",
            DType::IQ4_XS => "IQ4_XS",
            DType::MXFP4 => "MXFP4",
            DType::Q2_K => "Q2_K",
            DType::Q3_K => "Q3_K",
            DType::TQ2_0 => "TQ2_0",
            DType::TQ1_0 => "TQ1_0",
            DType::IQ3_XXS => "IQ3_XXS",
            DType::IQ3_S => "IQ3_S",
            DType::IQ2_XXS => "IQ2_XXS",
            DType::IQ2_XS => "IQ2_XS",
            DType::IQ2_S => "IQ2_S",
            DType::IQ1_S => "IQ1_S",
            DType::IQ1_M => "IQ1_M",
        }
    }

    /// Elements per block; 1 for the float types.
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => QK,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => QK_K,
            DType::IQ4_NL | DType::MXFP4 => QK,
            DType::IQ4_XS | DType::TQ2_0 | DType::TQ1_0 | DType::IQ3_XXS | DType::IQ3_S => QK_K,
            DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S | DType::IQ1_S | DType::IQ1_M => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use blocks::*;
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => size_of::<BlockQ4_0>(),
            DType::Q4_1 => size_of::<BlockQ4_1>(),
            DType::Q5_0 => size_of::<BlockQ5_0>(),
            DType::Q5_1 => size_of::<BlockQ5_1>(),
            DType::Q8_0 => size_of::<BlockQ8_0>(),
            DType::Q4_K => size_of::<BlockQ4K>(),
            DType::Q5_K => size_of::<BlockQ5K>(),
            DType::Q6_K => size_of::<BlockQ6K>(),
            DType::IQ4_NL => size_of::<BlockIQ4NL>(),
            DType::IQ4_XS => size_of::<BlockIQ4XS>(),
            DType::MXFP4 => size_of::<BlockMXFP4>(),
            DType::Q2_K => size_of::<BlockQ2K>(),
            DType::Q3_K => size_of::<BlockQ3K>(),
            DType::TQ2_0 => size_of::<BlockTQ2_0>(),
            DType::TQ1_0 => size_of::<BlockTQ1_0>(),
            DType::IQ3_XXS => size_of::<BlockIQ3XXS>(),
            DType::IQ3_S => size_of::<BlockIQ3S>(),
            DType::IQ2_XXS => size_of::<BlockIQ2XXS>(),
            DType::IQ2_XS => size_of::<BlockIQ2XS>(),
            DType::IQ2_S => size_of::<BlockIQ2S>(),
            DType::IQ1_S => size_of::<BlockIQ1S>(),
            DType::IQ1_M => size_of::<BlockIQ1M>(),
        }
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole number
    /// of blocks or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        row_bytes(n, self.block_elems(), self.block_bytes())
    }

    /// The format activations are quantized to before a dot with this type.
    pub fn act_format(self) -> ActFormat {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => ActFormat::F32,
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => ActFormat::Q8_0S,
            DType::Q4_1 | DType::Q5_1 => ActFormat::Q8_1,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => ActFormat::Q8_K,
            // Why these partners: see `lut4`.
            DType::IQ4_NL | DType::MXFP4 => ActFormat::Q8_0S,
            DType::IQ4_XS | DType::TQ2_0 | DType::TQ1_0 | DType::IQ3_XXS | DType::IQ3_S => ActFormat::Q8_K,
            // As in GGML: see `grid`.
            DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S | DType::IQ1_S | DType::IQ1_M => ActFormat::Q8_K,
        }
    }

    pub(super) fn checked_row_bytes(self, n: usize) -> Result<usize, KernelError> {
        checked_row_bytes(self.name(), n, self.block_elems(), self.block_bytes())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Formats of quantized activation rows.
///
/// - `F32`: plain little-endian floats (partner of F32/F16/BF16 weights).
/// - `Q8_0`: blocks of 32 as f16 `d` and 32 i8, `d = max|x| / 127` (no
///   weight type's partner; a Q8_0 KV cache stores its rows so).
/// - `Q8_0S`: as Q8_0 plus the i16 sum of the quants after `d` (partner of
///   Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4).
/// - `Q8_1`: as Q8_0 plus GGML's f16 `d · Σq` after `d` (partner of
///   Q4_1/Q5_1).
/// - `Q8_K`: blocks of 256 as f32 `d`, 256 i8, then 16 i16 sums of 16 quants
///   (partner of the K-quants, IQ4_XS, the ternary formats and the grid
///   i-quants).
///
/// Quants round to nearest with ties to even and stay within ±127. Inputs
/// must be finite: a non-finite value makes its block's scale non-finite,
/// and its quants are unspecified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ActFormat {
    F32,
    Q8_0,
    Q8_0S,
    Q8_1,
    Q8_K,
}

impl ActFormat {
    pub fn name(self) -> &'static str {
        match self {
            ActFormat::F32 => "F32",
            ActFormat::Q8_0 => "Q8_0",
            ActFormat::Q8_0S => "Q8_0S",
            ActFormat::Q8_1 => "Q8_1",
            ActFormat::Q8_K => "Q8_K",
        }
    }

    pub fn block_elems(self) -> usize {
        match self {
            ActFormat::F32 => 1,
            ActFormat::Q8_0 | ActFormat::Q8_0S | ActFormat::Q8_1 => QK,
            ActFormat::Q8_K => QK_K,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            ActFormat::F32 => 4,
            ActFormat::Q8_0 => size_of::<blocks::BlockQ8_0>(),
            ActFormat::Q8_0S => size_of::<blocks::BlockQ8_0S>(),
            ActFormat::Q8_1 => size_of::<blocks::BlockQ8_1>(),
            ActFormat::Q8_K => size_of::<blocks::BlockQ8K>(),
        }
    }

    /// Bytes of a quantized row of `n` elements; `None` when `n` is not a
    /// whole number of blocks or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        row_bytes(n, self.block_elems(), self.block_bytes())
    }

    pub(super) fn checked_row_bytes(self, n: usize) -> Result<usize, KernelError> {
        checked_row_bytes(self.name(), n, self.block_elems(), self.block_bytes())
    }
}

fn row_bytes(n: usize, block_elems: usize, block_bytes: usize) -> Option<usize> {
    if !n.is_multiple_of(block_elems) {
        return None;
    }
    (n / block_elems).checked_mul(block_bytes)
}

fn checked_row_bytes(
    format: &'static str,
    n: usize,
    block_elems: usize,
    block_bytes: usize,
) -> Result<usize, KernelError> {
    if !n.is_multiple_of(block_elems) {
        return Err(KernelError::PartialBlock { format, n, block: block_elems });
    }
    row_bytes(n, block_elems, block_bytes).ok_or(KernelError::TooLarge { format, n })
}
