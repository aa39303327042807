//! Gated DeltaNet, the linear attention of Qwen3.5 and Qwen3-Next, over a
//! sequence's tokens in order (the recurrent form, which llama.cpp's CPU
//! backend also runs for prompts).
//!
//! A layer keeps per sequence a short convolution's last inputs and, per
//! value head, a `head × head` state `S`. A token's projections (`qkv`,
//! the output gate `z`, and one `beta` and `alpha` per value head) go
//! through:
//!
//! 1. a causal convolution of each `qkv` channel over its last `conv`
//!    inputs, then SiLU;
//! 2. the convolved Q and K L2-normalized per key head;
//! 3. per value head `h` (key head `h mod k_heads`, or `h / (v_heads /
//!    k_heads)` where the heads are grouped): the state decays by
//!    `exp(g)` with `g = softplus(alpha + dt_bias) · a`, then takes the
//!    delta rule's step `S += k ⊗ β(v − Sᵀk)` with `β = σ(beta)`, and the
//!    head's output is `Sᵀq / √head`;
//! 4. each head's output RMS-normed (weight `norm`) and multiplied by
//!    `silu(z)`.
//!
//! A run of a sequence's tokens goes through steps 1–2 and the gates token
//! by token, then each value head takes all of them in order through its
//! own state (the heads spread over threads by the caller's
//! [`SplitHeads`]), then step 4.
//!
//! The state is stored transposed (row `j` holds column `j` of `S`), so
//! that each output element reads one contiguous row. Every reduction runs
//! in the fixed 16-lane order of [`super::simd`], so the result is the
//! same bits on every instruction set level and does not depend on any
//! other sequence.

use super::row::{rms_norm, silu};
use super::simd::{LANES, Simd, dispatch, padded};

/// The widths of a Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaShape {
    /// Query/key heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`), a multiple of `k_heads`.
    pub v_heads: usize,
    /// Every head's width (`ssm.state_size`).
    pub head: usize,
    /// The convolution's length in positions (`ssm.conv_kernel`).
    pub conv: usize,
    /// Value heads read their key heads in groups: `h / (v_heads /
    /// k_heads)` (Qwen3-Next's files); otherwise in turn, `h mod k_heads`
    /// (Qwen3.5's, whose converter orders the value heads so).
    pub grouped: bool,
}

impl DeltaShape {
    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        match self.grouped {
            true => h / (self.v_heads / self.k_heads).max(1),
            false => h % self.k_heads,
        }
    }

    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head
    }

    /// Channels of the convolution: Q, K and V.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Values a sequence keeps of the convolution's inputs.
    pub fn conv_state(&self) -> usize {
        self.conv_dim() * self.conv.saturating_sub(1)
    }

    /// Values a sequence keeps of the heads' states.
    pub fn delta_state(&self) -> usize {
        self.v_heads * self.head * self.head
    }
}

/// A layer's own parameters.
#[derive(Debug, Clone, Copy)]
pub struct DeltaWeights<'a> {
    /// `conv` taps per channel, oldest input first.
    pub conv: &'a [f32],
    /// Per value head.
    pub dt_bias: &'a [f32],
    /// Per value head: `-exp(A_log)`.
    pub a: &'a [f32],
    /// The output norm's weight, `head` values.
    pub norm: &'a [f32],
    pub eps: f32,
}

/// One sequence's state in a layer.
pub struct DeltaState<'a> {
    /// Per channel, its last `conv - 1` inputs, oldest first.
    pub conv: &'a mut [f32],
    /// Per value head, `S` transposed.
    pub delta: &'a mut [f32],
}

/// The projections of a run of one sequence's consecutive tokens, row
/// after row: `qkv` (`conv_dim` each), `z` (`value_dim`), `beta` and
/// `alpha` (`v_heads`).
#[derive(Debug, Clone, Copy)]
pub struct DeltaRows<'a> {
    pub qkv: &'a [f32],
    pub z: &'a [f32],
    pub beta: &'a [f32],
    pub alpha: &'a [f32],
}

/// One value head's share of a run: its state, and its outputs before the
/// norm (`head` per token).
pub struct DeltaHead<'a> {
    index: usize,
    state: &'a mut [f32],
    out: Vec<f32>,
}

/// How a run's value heads are spread over threads: each head's work
/// depends on its own state alone, so any split gives the same bits.
pub trait SplitHeads {
    fn split(&self, heads: &mut [DeltaHead<'_>], work: &(dyn Fn(&mut [DeltaHead<'_>]) + Sync));
}

/// Every head on the calling thread.
pub struct Serial;

impl SplitHeads for Serial {
    fn split(&self, heads: &mut [DeltaHead<'_>], work: &(dyn Fn(&mut [DeltaHead<'_>]) + Sync)) {
        work(heads)
    }
}

