//! The blocks layers are made of, each written once against the
//! [`Backend`]: a block loads its tensors (named as llama.cpp's converter
//! names them) and runs as one residual step, `x += block(x)`.
//!
//! - `attention.rs`: causal self-attention over the paged KV store, with
//!   optional Q/K/V biases and Q/K norms;
//! - `mlp.rs`: the SwiGLU feed-forward.
//!
//! [`Layer`] composes a layer's blocks from its declared
//! [`LayerKind`](super::layer::LayerKind).

mod attention;
mod mlp;

use sluice_kernels::backend::Backend;
use sluice_kernels::ops::{HeadShape, Rope};

use super::batch::ForwardError;
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::layer::{Cache, Ffn, LayerKind, Mixer};
use super::lora::{Adapter, PassAdapters, Site};
use super::weights::{LoadError, Weight, tensor_problem, vector, weight};
use attention::AttentionBlock;
use mlp::Mlp;

/// One loaded layer: its mixer's residual step, then its feed-forward's.
pub(crate) struct Layer<B: Backend> {
    mixer: MixerBlock<B>,
    ffn: FfnBlock<B>,
}

enum MixerBlock<B: Backend> {
    Attention(AttentionBlock<B>),
}

enum FfnBlock<B: Backend> {
    SwiGlu(Mlp<B>),
}

/// Where the layers of a model keep their per-sequence state, assigned in
/// layer order as each layer's [`Cache`] asks.
#[derive(Debug, Default)]
pub(crate) struct CacheLayout {
    /// Layers with K/V in the paged store.
    pub(crate) paged: usize,
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
        let mixer = match (kind.mixer, kind.mixer.cache()) {
            (Mixer::Attention(attention), Cache::Paged) => {
                caches.paged += 1;
                MixerBlock::Attention(AttentionBlock::load(&tensors, attention, hp, caches.paged - 1)?)
            }
        };
        let ffn = match kind.ffn {
            Ffn::SwiGlu => FfnBlock::SwiGlu(Mlp::load(&tensors, hp)?),
        };
        Ok(Layer { mixer, ffn })
    }

    /// Run the layer over the pass's rows `x`.
    pub(crate) fn run(
        &self,
        pass: &Pass<'_, B>,
        layer: usize,
        kv: &mut B::Kv,
        scratch: &mut Scratch<B>,
    ) -> Result<(), ForwardError> {
        match &self.mixer {
            MixerBlock::Attention(attention) => attention.run(pass, layer, kv, scratch)?,
        }
        match &self.ffn {
            FfnBlock::SwiGlu(mlp) => mlp.run(pass, layer, scratch),
        }
        Ok(())
    }

    /// Write what this layer keeps for rows whose hidden state is
    /// `scratch.x`, without running it (DFlash context injection).
    pub(crate) fn inject(&self, pass: &Pass<'_, B>, kv: &mut B::Kv, scratch: &mut Scratch<B>) {
        match &self.mixer {
            MixerBlock::Attention(attention) => attention.inject(pass, kv, scratch),
        }
    }

    /// The weight at `site`, for an adapter.
    pub(crate) fn weight(&self, site: Site) -> Option<&Weight<B>> {
        let MixerBlock::Attention(attention) = &self.mixer;
        let FfnBlock::SwiGlu(mlp) = &self.ffn;
        attention.weight(site).or_else(|| mlp.weight(site))
    }
}

/// What every block of one forward pass reads.
pub(crate) struct Pass<'a, B: Backend> {
    pub(crate) backend: &'a B,
    /// The rows' layout on the backend (positions, KV slots, visibility).
    pub(crate) layout: &'a B::Pass,
    pub(crate) rows: usize,
    pub(crate) rms_eps: f32,
    pub(crate) rope: &'a Rope,
    pub(crate) heads: HeadShape,
    pub(crate) lora: &'a PassAdapters,
    pub(crate) adapters: &'a [Adapter<B>],
}

impl<B: Backend> Pass<'_, B> {
    /// Add the adapters' deltas for the weight at `site` of `layer`.
    fn adapted(&self, layer: usize, site: Site, x: &B::Rows, out: &mut B::Rows) {
        self.lora.apply(self.backend, self.adapters, Some((layer, site)), x, out);
    }
}

/// The buffers of a pass: the residual stream `x` and the blocks' working
/// rows, kept between passes so that steady decoding allocates nothing.
pub(crate) struct Scratch<B: Backend> {
    pub(crate) x: B::Rows,
    pub(crate) h: B::Rows,
    q: B::Rows,
    pub(crate) k: B::Rows,
    pub(crate) v: B::Rows,
    attn: B::Rows,
    gate: B::Rows,
    up: B::Rows,
    pub(crate) ffn: B::Rows,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Scratch {
            x: B::Rows::default(),
            h: B::Rows::default(),
            q: B::Rows::default(),
            k: B::Rows::default(),
            v: B::Rows::default(),
            attn: B::Rows::default(),
            gate: B::Rows::default(),
            up: B::Rows::default(),
            ffn: B::Rows::default(),
        }
    }
}

/// The tensors of one layer, `blk.<index>.<suffix>`.
struct LayerTensors<'a, B: Backend> {
    backend: &'a B,
    file: &'a GgufFile,
    index: usize,
}

impl<B: Backend> LayerTensors<'_, B> {
    fn name(&self, suffix: &str) -> String {
        format!("blk.{}.{suffix}", self.index)
    }

    fn weight(&self, suffix: &str, n_in: usize, n_out: usize) -> Result<Weight<B>, LoadError> {
        weight(self.backend, self.file, &self.name(suffix), n_in, n_out)
    }

    fn vector(&self, suffix: &str, len: usize) -> Result<B::Vector, LoadError> {
        vector(self.backend, self.file, &self.name(suffix), len)
    }

    /// A vector the file may carry; `required` makes its absence an error.
    fn optional(&self, suffix: &str, len: usize, required: bool) -> Result<Option<B::Vector>, LoadError> {
        let name = self.name(suffix);
        match self.file.tensor(&name) {
            Some(_) => vector(self.backend, self.file, &name, len).map(Some),
            None if required => Err(tensor_problem(&name, "missing")),
            None => Ok(None),
        }
    }
}
