//! CPU kernels for everything in a transformer layer but the matrix products:
//! RMSNorm, softmax, SiLU/SwiGLU, residual add, RoPE, attention over a
//! paged KV cache of f16 values or Q8_0 blocks, and LoRA adapters' low-rank
//! deltas.
//!
//! # Batch invariance
//!
//! Every kernel works on one token row, and every reduction in it (the sum
//! of squares in RMSNorm, the max and sum of a softmax, attention's dot
//! products and weighted sums) runs in an order fixed by that row's length
//! alone: 16 lane accumulators, lane `l` taking elements `l`, `l + 16`, … in
//! index order, combined as lane `l` with `l + 8`, then `l + 4`, `l + 2`,
//! `l + 1`. Attention sums over positions in position order, whatever blocks
//! hold them. So a row's output is the same bits alone or in a batch, for
//! any prompt chunking, thread count or paging.
//!
//! The instruction set (AVX-512, AVX2 + F16C, or portable scalar code) is
//! detected once per process. All three run the same sequence of IEEE-754
//! operations (no fused multiply-add, `exp` from one shared polynomial), so
//! they agree bit for bit too; the tests check that on every level the CPU
//! has.

mod attention;
mod dense_attention;
mod kv;
mod low_rank;
mod rope;
mod row;
pub(crate) mod simd;

pub use attention::{HeadShape, KvPages, PageTable, attend, attend_heads};
pub use dense_attention::attend_within;
pub(crate) use kv::KvArena;
pub use kv::{KvRows, KvType};
pub use low_rank::LowRank;
pub use rope::{Rope, RopeAngles, RopeKind, RopePos};
pub use row::{
    Gelu, add_in_place, f32_to_f16_row, gelu, layer_norm, rms_norm, rms_norm_in_place, silu, softmax_in_place, swiglu,
};

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

/// Deterministic pseudo-random values in `[-scale, scale)` for tests.
#[cfg(test)]
pub(crate) fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}