/// Run `n` consecutive tokens of one sequence through the layer: update
/// `state` and write each token's `value_dim` outputs (normed and gated)
/// into `out`, the value heads spread by `split`. A run gives the bits of
/// its tokens run one at a time.
///
/// # Panics
/// If a slice is not as long as `shape` and `n` make it, or `v_heads` is
/// not a multiple of `k_heads`.
pub fn delta_net(
    shape: DeltaShape,
    weights: DeltaWeights<'_>,
    state: DeltaState<'_>,
    rows: DeltaRows<'_>,
    out: &mut [f32],
    split: &dyn SplitHeads,
) {
    let (head, conv_dim, heads) = (shape.head, shape.conv_dim(), shape.v_heads);
    let n = rows.qkv.len() / conv_dim.max(1);
    assert!(shape.k_heads > 0 && heads.is_multiple_of(shape.k_heads), "delta_net: heads");
    assert_eq!(rows.qkv.len(), n * conv_dim, "delta_net: qkv");
    assert_eq!(rows.z.len(), n * shape.value_dim(), "delta_net: z");
    assert!(rows.beta.len() == n * heads && rows.alpha.len() == n * heads, "delta_net: beta, alpha");
    assert!(weights.dt_bias.len() == heads && weights.a.len() == heads, "delta_net: dt, a");
    assert_eq!(weights.conv.len(), conv_dim * shape.conv, "delta_net: conv weights");
    assert_eq!(weights.norm.len(), head, "delta_net: norm");
    assert_eq!(state.conv.len(), shape.conv_state(), "delta_net: conv state");
    assert_eq!(state.delta.len(), shape.delta_state(), "delta_net: delta state");
    assert_eq!(out.len(), n * shape.value_dim(), "delta_net: out");

    let mixed = convolve(shape, weights, state.conv, rows.qkv);
    // Each token's β and decay per value head.
    let gates: Vec<(f32, f32)> = (0..n * heads)
        .map(|at| {
            let h = at % heads;
            let beta = 1.0 / (1.0 + (-rows.beta[at]).exp());
            (beta, (softplus(rows.alpha[at] + weights.dt_bias[h]) * weights.a[h]).exp())
        })
        .collect();
    let mut work: Vec<DeltaHead<'_>> = state
        .delta
        .chunks_exact_mut(head * head)
        .enumerate()
        .map(|(index, state)| DeltaHead { index, state, out: vec![0.0; n * head] })
        .collect();
    split.split(&mut work, &|part: &mut [DeltaHead<'_>]| {
        for task in part {
            run_head(shape, &mixed, &gates, task);
        }
    });
    let mut gate = vec![0.0; head];
    for task in &work {
        let h = task.index;
        for t in 0..n {
            let out = &mut out[t * shape.value_dim() + h * head..][..head];
            rms_norm(&task.out[t * head..][..head], weights.norm, weights.eps, out);
            gate.copy_from_slice(&rows.z[t * shape.value_dim() + h * head..][..head]);
            silu(&mut gate);
            out.iter_mut().zip(&gate).for_each(|(x, g)| *x *= g);
        }
    }
}

/// Each token's `qkv` through the causal convolution (each channel's taps
/// summed in order in f32, as ggml's `ssm_conv` sums them) and SiLU, its Q
/// and K heads L2-normed; the window moves on.
fn convolve(shape: DeltaShape, weights: DeltaWeights<'_>, past: &mut [f32], qkv: &[f32]) -> Vec<f32> {
    let (conv_dim, taps) = (shape.conv_dim(), shape.conv);
    let kept = taps - 1;
    let mut mixed = vec![0.0; qkv.len()];
    for (input, mixed) in qkv.chunks_exact(conv_dim).zip(mixed.chunks_exact_mut(conv_dim)) {
        for (channel, value) in mixed.iter_mut().enumerate() {
            let w = &weights.conv[channel * taps..][..taps];
            let past = &mut past[channel * kept..][..kept];
            let mut sum = 0.0f32;
            for (tap, &x) in past.iter().enumerate() {
                sum += x * w[tap];
            }
            sum += input[channel] * w[kept];
            *value = sum;
            if kept > 0 {
                past.copy_within(1.., 0);
                past[kept - 1] = input[channel];
            }
        }
        silu(mixed);
        for head in mixed[..2 * shape.key_dim()].chunks_exact_mut(shape.head) {
            l2_normalize(head, weights.eps);
        }
    }
    mixed
}

