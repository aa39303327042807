//! Synthetic LoRA adapters in llama.cpp's GGUF form (`general.type =
//! adapter`, `<weight>.lora_a` of `[n_in, rank]` and `.lora_b` of `[rank,
//! n_out]`), and base models with an adapter merged into their weights as
//! `W + scale · (alpha / rank) · B·A`, to check the unmerged arithmetic
//! against.

use crate::gguf_writer::{GgufBuilder, Rng, Tensor, Value};

/// A base weight an adapter changes: its name and GGUF shape `[n_in, n_out]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub n_in: u64,
    pub n_out: u64,
}

/// The seven matrices of every layer of a llama-style model of these
/// widths (`q_dim` = `n_embd` for the shapes here).
pub fn layer_targets(n_layer: usize, n_embd: u64, kv_dim: u64, n_ff: u64) -> Vec<Target> {
    let sites: [(&str, u64, u64); 7] = [
        ("attn_q.weight", n_embd, n_embd),
        ("attn_k.weight", n_embd, kv_dim),
        ("attn_v.weight", n_embd, kv_dim),
        ("attn_output.weight", n_embd, n_embd),
        ("ffn_gate.weight", n_embd, n_ff),
        ("ffn_up.weight", n_embd, n_ff),
        ("ffn_down.weight", n_ff, n_embd),
    ];
    (0..n_layer)
        .flat_map(|layer| {
            sites.iter().map(move |&(site, n_in, n_out)| Target { name: format!("blk.{layer}.{site}"), n_in, n_out })
        })
        .collect()
}

/// The default model's matrices (SmolLM2-135M: 30 layers, 576 wide, keys
/// and values 192, feed-forward 1536).
pub fn default_model_targets() -> Vec<Target> {
    layer_targets(30, 576, 192, 1536)
}

/// How an adapter is drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub arch: &'static str,
    pub rank: usize,
    /// `adapter.lora.alpha`; 0 leaves the key out.
    pub alpha: f32,
    pub seed: u64,
    /// `lora_b`'s values are uniform in ±this (`lora_a`'s in ±1/√n_in).
    pub magnitude: f32,
}

impl LoraSpec {
    /// Rank 8, alpha 16, on `arch`.
    pub fn new(arch: &'static str, seed: u64, magnitude: f32) -> Self {
        LoraSpec { arch, rank: 8, alpha: 16.0, seed, magnitude }
    }

    /// The adapter's file: F32 factors for every target.
    pub fn build(&self, targets: &[Target]) -> GgufBuilder {
        let mut rng = Rng::new(self.seed);
        let mut builder = GgufBuilder::new()
            .meta("general.architecture", Value::Str(self.arch.into()))
            .meta("general.type", Value::Str("adapter".into()))
            .meta("adapter.type", Value::Str("lora".into()));
        if self.alpha != 0.0 {
            builder = builder.meta("adapter.lora.alpha", Value::F32(self.alpha));
        }
        let rank = self.rank as u64;
        for target in targets {
            let a = rng.vec((target.n_in * rank) as usize, 1.0 / (target.n_in as f32).sqrt());
            let b = rng.vec((rank * target.n_out) as usize, self.magnitude);
            builder = builder
                .tensor(Tensor::f32(&format!("{}.lora_a", target.name), &[target.n_in, rank], &a))
                .tensor(Tensor::f32(&format!("{}.lora_b", target.name), &[rank, target.n_out], &b));
        }
        builder
    }

    /// `base` (F32 weights) with the adapter `build(targets)` writes merged
    /// in at `scale`: each target `W += scale · alpha/rank · B·A`, summed in
    /// f64 and rounded once.
    pub fn merged(&self, base: &GgufBuilder, targets: &[Target], scale: f32) -> GgufBuilder {
        let adapter = self.build(targets);
        let values = |name: &str| -> Vec<f32> {
            let tensor = adapter.tensors.iter().find(|tensor| tensor.name == name).expect("built above");
            f32_values(tensor)
        };
        let factor = f64::from(scale) * if self.alpha == 0.0 { 1.0 } else { f64::from(self.alpha) / self.rank as f64 };
        let mut merged = base.clone();
        for target in targets {
            let tensor = merged.tensors.iter_mut().find(|tensor| tensor.name == target.name).expect("a base weight");
            assert_eq!(tensor.type_id, 0, "merging needs F32 base weights");
            let (a, b) = (values(&format!("{}.lora_a", target.name)), values(&format!("{}.lora_b", target.name)));
            let (n_in, rank) = (target.n_in as usize, self.rank);
            let mut w = f32_values(tensor);
            for (o, row) in w.chunks_exact_mut(n_in).enumerate() {
                for (i, value) in row.iter_mut().enumerate() {
                    let delta: f64 = (0..rank).map(|r| f64::from(b[o * rank + r]) * f64::from(a[r * n_in + i])).sum();
                    *value = (f64::from(*value) + factor * delta) as f32;
                }
            }
            tensor.data = w.iter().flat_map(|value| value.to_le_bytes()).collect();
        }
        merged
    }
}

fn f32_values(tensor: &Tensor) -> Vec<f32> {
    tensor.data.chunks_exact(4).map(|word| f32::from_le_bytes([word[0], word[1], word[2], word[3]])).collect()
}
