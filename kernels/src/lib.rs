//! sluice's numeric kernels: quantized dot products and matmul, the row
//! operations of a transformer layer, a persistent thread pool, and the
//! [`backend::Backend`] seam that model code computes through (its CPU
//! implementation is built from the rest of this crate). [`cpu`], at the
//! bottom, decides which instruction set every CPU kernel runs.
pub mod backend;
pub mod cpu;
#[cfg(test)]
mod dispatch_tests;
pub mod gemm;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod stream;
