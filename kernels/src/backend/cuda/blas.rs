//! cuBLAS for products of f16 and bf16 weights over more rows than the
//! decode kernel takes: the activations are rounded to the weights' type
//! (one kernel) and cuBLAS multiplies with f32 accumulation and output.
//! cuBLAS is a separate NVIDIA library (`libcublas.so.12`, from a CUDA
//! toolkit or the `nvidia-cublas-cu12` wheel), loaded at run time when
//! present; without it, or with `SLUICE_CUBLAS=0`, the tiled kernel of
//! gemm.cu serves these products as it serves every other format.

use std::sync::{Arc, Mutex};

use cudarc::cublas::{CudaBlas, result as blas, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

use super::functions::grid;
use super::gpu::{CudaMatrix, Gpu, MATVEC_ROWS, int};
use crate::quant::DType;

pub(super) struct Blas {
    handle: CudaBlas,
    /// The rounded activations, kept and grown between products.
    half: Mutex<Option<CudaSlice<u16>>>,
}

impl Blas {
    /// cuBLAS on `stream`, or why not (turned off, not found, failed).
    pub(super) fn load(stream: &Arc<CudaStream>) -> Result<Blas, String> {
        if std::env::var("SLUICE_CUBLAS").is_ok_and(|value| value == "0") {
            return Err("turned off (SLUICE_CUBLAS=0)".into());
        }
        // SAFETY: only tries to open the library (cudarc would panic on
        // the first call into a library it cannot find).
        if !unsafe { sys::is_culib_present() } {
            return Err("libcublas not found on the loader's path".into());
        }
        let handle = CudaBlas::new(Arc::clone(stream)).map_err(|error| format!("no handle: {error}"))?;
        Ok(Blas { handle, half: Mutex::default() })
    }

    /// Whether cuBLAS takes this product.
    pub(super) fn takes(weights: &CudaMatrix, m: usize) -> bool {
        matches!(weights.dtype(), DType::F16 | DType::BF16) && m > MATVEC_ROWS
    }

    /// `y = x · weightsᵀ` for `m` rows; `y` holds m × n_out floats, `x`
    /// m × n_in. Failures are kept by `gpu` for the next download.
    pub(super) fn product(
        &self,
        gpu: &Gpu,
        weights: &CudaMatrix,
        x: &CudaSlice<f32>,
        m: usize,
        y: &mut CudaSlice<f32>,
    ) {
        let (n_in, n_out) = (weights.n_in(), weights.n_out());
        let (Some(len), Some(rows), Some(n_in_int), Some(n_out_int)) =
            (m.checked_mul(n_in), int(m), int(n_in), int(n_out))
        else {
            return gpu.fail(format!("a cuBLAS product of {m} rows of {n_in}"));
        };
        let bf16 = weights.dtype() == DType::BF16;
        let mut half = self.half.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if half.as_ref().is_none_or(|buffer| buffer.len() < len) {
            *half = gpu.record("allocating activations", gpu.transfers().alloc_zeros::<u16>(len));
        }
        let (Some(half), Some(function)) = (half.as_mut(), gpu.function("sl_round_half")) else { return };
        let stream = gpu.stream();
        let (n, flag) = (len as i64, i32::from(bf16));
        let mut args = stream.launch_builder(&function);
        args.arg(&mut *half).arg(x).arg(&n).arg(&flag);
        let config = grid((len.div_ceil(256).min(65535), 1, 1), 256);
        // SAFETY: sl_round_half(u16* out, const float* x, long long n, int
        // bf16): `half` holds at least len halves (sized above), `x` the
        // m × n_in floats the caller checked.
        let rounded = unsafe { args.launch(config) };
        if gpu.record("rounding activations", rounded).is_none() {
            return;
        }
        let kind = if bf16 { sys::cudaDataType_t::CUDA_R_16BF } else { sys::cudaDataType_t::CUDA_R_16F };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (w, _w) = weights.bytes().device_ptr(stream);
        let (a, _a) = half.device_ptr(stream);
        let (out, _out) = y.device_ptr_mut(stream);
        // Row-major weights (n_out × n_in) are column-major n_in × n_out:
        // transposed, they are cuBLAS's A (n_out × n_in); the rows of x are
        // its B (n_in × m, column-major) and C is n_out × m column-major,
        // which is y row-major.
        // SAFETY: the pointers are live device buffers of this context of
        // the stated sizes (w: n_out × n_in of the type, checked when the
        // matrix was made; a: m × n_in halves; out: m × n_out floats, sized
        // by the caller); alpha and beta outlive the call, which only
        // enqueues work on the handle's stream (this backend's).
        let done = unsafe {
            blas::gemm_ex(
                *self.handle.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n_out_int,
                rows,
                n_in_int,
                (&raw const alpha).cast(),
                w as *const _,
                kind,
                n_in_int,
                a as *const _,
                kind,
                n_in_int,
                (&raw const beta).cast(),
                out as *mut _,
                sys::cudaDataType_t::CUDA_R_32F,
                n_out_int,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if let Err(error) = done {
            gpu.fail(format!("cuBLAS product: {error}"));
        }
    }
}
