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
    let tensor = shaped(file, name, &[n_in, widths.iter().sum()])?;
    split_rows(backend, file, name, tensor, n_in, widths)
}

/// The matrices of a tensor of experts of GGUF shape `[n_in, Σ widths,
/// count]` (`ffn_{gate,up,down}_exps`): per expert, its parts of `widths`
/// output rows each, in order (one part, or gate and up of a merged
/// `ffn_gate_up_exps`). An expert's rows follow the previous expert's.
pub(crate) fn experts<B: Backend>(
    backend: &B,
    file: &GgufFile,
    name: &str,
    n_in: usize,
    widths: &[usize],
    count: usize,
) -> Result<Vec<Vec<Weight<B>>>, LoadError> {
    let tensor = shaped(file, name, &[n_in, widths.iter().sum(), count])?;
    let mut parts = split_rows(backend, file, name, tensor, n_in, &widths.repeat(count))?.into_iter();
    Ok((0..count).map(|_| parts.by_ref().take(widths.len()).collect()).collect())
}

/// The tensor `name`, of GGUF shape `dims`.
fn shaped<'f>(file: &'f GgufFile, name: &str, dims: &[usize]) -> Result<&'f TensorInfo, LoadError> {
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    // ggml's shapes end in implicit ones: a vector is a matrix of one row.
    let trimmed = |dims: Vec<usize>| {
        let end = dims.iter().rposition(|&dim| dim != 1).map_or(0, |last| last + 1);
        dims[..end].to_vec()
    };
    if trimmed(tensor.dims.iter().map(|&dim| dim as usize).collect()) != trimmed(dims.to_vec()) {
        return Err(tensor_problem(name, &format!("shape {:?}, expected {dims:?}", tensor.dims)));
    }
    Ok(tensor)
}

/// `tensor`'s rows of `n_in` weights, made resident as one matrix per
/// part: part `i` is the `widths[i]` rows after those of the parts before.
fn split_rows<B: Backend>(
    backend: &B,
    file: &GgufFile,
    name: &str,
    tensor: &TensorInfo,
    n_in: usize,
    widths: &[usize],
) -> Result<Vec<Weight<B>>, LoadError> {
    let n_out: usize = widths.iter().sum();
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

#[cfg(test)]
mod tests {
    use sluice_kernels::backend::{Backend, CpuBackend};
    use sluice_tests::gguf_writer::{GgufBuilder, Tensor};

    use super::{experts, weight};
    use crate::gguf::GgufFile;

    fn file(tensors: Vec<Tensor>) -> GgufFile {
        let builder = tensors.into_iter().fold(GgufBuilder::new(), GgufBuilder::tensor);
        GgufFile::from_bytes(builder.build()).expect("parses")
    }

    /// Expert `e`'s row `r` is all `10e + r`.
    fn stacked(name: &str, n_in: u64, n_out: u64, count: u64) -> Tensor {
        let values: Vec<f32> = (0..count * n_out)
            .flat_map(|row| std::iter::repeat_n((10 * (row / n_out) + row % n_out) as f32, n_in as usize))
            .collect();
        Tensor::f32(name, &[n_in, n_out, count], &values)
    }

    #[test]
    fn each_expert_is_its_own_rows_of_the_stacked_tensor_in_its_parts() {
        let backend = CpuBackend::new(1);
        let file = file(vec![stacked("exps", 4, 6, 3)]);
        let x = vec![1.0; 4];
        let outputs = |parts: &[usize]| -> Vec<Vec<Vec<f32>>> {
            let experts = experts(&backend, &file, "exps", 4, parts, 3).expect("loads");
            experts
                .iter()
                .map(|parts| {
                    parts
                        .iter()
                        .map(|part| {
                            let mut out = Vec::new();
                            backend.matmul(&part.matrix, &x, 1, &mut out);
                            out.iter().map(|value| value / 4.0).collect()
                        })
                        .collect()
                })
                .collect()
        };
        let whole = outputs(&[6]);
        assert_eq!(whole[2], [vec![20.0, 21.0, 22.0, 23.0, 24.0, 25.0]]);
        // Gate and up of a merged tensor: each expert's first rows, then the rest.
        let halves = outputs(&[3, 3]);
        assert_eq!(halves[1], [vec![10.0, 11.0, 12.0], vec![13.0, 14.0, 15.0]]);
        let error = experts(&backend, &file, "exps", 4, &[6], 4).err().expect("refused").to_string();
        assert_eq!(error, "tensor \"exps\": shape [4, 6, 3], expected [4, 6, 4]");
    }

    #[test]
    fn a_vector_is_a_matrix_of_one_row() {
        let backend = CpuBackend::new(1);
        let file = file(vec![Tensor::f32("gate", &[4], &[1.0, 2.0, 3.0, 4.0])]);
        let gate = weight(&backend, &file, "gate", 4, 1).expect("loads");
        let mut out = Vec::new();
        backend.matmul(&gate.matrix, &vec![1.0; 4], 1, &mut out);
        assert_eq!(out, [10.0]);
        let error = weight(&backend, &file, "gate", 4, 2).err().expect("refused").to_string();
        assert_eq!(error, "tensor \"gate\": shape [4], expected [4, 2]");
    }
}
