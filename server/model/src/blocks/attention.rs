//! Causal self-attention with grouped KV heads over the paged KV store:
//! RMSNorm (where the layer has one), Q/K/V projections (optional biases),
//! optional Q/K RMSNorm (per head or over the whole vector), RoPE (the
//! model's or the layer's own, or none), then every row's K/V is stored
//! before any row attends, so rows of one sequence in a pass see each other
//! causally, over the whole sequence or a sliding window, with learned
//! sinks where the layer has them; an output gate (its sigmoid) where the
//! query projection carries one. The output projection (with its bias,
//! where it has one) may be RMS-normed and scaled before the residual add.

use sluice_kernels::backend::Backend;
use sluice_kernels::ops::{Rope, Scores};

use super::pass::{KvPlace, LayerTensors, Pass, Residual, Scratch, Stores};
use crate::batch::ForwardError;
use crate::hparams::HParams;
use crate::layer::{Attention, LayerKind};
use crate::lora::Site;
use crate::weights::{LoadError, Weight};

/// The Q|K|V weight of files that fuse them (Phi-3), rows in that order.
pub(super) const FUSED_QKV: &str = "attn_qkv.weight";

pub(super) struct AttentionBlock<B: Backend> {
    /// `None`: the projections read the residual stream itself.
    norm: Option<B::Vector>,
    q: Weight<B>,
    k: Weight<B>,
    v: Weight<B>,
    /// Q, K and V are the parts of one fused tensor (`attn_qkv.weight`).
    fused_qkv: bool,
    q_bias: Option<B::Vector>,
    k_bias: Option<B::Vector>,
    v_bias: Option<B::Vector>,
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    output: Weight<B>,
    output_bias: Option<B::Vector>,
    residual: Residual<B>,
    /// Q and K are rotated.
    rotary: bool,
    /// Q's scale, when Q is scaled before attention rather than its scores.
    q_scale: Option<f32>,
    /// Its scores but for the sinks, which it holds.
    scores: Scores<'static>,
    sinks: Option<Vec<f32>>,
    /// It rotates with the pass's local RoPE.
    local_rope: bool,
    /// Its layer of the KV stores.
    cache: KvPlace,
    /// The query projection carries each head's output gate after its
    /// query.
    output_gate: bool,
}

impl<B: Backend> AttentionBlock<B> {
    pub(super) fn load(
        tensors: &LayerTensors<'_, B>,
        kind: Attention,
        layer: LayerKind,
        hp: &HParams,
        cache: KvPlace,
    ) -> Result<Self, LoadError> {
        let (n_embd, q_dim, kv_dim) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let scale = match (kind.q_scale, kind.score_scale) {
            (Some(_), _) => 1.0,
            (None, Some(scale)) => scale,
            (None, None) => 1.0 / (hp.head_dim as f32).sqrt(),
        };
        let (q_norm_len, k_norm_len) = match kind.qk_norm_whole {
            true => (q_dim, kv_dim),
            false => (hp.head_dim, hp.head_dim),
        };
        let q_width = if kind.output_gate { 2 * q_dim } else { q_dim };
        let widths = [q_width, kv_dim, kv_dim];
        let fused_qkv = tensors.has(FUSED_QKV);
        let [q, k, v] = match fused_qkv {
            true => tensors.fused(FUSED_QKV, n_embd, widths)?,
            false => [
                tensors.weight("attn_q.weight", n_embd, q_width)?,
                tensors.weight("attn_k.weight", n_embd, kv_dim)?,
                tensors.weight("attn_v.weight", n_embd, kv_dim)?,
            ],
        };
        // A fused weight may come with a fused bias or with separate ones.
        let [q_bias, k_bias, v_bias] = match fused_qkv && tensors.has("attn_qkv.bias") {
            true => tensors.fused_vector("attn_qkv.bias", widths)?.map(Some),
            false => [
                tensors.optional("attn_q.bias", q_width, kind.qkv_bias)?,
                tensors.optional("attn_k.bias", kv_dim, kind.qkv_bias)?,
                tensors.optional("attn_v.bias", kv_dim, kind.qkv_bias)?,
            ],
        };
        Ok(AttentionBlock {
            norm: layer.pre_norms.then(|| tensors.vector("attn_norm.weight", n_embd)).transpose()?,
            q,
            k,
            v,
            fused_qkv,
            q_bias,
            k_bias,
            v_bias,
            q_norm: tensors.optional("attn_q_norm.weight", q_norm_len, kind.qk_norm)?,
            k_norm: tensors.optional("attn_k_norm.weight", k_norm_len, kind.qk_norm)?,
            output: tensors.weight("attn_output.weight", q_dim, n_embd)?,
            output_bias: tensors.optional("attn_output.bias", n_embd, kind.output_bias)?,
            residual: Residual::load(tensors, layer, "post_attention_norm.weight", n_embd)?,
            rotary: kind.rotary,
            q_scale: kind.q_scale,
            scores: Scores { softcap: kind.softcap, window: kind.window, ..Scores::scaled(scale) },
            sinks: kind.sinks.then(|| tensors.host("attn_sinks.weight", hp.n_head)).transpose()?,
            local_rope: kind.own_rope.is_some(),
            cache,
            output_gate: kind.output_gate,
        })
    }

