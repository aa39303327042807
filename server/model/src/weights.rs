//! Tensors of a GGUF file made resident on a [`Backend`]: weight matrices
//! and small vectors, each checked against the shape its user expects, and
//! the error a load stops with. Every block, family, adapter and projector
//! loads through these.

use std::path::PathBuf;

use sluice_kernels::backend::{Backend, MatrixSource};
use sluice_kernels::quant::{DType, dequantize_row};

use super::gguf::{GgufError, GgufFile};
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
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    if tensor.dims.len() != 2 || tensor.dims[0] != n_in as u64 || tensor.dims[1] != n_out as u64 {
        return Err(tensor_problem(name, &format!("shape {:?}, expected [{n_in}, {n_out}]", tensor.dims)));
    }
    let dtype = tensor
        .dtype
        .weights()
        .ok_or_else(|| tensor_problem(name, &format!("type {} is not a weight format", tensor.dtype.name())))?;
    let bytes = file.shared_data(tensor).ok_or_else(|| tensor_problem(name, "data outside the file"))?;
    let matrix = backend
        .matrix(MatrixSource { dtype, bytes, n_out, n_in })
        .map_err(|error| tensor_problem(name, &error.to_string()))?;
    Ok(Weight { matrix, n_in, n_out })
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
