//! The error the `ops` kernels share, in a leaf that each of them imports
//! (`mod.rs` only re-exports it).

/// Model parameters or cache layouts the kernels cannot work with.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("invalid rope parameters: {0}")]
    Rope(String),
    #[error("invalid attention heads: {0}")]
    Heads(String),
    #[error("invalid attention inputs: {0}")]
    Attention(String),
    #[error("invalid low-rank factors: {0}")]
    LowRank(String),
}
