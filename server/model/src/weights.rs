//! Tensors of a GGUF file made resident on a [`Backend`]: weight matrices
//! and small vectors, each checked against the shape its user expects, and
//! the error a load stops with. Every block, family, adapter and projector
//! loads through these.

use std::path::PathBuf;

use sluice_kernels::backend::{Backend, MatrixSource};
use sluice_kernels::quant::{DType, dequantize_row};

use super::gguf::{GgufError, GgufFile, TensorInfo};
use super::hparams::HParamsError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    HParams(#[from] HParamsError),
    #[error("tensor {name:?}: {problem}")]
    Tensor { name: String, problem: String },
    #[error("LoRA adapter {}: {problem}", path.display())]
    Adapter { path: PathBuf, problem: String },
}

/// A weight matrix resident on the backend, with its shape.
pub(crate) struct Weight<B: Backend> {
    pub(crate) matrix: B::Matrix,
    pub(crate) n_in: usize,
    pub(crate) n_out: usize,
}

pub(crate) fn tensor_problem(name: &str, problem: &str) -> LoadError {
    LoadError::Tensor { name: name.into(), problem: problem.into() }
}

/// A weight matrix of GGUF shape `[n_in, n_out]`, made resident.
pub(crate) fn weight<B: Backend>(
    backend: &B,
    file: &GgufFile,
    name: &str,
    n_in: usize,
    n_out: usize,
) -> Result<Weight<B>, LoadError> {
    let mut parts = fused(backend, file, name, n_in, &[n_out])?;
    parts.pop().ok_or_else(|| tensor_problem(name, "missing"))
}

/// A fused weight matrix of GGUF shape `[n_in, Σ widths]` (Q|K|V, gate|up)
/// as one resident matrix per part: part `i` is the `widths[i]` output
/// rows after those of the parts before it. Each output is the dot of its
/// own row with the input, so the parts compute what the fused matrix
/// would, and every block runs them as it runs separate tensors.
pub(crate) fn fused<B: Backend>(
    backend: &B,
    file: &GgufFile,
    name: &str,
    n_in: usize,
    widths: &[usize],
) -> Result<Vec<Weight<B>>, LoadError> {
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    let n_out: usize = widths.iter().sum();
    if tensor.dims.len() != 2 || tensor.dims[0] != n_in as u64 || tensor.dims[1] != n_out as u64 {
        return Err(tensor_problem(name, &format!("shape {:?}, expected [{n_in}, {n_out}]", tensor.dims)));
    }
    let dtype = tensor
        .dtype
        .weights()
        .ok_or_else(|| tensor_problem(name, &format!("type {} is not a weight format", tensor.dtype.name())))?;
    let row_bytes =
        dtype.row_bytes(n_in).filter(|bytes| bytes.checked_mul(n_out) == Some(tensor.len)).ok_or_else(|| {
            tensor_problem(name, &format!("{} bytes do not hold {n_out} rows of {n_in} {}", tensor.len, dtype.name()))
        })?;
    let mut first = 0;
    let mut parts = Vec::with_capacity(widths.len());
    for &width in widths {
        let part = TensorInfo { start: tensor.start + first * row_bytes, len: width * row_bytes, ..tensor.clone() };
        let bytes = file.shared_data(&part).ok_or_else(|| tensor_problem(name, "data outside the file"))?;
        let matrix = backend
            .matrix(MatrixSource { dtype, bytes, n_out: width, n_in })
            .map_err(|error| tensor_problem(name, &error.to_string()))?;
        parts.push(Weight { matrix, n_in, n_out: width });
        first += width;
    }
    Ok(parts)
}

/// A small f32 (or f16/bf16) vector, dequantized and made resident.
pub(crate) fn vector<B: Backend>(backend: &B, file: &GgufFile, name: &str, len: usize) -> Result<B::Vector, LoadError> {
    let values = host_vector(file, name, len)?;
    backend.vector(&values).map_err(|error| tensor_problem(name, &error.to_string()))
}

/// A small f32 (or f16/bf16) vector's values.
pub(crate) fn host_vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    if tensor.elements() != len as u64 {
        return Err(tensor_problem(name, &format!("shape {:?}, expected [{len}]", tensor.dims)));
    }
    let Some(dtype @ (DType::F32 | DType::F16 | DType::BF16)) = tensor.dtype.weights() else {
        return Err(tensor_problem(name, &format!("type {} for a norm/bias vector", tensor.dtype.name())));
    };
    let mut values = vec![0.0; len];
    dequantize_row(dtype, file.data(tensor), &mut values).map_err(|error| tensor_problem(name, &error.to_string()))?;
    Ok(values)
}
