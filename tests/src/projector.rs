//! Synthetic vision projectors (llama.cpp's `clip` mmproj format) with
//! seeded random weights, for the Qwen2-VL and Qwen2.5-VL towers; text
//! models whose vocabulary images can be placed in; test images.

use std::io::Cursor;

use crate::gguf_writer::{GgufBuilder, Rng, Tensor, TinyModel, Value};

/// The vocabulary of synthetic vision models: lowercase letters, newline
/// and space (byte-level pieces), and the chat and vision markers.
pub fn vision_vocabulary() -> Vec<String> {
    let mut tokens: Vec<String> = ('a'..='z').map(String::from).collect();
    tokens.extend(["Ċ", "Ġ"].map(String::from));
    let specials = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"];
    tokens.extend(specials.map(String::from));
    tokens
}

/// `model` (an M-RoPE shape) with [`vision_vocabulary`], the markers
/// typed as control tokens so that prompts may name them.
pub fn vision_model(model: &TinyModel) -> GgufBuilder {
    let tokens = vision_vocabulary();
    let types: Vec<i32> = tokens.iter().map(|token| if token.starts_with("<|") { 3 } else { 1 }).collect();
    TinyModel { n_vocab: tokens.len(), tokens: Some(tokens), ..model.clone() }
        .build()
        .meta("tokenizer.ggml.token_type", Value::I32s(types))
}

/// A PNG of smooth gradients, the same for the same size.
pub fn test_png(width: u32, height: u32) -> Vec<u8> {
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x * 9 % 256) as u8, (y * 4 % 256) as u8, ((x + y) * 3 % 256) as u8])
    });
    let mut bytes = Vec::new();
    image.write_to(&mut Cursor::new(&mut bytes), image::ImageFormat::Png).expect("a PNG encodes in memory");
    bytes
}

/// Shape of a synthetic tower.
#[derive(Debug, Clone)]
pub struct TinyProjector {
    /// `qwen2vl_merger` or `qwen2.5vl_merger`.
    pub kind: &'static str,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub patch_size: usize,
    /// Width of the text model the merger feeds.
    pub n_out: usize,
    /// Qwen2.5-VL: full attention every `pattern`-th block, windows of
    /// `window_size` pixels otherwise.
    pub pattern: u32,
    pub window_size: u32,
    pub seed: u64,
}

impl TinyProjector {
    /// A Qwen2-VL tower: 2 blocks 32 wide (4 heads of 8), patches of 4.
    pub fn qwen2vl(n_out: usize, seed: u64) -> Self {
        TinyProjector {
            kind: "qwen2vl_merger",
            n_embd: 32,
            n_head: 4,
            n_ff: 64,
            n_layer: 2,
            patch_size: 4,
            n_out,
            pattern: 0,
            window_size: 0,
            seed,
        }
    }

    /// A Qwen2.5-VL tower of the same size: 3 blocks, the last full, the
    /// others in windows of 2 × 2 output rows (16 pixels).
    pub fn qwen25vl(n_out: usize, seed: u64) -> Self {
        TinyProjector {
            kind: "qwen2.5vl_merger",
            n_layer: 3,
            pattern: 3,
            window_size: 16,
            ..Self::qwen2vl(n_out, seed)
        }
    }

    /// Qwen2-VL-2B's vision shapes (32 blocks, 1280 wide, 16 heads, MLP
    /// 5120, patches of 14) feeding a model `n_out` wide: the encoder
    /// benchmark's tower.
    pub fn qwen2vl_2b(n_out: usize, seed: u64) -> Self {
        TinyProjector {
            n_embd: 1280,
            n_head: 16,
            n_ff: 5120,
            n_layer: 32,
            patch_size: 14,
            ..Self::qwen2vl(n_out, seed)
        }
    }

    pub fn gated(&self) -> bool {
        self.kind == "qwen2.5vl_merger"
    }

