//! `qwen35`, `qwen35moe` and `qwen3next`: Qwen3.5 and Qwen3.6, dense and
//! mixtures of experts, and Qwen3-Next. Hybrid layers: Gated DeltaNet
//! linear attention, and every `full_attention_interval`-th layer (or as
//! `attention.recurrent_layers` says) gated full attention with Q/K norms
//! and rotary over part of each head: interleaved M-RoPE for Qwen3.5,
//! NEOX for Qwen3-Next. The feed-forward's pre-norm is the file's
//! `post_attention_norm`; `qwen35moe`'s and `qwen3next`'s feed-forward is
//! experts with renormalized weights and a gated shared expert. The
//! trailing `nextn_predict_layers` layers (multi-token prediction) are not
//! run.
//!
//! Qwen3-Next's files differ in the linear layers: value heads read their
//! key heads in groups (`DeltaShape::grouped`), β and α come fused per key
//! head (`ssm_ba`), and older files fuse Q, K, V and z per key head too
//! (`ssm_in`; see `blocks::delta_net`).

use sluice_kernels::ops::DeltaShape;

use super::experts::{Layout, experts};
use super::family::Family;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, invalid, sections};
use crate::layer::{Attention, Ffn, LayerKind, Mixer};
use crate::weights::LoadError;

pub(super) struct Qwen35 {
    name: &'static str,
    /// Its feed-forward is experts.
    moe: bool,
    /// Qwen3-Next: NEOX rotary, grouped key heads.
    next: bool,
}

pub(super) const QWEN35: Qwen35 = Qwen35 { name: "qwen35", moe: false, next: false };
pub(super) const QWEN35MOE: Qwen35 = Qwen35 { name: "qwen35moe", moe: true, next: false };
pub(super) const QWEN3NEXT: Qwen35 = Qwen35 { name: "qwen3next", moe: true, next: true };

const LAYOUT: Layout = Layout { normalized: true, shared: true, ..Layout::PLAIN };

/// llama.cpp's bound on a linear layer's convolution and heads: beyond
/// these a file is malformed, not a bigger model.
const MAX_CONV: u32 = 64;
const MAX_HEADS: u32 = 4096;
const MAX_HEAD: u32 = 1024;

impl Family for Qwen35 {
    fn name(&self) -> &'static str {
        self.name
    }

    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError> {
        if self.next {
            return Ok(RopeStyle::Neox);
        }
        Ok(RopeStyle::IMRope(sections(file, &format!("{}.rope.dimension_sections", self.name), n_rot)?))
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let ffn = match self.moe {
            true => Ffn::Experts(experts(file, self.name, hp, LAYOUT)?.ok_or_else(|| {
                invalid(&format!("{}.expert_count", self.name), "absent", format!("a {} model has experts", self.name))
            })?),
            false => Ffn::SwiGlu,
        };
        let shape = self.delta_shape(file)?;
        let attention = Attention { output_gate: true, ..Attention::full(false, true) };
        let layer =
            |mixer| LayerKind { mixer, ffn, ffn_norm: "post_attention_norm.weight", ..LayerKind::plain(attention) };
        Ok(self
            .recurrent(file, hp.n_layer)?
            .into_iter()
            .map(|recurrent| layer(if recurrent { Mixer::DeltaNet(shape) } else { Mixer::Attention(attention) }))
            .collect())
    }
}

impl Qwen35 {
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    /// Which of the `n_layer` layers run are recurrent.
    fn recurrent(&self, file: &GgufFile, n_layer: usize) -> Result<Vec<bool>, HParamsError> {
        let listed = self.key("attention.recurrent_layers");
        if file.get(&listed).is_some() {
            let flags = file.ints(&listed)?;
            if flags.len() < n_layer || flags.iter().any(|flag| !(0..=1).contains(flag)) {
                return Err(invalid(&listed, format!("{flags:?}"), format!("must be {n_layer} flags of 0 or 1")));
            }
            return Ok(flags[..n_layer].iter().map(|&flag| flag == 1).collect());
        }
        let key = self.key("full_attention_interval");
        let interval = file.opt_u32(&key)?.unwrap_or(4);
        if interval == 0 {
            return Err(invalid(&key, 0, "must be positive".into()));
        }
        Ok((0..n_layer).map(|layer| !(layer + 1).is_multiple_of(interval as usize)).collect())
    }

    /// The linear layers' widths, checked as llama.cpp's layout needs them.
    fn delta_shape(&self, file: &GgufFile) -> Result<DeltaShape, HParamsError> {
        let read = |key: &str, max: u32| -> Result<usize, HParamsError> {
            let key = self.key(key);
            match file.u32(&key)? {
                value if value == 0 || value > max => Err(invalid(&key, value, format!("must be 1..={max}"))),
                value => Ok(value as usize),
            }
        };
        let shape = DeltaShape {
            k_heads: read("ssm.group_count", MAX_HEADS)?,
            v_heads: read("ssm.time_step_rank", MAX_HEADS)?,
            head: read("ssm.state_size", MAX_HEAD)?,
            conv: read("ssm.conv_kernel", MAX_CONV)?,
            grouped: self.next,
        };
        if !shape.v_heads.is_multiple_of(shape.k_heads) {
            let why = format!("must be a multiple of {}.ssm.group_count {}", self.name, shape.k_heads);
            return Err(invalid(&self.key("ssm.time_step_rank"), shape.v_heads, why));
        }
        let inner = read("ssm.inner_size", u32::MAX)?;
        if inner != shape.value_dim() {
            let why = format!("must be ssm.time_step_rank × ssm.state_size = {}", shape.value_dim());
            return Err(invalid(&self.key("ssm.inner_size"), inner, why));
        }
        Ok(shape)
    }
}
