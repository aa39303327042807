//! The error of the `quant` kernels, in a leaf of its own (`mod.rs`
//! re-exports it).

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    #[error("a row of {n} elements is not a whole number of {format} blocks of {block}")]
    PartialBlock { format: &'static str, n: usize, block: usize },
    #[error("a {format} row of {n} elements is too large to address")]
    TooLarge { format: &'static str, n: usize },
    #[error("{what} has length {got}, expected {expected}")]
    Length { what: &'static str, got: usize, expected: usize },
}
