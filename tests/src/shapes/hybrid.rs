//! The layers of a hybrid shape (Qwen3.5's): Gated DeltaNet layers with a
//! gated full-attention layer every fourth, and a gated shared expert
//! beside the experts, as llama.cpp's converter writes them.

use super::plan::{F32, Fill, Planned};
use crate::gguf_writer::Value;

/// The Gated DeltaNet widths and the attention layers' rotation of a
/// hybrid [`Shape`](super::Shape).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeHybrid {
    /// Query/key heads and value heads of the linear layers, `head` wide.
    pub k_heads: usize,
    pub v_heads: usize,
    pub head: usize,
    /// The convolution's length in positions.
    pub conv: usize,
    /// Rotated elements of each attention head, in interleaved M-RoPE
    /// sections of these many pairs.
    pub n_rot: usize,
    pub sections: [i32; 4],
    /// The shared expert's width.
    pub shared: usize,
}

/// Every fourth layer attends over every position.
const FULL_INTERVAL: usize = 4;

type Matrix<'a> = &'a dyn Fn(String, u64, u64) -> Planned;

impl ShapeHybrid {
    /// Layer `layer`'s mixer tensors (after its `attn_norm`) in a model
    /// `e` wide whose attention has `heads` (query, KV) of `head_dim`.
    pub(super) fn mixer(
        &self,
        layer: usize,
        (e, head_dim): (u64, u64),
        heads: (u64, u64),
        matrix: Matrix<'_>,
    ) -> Vec<Planned> {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        let vector = |suffix: &str, len: usize, fill: Fill| Planned {
            name: name(suffix),
            dims: vec![len as u64],
            type_id: F32,
            fill,
        };
        if (layer + 1).is_multiple_of(FULL_INTERVAL) {
            let (q, kv) = (head_dim * heads.0, head_dim * heads.1);
            return vec![
                matrix(name("attn_q.weight"), e, 2 * q),
                matrix(name("attn_k.weight"), e, kv),
                matrix(name("attn_v.weight"), e, kv),
                vector("attn_q_norm.weight", head_dim as usize, Fill::NearOne),
                vector("attn_k_norm.weight", head_dim as usize, Fill::NearOne),
                matrix(name("attn_output.weight"), q, e),
            ];
        }
        let (key, value) = ((self.k_heads * self.head) as u64, (self.v_heads * self.head) as u64);
        let conv_dim = 2 * key + value;
        vec![
            matrix(name("attn_qkv.weight"), e, conv_dim),
            matrix(name("attn_gate.weight"), e, value),
            // Converters and llama-quantize keep the convolution in F32.
            Planned {
                name: name("ssm_conv1d.weight"),
                dims: vec![self.conv as u64, conv_dim],
                type_id: F32,
                fill: Fill::Uniform(0.5),
            },
            vector("ssm_dt.bias", self.v_heads, Fill::Uniform(0.5)),
            vector("ssm_a", self.v_heads, Fill::Decay),
            matrix(name("ssm_beta.weight"), e, self.v_heads as u64),
            matrix(name("ssm_alpha.weight"), e, self.v_heads as u64),
            vector("ssm_norm.weight", self.head, Fill::NearOne),
            matrix(name("ssm_out.weight"), value, e),
        ]
    }

    /// Layer `layer`'s shared expert and its gate, in a model `e` wide.
    pub(super) fn shared(&self, layer: usize, e: u64, matrix: Matrix<'_>) -> Vec<Planned> {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        let s = self.shared as u64;
        vec![
            Planned {
                name: name("ffn_gate_inp_shexp.weight"),
                dims: vec![e],
                type_id: F32,
                fill: Fill::Uniform(1.0 / (e as f32).sqrt()),
            },
            matrix(name("ffn_gate_shexp.weight"), e, s),
            matrix(name("ffn_up_shexp.weight"), e, s),
            matrix(name("ffn_down_shexp.weight"), s, e),
        ]
    }

    /// Its metadata under `arch`'s keys.
    pub(super) fn metadata(&self, arch: &str) -> Vec<(String, Value)> {
        let key = |name: &str| format!("{arch}.{name}");
        vec![
            (key("rope.dimension_count"), Value::U32(self.n_rot as u32)),
            (key("rope.dimension_sections"), Value::I32s(self.sections.to_vec())),
            (key("full_attention_interval"), Value::U32(FULL_INTERVAL as u32)),
            (key("ssm.conv_kernel"), Value::U32(self.conv as u32)),
            (key("ssm.state_size"), Value::U32(self.head as u32)),
            (key("ssm.group_count"), Value::U32(self.k_heads as u32)),
            (key("ssm.time_step_rank"), Value::U32(self.v_heads as u32)),
            (key("ssm.inner_size"), Value::U32((self.v_heads * self.head) as u32)),
            (key("expert_shared_feed_forward_length"), Value::U32(self.shared as u32)),
        ]
    }
}
