//! The gated feed-forward: RMSNorm (where the layer has one), gate and up
//! projections, `act(gate) · up` (SiLU or GELU), down projection, and where
//! the layer has them, an RMSNorm and a scale of the result before the
//! residual add.

use sluice_kernels::backend::Backend;

use super::pass::{LayerTensors, Pass, Residual, Scratch};
use crate::batch::ForwardError;
use crate::hparams::HParams;
use crate::layer::{Ffn, LayerKind};
use crate::lora::Site;
use crate::weights::{LoadError, Weight};

const UP: &str = "ffn_up.weight";

pub(super) struct Mlp<B: Backend> {
    /// `None`: the projections read the residual stream itself.
    norm: Option<B::Vector>,
    gate: Weight<B>,
    up: Weight<B>,
    /// Gate and up are the halves of one fused `ffn_up.weight`.
    fused_up: bool,
    down: Weight<B>,
    /// GELU's tanh form gates (Gemma's `Ffn::GeGlu`), else SiLU.
    geglu: bool,
    residual: Residual<B>,
}

impl<B: Backend> Mlp<B> {
    pub(super) fn load(tensors: &LayerTensors<'_, B>, layer: LayerKind, hp: &HParams) -> Result<Self, LoadError> {
        // Without a gate tensor, `ffn_up` holds the gate's rows, then the
        // up projection's (Phi-3, GLM-4); an `ffn_up` of `n_ff` rows is a
        // plain one whose gate is missing.
        let fused_up = !tensors.has("ffn_gate.weight") && tensors.out_rows(UP).is_some_and(|rows| rows != hp.n_ff);
        let [gate, up] = match fused_up {
            true => tensors.fused(UP, hp.n_embd, [hp.n_ff, hp.n_ff])?,
            false => [tensors.weight("ffn_gate.weight", hp.n_embd, hp.n_ff)?, tensors.weight(UP, hp.n_embd, hp.n_ff)?],
        };
        Ok(Mlp {
            norm: layer.pre_norms.then(|| tensors.vector(layer.ffn_norm, hp.n_embd)).transpose()?,
            gate,
            up,
            fused_up,
            down: tensors.weight("ffn_down.weight", hp.n_ff, hp.n_embd)?,
            geglu: layer.ffn == Ffn::GeGlu,
            residual: Residual::load(tensors, layer, "post_ffw_norm.weight", hp.n_embd)?,
        })
    }

    pub(super) fn run(&self, pass: &Pass<'_, B>, layer: usize, s: &mut Scratch<B>) -> Result<(), ForwardError> {
        let b = pass.backend;
        let input = match &self.norm {
            Some(norm) => {
                b.rms_norm(&s.x, norm, pass.rms_eps, &mut s.h);
                &s.h
            }
            None => &s.x,
        };
        b.matmuls(input, pass.rows, &mut [(&self.gate.matrix, &mut s.gate), (&self.up.matrix, &mut s.up)]);
        pass.adapted(layer, Site::Gate, input, &mut s.gate);
        pass.adapted(layer, Site::Up, input, &mut s.up);
        match self.geglu {
            true => b.geglu(&s.gate, &s.up, &mut s.ffn)?,
            false => b.swiglu(&s.gate, &s.up, &mut s.ffn),
        }
        b.matmul(&self.down.matrix, &s.ffn, pass.rows, &mut s.h);
        pass.adapted(layer, Site::Down, &s.ffn, &mut s.h);
        self.residual.add(pass, &mut s.h, &mut s.x)?;
        Ok(())
    }

    pub(super) fn weight(&self, site: Site) -> Option<&Weight<B>> {
        match site {
            Site::Gate => Some(&self.gate),
            Site::Up => Some(&self.up),
            Site::Down => Some(&self.down),
            _ => None,
        }
    }

    /// The fused tensor the weight at `site` is a part of.
    pub(super) fn fused(&self, site: Site) -> Option<&'static str> {
        (self.fused_up && matches!(site, Site::Gate | Site::Up)).then_some(UP)
    }
}
