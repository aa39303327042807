//! What the blocks of a layer share: the pass they run in, its buffers, and
//! the tensors they load.

use sluice_kernels::backend::Backend;
use sluice_kernels::ops::{HeadShape, Rope};

use crate::gguf::GgufFile;
use crate::lora::{Adapter, PassAdapters, Site};
use crate::weights::{LoadError, Weight, fused, host_vector, tensor_problem, vector, weight};

/// What every block of one forward pass reads.
pub(crate) struct Pass<'a, B: Backend> {
    pub(crate) backend: &'a B,
    /// The rows' layout on the backend (positions, KV slots, visibility).
    pub(crate) layout: &'a B::Pass,
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
}

impl<B: Backend> Pass<'_, B> {
    /// Add the adapters' deltas for the weight at `site` of `layer`.
    pub(super) fn adapted(&self, layer: usize, site: Site, x: &B::Rows, out: &mut B::Rows) {
        self.lora.apply(self.backend, self.adapters, Some((layer, site)), x, out);
    }
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

    /// A fused vector's parts, `widths` values each, in order.
    pub(super) fn fused_vector<const N: usize>(
        &self,
        suffix: &str,
        widths: [usize; N],
    ) -> Result<[B::Vector; N], LoadError> {
        let name = self.name(suffix);
        let values = host_vector(self.file, &name, widths.iter().sum())?;
        let mut rest = &values[..];
        let mut parts = Vec::with_capacity(N);
        for width in widths {
            let (part, after) = rest.split_at(width);
            parts.push(self.backend.vector(part).map_err(|error| tensor_problem(&name, &error.to_string()))?);
            rest = after;
        }
        parts.try_into().map_err(|_| tensor_problem(&name, "not split in its parts"))
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
