//! CPU kernels for everything in a transformer layer but the matrix products:
//! RMSNorm, softmax, SiLU/SwiGLU, residual add, RoPE, attention over a
//! paged KV cache of f16 values or Q8_0 blocks, Gated DeltaNet's recurrence,
//! and LoRA adapters' low-rank deltas.
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
mod delta_net;
mod dense_attention;
mod error;
mod experts;
mod kv;
mod low_rank;
mod rope;
mod rope_scaling;
#[cfg(test)]
mod rope_scaling_tests;
mod row;
pub(crate) mod simd;
#[cfg(test)]
mod testing;

pub use attention::{HeadShape, KvPages, PageTable, Scores, attend, attend_heads};
pub use delta_net::{DeltaHead, DeltaRows, DeltaShape, DeltaState, DeltaWeights, Serial, SplitHeads, delta_net};
pub use dense_attention::attend_within;
pub use error::OpsError;
pub use experts::{scatter_rows, weighted_sum};
pub(crate) use kv::KvArena;
pub use kv::{KvRows, KvType};
pub use low_rank::LowRank;
pub use rope::{Rope, RopeAngles, RopeKind, RopePos};
pub use rope_scaling::{RopeScaling, Yarn};
pub use row::{
    Gelu, add_in_place, f32_to_f16_row, geglu_f16, gelu, layer_norm, rms_norm, rms_norm_in_place, scale, sigmoid_gate,
    silu, softmax_in_place, swiglu, swiglu_oai,
};
#[cfg(test)]
pub(crate) use testing::noise;