    /// The projector file.
    pub fn build(&self) -> GgufBuilder {
        let mut rng = Rng::new(self.seed);
        let (e, f, p) = (self.n_embd as u64, self.n_ff as u64, self.patch_size as u64);
        let mut builder = GgufBuilder::new()
            .meta("general.architecture", Value::Str("clip".into()))
            .meta("clip.has_vision_encoder", Value::Bool(true))
            .meta("clip.projector_type", Value::Str(self.kind.into()))
            .meta("clip.vision.embedding_length", Value::U32(self.n_embd as u32))
            .meta("clip.vision.feed_forward_length", Value::U32(self.n_ff as u32))
            .meta("clip.vision.block_count", Value::U32(self.n_layer as u32))
            .meta("clip.vision.projection_dim", Value::U32(self.n_out as u32))
            .meta("clip.vision.attention.head_count", Value::U32(self.n_head as u32))
            .meta("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-6))
            .meta("clip.vision.image_size", Value::U32(560))
            .meta("clip.vision.patch_size", Value::U32(self.patch_size as u32))
            .meta("clip.vision.image_mean", Value::F32s(vec![0.481_454_66, 0.457_827_5, 0.408_210_73]))
            .meta("clip.vision.image_std", Value::F32s(vec![0.268_629_54, 0.261_302_6, 0.275_777_1]));
        if self.gated() {
            builder = builder
                .meta("clip.use_silu", Value::Bool(true))
                .meta("clip.vision.n_wa_pattern", Value::U32(self.pattern))
                .meta("clip.vision.window_size", Value::U32(self.window_size));
        }
        let matrix = |name: &str, n_in: u64, n_out: u64, rng: &mut Rng| {
            Tensor::f32(name, &[n_in, n_out], &rng.vec((n_in * n_out) as usize, 1.0 / (n_in as f32).sqrt()))
        };
        let vector = |name: &str, len: u64, rng: &mut Rng, around: f32| {
            let values: Vec<f32> = rng.vec(len as usize, 0.2).iter().map(|x| around + x).collect();
            Tensor::f32(name, &[len], &values)
        };
        let kernel = 3 * p * p;
        for name in ["v.patch_embd.weight", "v.patch_embd.weight.1"] {
            let values = rng.vec((kernel * e) as usize, 1.0 / (kernel as f32).sqrt());
            builder = builder.tensor(Tensor::f32(name, &[p, p, 3, e], &values));
        }
        let norm = |builder: GgufBuilder, name: &str, rng: &mut Rng| {
            let builder = builder.tensor(vector(&format!("{name}.weight"), e, rng, 1.0));
            if self.gated() { builder } else { builder.tensor(vector(&format!("{name}.bias"), e, rng, 0.0)) }
        };
        for layer in 0..self.n_layer {
            let name = |part: &str| format!("v.blk.{layer}.{part}");
            builder = norm(builder, &name("ln1"), &mut rng);
            for part in ["attn_q", "attn_k", "attn_v", "attn_out"] {
                builder = builder.tensor(matrix(&name(&format!("{part}.weight")), e, e, &mut rng)).tensor(vector(
                    &name(&format!("{part}.bias")),
                    e,
                    &mut rng,
                    0.0,
                ));
            }
            builder = norm(builder, &name("ln2"), &mut rng);
            let mut parts = vec![("ffn_up", e, f), ("ffn_down", f, e)];
            if self.gated() {
                parts.push(("ffn_gate", e, f));
            }
            for (part, n_in, n_out) in parts {
                builder = builder
                    .tensor(matrix(&name(&format!("{part}.weight")), n_in, n_out, &mut rng))
                    .tensor(vector(&name(&format!("{part}.bias")), n_out, &mut rng, 0.0));
            }
        }
        builder = norm(builder, "v.post_ln", &mut rng);
        let o = self.n_out as u64;
        builder
            .tensor(matrix("mm.0.weight", 4 * e, 4 * e, &mut rng))
            .tensor(vector("mm.0.bias", 4 * e, &mut rng, 0.0))
            .tensor(matrix("mm.2.weight", 4 * e, o, &mut rng))
            .tensor(vector("mm.2.bias", o, &mut rng, 0.0))
    }
}
