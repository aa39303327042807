//! Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next): RMSNorm, the
//! projections `attn_qkv` (Q|K|V, convolved), `attn_gate` (z), `ssm_beta`
//! and `ssm_alpha`, then each sequence's rows through its recurrent state
//! in cell order ([`sluice_kernels::ops::delta_net`]), and `ssm_out`
//! before the residual add.
//!
//! Qwen3-Next's files fuse β and α into `ssm_ba`, per key head its group
//! of value heads' β then their α; its older files also fuse the rest into
//! `ssm_in`, per key head its Q, its K, then its group's V and z. Their
//! products are taken apart on the host into the split layout.
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
use crate::lora::Site;
use crate::weights::{LoadError, Weight, tensor_problem};

/// How a file gives a pair of a layer's projections: apart, or fused.
enum Pair<B: Backend> {
    Split(Weight<B>, Weight<B>),
    Fused(Weight<B>),
}

impl<B: Backend> Pair<B> {
    /// The pair `first`, `second` (widths `widths`), or `fused` (their
    /// sum) where the file has it instead.
    fn load(
        tensors: &LayerTensors<'_, B>,
        [first, second, fused]: [&str; 3],
        n_in: usize,
        widths: [usize; 2],
    ) -> Result<Self, LoadError> {
        if tensors.has(fused) {
            return Ok(Pair::Fused(tensors.weight(fused, n_in, widths[0] + widths[1])?));
        }
        Ok(Pair::Split(tensors.weight(first, n_in, widths[0])?, tensors.weight(second, n_in, widths[1])?))
    }

    /// Its products of the pass's rows, into `first` and `second` (only
    /// `first`, the fused width, for a fused pair).
    fn products<'a>(
        &'a self,
        first: &'a mut B::Rows,
        second: &'a mut B::Rows,
    ) -> Vec<(&'a B::Matrix, &'a mut B::Rows)> {
        match self {
            Pair::Split(a, b) => vec![(&a.matrix, first), (&b.matrix, second)],
            Pair::Fused(fused) => vec![(&fused.matrix, first)],
        }
    }

    /// Its products on the host, apart: a fused product's rows are cut
    /// into `groups` runs, each the concatenation of one piece of each
    /// output (`pieces`: per group, the widths of the first output's
    /// pieces, then the second's).
    fn download(
        &self,
        b: &B,
        first: &B::Rows,
        second: &B::Rows,
        groups: usize,
        pieces: (&[usize], &[usize]),
    ) -> Result<(Vec<f32>, Vec<f32>), ForwardError> {
        match self {
            Pair::Split(..) => Ok((b.download(first)?, b.download(second)?)),
            Pair::Fused(_) => Ok(unfuse(&b.download(first)?, groups, pieces)),
        }
    }
}

/// Rows of `groups` runs each of pieces `pieces.0` then `pieces.1`, as two
/// outputs: each piece `i` of every group in turn goes to output piece
/// `i`'s place (per row, piece 0 of every group, then piece 1, …).
fn unfuse(fused: &[f32], groups: usize, (first, second): (&[usize], &[usize])) -> (Vec<f32>, Vec<f32>) {
    let group: usize = first.iter().chain(second).sum();
    let width = (group * groups).max(1);
    let n = fused.len() / width;
    let lay = |pieces: &[usize], skip: usize| -> Vec<f32> {
        let mut out = Vec::with_capacity(n * pieces.iter().sum::<usize>() * groups);
        for row in fused.chunks_exact(width) {
            let mut at = skip;
            for &piece in pieces {
                for g in 0..groups {
                    out.extend_from_slice(&row[g * group + at..][..piece]);
                }
                at += piece;
            }
        }
        out
    };
    (lay(first, 0), lay(second, first.iter().sum()))
}

