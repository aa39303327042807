//! Random-weight models in the shapes of real ones, for measuring speed on
//! the sizes people run without downloading their weights.
//!
//! The file is F16 (norms in F32, as converters write them) and is streamed
//! to disk tensor by tensor, so a 7B shape (15 GB) needs no more memory
//! than one tensor row. llama.cpp's `llama-quantize` turns it into any
//! format for benchmarking (see `docs/benchmarks.md`). The vocabulary is
//! byte-level (the 256 GPT-2 byte symbols, then `t256`, `t257`, …) so both
//! sluice and llama.cpp load and tokenize it.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::gguf_writer::{Rng, TensorInfo, Value, header};

mod hybrid;
mod plan;

pub use hybrid::ShapeHybrid;
use plan::{F16, F32, Fill, Planned, Q4_K, Q4_K_BLOCK};

/// The architecture and sizes of a transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub arch: &'static str,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_ctx: u32,
    pub rope_base: f32,
    /// Whether the LM head is the token embedding table (no `output.weight`).
    pub tied: bool,
    /// Elements per head where they are not `n_embd / n_head` (Gemma 3's
    /// heads of 256 on a 1152-wide model).
    pub head_dim: Option<usize>,
    /// Positions a sliding-window layer sees (Gemma 3's local layers).
    pub window: Option<u32>,
    /// A mixture of experts in place of each MLP.
    pub experts: Option<ShapeExperts>,
    /// Gated DeltaNet layers but every fourth, and a shared expert.
    pub hybrid: Option<ShapeHybrid>,
}

/// The experts of a [`Shape`]: `count` of them, `used` per token, each
/// `n_ff` wide (written as `expert_feed_forward_length`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeExperts {
    pub count: usize,
    pub used: usize,
    pub n_ff: usize,
}

