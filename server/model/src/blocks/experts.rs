//! A mixture of experts' feed-forward, as llama.cpp's `build_moe_ffn`
//! computes it on the CPU: RMSNorm, the router's scores (`ffn_gate_inp`,
//! plus its bias where it has one), each row's `used` best experts (best
//! first; a tie goes to the lower index) and their weights (see
//! [`Gating`]), optionally divided by their sum, each chosen expert's
//! gated MLP (biased where the file has biases), and the outputs times
//! their weights summed in that order. A shared expert (Qwen2-MoE) runs on
//! every row and is added scaled by the sigmoid of its gate.
//!
//! The rows of a pass are grouped by expert: each chosen expert's weights
//! are multiplied against all its rows at once, and an expert no row chose
//! is not read. A row's products are the same bits in any group (the
//! backend's matmul is batch-invariant) and its experts are summed in its
//! own order, so a row's output never depends on the other rows.

use sluice_kernels::backend::Backend;

use super::pass::{ExpertRows, LayerTensors, Pass, Residual, Scratch};
use crate::batch::ForwardError;
use crate::hparams::HParams;
use crate::layer::{ExpertMlp, Experts, Gating, LayerKind, Shared};
use crate::weights::{LoadError, Weight, tensor_problem};

/// Experts are multiplied together, not one by one, while they have fewer
/// rows than this on average.
const GROUPED_BELOW_ROWS: usize = 8;

/// ggml clamps the sum of a row's weights to this (f16's smallest
/// normal) before dividing by it.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

pub(super) struct ExpertsBlock<B: Backend> {
    norm: Option<B::Vector>,
    router: Weight<B>,
    router_bias: Option<Vec<f32>>,
    /// Added to the scores for choosing only.
    selection_bias: Option<Vec<f32>>,
    experts: Vec<Expert<B>>,
    shared: Option<SharedExpert<B>>,
    spec: Experts,
    residual: Residual<B>,
}

/// An expert to run, over its `m` rows: its gathered `input`, or these
/// rows (the shared expert's, all of the pass's), and its buffers.
type Job<'a, B> = (&'a Expert<B>, Option<&'a <B as Backend>::Rows>, usize, &'a mut ExpertRows<B>);

/// One expert's gated MLP.
struct Expert<B: Backend> {
    gate: Weight<B>,
    up: Weight<B>,
    down: Weight<B>,
    /// The gate, up and down projections' biases.
    biases: Option<[B::Vector; 3]>,
}

struct SharedExpert<B: Backend> {
    /// One row: the expert's gate score for each input row, where its
    /// output is gated.
    gate: Option<Weight<B>>,
    mlp: Expert<B>,
}

