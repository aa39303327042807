//! Weight formats (GGML block layouts), activation quantization, and the
//! dot products between them.
//!
//! Weights stay in their file format. Each activation row is quantized once
//! into the "dot partner" format of the weight type ([`DType::act_format`]),
//! and a dot product then multiplies integers inside each block and adds
//! the per-block float results in ascending block order.
//!
//! Batch invariance: [`vec_dot`] of a given (weight row, activation row) pair
//! gives the same bits at every call site. The SIMD levels compute each
//! block's integer sums exactly as the scalar reference does and then run
//! the reference's float steps in its order, so the level (chosen once per
//! process by [`crate::cpu`]) never changes a result, and
//! `matmul` computes every output element with this same dot.

pub(crate) mod blocks;
mod entries;
mod error;
mod formats;
#[cfg(test)]
mod ggml_rows;
mod grid;
mod iq1;
pub(crate) mod iq1_grid;
#[cfg(test)]
mod iq1_tests;
mod iq2;
pub(crate) mod iq2_grids;
#[cfg(test)]
mod iq2_tests;
mod iq3;
pub(crate) mod iq3_grids;
#[cfg(test)]
mod iq3_tests;
mod iq_signs;
mod low_k;
#[cfg(test)]
mod low_k_tests;
mod lut4;
#[cfg(test)]
mod lut4_tests;
pub(crate) mod packed;
mod pages;
mod scalar;
mod steps;
mod ternary;
#[cfg(test)]
mod ternary_tests;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::cpu::{Family, SimdLevel, note};
pub(crate) use entries::Dot;
use entries::{DotFn, QuantizeFn};
pub use error::KernelError;
pub use formats::{ActFormat, DType};
pub use packed::PackedRows;

fn expect_len(what: &'static str, got: usize, expected: usize) -> Result<(), KernelError> {
    if got == expected { Ok(()) } else { Err(KernelError::Length { what, got, expected }) }
}

/// Decodes one row of `dtype` from `src` into `dst`; the row's length is
/// `dst.len()` and `src` must be exactly its bytes.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    expect_len("the source row (bytes)", src.len(), dtype.checked_row_bytes(dst.len())?)?;
    scalar::dequantize(dtype, src, dst);
    Ok(())
}

/// [`dequantize_row`] for lengths validated elsewhere (a matrix row).
pub(crate) fn dequantize_valid_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(dtype.row_bytes(dst.len()), Some(src.len()));
    scalar::dequantize(dtype, src, dst);
}

/// Quantizes one activation row `x` into `dst`, which must be exactly
/// `format.row_bytes(x.len())` bytes. Values must be finite (see
/// [`ActFormat`]).
pub fn quantize_act_row(format: ActFormat, x: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    expect_len("the quantized row (bytes)", dst.len(), format.checked_row_bytes(x.len())?)?;
    Kernels::current().quantize(format, x, dst);
    Ok(())
}

/// Dot product of a weight row of `n` elements with an activation row
/// quantized by [`quantize_act_row`] into `dtype.act_format()`.
///
/// The lengths must be `dtype.row_bytes(n)` and
/// `dtype.act_format().row_bytes(n)` ([`try_vec_dot`] checks them); this is
/// debug-asserted only, since the matmul loops call it per element with
/// lengths validated once. Wrong lengths give a meaningless value, never
/// undefined behaviour.
pub fn vec_dot(dtype: DType, weight_row: &[u8], act_row: &[u8], n: usize) -> f32 {
    debug_assert_eq!(check_dot(dtype, weight_row, act_row, n), Ok(()));
    Kernels::current().dot(dtype).call(weight_row, act_row)
}

/// [`vec_dot`] with its lengths checked.
pub fn try_vec_dot(dtype: DType, weight_row: &[u8], act_row: &[u8], n: usize) -> Result<f32, KernelError> {
    check_dot(dtype, weight_row, act_row, n)?;
    Ok(vec_dot(dtype, weight_row, act_row, n))
}