/// A value head's tokens, in order, through its state.
fn run_head(shape: DeltaShape, mixed: &[f32], gates: &[(f32, f32)], task: &mut DeltaHead<'_>) {
    let (n, conv_dim, key_dim) = (shape.head, shape.conv_dim(), shape.key_dim());
    let h = task.index;
    let kh = shape.key_head(h);
    let scale = 1.0 / (n as f32).sqrt();
    for (t, token) in mixed.chunks_exact(conv_dim).enumerate() {
        let (q, k) = (&token[kh * n..][..n], &token[key_dim + kh * n..][..n]);
        let v = &token[2 * key_dim + h * n..][..n];
        let (beta, decay) = gates[t * shape.v_heads + h];
        let o = &mut task.out[t * n..][..n];
        dispatch!(simd => for (j, s_j) in task.state.chunks_exact_mut(n).enumerate() {
            o[j] = head_row(simd, s_j, q, k, v[j], decay, beta) * scale;
        });
    }
}

/// ggml's `softplus`: `ln(1 + eˣ)`, `x` itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// `x / ‖x‖` as llama.cpp computes it for these layers: an RMS norm with
/// `eps / n`, then times `1/√n`.
fn l2_normalize(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let sum: f64 = x.iter().fold(0.0, |sum, &v| sum + f64::from(v * v));
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps / n).sqrt();
    let after = 1.0 / n.sqrt();
    x.iter_mut().for_each(|v| *v = *v * scale * after);
}

