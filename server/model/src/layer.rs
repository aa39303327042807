//! What a layer is, as a family declares it before any tensor is read: how
//! it mixes positions, its feed-forward, and what it keeps per sequence
//! between passes. The loader composes blocks from these declarations and
//! the KV store is sized by asking each layer's [`Mixer::cache`].
//!
//! A layer mixes positions by causal attention (over the whole sequence or
//! a sliding window of it) or by a recurrence (Gated DeltaNet, whose state
//! a sequence carries from pass to pass), then runs a gated MLP or a
//! mixture of gated experts.

/// One layer's kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LayerKind {
    pub mixer: Mixer,
    pub ffn: Ffn,
    /// Each block's input is RMS-normed (`attn_norm`, `ffn_norm`); OLMo 2
    /// has none, its blocks read the residual stream itself.
    pub pre_norms: bool,
    /// Each block's output is RMS-normed before its residual add
    /// (`post_attention_norm`, `post_ffw_norm`: Gemma 2 and 3, OLMo 2).
    pub post_norms: bool,
    /// Each block's output is multiplied by this before its residual add
    /// (Granite's `residual_scale`), after any post-norm.
    pub residual_scale: Option<f32>,
    /// The feed-forward's pre-norm: `ffn_norm.weight`, except in gpt-oss
    /// files (`post_attention_norm.weight`).
    pub ffn_norm: &'static str,
}

impl LayerKind {
    /// Attention of `attention`'s shape and a SwiGLU MLP, pre-norms only.
    pub(crate) const fn plain(attention: Attention) -> Self {
        LayerKind {
            mixer: Mixer::Attention(attention),
            ffn: Ffn::SwiGlu,
            pre_norms: true,
            post_norms: false,
            residual_scale: None,
            ffn_norm: "ffn_norm.weight",
        }
    }
}

/// How a layer mixes information across positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Mixer {
    /// Softmax attention over earlier positions of the sequence.
    Attention(Attention),
    /// Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next): a short
    /// causal convolution and a delta-rule state per head, carried by each
    /// sequence ([`sluice_kernels::ops::delta_net`]).
    DeltaNet(sluice_kernels::ops::DeltaShape),
}

/// The shape of an attention mixer. A flag says what the file must carry;
/// biases and norms a file carries without the flag are applied too, as
/// llama.cpp applies any tensor it finds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Attention {
    /// Biases on the Q, K and V projections (`attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// RMSNorm of each Q and K head before RoPE (`attn_{q,k}_norm`).
    pub qk_norm: bool,
    /// The Q and K norms span the whole projected vector, all heads
    /// together (OLMo 2: weights of `n_head·head_dim` and
    /// `n_head_kv·head_dim`), not each head.
    pub qk_norm_whole: bool,
    /// Q and K are rotated; a layer without position embedding (SmolLM3's
    /// every fourth, Granite files with `rope.scaling.finetuned = false`)
    /// attends by content alone.
    pub rotary: bool,
    /// The scores' scale instead of `1/√head_dim` (Granite's
    /// `attention.scale`); ignored when `q_scale` is set.
    pub score_scale: Option<f32>,
    /// Q is multiplied by this after RoPE and the scores are not scaled
    /// again (Gemma, where llama.cpp rounds there); `None`: scores are
    /// scaled by `1/√head_dim`.
    pub q_scale: Option<f32>,
    /// Scores soft-capped at this (Gemma 2).
    pub softcap: Option<f32>,
    /// A row sees only the last `window` positions of its sequence, its
    /// own included (sliding-window layers).
    pub window: Option<usize>,
    /// A RoPE of its own instead of the model's (local layers' in
    /// Gemma 2 and 3, where their files say so).
    pub own_rope: Option<OwnRope>,
    /// A bias on the output projection (`attn_output.bias`: gpt-oss).
    pub output_bias: bool,
    /// A learned sink score per query head (`attn_sinks.weight`: gpt-oss),
    /// see [`sluice_kernels::ops::Scores::sinks`].
    pub sinks: bool,
    /// The query projection is twice as wide, each head's query followed by
    /// its output gate; the attention's output is multiplied by the gate's
    /// sigmoid before the output projection (Qwen3.5, Qwen3-Next).
    pub output_gate: bool,
}

/// A layer's RoPE base and frequency scale (its pairing is the model's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OwnRope {
    pub base: f32,
    pub freq_scale: f32,
}

