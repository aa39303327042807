//! Synthetic hybrid models: Qwen3.5's and Qwen3-Next's layers of Gated
//! DeltaNet linear attention with a gated full-attention layer every
//! fourth, as llama.cpp's converter writes them.

use crate::gguf_writer::{GgufBuilder, Rng, Tensor, TinyModel, Value};

/// The linear layers' widths: 2 key heads and 4 value heads of 16, a
/// causal convolution over the last 4 positions.
pub const KEY_HEADS: usize = 2;
pub const VALUE_HEADS: usize = 4;
pub const HEAD: usize = 16;
pub const CONV: usize = 4;
/// Every fourth layer attends over every position.
pub const FULL_INTERVAL: usize = 4;

/// A `qwen35` or `qwen35moe` model from the llama-shaped model `model` of
/// `shape` (heads of 16): its attention layers but every fourth become
/// Gated DeltaNet layers (`attn_qkv`, `attn_gate`, `ssm_*`); the others
/// get a query twice as wide (each head's query, then its output gate),
/// Q/K norms and interleaved M-RoPE over half of each head; every FFN
/// pre-norm is named `post_attention_norm`. `qwen3next` (NEOX rotary, no
/// sections) fuses β and α into `ssm_ba`, and its first layer has the
/// older files' fused `ssm_in` instead of `attn_qkv` and `attn_gate`.
pub fn qwen35(shape: &TinyModel, model: GgufBuilder) -> GgufBuilder {
    let arch = shape.arch;
    let mut rng = Rng::new(shape.seed ^ 0x35);
    let e = shape.n_embd as u64;
    let head_dim = (shape.n_embd / shape.n_head) as u64;
    let (key_dim, value_dim) = ((KEY_HEADS * HEAD) as u64, (VALUE_HEADS * HEAD) as u64);
    let conv_dim = 2 * key_dim + value_dim;
    let heads = VALUE_HEADS as u64;
    let matrix = |n_in: u64, n_out: u64, rng: &mut Rng| rng.vec((n_in * n_out) as usize, 1.0 / (n_in as f32).sqrt());
    let near_one = |len: u64, rng: &mut Rng| rng.vec(len as usize, 0.2).iter().map(|x| 1.0 + x).collect::<Vec<_>>();
    let next = arch == "qwen3next";
    let mut model = model.meta(&format!("{arch}.rope.dimension_count"), Value::U32(head_dim as u32 / 2));
    if !next {
        model = model.meta(&format!("{arch}.rope.dimension_sections"), Value::I32s(vec![2, 1, 1, 0]));
    }
    let mut model = model
        .meta(&format!("{arch}.full_attention_interval"), Value::U32(FULL_INTERVAL as u32))
        .meta(&format!("{arch}.ssm.conv_kernel"), Value::U32(CONV as u32))
        .meta(&format!("{arch}.ssm.state_size"), Value::U32(HEAD as u32))
        .meta(&format!("{arch}.ssm.group_count"), Value::U32(KEY_HEADS as u32))
        .meta(&format!("{arch}.ssm.time_step_rank"), Value::U32(VALUE_HEADS as u32))
        .meta(&format!("{arch}.ssm.inner_size"), Value::U32(value_dim as u32));
    for layer in 0..shape.n_layer {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        let norm = model.tensors.iter().find(|t| t.name == name("ffn_norm.weight")).expect("a pre-norm").clone();
        model = model
            .without_tensor(&norm.name)
            .tensor(Tensor { name: name("post_attention_norm.weight"), ..norm })
            .without_tensor(&name("attn_q.weight"));
        if (layer + 1) % FULL_INTERVAL == 0 {
            model = model
                .tensor(Tensor::f32(&name("attn_q.weight"), &[e, 2 * e], &matrix(e, 2 * e, &mut rng)))
                .tensor(Tensor::f32(&name("attn_q_norm.weight"), &[head_dim], &near_one(head_dim, &mut rng)))
                .tensor(Tensor::f32(&name("attn_k_norm.weight"), &[head_dim], &near_one(head_dim, &mut rng)));
            continue;
        }
        // A decay of exp(softplus(alpha + dt) · a) per step, a in -1.5..-0.5.
        let a: Vec<f32> = rng.vec(VALUE_HEADS, 0.5).iter().map(|x| x - 1.0).collect();
        model = ["attn_k.weight", "attn_v.weight", "attn_output.weight"]
            .iter()
            .fold(model, |model, suffix| model.without_tensor(&name(suffix)));
        model = match (next, layer) {
            (true, 0) => {
                let fused = conv_dim + value_dim;
                model.tensor(Tensor::f32(&name("ssm_in.weight"), &[e, fused], &matrix(e, fused, &mut rng)))
            }
            _ => model
                .tensor(Tensor::f32(&name("attn_qkv.weight"), &[e, conv_dim], &matrix(e, conv_dim, &mut rng)))
                .tensor(Tensor::f32(&name("attn_gate.weight"), &[e, value_dim], &matrix(e, value_dim, &mut rng))),
        };
        model = model
            .tensor(Tensor::f32(
                &name("ssm_conv1d.weight"),
                &[CONV as u64, conv_dim],
                &rng.vec(CONV * conv_dim as usize, 0.5),
            ))
            .tensor(Tensor::f32(&name("ssm_dt.bias"), &[heads], &rng.vec(VALUE_HEADS, 0.5)))
            .tensor(Tensor::f32(&name("ssm_a"), &[heads], &a));
        model = match next {
            true => model.tensor(Tensor::f32(&name("ssm_ba.weight"), &[e, 2 * heads], &matrix(e, 2 * heads, &mut rng))),
            false => model
                .tensor(Tensor::f32(&name("ssm_beta.weight"), &[e, heads], &matrix(e, heads, &mut rng)))
                .tensor(Tensor::f32(&name("ssm_alpha.weight"), &[e, heads], &matrix(e, heads, &mut rng))),
        };
        model = model
            .tensor(Tensor::f32(&name("ssm_norm.weight"), &[HEAD as u64], &near_one(HEAD as u64, &mut rng)))
            .tensor(Tensor::f32(&name("ssm_out.weight"), &[value_dim, e], &matrix(value_dim, e, &mut rng)));
    }
    model
}