/// Row `j` of one head's transposed state: decay it, take the delta
/// rule's step with this token's `v[j]`, and return its dot with `q`.
#[inline(always)]
fn head_row<S: Simd>(s: S, row: &mut [f32], q: &[f32], k: &[f32], v: f32, decay: f32, beta: f32) -> f32 {
    let decay_v = s.splat(decay);
    let (chunks, tail) = row.as_chunks_mut::<LANES>();
    let (k_chunks, k_tail) = k.as_chunks::<LANES>();
    let mut acc = s.splat(0.0);
    for (r, kc) in chunks.iter_mut().zip(k_chunks) {
        let decayed = s.mul(s.load(r), decay_v);
        s.store(decayed, r);
        acc = s.add(acc, s.mul(decayed, s.load(kc)));
    }
    let mut last = padded(tail, 0.0);
    if !tail.is_empty() {
        let decayed = s.mul(s.load(&last), decay_v);
        s.store(decayed, &mut last);
        acc = s.add(acc, s.mul(decayed, s.load(&padded(k_tail, 0.0))));
    }
    let delta = s.splat((v - s.reduce_sum(acc)) * beta);
    let (q_chunks, q_tail) = q.as_chunks::<LANES>();
    let mut acc = s.splat(0.0);
    for ((r, kc), qc) in chunks.iter_mut().zip(k_chunks).zip(q_chunks) {
        let stepped = s.add(s.load(r), s.mul(s.load(kc), delta));
        s.store(stepped, r);
        acc = s.add(acc, s.mul(stepped, s.load(qc)));
    }
    if !tail.is_empty() {
        let stepped = s.add(s.load(&last), s.mul(s.load(&padded(k_tail, 0.0)), delta));
        s.store(stepped, &mut last);
        acc = s.add(acc, s.mul(stepped, s.load(&padded(q_tail, 0.0))));
        let n = tail.len();
        tail.copy_from_slice(&last[..n]);
    }
    s.reduce_sum(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::same_on_every_level;
    use crate::ops::noise;

    const TILED: DeltaShape = DeltaShape { k_heads: 2, v_heads: 4, head: 20, conv: 4, grouped: false };
    const GROUPED: DeltaShape = DeltaShape { grouped: true, ..TILED };

    struct Layer {
        conv: Vec<f32>,
        dt_bias: Vec<f32>,
        a: Vec<f32>,
        norm: Vec<f32>,
    }

    fn layer(shape: DeltaShape) -> Layer {
        Layer {
            conv: noise(shape.conv_dim() * shape.conv, 1, 0.5),
            dt_bias: noise(shape.v_heads, 2, 0.5),
            a: noise(shape.v_heads, 3, 0.5).iter().map(|x| x - 1.0).collect(),
            norm: noise(shape.head, 4, 0.2).iter().map(|x| 1.0 + x).collect(),
        }
    }

    fn rows(shape: DeltaShape, n: usize) -> Vec<[Vec<f32>; 4]> {
        (0..n as u64)
            .map(|t| {
                [
                    noise(shape.conv_dim(), 10 + t, 1.0),
                    noise(shape.value_dim(), 100 + t, 1.0),
                    noise(shape.v_heads, 200 + t, 2.0),
                    noise(shape.v_heads, 300 + t, 2.0),
                ]
            })
            .collect()
    }

    /// Every output of `n` tokens run from a zero state in runs of
    /// `chunk`, the heads split in two.
    fn run(shape: DeltaShape, n: usize, chunk: usize) -> Vec<f32> {
        let layer = layer(shape);
        let weights =
            DeltaWeights { conv: &layer.conv, dt_bias: &layer.dt_bias, a: &layer.a, norm: &layer.norm, eps: 1e-6 };
        let (mut conv, mut delta) = (vec![0.0; shape.conv_state()], vec![0.0; shape.delta_state()]);
        let mut outputs = Vec::new();
        for run in rows(shape, n).chunks(chunk) {
            let join = |part: usize| run.iter().flat_map(|row| row[part].clone()).collect::<Vec<f32>>();
            let (qkv, z, beta, alpha) = (join(0), join(1), join(2), join(3));
            let mut out = vec![0.0; run.len() * shape.value_dim()];
            let rows = DeltaRows { qkv: &qkv, z: &z, beta: &beta, alpha: &alpha };
            let state = DeltaState { conv: &mut conv, delta: &mut delta };
            delta_net(shape, weights, state, rows, &mut out, &Halves);
            outputs.extend(out);
        }
        outputs
    }

    /// The heads in two halves, the second first.
    struct Halves;

    impl SplitHeads for Halves {
        fn split(&self, heads: &mut [DeltaHead<'_>], work: &(dyn Fn(&mut [DeltaHead<'_>]) + Sync)) {
            let (first, second) = heads.split_at_mut(heads.len() / 2);
            work(second);
            work(first);
        }
    }

    /// The layer in f64, straight from its definition.
    fn reference(shape: DeltaShape, n: usize) -> Vec<f64> {
        let layer = layer(shape);
        let (d, taps) = (shape.head, shape.conv);
        let inputs = rows(shape, n);
        let mut states = vec![vec![vec![0.0f64; d]; d]; shape.v_heads];
        let mut outputs = Vec::new();
        for t in 0..n {
            let mixed: Vec<f64> = (0..shape.conv_dim())
                .map(|c| {
                    let x: f64 = (0..taps)
                        .filter(|i| t + i + 1 >= taps)
                        .map(|i| inputs[t + i + 1 - taps][0][c] as f64 * layer.conv[c * taps + i] as f64)
                        .sum();
                    x / (1.0 + (-x).exp())
                })
                .collect();
            let unit = |v: &[f64]| {
                let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                v.iter().map(|x| x / norm).collect::<Vec<_>>()
            };
            let [_, z, beta, alpha] = &inputs[t];
            for h in 0..shape.v_heads {
                let kh = if shape.grouped { h / (shape.v_heads / shape.k_heads) } else { h % shape.k_heads };
                let q = unit(&mixed[kh * d..][..d]);
                let k = unit(&mixed[shape.key_dim() + kh * d..][..d]);
                let v = &mixed[2 * shape.key_dim() + h * d..][..d];
                let g = (1.0 + (alpha[h] as f64 + layer.dt_bias[h] as f64).exp()).ln() * layer.a[h] as f64;
                let b = 1.0 / (1.0 + (-beta[h] as f64).exp());
                let s = &mut states[h];
                s.iter_mut().flatten().for_each(|x| *x *= g.exp());
                let sk: Vec<f64> = (0..d).map(|j| (0..d).map(|i| s[i][j] * k[i]).sum()).collect();
                for i in 0..d {
                    for j in 0..d {
                        s[i][j] += k[i] * b * (v[j] - sk[j]);
                    }
                }
                let o: Vec<f64> =
                    (0..d).map(|j| (0..d).map(|i| s[i][j] * q[i]).sum::<f64>() / (d as f64).sqrt()).collect();
                let rms = (o.iter().map(|x| x * x).sum::<f64>() / d as f64 + 1e-6).sqrt();
                for j in 0..d {
                    let zj = z[h * d + j] as f64;
                    outputs.push(o[j] / rms * layer.norm[j] as f64 * zj / (1.0 + (-zj).exp()));
                }
            }
        }
        outputs
    }

    #[test]
    fn tokens_through_the_layer_match_its_definition_in_f64() {
        let n = 12;
        for shape in [TILED, GROUPED] {
            let (ours, exact) = (run(shape, n, 1), reference(shape, n));
            for (index, (a, b)) in ours.iter().zip(&exact).enumerate() {
                assert!((*a as f64 - b).abs() <= 2e-4 * (1.0 + b.abs()), "{shape:?} output {index}: {a} vs {b}");
            }
        }
        assert!(run(TILED, n, 1) != run(GROUPED, n, 1), "the head mapping matters");
    }

    #[test]
    fn runs_of_any_length_and_every_level_give_the_same_bits() {
        for shape in [TILED, GROUPED] {
            let one = same_on_every_level(|| run(shape, 7, 1));
            for chunk in [2, 3, 7] {
                assert!(run(shape, 7, chunk) == one, "runs of {chunk}");
            }
        }
    }
}
