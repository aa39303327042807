//! Causal self-attention with grouped KV heads over the paged KV store:
//! RMSNorm, Q/K/V projections (optional biases), optional per-head Q/K
//! RMSNorm, RoPE (the model's or the layer's own), then every row's K/V is
//! stored before any row attends, so rows of one sequence in a pass see
//! each other causally, over the whole sequence or a sliding window. The
//! output projection may be RMS-normed before the residual add.

use sluice_kernels::backend::Backend;
use sluice_kernels::ops::{Rope, Scores};

use super::pass::{KvPlace, LayerTensors, Pass, Scratch, Stores};
use crate::batch::ForwardError;
use crate::hparams::HParams;
use crate::layer::Attention;
use crate::lora::Site;
use crate::weights::{LoadError, Weight};

pub(super) struct AttentionBlock<B: Backend> {
    norm: B::Vector,
    q: Weight<B>,
    k: Weight<B>,
    v: Weight<B>,
    q_bias: Option<B::Vector>,
    k_bias: Option<B::Vector>,
    v_bias: Option<B::Vector>,
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    output: Weight<B>,
    post_norm: Option<B::Vector>,
    /// Q's scale, when Q is scaled before attention rather than its scores.
    q_scale: Option<f32>,
    scores: Scores,
    /// It rotates with the pass's local RoPE.
    local_rope: bool,
    /// Its layer of the KV stores.
    cache: KvPlace,
}

impl<B: Backend> AttentionBlock<B> {
    pub(super) fn load(
        tensors: &LayerTensors<'_, B>,
        kind: Attention,
        post_norm: bool,
        hp: &HParams,
        cache: KvPlace,
    ) -> Result<Self, LoadError> {
        let (n_embd, q_dim, kv_dim) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let scale = match kind.q_scale {
            Some(_) => 1.0,
            None => 1.0 / (hp.head_dim as f32).sqrt(),
        };
        Ok(AttentionBlock {
            norm: tensors.vector("attn_norm.weight", n_embd)?,
            q: tensors.weight("attn_q.weight", n_embd, q_dim)?,
            k: tensors.weight("attn_k.weight", n_embd, kv_dim)?,
            v: tensors.weight("attn_v.weight", n_embd, kv_dim)?,
            q_bias: tensors.optional("attn_q.bias", q_dim, kind.qkv_bias)?,
            k_bias: tensors.optional("attn_k.bias", kv_dim, kind.qkv_bias)?,
            v_bias: tensors.optional("attn_v.bias", kv_dim, kind.qkv_bias)?,
            q_norm: tensors.optional("attn_q_norm.weight", hp.head_dim, kind.qk_norm)?,
            k_norm: tensors.optional("attn_k_norm.weight", hp.head_dim, kind.qk_norm)?,
            output: tensors.weight("attn_output.weight", q_dim, n_embd)?,
            post_norm: post_norm.then(|| tensors.vector("post_attention_norm.weight", n_embd)).transpose()?,
            q_scale: kind.q_scale,
            scores: Scores { scale, softcap: kind.softcap, window: kind.window },
            local_rope: kind.own_rope.is_some(),
            cache,
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
        b.rms_norm(&s.x, &self.norm, pass.rms_eps, &mut s.h);
        b.matmuls(
            &s.h,
            pass.rows,
            &mut [(&self.q.matrix, &mut s.q), (&self.k.matrix, &mut s.k), (&self.v.matrix, &mut s.v)],
        );
        for (site, values) in [(Site::Q, &mut s.q), (Site::K, &mut s.k), (Site::V, &mut s.v)] {
            pass.adapted(layer, site, &s.h, values);
        }
        for (values, bias) in [(&mut s.q, &self.q_bias), (&mut s.k, &self.k_bias), (&mut s.v, &self.v_bias)] {
            if let Some(bias) = bias {
                b.add_bias(values, bias);
            }
        }
        for (values, norm) in [(&mut s.q, &self.q_norm), (&mut s.k, &self.k_norm)] {
            if let Some(norm) = norm {
                b.rms_norm_in_place(values, norm, pass.rms_eps);
            }
        }
        let (rope, angles) = self.rope(pass);
        b.rope(rope, angles, &mut s.q);
        b.rope(rope, angles, &mut s.k);
        if let Some(q_scale) = self.q_scale {
            b.scale(&mut s.q, q_scale)?;
        }
        let (kv, cache, layout) = self.store(pass, kv);
        b.store_kv(kv, cache, &s.k, &s.v, layout);
        b.attend(kv, cache, &s.q, layout, pass.heads, self.scores, &mut s.attn)?;
        b.matmul(&self.output.matrix, &s.attn, pass.rows, &mut s.h);
        pass.adapted(layer, Site::Output, &s.attn, &mut s.h);
        if let Some(norm) = &self.post_norm {
            b.rms_norm_in_place(&mut s.h, norm, pass.rms_eps);
        }
        b.add(&mut s.x, &s.h);
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
        let (rope, angles) = self.rope(pass);
        b.rope(rope, angles, &mut s.k);
        let (kv, cache, layout) = self.store(pass, kv);
        b.store_kv(kv, cache, &s.k, &s.v, layout);
    }

    pub(super) fn weight(&self, site: Site) -> Option<&Weight<B>> {
        match site {
            Site::Q => Some(&self.q),
            Site::K => Some(&self.k),
            Site::V => Some(&self.v),
            Site::Output => Some(&self.output),
            Site::Gate | Site::Up | Site::Down => None,
        }
    }
}