    pub(super) fn run(
        &self,
        pass: &Pass<'_, B>,
        layer: usize,
        kv: &mut Stores<'_, B>,
        s: &mut Scratch<B>,
    ) -> Result<(), ForwardError> {
        let b = pass.backend;
        let input = match &self.norm {
            Some(norm) => {
                b.rms_norm(&s.x, norm, pass.rms_eps, &mut s.h);
                &s.h
            }
            None => &s.x,
        };
        b.matmuls(
            input,
            pass.rows,
            &mut [(&self.q.matrix, &mut s.q), (&self.k.matrix, &mut s.k), (&self.v.matrix, &mut s.v)],
        );
        for (site, values) in [(Site::Q, &mut s.q), (Site::K, &mut s.k), (Site::V, &mut s.v)] {
            pass.adapted(layer, site, input, values);
        }
        for (values, bias) in [(&mut s.q, &self.q_bias), (&mut s.k, &self.k_bias), (&mut s.v, &self.v_bias)] {
            if let Some(bias) = bias {
                b.add_bias(values, bias);
            }
        }
        if self.output_gate {
            // Each head's query, then its gate: the queries to `s.q`, the
            // gates to `s.up`.
            let parts = pass.rows * pass.heads.n_head();
            let (queries, gates): (Vec<usize>, Vec<usize>) = (0..parts).map(|part| (2 * part, 2 * part + 1)).unzip();
            b.gather(&s.q, &queries, pass.heads.head_dim(), &mut s.gate);
            b.gather(&s.q, &gates, pass.heads.head_dim(), &mut s.up);
            std::mem::swap(&mut s.q, &mut s.gate);
        }
        for (values, norm) in [(&mut s.q, &self.q_norm), (&mut s.k, &self.k_norm)] {
            if let Some(norm) = norm {
                b.rms_norm_in_place(values, norm, pass.rms_eps);
            }
        }
        if self.rotary {
            let (rope, angles) = self.rope(pass);
            b.rope(rope, angles, &mut s.q);
            b.rope(rope, angles, &mut s.k);
        }
        if let Some(q_scale) = self.q_scale {
            b.scale(&mut s.q, q_scale)?;
        }
        if !pass.q_temperature.is_empty() {
            b.scale_rows(&mut s.q, pass.q_temperature)?;
        }
        let (kv, cache, layout) = self.store(pass, kv);
        b.store_kv(kv, cache, &s.k, &s.v, layout);
        let scores = Scores { sinks: self.sinks.as_deref(), ..self.scores };
        b.attend(kv, cache, &s.q, layout, pass.heads, scores, &mut s.attn)?;
        if self.output_gate {
            b.sigmoid_gate(&mut s.attn, &s.up)?;
        }
        b.matmul(&self.output.matrix, &s.attn, pass.rows, &mut s.h);
        pass.adapted(layer, Site::Output, &s.attn, &mut s.h);
        if let Some(bias) = &self.output_bias {
            b.add_bias(&mut s.h, bias);
        }
        self.residual.add(pass, &mut s.h, &mut s.x)?;
        Ok(())
    }

    /// Its RoPE and the pass's angles of it.
    fn rope<'a>(&self, pass: &Pass<'a, B>) -> (&'a Rope, &'a B::Pass) {
        match pass.local_rope {
            Some(local) if self.local_rope => local,
            _ => (pass.rope, pass.layout),
        }
    }

    /// Its store, its layer there, and the pass's layout of that store's
    /// cells.
    fn store<'a>(&self, pass: &Pass<'a, B>, kv: &'a mut Stores<'_, B>) -> (&'a mut B::Kv, usize, &'a B::Pass) {
        match (self.cache, kv.window.as_deref_mut(), pass.window_layout) {
            (KvPlace::Window(layer), Some(window), Some(layout)) => (window, layer, layout),
            (KvPlace::Window(layer), ..) => (&mut *kv.paged, kv.n_paged + layer, pass.layout),
            (KvPlace::Paged(layer), ..) => (&mut *kv.paged, layer, pass.layout),
        }
    }

    /// Store the K (normed, rotated) and V of rows whose input is `s.x`.
    pub(super) fn inject(&self, pass: &Pass<'_, B>, kv: &mut Stores<'_, B>, s: &mut Scratch<B>) {
        let b = pass.backend;
        b.matmuls(&s.x, pass.rows, &mut [(&self.k.matrix, &mut s.k), (&self.v.matrix, &mut s.v)]);
        if let Some(norm) = &self.k_norm {
            b.rms_norm_in_place(&mut s.k, norm, pass.rms_eps);
        }
        if self.rotary {
            let (rope, angles) = self.rope(pass);
            b.rope(rope, angles, &mut s.k);
        }
        let (kv, cache, layout) = self.store(pass, kv);
        b.store_kv(kv, cache, &s.k, &s.v, layout);
    }

    pub(super) fn weight(&self, site: Site) -> Option<&Weight<B>> {
        match site {
            Site::Q => Some(&self.q),
            Site::K => Some(&self.k),
            Site::V => Some(&self.v),
            Site::Output => Some(&self.output),
            _ => None,
        }
    }

    /// The fused tensor the weight at `site` is a part of.
    pub(super) fn fused(&self, site: Site) -> Option<&'static str> {
        (self.fused_qkv && matches!(site, Site::Q | Site::K | Site::V)).then_some(FUSED_QKV)
    }
}