/// The shapes `write-model --shape` knows, by name.
pub const NAMED: [(&str, Shape); 9] = [
    (
        "smollm2-135m",
        Shape {
            arch: "llama",
            n_vocab: 49152,
            n_embd: 576,
            n_layer: 30,
            n_head: 9,
            n_head_kv: 3,
            n_ff: 1536,
            n_ctx: 8192,
            rope_base: 100000.0,
            tied: true,
            head_dim: None,
            window: None,
            experts: None,
            hybrid: None,
        },
    ),
    (
        "llama-3.2-1b",
        Shape {
            arch: "llama",
            n_vocab: 128256,
            n_embd: 2048,
            n_layer: 16,
            n_head: 32,
            n_head_kv: 8,
            n_ff: 8192,
            n_ctx: 131072,
            rope_base: 500000.0,
            tied: true,
            head_dim: None,
            window: None,
            experts: None,
            hybrid: None,
        },
    ),
    (
        "qwen2.5-7b",
        Shape {
            arch: "qwen2",
            n_vocab: 152064,
            n_embd: 3584,
            n_layer: 28,
            n_head: 28,
            n_head_kv: 4,
            n_ff: 18944,
            n_ctx: 32768,
            rope_base: 1000000.0,
            tied: false,
            head_dim: None,
            window: None,
            experts: None,
            hybrid: None,
        },
    ),
    (
        "llama-3.1-8b",
        Shape {
            arch: "llama",
            n_vocab: 128256,
            n_embd: 4096,
            n_layer: 32,
            n_head: 32,
            n_head_kv: 8,
            n_ff: 14336,
            n_ctx: 131072,
            rope_base: 500000.0,
            tied: false,
            head_dim: None,
            window: None,
            experts: None,
            hybrid: None,
        },
    ),
    (
        // Five local layers (window 512, RoPE base 10⁴) to one global
        // (10⁶), QK-norm and post-norms: Gemma 3 1B.
        "gemma-3-1b",
        Shape {
            arch: "gemma3",
            n_vocab: 262144,
            n_embd: 1152,
            n_layer: 26,
            n_head: 4,
            n_head_kv: 1,
            n_ff: 6912,
            n_ctx: 32768,
            rope_base: 1000000.0,
            tied: true,
            head_dim: Some(256),
            window: Some(512),
            experts: None,
            hybrid: None,
        },
    ),
    (
        // Phi-3-mini (Q/K/V and gate/up fused) cut to 8 of its 32 layers.
        "phi-3-mini-8l",
        Shape {
            arch: "phi3",
            n_vocab: 32064,
            n_embd: 3072,
            n_layer: 8,
            n_head: 32,
            n_head_kv: 32,
            n_ff: 8192,
            n_ctx: 4096,
            rope_base: 10000.0,
            tied: false,
            head_dim: None,
            window: None,
            experts: None,
            hybrid: None,
        },
    ),
    (
        // Qwen3-30B-A3B (128 experts of 768, 8 used; Q/K norms; heads of
        // 128 on a 2048-wide model) cut to 8 of its 48 layers.
        "qwen3-30b-a3b-8l",
        Shape {
            arch: "qwen3moe",
            n_vocab: 151936,
            n_embd: 2048,
            n_layer: 8,
            n_head: 32,
            n_head_kv: 4,
            n_ff: 6144,
            n_ctx: 40960,
            rope_base: 1000000.0,
            tied: false,
            head_dim: Some(128),
            window: None,
            experts: Some(ShapeExperts { count: 128, used: 8, n_ff: 768 }),
            hybrid: None,
        },
    ),
    (
        // gpt-oss-20b (32 experts of 2880, 4 used, with biases; 64 heads of
        // 64 with sinks, every other layer windowed to 128; YaRN) cut to 6
        // of its 24 layers.
        "gpt-oss-20b-6l",
        Shape {
            arch: "gpt-oss",
            n_vocab: 201088,
            n_embd: 2880,
            n_layer: 6,
            n_head: 64,
            n_head_kv: 8,
            n_ff: 2880,
            n_ctx: 131072,
            rope_base: 150000.0,
            tied: false,
            head_dim: Some(64),
            window: Some(128),
            experts: Some(ShapeExperts { count: 32, used: 4, n_ff: 2880 }),
            hybrid: None,
        },
    ),
    (
        // Qwen3.5-35B-A3B (256 experts of 512, 8 used, and a shared one of
        // 512; Gated DeltaNet layers of 16 key and 32 value heads of 128;
        // gated attention every fourth layer, 16 heads of 256, 2 KV heads,
        // interleaved M-RoPE over 64 of each) cut to 8 of its 40 layers.
        "qwen35-35b-a3b-8l",
        Shape {
            arch: "qwen35moe",
            n_vocab: 248320,
            n_embd: 2048,
            n_layer: 8,
            n_head: 16,
            n_head_kv: 2,
            n_ff: 512,
            n_ctx: 262144,
            rope_base: 10_000_000.0,
            tied: false,
            head_dim: Some(256),
            window: None,
            experts: Some(ShapeExperts { count: 256, used: 8, n_ff: 512 }),
            hybrid: Some(ShapeHybrid {
                k_heads: 16,
                v_heads: 32,
                head: 128,
                conv: 4,
                n_rot: 64,
                sections: [11, 11, 10, 0],
                shared: 512,
            }),
        },
    ),
];

/// How a model's weight matrices are stored (norms are F32 either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matrices {
    F16,
    /// Random Q4_K blocks (not a quantization of anything): the bytes a
    /// Q4_K file of the shape has, for measuring speed.
    Q4K,
}

impl Shape {
    /// The shape called `name` (see [`NAMED`]).
    pub fn named(name: &str) -> Option<Shape> {
        NAMED.iter().find(|(known, _)| *known == name).map(|(_, shape)| shape.clone())
    }

    fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.n_embd / self.n_head)
    }

    /// Checks what the loaders require: heads that divide the width and
    /// each other, and rows Q4_K can hold when asked for (F16 takes any).
    pub fn check(&self, matrices: Matrices) -> Result<(), String> {
        let widths = [self.n_embd, self.n_ff, self.experts.map_or(self.n_ff, |experts| experts.n_ff)];
        if matrices == Matrices::Q4K && widths.iter().any(|width| !width.is_multiple_of(256)) {
            return Err(format!("Q4_K rows are multiples of 256 values, and this shape has {self:?}"));
        }
        let ok = self.n_head > 0
            && self.n_head_kv > 0
            && (self.head_dim.is_some() || self.n_embd.is_multiple_of(self.n_head))
            && self.n_head.is_multiple_of(self.n_head_kv)
            && self.n_layer > 0
            && self.n_ff > 0
            && self.n_vocab >= 256
            && self.experts.is_none_or(|experts| (1..=experts.count).contains(&experts.used) && experts.n_ff > 0);
        if ok { Ok(()) } else { Err(format!("inconsistent shape {self:?}")) }
    }

    fn plan(&self, matrices: Matrices) -> Vec<Planned> {
        let (e, v, f) = (self.n_embd as u64, self.n_vocab as u64, self.n_ff as u64);
        let head_dim = self.head_dim() as u64;
        let (q, kv) = (head_dim * self.n_head as u64, head_dim * self.n_head_kv as u64);
        let matrix = |name: String, n_in: u64, n_out: u64| Planned {
            name,
            dims: vec![n_in, n_out],
            type_id: if matrices == Matrices::Q4K { Q4_K } else { F16 },
            fill: Fill::Uniform(1.0 / (n_in as f32).sqrt()),
        };
        let vector = |name: String, len: u64, fill: Fill| Planned { name, dims: vec![len], type_id: F32, fill };
        let mut plan =
            vec![matrix("token_embd.weight".into(), e, v), vector("output_norm.weight".into(), e, Fill::NearOne)];
        if !self.tied {
            plan.push(matrix("output.weight".into(), e, v));
        }
        for layer in 0..self.n_layer {
            let name = |suffix: &str| format!("blk.{layer}.{suffix}");
            plan.push(vector(name("attn_norm.weight"), e, Fill::NearOne));
            let gpt_oss = self.arch == "gpt-oss";
            if let Some(hybrid) = self.hybrid {
                plan.extend(hybrid.mixer(layer, (e, head_dim), (self.n_head as u64, self.n_head_kv as u64), &matrix));
            } else {
                if self.arch == "phi3" {
                    plan.push(matrix(name("attn_qkv.weight"), e, q + 2 * kv));
                } else {
                    plan.push(matrix(name("attn_q.weight"), e, q));
                    plan.push(matrix(name("attn_k.weight"), e, kv));
                    plan.push(matrix(name("attn_v.weight"), e, kv));
                }
                if self.arch == "qwen2" || gpt_oss {
                    plan.push(vector(name("attn_q.bias"), q, Fill::Uniform(0.1)));
                    plan.push(vector(name("attn_k.bias"), kv, Fill::Uniform(0.1)));
                    plan.push(vector(name("attn_v.bias"), kv, Fill::Uniform(0.1)));
                }
                if gpt_oss {
                    plan.push(vector(name("attn_output.bias"), e, Fill::Uniform(0.1)));
                    plan.push(vector(name("attn_sinks.weight"), self.n_head as u64, Fill::Uniform(1.0)));
                }
                if matches!(self.arch, "gemma3" | "qwen3moe") {
                    plan.push(vector(name("attn_q_norm.weight"), head_dim, Fill::NearOne));
                    plan.push(vector(name("attn_k_norm.weight"), head_dim, Fill::NearOne));
                }
                if self.arch == "gemma3" {
                    plan.push(vector(name("post_attention_norm.weight"), e, Fill::NearOne));
                    plan.push(vector(name("post_ffw_norm.weight"), e, Fill::NearOne));
                }
                plan.push(matrix(name("attn_output.weight"), q, e));
            }
            let ffn_norm = match gpt_oss || self.hybrid.is_some() {
                true => "post_attention_norm.weight",
                false => "ffn_norm.weight",
            };
            plan.push(vector(name(ffn_norm), e, Fill::NearOne));
            if let Some(experts) = self.experts {
                let (count, f) = (experts.count as u64, experts.n_ff as u64);
                // Converters and llama-quantize keep the router in F32.
                let router = Fill::Uniform(3.0 / (e as f32).sqrt());
                plan.push(Planned {
                    name: name("ffn_gate_inp.weight"),
                    dims: vec![e, count],
                    type_id: F32,
                    fill: router,
                });
                for (suffix, n_in, n_out) in [("ffn_gate_exps", e, f), ("ffn_up_exps", e, f), ("ffn_down_exps", f, e)] {
                    let Planned { name: tensor, dims, type_id, fill } =
                        matrix(name(&format!("{suffix}.weight")), n_in, n_out);
                    plan.push(Planned { name: tensor, dims: [dims, vec![count]].concat(), type_id, fill });
                    if gpt_oss {
                        let bias = name(&format!("{suffix}.bias"));
                        plan.push(Planned {
                            name: bias,
                            dims: vec![n_out, count],
                            type_id: F32,
                            fill: Fill::Uniform(0.1),
                        });
                    }
                }
                if gpt_oss {
                    plan.push(vector(name("ffn_gate_inp.bias"), count, Fill::Uniform(0.1)));
                }
                if let Some(hybrid) = self.hybrid {
                    plan.extend(hybrid.shared(layer, e, &matrix));
                }
                continue;
            }
            if self.arch == "phi3" {
                plan.push(matrix(name("ffn_up.weight"), e, 2 * f));
            } else {
                plan.push(matrix(name("ffn_gate.weight"), e, f));
                plan.push(matrix(name("ffn_up.weight"), e, f));
            }
            plan.push(matrix(name("ffn_down.weight"), f, e));
        }
        plan
    }

    fn metadata(&self) -> Vec<(String, Value)> {
        let arch = self.arch;
        let key = |name: &str| format!("{arch}.{name}");
        let tokens: Vec<String> =
            byte_symbols().into_iter().chain((256..self.n_vocab).map(|id| format!("t{id}"))).collect();
        let mut metadata = vec![
            ("general.architecture".into(), Value::Str(arch.into())),
            // Not the architecture's name: llama.cpp treats a Phi-3 by its name
            // and then asks for tokens this vocabulary lacks.
            ("general.name".into(), Value::Str(format!("random weights, {} layers of {}", self.n_layer, self.n_embd))),
            (key("context_length"), Value::U32(self.n_ctx)),
            (key("embedding_length"), Value::U32(self.n_embd as u32)),
            (key("block_count"), Value::U32(self.n_layer as u32)),
            (key("feed_forward_length"), Value::U32(self.n_ff as u32)),
            (key("attention.head_count"), Value::U32(self.n_head as u32)),
            (key("attention.head_count_kv"), Value::U32(self.n_head_kv as u32)),
            (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
            (key("rope.freq_base"), Value::F32(self.rope_base)),
            (key("attention.key_length"), Value::U32(self.head_dim() as u32)),
            (key("attention.value_length"), Value::U32(self.head_dim() as u32)),
            ("tokenizer.ggml.model".into(), Value::Str("gpt2".into())),
            ("tokenizer.ggml.tokens".into(), Value::Strs(tokens)),
            ("tokenizer.ggml.merges".into(), Value::Strs(Vec::new())),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(0)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
        ];
        if let Some(window) = self.window {
            metadata.push((key("attention.sliding_window"), Value::U32(window)));
        }
        if let Some(experts) = self.experts {
            metadata.push((key("expert_count"), Value::U32(experts.count as u32)));
            metadata.push((key("expert_used_count"), Value::U32(experts.used as u32)));
            metadata.push((key("expert_feed_forward_length"), Value::U32(experts.n_ff as u32)));
        }
        if let Some(hybrid) = self.hybrid {
            metadata.extend(hybrid.metadata(arch));
        }
        if arch == "gpt-oss" {
            // The published files' YaRN.
            metadata.push((key("rope.scaling.type"), Value::Str("yarn".into())));
            metadata.push((key("rope.scaling.factor"), Value::F32(32.0)));
            metadata.push((key("rope.scaling.original_context_length"), Value::U32(4096)));
        }
        metadata
    }

    /// Writes the model to `path` with weights drawn from `seed`.
    pub fn write(&self, path: &Path, seed: u64, matrices: Matrices) -> io::Result<()> {
        self.check(matrices).map_err(io::Error::other)?;
        let plan = self.plan(matrices);
        let infos: Vec<TensorInfo> = plan
            .iter()
            .map(|t| TensorInfo { name: &t.name, dims: &t.dims, type_id: t.type_id, bytes: t.bytes() })
            .collect();
        let alignment = 32;
        let (head, offsets) = header(&self.metadata(), &infos, alignment);
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        out.write_all(&head)?;
        let mut written = 0u64;
        let mut rng = Rng::new(seed);
        for ((tensor, info), offset) in plan.iter().zip(&infos).zip(offsets) {
            out.write_all(&vec![0; (offset - written) as usize])?;
            stream(&mut out, tensor, &mut rng)?;
            written = offset + info.bytes;
        }
        out.flush()
    }
}

