//! Numeric kernels. Filled in by the model-core work.
pub mod ops;
pub mod quant;
pub mod matmul;
pub mod pool;