pub(super) struct DeltaNetBlock<B: Backend> {
    shape: DeltaShape,
    norm: B::Vector,
    /// Q|K|V and z.
    qkvz: Pair<B>,
    /// β and α.
    gates: Pair<B>,
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
            qkvz: Pair::load(
                tensors,
                ["attn_qkv.weight", "attn_gate.weight", "ssm_in.weight"],
                n_embd,
                [conv_dim, shape.value_dim()],
            )?,
            gates: Pair::load(tensors, ["ssm_beta.weight", "ssm_alpha.weight", "ssm_ba.weight"], n_embd, [heads; 2])?,
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
        layer: usize,
        kv: &mut Stores<'_, B>,
        s: &mut Scratch<B>,
    ) -> Result<(), ForwardError> {
        let b = pass.backend;
        let shape = self.shape;
        b.rms_norm(&s.x, &self.norm, pass.rms_eps, &mut s.h);
        let mut products = self.qkvz.products(&mut s.q, &mut s.gate);
        products.extend(self.gates.products(&mut s.k, &mut s.v));
        b.matmuls(&s.h, pass.rows, &mut products);
        // Adapters change the split projections only (see `fused`).
        for (site, out) in
            [(Site::Qkv, &mut s.q), (Site::Z, &mut s.gate), (Site::Beta, &mut s.k), (Site::Alpha, &mut s.v)]
        {
            if self.weight(site).is_some() {
                pass.adapted(layer, site, &s.h, out);
            }
        }
        // Fused, per key head: its Q and K, its value heads' V and z; its
        // value heads' β and α.
        let (k_heads, group) = (shape.k_heads, shape.v_heads / shape.k_heads);
        let (head, group_width) = (shape.head, group * shape.head);
        let (qkv, z) = self.qkvz.download(b, &s.q, &s.gate, k_heads, (&[head, head, group_width], &[group_width]))?;
        let (beta, alpha) = self.gates.download(b, &s.k, &s.v, k_heads, (&[group], &[group]))?;
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
        pass.adapted(layer, Site::SsmOut, &s.attn, &mut s.h);
        self.residual.add(pass, &mut s.h, &mut s.x)?;
        Ok(())
    }

    /// The weight at `site`, for an adapter.
    pub(super) fn weight(&self, site: Site) -> Option<&Weight<B>> {
        match (site, &self.qkvz, &self.gates) {
            (Site::Qkv, Pair::Split(qkv, _), _) | (Site::Z, Pair::Split(_, qkv), _) => Some(qkv),
            (Site::Beta, _, Pair::Split(beta, _)) | (Site::Alpha, _, Pair::Split(_, beta)) => Some(beta),
            (Site::SsmOut, ..) => Some(&self.output),
            _ => None,
        }
    }

    /// The fused tensor the weight at `site` is a part of.
    pub(super) fn fused(&self, site: Site) -> Option<&'static str> {
        match (site, &self.qkvz, &self.gates) {
            (Site::Qkv | Site::Z, Pair::Fused(_), _) => Some("ssm_in.weight"),
            (Site::Beta | Site::Alpha, _, Pair::Fused(_)) => Some("ssm_ba.weight"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unfuse;

    #[test]
    fn fused_rows_come_apart_piece_by_piece_across_groups() {
        // Two rows of two groups, each group q, k, v v | z z (Qwen3-Next's
        // `ssm_in` with heads of 1 and two value heads per key head).
        let row = |r: f32| {
            [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [11.0, 12.0, 13.0, 14.0, 15.0, 16.0]]
                .concat()
                .iter()
                .map(|x| x + r)
                .collect::<Vec<f32>>()
        };
        let fused = [row(0.0), row(100.0)].concat();
        let (qkv, z) = unfuse(&fused, 2, (&[1, 1, 2], &[2]));
        let want = |r: f32, values: &[f32]| values.iter().map(|x| x + r).collect::<Vec<f32>>();
        let qkv_row = [1.0, 11.0, 2.0, 12.0, 3.0, 4.0, 13.0, 14.0];
        assert_eq!(qkv, [want(0.0, &qkv_row), want(100.0, &qkv_row)].concat());
        assert_eq!(z, [want(0.0, &[5.0, 6.0, 15.0, 16.0]), want(100.0, &[5.0, 6.0, 15.0, 16.0])].concat());
    }
}