impl Attention {
    /// Full attention, scores scaled by `1/√head_dim`, the model's RoPE.
    pub(crate) const fn full(qkv_bias: bool, qk_norm: bool) -> Self {
        Attention {
            qkv_bias,
            qk_norm,
            qk_norm_whole: false,
            rotary: true,
            score_scale: None,
            q_scale: None,
            softcap: None,
            window: None,
            own_rope: None,
            output_bias: false,
            sinks: false,
            output_gate: false,
        }
    }
}

/// A layer's feed-forward: `down(act(gate(x)) · up(x))`, or a weighted
/// sum of several such experts, each row choosing its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Ffn {
    /// `act` = SiLU.
    SwiGlu,
    /// `act` = GELU, tanh form, as llama.cpp's CPU backend evaluates it
    /// (`ops::geglu_f16`).
    GeGlu,
    /// A router picks each row's experts (SwiGLU MLPs of their own).
    Experts(Experts),
}

/// A mixture-of-experts feed-forward: a router (`ffn_gate_inp`) scores
/// the experts of each row, the `used` best-scored experts run
/// (`ffn_{gate,up,down}_exps`) and their outputs are summed weighted by a
/// softmax, best first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Experts {
    pub count: usize,
    pub used: usize,
    /// Each expert's feed-forward width.
    pub n_ff: usize,
    pub gating: Gating,
    /// A learned bias added to the scores for choosing only
    /// (`exp_probs_b.bias`: GLM-4.5, DeepSeek V3).
    pub selection_bias: bool,
    /// The experts fall in groups of equal size (`.0` of them); a row
    /// chooses among the `.1` groups whose two best scores sum highest.
    pub groups: Option<(usize, usize)>,
    /// The chosen experts' weights are divided by their sum (Mixtral,
    /// Qwen3-MoE; not Qwen2-MoE).
    pub normalized: bool,
    /// The weights are then multiplied by this (`expert_weights_scale`).
    pub scale: Option<f32>,
    /// A shared expert runs on every row.
    pub shared: Option<Shared>,
    pub mlp: ExpertMlp,
    /// The router and each expert's projections have biases
    /// (`ffn_gate_inp.bias`, `ffn_{gate,up,down}_exps.bias`: gpt-oss).
    pub biases: bool,
}

/// A shared expert: its width, and whether its output is scaled by the
/// sigmoid of its own gate (`ffn_gate_inp_shexp`: Qwen2-MoE; not GLM-4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shared {
    pub width: usize,
    pub gated: bool,
}

/// How a router's scores become the chosen experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gating {
    /// A softmax over all experts; the most probable are chosen and weigh
    /// by their probabilities (Qwen, Mixtral).
    Softmax,
    /// Each score's sigmoid; the highest are chosen and weigh by it
    /// (GLM-4.5, DeepSeek V3).
    Sigmoid,
    /// The best-scored are chosen and weigh by a softmax over their scores
    /// alone (gpt-oss).
    SoftmaxOfChosen,
}

/// Each expert's gated MLP, `down(act(gate(x), up(x)))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpertMlp {
    /// `act(g, u) = silu(g) · u`.
    SwiGlu,
    /// gpt-oss's: the gate clamped above and the up projection on both
    /// sides at 7, `act(g, u) = g · σ(1.702 g) · (u + 1)`
    /// ([`sluice_kernels::ops::swiglu_oai`]).
    ClampedSwiGlu,
}

/// What a layer keeps for each sequence between passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cache {
    /// A key and a value per position, in the paged KV store.
    Paged,
    /// A key and a value for each of the last `n` positions only: older
    /// cells are never read again, so their blocks may go back to a pool
    /// of their own as the sequence grows (sliding-window attention).
    Window(usize),
    /// A fixed-size state that each pass carries forward; it cannot be
    /// rolled back to an earlier position.
    Recurrent,
}

impl Mixer {
    /// Its attention's shape, if it attends.
    #[cfg(test)]
    pub(crate) fn attention(self) -> Option<Attention> {
        match self {
            Mixer::Attention(attention) => Some(attention),
            Mixer::DeltaNet(_) => None,
        }
    }

    pub(crate) fn cache(self) -> Cache {
        match self {
            Mixer::Attention(Attention { window: Some(n), .. }) => Cache::Window(n),
            Mixer::Attention(_) => Cache::Paged,
            Mixer::DeltaNet(_) => Cache::Recurrent,
        }
    }
}