impl<B: Backend> ExpertsBlock<B> {
    pub(super) fn load(
        tensors: &LayerTensors<'_, B>,
        layer: LayerKind,
        spec: Experts,
        hp: &HParams,
    ) -> Result<Self, LoadError> {
        let (n_embd, n_ff, count) = (hp.n_embd, spec.n_ff, spec.count);
        // A merged `ffn_gate_up_exps` holds each expert's gate rows, then
        // its up rows.
        let gate_up: Vec<(Weight<B>, Weight<B>)> = match tensors.has("ffn_gate_up_exps.weight") {
            true => tensors
                .experts("ffn_gate_up_exps.weight", n_embd, &[n_ff, n_ff], count)?
                .into_iter()
                .map(|parts| pair(parts, &tensors.name("ffn_gate_up_exps.weight")))
                .collect::<Result<_, _>>()?,
            false => tensors
                .experts("ffn_gate_exps.weight", n_embd, &[n_ff], count)?
                .into_iter()
                .zip(tensors.experts("ffn_up_exps.weight", n_embd, &[n_ff], count)?)
                .map(|(gate, up)| pair(gate.into_iter().chain(up).collect(), &tensors.name("ffn_up_exps.weight")))
                .collect::<Result<_, _>>()?,
        };
        let downs = tensors.experts("ffn_down_exps.weight", n_ff, &[n_embd], count)?;
        // Each expert's gate, up and down biases, in turn.
        let mut biases = match spec.biases {
            true => Some(
                ["ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"]
                    .into_iter()
                    .zip([n_ff, n_ff, n_embd])
                    .map(|(suffix, width)| Ok(tensors.split_vector(suffix, &vec![width; count])?.into_iter()))
                    .collect::<Result<Vec<_>, LoadError>>()?,
            ),
            false => None,
        };
        let experts = gate_up
            .into_iter()
            .zip(downs)
            .map(|((gate, up), down)| {
                let name = tensors.name("ffn_down_exps.weight");
                let down = down.into_iter().next().ok_or_else(|| tensor_problem(&name, "not split in its parts"))?;
                let biases = biases
                    .as_mut()
                    .map(|each| each.iter_mut().filter_map(Iterator::next).collect::<Vec<_>>().try_into())
                    .transpose()
                    .map_err(|_| tensor_problem(&name, "without an expert's biases"))?;
                Ok(Expert { gate, up, down, biases })
            })
            .collect::<Result<_, LoadError>>()?;
        let shared = spec
            .shared
            .map(|Shared { width, gated }| -> Result<_, LoadError> {
                Ok(SharedExpert {
                    gate: gated.then(|| tensors.weight("ffn_gate_inp_shexp.weight", n_embd, 1)).transpose()?,
                    mlp: Expert {
                        gate: tensors.weight("ffn_gate_shexp.weight", n_embd, width)?,
                        up: tensors.weight("ffn_up_shexp.weight", n_embd, width)?,
                        down: tensors.weight("ffn_down_shexp.weight", width, n_embd)?,
                        biases: None,
                    },
                })
            })
            .transpose()?;
        Ok(ExpertsBlock {
            norm: layer.pre_norms.then(|| tensors.vector(layer.ffn_norm, n_embd)).transpose()?,
            router: tensors.weight("ffn_gate_inp.weight", n_embd, count)?,
            router_bias: spec.biases.then(|| tensors.host("ffn_gate_inp.bias", count)).transpose()?,
            selection_bias: spec.selection_bias.then(|| tensors.host("exp_probs_b.bias", count)).transpose()?,
            experts,
            shared,
            spec,
            residual: Residual::load(tensors, layer, "post_ffw_norm.weight", n_embd)?,
        })
    }

    pub(super) fn run(&self, pass: &Pass<'_, B>, s: &mut Scratch<B>) -> Result<(), ForwardError> {
        let b = pass.backend;
        let (n_embd, used) = (self.router.n_in, self.spec.used);
        if pass.rows == 0 {
            return Ok(());
        }
        let input = match &self.norm {
            Some(norm) => {
                b.rms_norm(&s.x, norm, pass.rms_eps, &mut s.h);
                &s.h
            }
            None => &s.x,
        };
        b.matmul(&self.router.matrix, input, pass.rows, &mut s.gate);
        let mut logits = b.download(&s.gate)?;
        if let Some(bias) = &self.router_bias {
            logits.chunks_exact_mut(bias.len()).for_each(|row| row.iter_mut().zip(bias).for_each(|(x, b)| *x += b));
        }
        let routes = route(&logits, self.spec, self.selection_bias.as_deref());
        // Each expert's slots (row · used + k), rows in order.
        let mut groups = vec![Vec::new(); self.spec.count];
        for (slot, &(expert, _)) in routes.iter().enumerate() {
            groups[expert].push(slot);
        }
        let chosen: Vec<(&Expert<B>, &[usize])> = (self.experts.iter().zip(&groups))
            .filter(|(_, slots)| !slots.is_empty())
            .map(|(expert, slots)| (expert, slots.as_slice()))
            .collect();
        // Experts with few rows each (decoding) are handed out together, a
        // hand-out per expert costing more than its products; with many
        // (a prompt) one at a time, so that each one's rows stay in cache
        // from its gate to its down projection.
        let per_batch = match routes.len() < GROUPED_BELOW_ROWS * chosen.len() {
            true => chosen.len().max(1),
            false => 1,
        };
        if s.experts.len() < per_batch + 1 {
            s.experts.resize_with(per_batch + 1, ExpertRows::default);
        }
        // The shared expert's buffers follow every batch's.
        let (buffers, shared_buffers) = s.experts.split_at_mut(per_batch);
        let mut shared = self.shared.as_ref().map(|shared| (&shared.mlp, &mut shared_buffers[0]));
        let mut rows = Vec::new();
        for batch in chosen.chunks(per_batch) {
            for (buffer, (_, slots)) in buffers.iter_mut().zip(batch) {
                rows.clear();
                rows.extend(slots.iter().map(|slot| slot / used));
                b.gather(input, &rows, n_embd, &mut buffer.input);
            }
            let mut jobs: Vec<Job<'_, B>> = (batch.iter())
                .zip(buffers.iter_mut())
                .map(|(&(expert, slots), buffer)| (expert, None, slots.len(), buffer))
                .collect();
            if let Some((mlp, buffer)) = shared.take() {
                jobs.push((mlp, Some(input), pass.rows, buffer));
            }
            Expert::run_all(b, self.spec.mlp, &mut jobs)?;
            for ((_, slots), buffer) in batch.iter().zip(buffers.iter()) {
                b.scatter(&buffer.out, slots, n_embd, routes.len(), &mut s.slots)?;
            }
        }
        let weights: Vec<f32> = routes.iter().map(|&(_, weight)| weight).collect();
        b.weighted_sum(&s.slots, &weights, used, &mut s.ffn)?;
        if self.shared.is_some() {
            let out = &mut s.experts[per_batch].out;
            if let Some(gate) = self.shared.as_ref().and_then(|shared| shared.gate.as_ref()) {
                b.matmul(&gate.matrix, input, pass.rows, &mut s.gate);
                let factors: Vec<f32> = b.download(&s.gate)?.into_iter().map(sigmoid).collect();
                b.scale_rows(out, &factors)?;
            }
            b.add(&mut s.ffn, out);
        }
        self.residual.add(pass, &mut s.ffn, &mut s.x)?;
        Ok(())
    }
}