fn check_dot(dtype: DType, weight_row: &[u8], act_row: &[u8], n: usize) -> Result<(), KernelError> {
    expect_len("the weight row (bytes)", weight_row.len(), dtype.checked_row_bytes(n)?)?;
    expect_len("the activation row (bytes)", act_row.len(), dtype.act_format().checked_row_bytes(n)?)
}

/// The kernels of one supported level. Only constructed for a level the CPU
/// supports, which is what makes calling its entry points sound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernels {
    level: SimdLevel,
}

impl Kernels {
    /// The kernels of the level [`crate::cpu`] gives this family.
    pub(crate) fn current() -> Kernels {
        Kernels { level: Family::Quant.level() }
    }

    /// `None` when the CPU does not support `level`.
    #[cfg(test)]
    pub(crate) fn new(level: SimdLevel) -> Option<Kernels> {
        Family::Quant.supports(level).then_some(Kernels { level })
    }

    pub(crate) fn dot(self, dtype: DType) -> Dot {
        note(Family::Quant, self.level);
        match self.level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::avx2::kernels(dtype),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::avx512::kernels(dtype),
            _ => Dot {
                one: scalar_dot(dtype),
                four: None,
                four_by_two: None,
                four_by_four: None,
                four_by_eight: None,
                packed: None,
            },
        }
    }

    /// Lengths were validated by the caller.
    pub(crate) fn quantize(self, format: ActFormat, x: &[f32], dst: &mut [u8]) {
        note(Family::Quant, self.level);
        let f: QuantizeFn = match self.level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 | SimdLevel::Avx512 => x86::quantize(format),
            _ => scalar_quantize(format),
        };
        // SAFETY: `self` exists only for a level this CPU supports.
        unsafe { f(x, dst) }
    }
}

fn scalar_dot(dtype: DType) -> DotFn {
    match dtype {
        DType::F32 => |w, a| scalar::dot_float(w, a, scalar::f32_value),
        DType::F16 => |w, a| scalar::dot_float(w, a, scalar::half_to_f32),
        DType::BF16 => |w, a| scalar::dot_float(w, a, scalar::bf16_value),
        DType::Q4_0 => scalar::dot_q4_0,
        DType::Q4_1 => scalar::dot_q4_1,
        DType::Q5_0 => scalar::dot_q5_0,
        DType::Q5_1 => scalar::dot_q5_1,
        DType::Q8_0 => scalar::dot_q8_0,
        DType::Q4_K => scalar::dot_q4_k,
        DType::Q5_K => scalar::dot_q5_k,
        DType::Q6_K => scalar::dot_q6_k,
        DType::IQ4_NL => lut4::dot_iq4_nl,
        DType::IQ4_XS => lut4::dot_iq4_xs,
        DType::MXFP4 => lut4::dot_mxfp4,
        DType::Q2_K => low_k::dot_q2_k,
        DType::Q3_K => low_k::dot_q3_k,
        DType::TQ2_0 => ternary::dot::<blocks::BlockTQ2_0>,
        DType::TQ1_0 => ternary::dot::<blocks::BlockTQ1_0>,
        DType::IQ3_XXS => iq3::dot_iq3_xxs,
        DType::IQ3_S => iq3::dot_iq3_s,
        DType::IQ2_XXS => grid::dot::<blocks::BlockIQ2XXS>,
        DType::IQ2_XS => grid::dot::<blocks::BlockIQ2XS>,
        DType::IQ2_S => grid::dot::<blocks::BlockIQ2S>,
        DType::IQ1_S => grid::dot::<blocks::BlockIQ1S>,
        DType::IQ1_M => grid::dot::<blocks::BlockIQ1M>,
    }
}

fn scalar_quantize(format: ActFormat) -> QuantizeFn {
    match format {
        ActFormat::F32 => scalar::quantize_f32,
        ActFormat::Q8_0 => scalar::quantize_q8_0,
        ActFormat::Q8_0S => scalar::quantize_q8_0s,
        ActFormat::Q8_1 => scalar::quantize_q8_1,
        ActFormat::Q8_K => scalar::quantize_q8_k,
    }
}
