//! What a layer is, as a family declares it before any tensor is read: how
//! it mixes positions, its feed-forward, and what it keeps per sequence
//! between passes. The loader composes blocks from these declarations and
//! the KV store is sized by asking each layer's [`Mixer::cache`].
//!
//! Today every family's layers are full causal attention with a SwiGLU
//! MLP. Sliding windows, experts and recurrent mixers join as variants
//! here, each with the block that runs it.

/// One layer's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerKind {
    pub mixer: Mixer,
    pub ffn: Ffn,
}

/// How a layer mixes information across positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mixer {
    /// Softmax attention over every earlier position of the sequence.
    Attention(Attention),
}

/// The shape of an attention mixer. A flag says what the file must carry;
/// biases and norms a file carries without the flag are applied too, as
/// llama.cpp applies any tensor it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attention {
    /// Biases on the Q, K and V projections (`attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// RMSNorm of each Q and K head before RoPE (`attn_{q,k}_norm`).
    pub qk_norm: bool,
}

/// A layer's feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ffn {
    /// `down(silu(gate(x)) · up(x))`.
    SwiGlu,
}

/// What a layer keeps for each sequence between passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cache {
    /// A key and a value per position, in the paged KV store.
    Paged,
}

impl Mixer {
    pub(crate) fn cache(self) -> Cache {
        match self {
            Mixer::Attention(_) => Cache::Paged,
        }
    }
}
