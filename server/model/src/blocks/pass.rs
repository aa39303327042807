//! What the blocks of a layer share: the pass they run in, its buffers, and
//! the tensors they load.

use sluice_kernels::backend::{Backend, BackendError};
use sluice_kernels::ops::{HeadShape, Rope};

use crate::gguf::GgufFile;
use crate::layer::LayerKind;
use crate::lora::{Adapter, PassAdapters, Site};
use crate::recurrent::{RecurrentStore, Run};
use crate::weights::{LoadError, Weight, experts, fused, host_vector, tensor_problem, vector, weight};

/// What every block of one forward pass reads.
pub(crate) struct Pass<'a, B: Backend> {
    pub(crate) backend: &'a B,
    /// The rows' layout on the backend (positions, KV slots, visibility).
    pub(crate) layout: &'a B::Pass,
    /// Their layout in the window layers' store, in a context that has one.
    pub(crate) window_layout: Option<&'a B::Pass>,
    pub(crate) rows: usize,
    pub(crate) rms_eps: f32,
    pub(crate) rope: &'a Rope,
    /// The local layers' RoPE and its angles for this pass, where the
    /// model has one (Gemma 3); the layout is `layout`'s.
    pub(crate) local_rope: Option<(&'a Rope, &'a B::Pass)>,
    pub(crate) heads: HeadShape,
    /// Each row's query factor, where the model scales queries by
    /// position (Llama 4's temperature); empty otherwise.
    pub(crate) q_temperature: &'a [f32],
    pub(crate) lora: &'a PassAdapters,
    pub(crate) adapters: &'a [Adapter<B>],
    /// Each sequence's rows in cell order, for the recurrent layers.
    pub(crate) runs: &'a [Run],
}

impl<B: Backend> Pass<'_, B> {
    /// Add the adapters' deltas for the weight at `site` of `layer`.
    pub(super) fn adapted(&self, layer: usize, site: Site, x: &B::Rows, out: &mut B::Rows) {
        self.lora.apply(self.backend, self.adapters, Some((layer, site)), x, out);
    }
}

/// How a block's output joins the residual stream: RMS-normed first where
/// the layer has post-norms, scaled where it has a residual scale, then
/// added.
pub(super) struct Residual<B: Backend> {
    post_norm: Option<B::Vector>,
    scale: Option<f32>,
}

impl<B: Backend> Residual<B> {
    /// The layer's, its post-norm (where it has them) named `norm`.
    pub(super) fn load(
        tensors: &LayerTensors<'_, B>,
        layer: LayerKind,
        norm: &str,
        n_embd: usize,
    ) -> Result<Self, LoadError> {
        let post_norm = layer.post_norms.then(|| tensors.vector(norm, n_embd)).transpose()?;
        Ok(Residual { post_norm, scale: layer.residual_scale })
    }

    /// `x += out`, after `out`'s norm and scale.
    pub(super) fn add(&self, pass: &Pass<'_, B>, out: &mut B::Rows, x: &mut B::Rows) -> Result<(), BackendError> {
        let b = pass.backend;
        if let Some(norm) = &self.post_norm {
            b.rms_norm_in_place(out, norm, pass.rms_eps);
        }
        if let Some(scale) = self.scale {
            b.scale(out, scale)?;
        }
        b.add(x, out);
        Ok(())
    }
}

/// A layer's K/V in a context's stores: window layers have a store of
/// their own where the context frees old cells, else they follow the
/// paged layers in the one store (every cell kept, `--swa-full`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum KvPlace {
    Paged(usize),
    Window(usize),
}

/// A pass's KV stores: `window` is `None` in a context whose window
/// layers keep every cell beside the paged layers.
pub(crate) struct Stores<'a, B: Backend> {
    pub(crate) paged: &'a mut B::Kv,
    pub(crate) window: Option<&'a mut B::Kv>,
    /// Paged layers in the model (where window layers start in `paged`
    /// when they have no store of their own).
    pub(crate) n_paged: usize,
    /// The recurrent layers' states, in a model that has them.
    pub(crate) recurrent: Option<&'a mut RecurrentStore>,
}

/// The buffers of a pass: the residual stream `x` and the blocks' working
/// rows, kept between passes so that steady decoding allocates nothing.
pub(crate) struct Scratch<B: Backend> {
    pub(crate) x: B::Rows,
    pub(crate) h: B::Rows,
    pub(super) q: B::Rows,
    pub(crate) k: B::Rows,
    pub(crate) v: B::Rows,
    pub(super) attn: B::Rows,
    pub(super) gate: B::Rows,
    pub(super) up: B::Rows,
    pub(crate) ffn: B::Rows,
    /// Each expert's buffers, for the experts a pass chose (and a shared
    /// expert, last).
    pub(super) experts: Vec<ExpertRows<B>>,
    /// Every row's chosen experts' outputs, a row's after another's.
    pub(super) slots: B::Rows,
}

