//! Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next): RMSNorm, the
//! projections `attn_qkv` (Q|K|V, convolved), `attn_gate` (z), `ssm_beta`
//! and `ssm_alpha`, then each sequence's rows through its recurrent state
//! in cell order ([`sluice_kernels::ops::delta_net`]), and `ssm_out`
//! before the residual add.
//!
//! The projections are the backend's matrix products; the recurrence runs
//! on the host (`Backend::delta_net`) over each sequence's rows of the pass
//! in turn, its arithmetic fixed by that sequence alone.

use sluice_kernels::backend::Backend;
use sluice_kernels::ops::{DeltaRows, DeltaShape, DeltaWeights};

use super::pass::{LayerTensors, Pass, Residual, Scratch, Stores};
use crate::batch::ForwardError;
use crate::hparams::HParams;
use crate::layer::LayerKind;
use crate::weights::{LoadError, Weight, tensor_problem};

pub(super) struct DeltaNetBlock<B: Backend> {
    shape: DeltaShape,
    norm: B::Vector,
    qkv: Weight<B>,
    z: Weight<B>,
    beta: Weight<B>,
    alpha: Weight<B>,
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    out_norm: Vec<f32>,
    output: Weight<B>,
    residual: Residual<B>,
    eps: f32,
    /// Its layer among the model's recurrent layers.
    state: usize,
}

impl<B: Backend> DeltaNetBlock<B> {
    pub(super) fn load(
        tensors: &LayerTensors<'_, B>,
        shape: DeltaShape,
        layer: LayerKind,
        hp: &HParams,
        state: usize,
    ) -> Result<Self, LoadError> {
        let n_embd = hp.n_embd;
        let (conv_dim, heads) = (shape.conv_dim(), shape.v_heads);
        // ggml's layout: each channel's taps together, `conv` of them.
        let conv = tensors.host("ssm_conv1d.weight", conv_dim * shape.conv)?;
        if tensors.out_rows("ssm_conv1d.weight") != Some(conv_dim) {
            return Err(tensor_problem(
                &tensors.name("ssm_conv1d.weight"),
                &format!("is not {} × {conv_dim}", shape.conv),
            ));
        }
        Ok(DeltaNetBlock {
            shape,
            norm: tensors.vector("attn_norm.weight", n_embd)?,
            qkv: tensors.weight("attn_qkv.weight", n_embd, conv_dim)?,
            z: tensors.weight("attn_gate.weight", n_embd, shape.value_dim())?,
            beta: tensors.weight("ssm_beta.weight", n_embd, heads)?,
            alpha: tensors.weight("ssm_alpha.weight", n_embd, heads)?,
            conv,
            dt_bias: tensors.host("ssm_dt.bias", heads)?,
            a: tensors.host("ssm_a", heads)?,
            out_norm: tensors.host("ssm_norm.weight", shape.head)?,
            output: tensors.weight("ssm_out.weight", shape.value_dim(), n_embd)?,
            residual: Residual::load(tensors, layer, "post_attention_norm.weight", n_embd)?,
            eps: hp.rms_eps,
            state,
        })
    }

    pub(super) fn run(
        &self,
        pass: &Pass<'_, B>,
        kv: &mut Stores<'_, B>,
        s: &mut Scratch<B>,
    ) -> Result<(), ForwardError> {
        let b = pass.backend;
        let shape = self.shape;
        b.rms_norm(&s.x, &self.norm, pass.rms_eps, &mut s.h);
        b.matmuls(
            &s.h,
            pass.rows,
            &mut [
                (&self.qkv.matrix, &mut s.q),
                (&self.z.matrix, &mut s.gate),
                (&self.beta.matrix, &mut s.k),
                (&self.alpha.matrix, &mut s.v),
            ],
        );
        let (qkv, z) = (b.download(&s.q)?, b.download(&s.gate)?);
        let (beta, alpha) = (b.download(&s.k)?, b.download(&s.v)?);
        let store = kv.recurrent.as_deref_mut().ok_or_else(|| ForwardError::Kernel("no recurrent store".into()))?;
        let weights =
            DeltaWeights { conv: &self.conv, dt_bias: &self.dt_bias, a: &self.a, norm: &self.out_norm, eps: self.eps };
        let (conv_dim, value_dim, heads) = (shape.conv_dim(), shape.value_dim(), shape.v_heads);
        let mut out = vec![0.0; pass.rows * value_dim];
        for run in pass.runs {
            let state = store
                .state(run.slot, self.state)
                .ok_or_else(|| ForwardError::Kernel(format!("recurrent state slot {} is not ready", run.slot)))?;
            // The run's rows together, in cell order.
            let gather = |values: &[f32], width: usize| -> Vec<f32> {
                run.rows.iter().flat_map(|&row| &values[row * width..][..width]).copied().collect()
            };
            let rows = (gather(&qkv, conv_dim), gather(&z, value_dim), gather(&beta, heads), gather(&alpha, heads));
            let mut run_out = vec![0.0; run.rows.len() * value_dim];
            let inputs = DeltaRows { qkv: &rows.0, z: &rows.1, beta: &rows.2, alpha: &rows.3 };
            b.delta_net(shape, weights, state, inputs, &mut run_out);
            for (&row, values) in run.rows.iter().zip(run_out.chunks_exact(value_dim)) {
                out[row * value_dim..][..value_dim].copy_from_slice(values);
            }
        }
        b.upload(&out, &mut s.attn)?;
        b.matmul(&self.output.matrix, &s.attn, pass.rows, &mut s.h);
        self.residual.add(pass, &mut s.h, &mut s.x)?;
        Ok(())
    }
}