/// Writes a tensor's values a row at a time.
fn stream(out: &mut impl Write, tensor: &Planned, rng: &mut Rng) -> io::Result<()> {
    let row = tensor.dims[0] as usize;
    let rows: u64 = tensor.dims[1..].iter().product();
    if tensor.type_id == Q4_K {
        return stream_q4_k(out, tensor, row, rows, rng);
    }
    let mut bytes = Vec::with_capacity(row * 4);
    for _ in 0..rows {
        bytes.clear();
        for _ in 0..row {
            let value = match tensor.fill {
                Fill::Uniform(scale) => rng.uniform(scale),
                Fill::NearOne => 1.0 + rng.uniform(0.2),
                Fill::Decay => rng.uniform(0.5) - 1.0,
            };
            if tensor.type_id == F16 {
                bytes.extend_from_slice(&half::f16::from_f32(value).to_le_bytes());
            } else {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        out.write_all(&bytes)?;
    }
    Ok(())
}

/// Random Q4_K blocks whose values spread over about ±`scale`: a value is
/// d·s·q − dmin·m with 6-bit s and m and 4-bit q, so d = dmin = scale / 512.
fn stream_q4_k(out: &mut impl Write, tensor: &Planned, row: usize, rows: u64, rng: &mut Rng) -> io::Result<()> {
    let Fill::Uniform(scale) = tensor.fill else { return Err(io::Error::other("Q4_K holds matrices only")) };
    let d = half::f16::from_f32(scale / 512.0).to_le_bytes();
    let mut bytes = vec![0u8; row / 256 * Q4_K_BLOCK as usize];
    for _ in 0..rows {
        for block in bytes.chunks_exact_mut(Q4_K_BLOCK as usize) {
            for chunk in block[4..].chunks_mut(8) {
                let random = rng.next_u64().to_le_bytes();
                chunk.copy_from_slice(&random[..chunk.len()]);
            }
            block[..2].copy_from_slice(&d);
            block[2..4].copy_from_slice(&d);
        }
        out.write_all(&bytes)?;
    }
    Ok(())
}

/// The 256 byte symbols of GPT-2's byte-level BPE, in byte order: printable
/// bytes stand for themselves, the rest map in order to U+0100 onwards.
fn byte_symbols() -> Vec<String> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            let code = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(code).map(String::from).unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_shapes_are_consistent_and_k_quantizable_where_wide_enough() {
        for (name, shape) in &NAMED {
            assert_eq!(shape.check(Matrices::F16), Ok(()), "{name}");
            // A 576-, 1152- or 2880-wide model cannot use K-quants
            // everywhere (llama-quantize falls back too); every other shape
            // can.
            let k_quantizable = !matches!(*name, "smollm2-135m" | "gemma-3-1b" | "gpt-oss-20b-6l");
            assert_eq!(shape.check(Matrices::Q4K).is_ok(), k_quantizable, "{name}");
            assert_eq!(Shape::named(name).as_ref(), Some(shape));
        }
        // Llama-3.2-1B: 1.24 billion parameters with tied embeddings.
        let shape = Shape::named("llama-3.2-1b").expect("known");
        let params: u64 = shape.plan(Matrices::F16).iter().map(|t| t.dims.iter().product::<u64>()).sum();
        assert_eq!(params / 10_000_000, 123);
        // Gemma 3 1B: 1.0 billion, 0.30 of it the tied 262144-token table;
        // Phi-3-mini's 8 layers of 113 million and its two 98-million
        // tables.
        let count = |name: &str| -> u64 {
            let shape = Shape::named(name).expect("known");
            shape.plan(Matrices::F16).iter().map(|t| t.dims.iter().product::<u64>()).sum()
        };
        assert_eq!(count("gemma-3-1b") / 10_000_000, 99);
        assert_eq!(count("phi-3-mini-8l") / 10_000_000, 110);
        // Qwen3-30B-A3B's 8 layers: 604 million expert weights and 19
        // million of attention each, and its two 311-million tables.
        assert_eq!(count("qwen3-30b-a3b-8l") / 10_000_000, 560);
        // gpt-oss-20b's 6 layers: 796 million expert weights and 27 million
        // of attention each, and its two 579-million tables.
        assert_eq!(count("gpt-oss-20b-6l") / 10_000_000, 609);
        // Qwen3.5-35B-A3B's 8 layers: 808 million expert weights (the
        // shared one included) and 29 to 46 million of mixer each, and its
        // two 509-million tables.
        assert_eq!(count("qwen35-35b-a3b-8l") / 10_000_000, 774);
        assert!(Shape::named("gpt-5").is_none());
    }

    #[test]
    fn byte_symbols_are_gpt2s() {
        let symbols = byte_symbols();
        assert_eq!(symbols.len(), 256);
        assert_eq!(symbols[b'A' as usize], "A");
        assert_eq!(symbols[b'\n' as usize], "\u{10a}");
        assert_eq!(symbols[b' ' as usize], "\u{120}");
        let unique: std::collections::HashSet<_> = symbols.iter().collect();
        assert_eq!(unique.len(), 256);
    }

    #[test]
    fn a_written_file_has_every_tensor_where_its_header_says() {
        let shape =
            Shape { n_vocab: 300, n_embd: 64, n_layer: 2, n_head: 4, n_head_kv: 2, n_ff: 96, ..NAMED[2].1.clone() };
        let path = std::env::temp_dir().join(format!("sluice-shape-{}.gguf", std::process::id()));
        shape.write(&path, 3, Matrices::F16).expect("written");
        let bytes = std::fs::read(&path).expect("readable");
        std::fs::remove_file(&path).expect("removed");
        let plan = shape.plan(Matrices::F16);
        let count = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        assert_eq!(count, plan.len() as u64);
        // The file ends where the header puts the end of the last tensor.
        let infos: Vec<TensorInfo> = plan
            .iter()
            .map(|t| TensorInfo { name: &t.name, dims: &t.dims, type_id: t.type_id, bytes: t.bytes() })
            .collect();
        let (head, offsets) = header(&shape.metadata(), &infos, 32);
        let end = head.len() as u64 + offsets.last().expect("tensors") + plan.last().expect("tensors").bytes();
        assert_eq!(bytes.len() as u64, end);
        // A norm's F32 values (1 ± 0.2) are where its offset says.
        let norm = plan.iter().position(|t| t.name == "blk.1.ffn_norm.weight").expect("planned");
        let at = head.len() + offsets[norm] as usize;
        let values: Vec<f32> = bytes[at..at + 4 * shape.n_embd]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        assert!(values.iter().all(|v| (0.8..=1.2).contains(v)), "{values:?}");
        assert!(plan.iter().any(|t| t.name == "output.weight") && plan.iter().any(|t| t.name == "blk.1.attn_v.bias"));
    }
}
