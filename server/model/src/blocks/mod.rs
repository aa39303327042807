//! The blocks layers are made of, each written once against the
//! [`Backend`]: a block loads its tensors (named as llama.cpp's converter
//! names them) and runs as one residual step, `x += block(x)`.
//!
//! - `attention.rs`: causal self-attention over the paged KV store, with
//!   optional Q/K/V biases, Q/K norms (per head or whole), a sliding
//!   window, soft-capped scores, a pre-scaled Q or a score scale of its
//!   own, a RoPE of its own or none, and an optional pre-norm, post-norm
//!   and residual scale;
//! - `mlp.rs`: the gated feed-forward (SwiGLU or GeGLU), with an optional
//!   pre-norm, post-norm and residual scale;
//! - `experts.rs`: a mixture of SwiGLU experts, each row routed to its
//!   own, rows grouped by expert, and an optional gated shared expert;
//! - `delta_net.rs`: Gated DeltaNet linear attention, each sequence's rows
//!   through its recurrent state;
//! - `pass.rs`: what they share (the pass, its buffers, a layer's tensors).
//!
//! [`Layer`] composes a layer's blocks from its declared
//! [`LayerKind`](super::layer::LayerKind).

mod attention;
mod delta_net;
mod experts;
mod mlp;
mod pass;

use sluice_kernels::backend::Backend;

use super::batch::ForwardError;
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::layer::{Cache, Ffn, LayerKind, Mixer};
use super::lora::Site;
use super::weights::{LoadError, Weight};
use attention::AttentionBlock;
use delta_net::DeltaNetBlock;
use experts::ExpertsBlock;
use mlp::Mlp;
use pass::LayerTensors;
pub(crate) use pass::{KvPlace, Pass, Scratch, Stores};

/// One loaded layer: its mixer's residual step, then its feed-forward's.
pub(crate) struct Layer<B: Backend> {
    mixer: MixerBlock<B>,
    ffn: FfnBlock<B>,
}

enum MixerBlock<B: Backend> {
    Attention(AttentionBlock<B>),
    DeltaNet(DeltaNetBlock<B>),
}

enum FfnBlock<B: Backend> {
    Gated(Mlp<B>),
    Experts(ExpertsBlock<B>),
}

/// Where the layers of a model keep their per-sequence state, assigned in
/// layer order as each layer's [`Cache`] asks.
#[derive(Debug, Default)]
pub(crate) struct CacheLayout {
    /// Layers with a K/V cell for every position ([`Cache::Paged`]).
    pub(crate) paged: usize,
    /// Layers that keep only a window of positions ([`Cache::Window`]).
    pub(crate) window: usize,
    /// The longest window among them: the cells a window store keeps per
    /// sequence.
    pub(crate) window_len: usize,
    /// The shapes of the layers that carry a recurrent state
    /// ([`Cache::Recurrent`]), in layer order.
    pub(crate) recurrent: Vec<sluice_kernels::ops::DeltaShape>,
}

impl<B: Backend> Layer<B> {
    /// Load layer `index` of kind `kind` from `file`, taking its place in
    /// `caches`.
    pub(crate) fn load(
        backend: &B,
        file: &GgufFile,
        hp: &HParams,
        index: usize,
        kind: LayerKind,
        caches: &mut CacheLayout,
    ) -> Result<Self, LoadError> {
        let tensors = LayerTensors { backend, file, index };
        let mixer = match kind.mixer {
            Mixer::Attention(attention) => {
                let place = match kind.mixer.cache() {
                    Cache::Window(n) => {
                        caches.window += 1;
                        caches.window_len = caches.window_len.max(n);
                        KvPlace::Window(caches.window - 1)
                    }
                    Cache::Paged | Cache::Recurrent => {
                        caches.paged += 1;
                        KvPlace::Paged(caches.paged - 1)
                    }
                };
                MixerBlock::Attention(AttentionBlock::load(&tensors, attention, kind, hp, place)?)
            }
            Mixer::DeltaNet(shape) => {
                caches.recurrent.push(shape);
                MixerBlock::DeltaNet(DeltaNetBlock::load(&tensors, shape, kind, hp, caches.recurrent.len() - 1)?)
            }
        };
        let ffn = match kind.ffn {
            Ffn::Experts(experts) => FfnBlock::Experts(ExpertsBlock::load(&tensors, kind, experts, hp)?),
            Ffn::SwiGlu | Ffn::GeGlu => FfnBlock::Gated(Mlp::load(&tensors, kind, hp)?),
        };
        Ok(Layer { mixer, ffn })
    }

    /// Run the layer over the pass's rows `x`.
    pub(crate) fn run(
        &self,
        pass: &Pass<'_, B>,
        layer: usize,
        kv: &mut Stores<'_, B>,
        scratch: &mut Scratch<B>,
    ) -> Result<(), ForwardError> {
        match &self.mixer {
            MixerBlock::Attention(attention) => attention.run(pass, layer, kv, scratch)?,
            MixerBlock::DeltaNet(delta_net) => delta_net.run(pass, layer, kv, scratch)?,
        }
        match &self.ffn {
            FfnBlock::Gated(mlp) => mlp.run(pass, layer, scratch),
            FfnBlock::Experts(experts) => experts.run(pass, scratch),
        }
    }

    /// Write what this layer keeps for rows whose hidden state is
    /// `scratch.x`, without running it (DFlash context injection).
    pub(crate) fn inject(&self, pass: &Pass<'_, B>, kv: &mut Stores<'_, B>, scratch: &mut Scratch<B>) {
        match &self.mixer {
            MixerBlock::Attention(attention) => attention.inject(pass, kv, scratch),
            // Never reached: a context of a model with recurrent layers
            // refuses injection before any layer runs.
            MixerBlock::DeltaNet(_) => {}
        }
    }

    /// The weight at `site`, for an adapter (experts have none).
    pub(crate) fn weight(&self, site: Site) -> Option<&Weight<B>> {
        let mixer = match &self.mixer {
            MixerBlock::Attention(attention) => attention.weight(site),
            MixerBlock::DeltaNet(delta_net) => delta_net.weight(site),
        };
        mixer.or_else(|| match &self.ffn {
            FfnBlock::Gated(mlp) => mlp.weight(site),
            FfnBlock::Experts(_) => None,
        })
    }

    /// The fused tensor (its suffix) the weight at `site` is a part of,
    /// which adapters cannot target.
    pub(crate) fn fused(&self, site: Site) -> Option<&'static str> {
        let mixer = match &self.mixer {
            MixerBlock::Attention(attention) => attention.fused(site),
            MixerBlock::DeltaNet(delta_net) => delta_net.fused(site),
        };
        mixer.or_else(|| match &self.ffn {
            FfnBlock::Gated(mlp) => mlp.fused(site),
            FfnBlock::Experts(_) => None,
        })
    }
}
