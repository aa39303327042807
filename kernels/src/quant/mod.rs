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
pub(crate) mod packed;
mod scalar;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;

use thiserror::Error;

use crate::cpu::{Family, SimdLevel, note};
use blocks::{QK, QK_K};
pub use packed::PackedRows;

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
}

impl DType {
    pub const ALL: [DType; 11] = [
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
            30 => DType::BF16,
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
        }
    }

    /// Elements per block; 1 for the float types.
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => QK,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => QK_K,
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
            DType::Q4_K | DType::Q5_K | DType::Q6_K => ActFormat::Q8_K,
        }
    }

    fn checked_row_bytes(self, n: usize) -> Result<usize, KernelError> {
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
///   Q4_0/Q5_0/Q8_0).
/// - `Q8_1`: as Q8_0 plus GGML's f16 `d · Σq` after `d` (partner of
///   Q4_1/Q5_1).
/// - `Q8_K`: blocks of 256 as f32 `d`, 256 i8, then 16 i16 sums of 16 quants.
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

    fn checked_row_bytes(self, n: usize) -> Result<usize, KernelError> {
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

fn expect_len(what: &'static str, got: usize, expected: usize) -> Result<(), KernelError> {
    if got == expected { Ok(()) } else { Err(KernelError::Length { what, got, expected }) }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    #[error("a row of {n} elements is not a whole number of {format} blocks of {block}")]
    PartialBlock { format: &'static str, n: usize, block: usize },
    #[error("a {format} row of {n} elements is too large to address")]
    TooLarge { format: &'static str, n: usize },
    #[error("{what} has length {got}, expected {expected}")]
    Length { what: &'static str, got: usize, expected: usize },
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

/// Kernel entry points may require CPU features; they are unsafe to call
/// unless the level they belong to is supported.
type DotFn = unsafe fn(&[u8], &[u8]) -> f32;
type Dot4Fn = unsafe fn([&[u8]; 4], &[u8]) -> [f32; 4];
type Dot4x2Fn = unsafe fn([&[u8]; 4], [&[u8]; 2]) -> [[f32; 4]; 2];
type Dot4x4Fn = unsafe fn([&[u8]; 4], [&[u8]; 4]) -> [[f32; 4]; 4];
type Dot4x8Fn = unsafe fn([&[u8]; 4], [&[u8]; 8]) -> [[f32; 4]; 8];
type QuantizeFn = unsafe fn(&[f32], &mut [u8]);
/// Packed groups of eight weight rows (as many as [`PackedDot::groups`])
/// against `A` activation rows: eight values per group, per activation row.
type PackedFn<const A: usize> = unsafe fn(&[u8], [&[u8]; A]) -> [[f32; 16]; A];

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

/// The dot kernels of one dtype at a supported level, resolved once per
/// matmul. [`Dot::call4`] gives, lane for lane, what [`Dot::call`] gives
/// for each row.
#[derive(Clone, Copy)]
pub(crate) struct Dot {
    one: DotFn,
    four: Option<Dot4Fn>,
    four_by_two: Option<Dot4x2Fn>,
    four_by_four: Option<Dot4x4Fn>,
    four_by_eight: Option<Dot4x8Fn>,
    packed: Option<PackedDot>,
}

/// The kernels over [`PackedRows`] groups, by activation rows per call.
#[derive(Clone, Copy)]
pub(crate) struct PackedDot {
    /// Groups per call, side by side in the level's vectors (1 or 2).
    pub(crate) groups: usize,
    pub(crate) one: PackedFn<1>,
    pub(crate) four: PackedFn<4>,
    /// Only where the registers hold eight rows' sums (AVX-512's 32);
    /// AVX2's 16 spill them.
    pub(crate) eight: Option<PackedFn<8>>,
}

impl Dot {
    #[inline]
    pub(crate) fn call(self, weight_row: &[u8], act_row: &[u8]) -> f32 {
        // SAFETY: `Dot` is only built by `Kernels::dot`, for a supported level.
        unsafe { (self.one)(weight_row, act_row) }
    }

    /// Whether this level multiplies the dtype's weights packed
    /// ([`PackedRows`]).
    pub(crate) fn packs(self) -> bool {
        self.packed.is_some()
    }

    /// Packed groups per call: [`Dot::call_packed`] takes up to this
    /// many at once (1 where the level has no packed kernels).
    pub(crate) fn packed_groups(self) -> usize {
        self.packed.map_or(1, |packed| packed.groups)
    }

    /// The rows of the packed groups in `groups` (at most
    /// [`Dot::packed_groups`] of them, consecutive) against each of `acts`,
    /// the same bits as [`Dot::call`] on each original row; `store(i,
    /// values)` takes activation row `i`'s outputs, eight per group. Does
    /// nothing at a level without packed kernels (the caller packs only
    /// where [`Dot::packs`]).
    #[inline]
    pub(crate) fn call_packed(
        self,
        groups: &[u8],
        n_groups: usize,
        acts: &[&[u8]],
        mut store: impl FnMut(usize, &[f32]),
    ) {
        let Some(packed) = self.packed else { return };
        let width = 8 * n_groups.min(packed.groups);
        let mut start = 0;
        while let Some(rest) = acts.get(start..).filter(|rest| !rest.is_empty()) {
            let mut emit = |values: &[[f32; 16]]| {
                for (k, v) in values.iter().enumerate() {
                    store(start + k, &v[..width]);
                }
                values.len()
            };
            start += match (rest.len(), packed.eight) {
                (8.., Some(eight)) => {
                    // SAFETY: as in `call`.
                    emit(&unsafe { eight(groups, std::array::from_fn(|k| rest[k])) })
                }
                (4.., _) => {
                    // SAFETY: as in `call`.
                    emit(&unsafe { (packed.four)(groups, std::array::from_fn(|k| rest[k])) })
                }
                _ => {
                    // SAFETY: as in `call`.
                    emit(&unsafe { (packed.one)(groups, [rest[0]]) })
                }
            };
        }
    }

    /// Four weight rows against one activation row: side by side,
    /// sharing the activation loads and the reductions, or one after
    /// another where that streams faster (Q8_0, the K-quants).
    #[inline]
    pub(crate) fn call4(self, weight_rows: [&[u8]; 4], act_row: &[u8]) -> [f32; 4] {
        match self.four {
            // SAFETY: as in `call`.
            Some(four) => unsafe { four(weight_rows, act_row) },
            None => weight_rows.map(|w| self.call(w, act_row)),
        }
    }

    /// Four weight rows against two activation rows, decoding each weight
    /// block once; the same bits as two `call4`s.
    #[inline]
    pub(crate) fn call4x2(self, weight_rows: [&[u8]; 4], act_rows: [&[u8]; 2]) -> [[f32; 4]; 2] {
        match self.four_by_two {
            // SAFETY: as in `call`.
            Some(four_by_two) => unsafe { four_by_two(weight_rows, act_rows) },
            None => act_rows.map(|a| self.call4(weight_rows, a)),
        }
    }

    /// Four weight rows against four activation rows; the same bits as
    /// two `call4x2`s.
    #[inline]
    pub(crate) fn call4x4(self, weight_rows: [&[u8]; 4], act_rows: [&[u8]; 4]) -> [[f32; 4]; 4] {
        match self.four_by_four {
            // SAFETY: as in `call`.
            Some(four_by_four) => unsafe { four_by_four(weight_rows, act_rows) },
            None => {
                let [a0, a1, a2, a3] = act_rows;
                let ([v0, v1], [v2, v3]) = (self.call4x2(weight_rows, [a0, a1]), self.call4x2(weight_rows, [a2, a3]));
                [v0, v1, v2, v3]
            }
        }
    }

    /// Four weight rows against eight activation rows; the same bits as
    /// two `call4x4`s.
    #[inline]
    pub(crate) fn call4x8(self, weight_rows: [&[u8]; 4], act_rows: [&[u8]; 8]) -> [[f32; 4]; 8] {
        match self.four_by_eight {
            // SAFETY: as in `call`.
            Some(four_by_eight) => unsafe { four_by_eight(weight_rows, act_rows) },
            None => {
                let [a0, a1, a2, a3, a4, a5, a6, a7] = act_rows;
                let ([v0, v1, v2, v3], [v4, v5, v6, v7]) =
                    (self.call4x4(weight_rows, [a0, a1, a2, a3]), self.call4x4(weight_rows, [a4, a5, a6, a7]));
                [v0, v1, v2, v3, v4, v5, v6, v7]
            }
        }
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