/// One expert's rows through its MLP.
pub(super) struct ExpertRows<B: Backend> {
    /// Its rows, gathered from the pass's.
    pub(super) input: B::Rows,
    pub(super) gate: B::Rows,
    pub(super) up: B::Rows,
    pub(super) act: B::Rows,
    pub(super) out: B::Rows,
}

impl<B: Backend> Default for ExpertRows<B> {
    fn default() -> Self {
        ExpertRows {
            input: B::Rows::default(),
            gate: B::Rows::default(),
            up: B::Rows::default(),
            act: B::Rows::default(),
            out: B::Rows::default(),
        }
    }
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
            experts: Vec::new(),
            slots: B::Rows::default(),
        }
    }
}

/// The tensors of one layer, `blk.<index>.<suffix>`.
pub(super) struct LayerTensors<'a, B: Backend> {
    pub(super) backend: &'a B,
    pub(super) file: &'a GgufFile,
    pub(super) index: usize,
}

impl<B: Backend> LayerTensors<'_, B> {
    pub(super) fn name(&self, suffix: &str) -> String {
        format!("blk.{}.{suffix}", self.index)
    }

    pub(super) fn weight(&self, suffix: &str, n_in: usize, n_out: usize) -> Result<Weight<B>, LoadError> {
        weight(self.backend, self.file, &self.name(suffix), n_in, n_out)
    }

    /// Whether the file has the layer's tensor `suffix`.
    pub(super) fn has(&self, suffix: &str) -> bool {
        self.file.tensor(&self.name(suffix)).is_some()
    }

    /// The output rows of a matrix the file carries (its second dimension).
    pub(super) fn out_rows(&self, suffix: &str) -> Option<usize> {
        self.file.tensor(&self.name(suffix)).and_then(|tensor| tensor.dims.get(1)).map(|&rows| rows as usize)
    }

    /// A fused weight's parts, `widths` output rows each (see
    /// [`fused`](crate::weights::fused)).
    pub(super) fn fused<const N: usize>(
        &self,
        suffix: &str,
        n_in: usize,
        widths: [usize; N],
    ) -> Result<[Weight<B>; N], LoadError> {
        let name = self.name(suffix);
        fused(self.backend, self.file, &name, n_in, &widths)?
            .try_into()
            .map_err(|_| tensor_problem(&name, "not split in its parts"))
    }

    /// Each of `count` experts' parts, `widths` output rows each (see
    /// [`experts`](crate::weights::experts)).
    pub(super) fn experts(
        &self,
        suffix: &str,
        n_in: usize,
        widths: &[usize],
        count: usize,
    ) -> Result<Vec<Vec<Weight<B>>>, LoadError> {
        experts(self.backend, self.file, &self.name(suffix), n_in, widths, count)
    }

    /// A fused vector's parts, `widths` values each, in order.
    pub(super) fn fused_vector<const N: usize>(
        &self,
        suffix: &str,
        widths: [usize; N],
    ) -> Result<[B::Vector; N], LoadError> {
        self.split_vector(suffix, &widths)?
            .try_into()
            .map_err(|_| tensor_problem(&self.name(suffix), "not split in its parts"))
    }

    /// The parts of a vector (or a matrix's rows, in order), `widths`
    /// values each: a fused bias's, or each expert's bias.
    pub(super) fn split_vector(&self, suffix: &str, widths: &[usize]) -> Result<Vec<B::Vector>, LoadError> {
        let name = self.name(suffix);
        let values = self.host(suffix, widths.iter().sum())?;
        let mut rest = &values[..];
        let mut parts = Vec::with_capacity(widths.len());
        for &width in widths {
            let (part, after) = rest.split_at(width);
            parts.push(self.backend.vector(part).map_err(|error| tensor_problem(&name, &error.to_string()))?);
            rest = after;
        }
        Ok(parts)
    }

    /// A vector's `len` values on the host.
    pub(super) fn host(&self, suffix: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        host_vector(self.file, &self.name(suffix), len)
    }

    pub(super) fn vector(&self, suffix: &str, len: usize) -> Result<B::Vector, LoadError> {
        vector(self.backend, self.file, &self.name(suffix), len)
    }

    /// A vector the file may carry; `required` makes its absence an error.
    pub(super) fn optional(&self, suffix: &str, len: usize, required: bool) -> Result<Option<B::Vector>, LoadError> {
        let name = self.name(suffix);
        match self.file.tensor(&name) {
            Some(_) => vector(self.backend, self.file, &name, len).map(Some),
            None if required => Err(tensor_problem(&name, "missing")),
            None => Ok(None),
        }
    }
}