impl<B: Backend> Expert<B> {
    /// Each job's expert over its `m` rows, from its gathered `input` or
    /// the given rows, into its `out`: the gate and up projections of all
    /// of them in one grouped product, the down projections in another.
    fn run_all(b: &B, mlp: ExpertMlp, jobs: &mut [Job<'_, B>]) -> Result<(), ForwardError> {
        grouped::<B, 2>(
            b,
            jobs.iter_mut()
                .map(|(expert, x, m, ExpertRows { input, gate, up, .. })| {
                    (x.unwrap_or(input), *m, [(&expert.gate.matrix, gate), (&expert.up.matrix, up)])
                })
                .collect(),
        );
        for (expert, _, _, buffer) in jobs.iter_mut() {
            if let Some([gate, up, _]) = &expert.biases {
                b.add_bias(&mut buffer.gate, gate);
                b.add_bias(&mut buffer.up, up);
            }
            match mlp {
                ExpertMlp::SwiGlu => b.swiglu(&buffer.gate, &buffer.up, &mut buffer.act),
                ExpertMlp::ClampedSwiGlu => b.swiglu_oai(&buffer.gate, &buffer.up, &mut buffer.act)?,
            }
        }
        grouped::<B, 1>(
            b,
            jobs.iter_mut()
                .map(|(expert, _, m, ExpertRows { act, out, .. })| (&*act, *m, [(&expert.down.matrix, out)]))
                .collect(),
        );
        for (expert, _, _, buffer) in jobs.iter_mut() {
            if let Some([_, _, down]) = &expert.biases {
                b.add_bias(&mut buffer.out, down);
            }
        }
        Ok(())
    }
}

/// Inputs, their rows, and `N` products of each.
type Products<'a, B, const N: usize> =
    (&'a <B as Backend>::Rows, usize, [(&'a <B as Backend>::Matrix, &'a mut <B as Backend>::Rows); N]);

/// Every product of every input in one [`Backend::grouped_matmuls`].
fn grouped<B: Backend, const N: usize>(b: &B, mut products: Vec<Products<'_, B, N>>) {
    b.grouped_matmuls(&mut products.iter_mut().map(|(x, m, products)| (*x, *m, &mut products[..])).collect::<Vec<_>>());
}

/// An expert's gate and up matrices from its parts.
fn pair<B: Backend>(parts: Vec<Weight<B>>, name: &str) -> Result<(Weight<B>, Weight<B>), LoadError> {
    let mut parts = parts.into_iter();
    match (parts.next(), parts.next()) {
        (Some(gate), Some(up)) => Ok((gate, up)),
        _ => Err(tensor_problem(name, "not split in its parts")),
    }
}

/// ggml's sigmoid of the shared expert's gate, `silu(x) / x`. At exactly
/// 0, where that is 0/0, sluice takes the limit (0.5) instead of NaN.
fn sigmoid(x: f32) -> f32 {
    if x == 0.0 { 0.5 } else { x / (1.0 + (-x).exp()) / x }
}

/// Each row's chosen experts and their weights, `spec.used` per row in
/// the order they are summed, from the router's scores (`spec.count` per
/// row) and the bias added to them for choosing only.
fn route(logits: &[f32], spec: Experts, selection_bias: Option<&[f32]>) -> Vec<(usize, f32)> {
    let count = spec.count.max(1);
    let mut routes = Vec::with_capacity(logits.len() / count * spec.used);
    let (mut probs, mut selection) = (vec![0.0; count], vec![0.0; count]);
    let mut order = Vec::with_capacity(count);
    let (mut chosen_scores, mut weights) = (vec![0.0; spec.used], vec![0.0; spec.used]);
    for scores in logits.chunks_exact(count) {
        match spec.gating {
            Gating::Softmax => softmax(scores, &mut probs),
            Gating::Sigmoid => probs.iter_mut().zip(scores).for_each(|(p, &x)| *p = 1.0 / (1.0 + (-x).exp())),
            Gating::SoftmaxOfChosen => probs.copy_from_slice(scores),
        }
        selection.copy_from_slice(&probs);
        if let Some(bias) = selection_bias {
            selection.iter_mut().zip(bias).for_each(|(s, b)| *s += b);
        }
        if let Some((n_groups, used_groups)) = spec.groups {
            keep_best_groups(&mut selection, n_groups, used_groups);
        }
        order.clear();
        order.extend(0..count);
        order.sort_by(|&a, &b| selection[b].total_cmp(&selection[a]).then(a.cmp(&b)));
        let chosen = &order[..spec.used];
        if spec.gating == Gating::SoftmaxOfChosen {
            chosen_scores.iter_mut().zip(chosen).for_each(|(score, &e)| *score = scores[e]);
            softmax(&chosen_scores, &mut weights);
            chosen.iter().zip(&weights).for_each(|(&e, &weight)| probs[e] = weight);
        }
        let divisor = match spec.normalized {
            // ggml sums a row's f32 weights in double.
            true => (chosen.iter().map(|&e| f64::from(probs[e])).sum::<f64>() as f32).max(MIN_WEIGHT_SUM),
            false => 1.0,
        };
        routes.extend(chosen.iter().map(|&e| {
            let weight = if spec.normalized { probs[e] / divisor } else { probs[e] };
            (e, spec.scale.map_or(weight, |scale| weight * scale))
        }));
    }
    routes
}

/// DeepSeek V3's group limit: the experts fall in `n_groups` groups of
/// equal size, each scored by its two best scores' sum (in double, then
/// f32, as ggml sums rows); all but the `used_groups` best groups (a tie
/// to the lower index) are removed from the choice.
fn keep_best_groups(selection: &mut [f32], n_groups: usize, used_groups: usize) {
    let per_group = selection.len() / n_groups.max(1);
    let best_two = |group: &[f32]| {
        let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &x in group {
            if x.total_cmp(&first).is_gt() {
                (first, second) = (x, first);
            } else if x.total_cmp(&second).is_gt() {
                second = x;
            }
        }
        (f64::from(first) + f64::from(second)) as f32
    };
    let scores: Vec<f32> = selection.chunks_exact(per_group.max(1)).map(best_two).collect();
    let mut groups: Vec<usize> = (0..scores.len()).collect();
    groups.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    for &group in &groups[used_groups.min(groups.len())..] {
        selection[group * per_group..(group + 1) * per_group].fill(f32::NEG_INFINITY);
    }
}

/// ggml's CPU softmax of one row: `exp(x - max)`, summed in double, each
/// times the f32 reciprocal of the sum.
fn softmax(scores: &[f32], out: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for (out, &score) in out.iter_mut().zip(scores) {
        *out = (score - max).exp();
        sum += f64::from(*out);
    }
    let scale = (1.0 / sum) as f32;
    out.iter_mut().for_each(|p| *p *= scale);
}

#[cfg(test)]
mod tests {
    use super::{route, sigmoid};
    use crate::layer::{ExpertMlp, Experts, Gating};

    const FOUR: Experts = Experts {
        count: 4,
        used: 2,
        n_ff: 8,
        gating: Gating::Softmax,
        selection_bias: false,
        groups: None,
        normalized: false,
        scale: None,
        shared: None,
        mlp: ExpertMlp::SwiGlu,
        biases: false,
    };

    #[test]
    fn rows_choose_their_most_probable_experts_most_probable_first() {
        // exp(2) : exp(1) : exp(0) : exp(0), softmax in f64 for reference.
        let logits = [0.0, 2.0, 1.0, 0.0, /* row 2 */ 5.0, 5.0, -1.0, 4.0];
        let routes = route(&logits, FOUR, None);
        let chosen: Vec<usize> = routes.iter().map(|&(expert, _)| expert).collect();
        // Row 2's tie goes to the lower index.
        assert_eq!(chosen, [1, 2, 0, 1]);
        let z = 2.0 + 2f64.exp() + 1f64.exp();
        assert!((f64::from(routes[0].1) - 2f64.exp() / z).abs() < 1e-6);
        assert!((f64::from(routes[1].1) - 1f64.exp() / z).abs() < 1e-6);
        assert_eq!(routes[2].1, routes[3].1);
        let normalized = route(&logits, Experts { normalized: true, ..FOUR }, None);
        let e = 1f64.exp();
        assert!((f64::from(normalized[0].1) - e / (e + 1.0)).abs() < 1e-6);
        assert!((f64::from(normalized[1].1) - 1.0 / (e + 1.0)).abs() < 1e-6);
        assert_eq!(normalized[2].1, 0.5);
    }

    #[test]
    fn a_softmax_of_the_chosen_weighs_the_best_scored_experts_by_their_scores_alone() {
        let logits = [0.0, 2.0, 1.0, -1.0, /* row 2 */ 3.0, 3.0, 9.0, 3.0];
        let routes = route(&logits, Experts { gating: Gating::SoftmaxOfChosen, ..FOUR }, None);
        let chosen: Vec<usize> = routes.iter().map(|&(expert, _)| expert).collect();
        assert_eq!(chosen, [1, 2, 2, 0]);
        let e = 1f64.exp();
        assert!((f64::from(routes[0].1) - e / (e + 1.0)).abs() < 1e-6);
        assert!((f64::from(routes[1].1) - 1.0 / (e + 1.0)).abs() < 1e-6);
        assert!((f64::from(routes[2].1) - 1.0 / (1.0 + (-6f64).exp())).abs() < 1e-6);
    }

    #[test]
    fn sigmoid_scores_choose_with_their_bias_within_the_best_groups_and_weigh_without_it() {
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        let logits = [0.0, 2.0, 1.0, -1.0];
        let spec = Experts { gating: Gating::Sigmoid, ..FOUR };
        // The bias lifts expert 3 above expert 2 for choosing only.
        let routes = route(&logits, spec, Some(&[0.0, 0.0, 0.0, 0.5]));
        assert_eq!(routes.iter().map(|&(e, _)| e).collect::<Vec<_>>(), [1, 3]);
        assert!((f64::from(routes[1].1) - sigmoid(-1.0)).abs() < 1e-6, "{routes:?}");
        // Normalized, then scaled.
        let scaled = route(&logits, Experts { normalized: true, scale: Some(2.5), ..spec }, None);
        let (a, b) = (sigmoid(2.0), sigmoid(1.0));
        assert!((f64::from(scaled[0].1) - 2.5 * a / (a + b)).abs() < 1e-6, "{scaled:?}");
        // Groups {0, 1} (best two sum 2) and {2, 3} (0.5 + 3 = 3.5): only the
        // second group is chosen from, though expert 1 scores second best.
        let selection = [1.0, 1.0, 3.0, 0.5];
        let grouped = route(&selection, Experts { groups: Some((2, 1)), ..spec }, None);
        assert_eq!(grouped.iter().map(|&(e, _)| e).collect::<Vec<_>>(), [2, 3]);
    }

    #[test]
    fn hostile_scores_route_without_panicking() {
        let routes =
            route(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0], Experts { normalized: true, ..FOUR }, None);
        assert_eq!(routes.len(), 2);
        assert!(route(&[], FOUR, None).is_empty());
    }

    #[test]
    fn the_shared_gate_is_a_sigmoid_and_half_at_zero() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(2.0) - 1.0 / (1.0 + (-2f32).exp())).abs() < 1e-7);
        assert!(sigmoid(-30.0) < 1e-12);
    }
}
