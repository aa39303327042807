//! Numeric kernels. Filled in by the model-core work.
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
