//! Writes GGUF v3 files for tests: synthetic models with seeded random
//! weights and deliberately corrupt files.

/// A metadata value to write.
#[derive(Debug, Clone)]
pub enum Value {
    U16(u16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U32s(Vec<u32>),
    I32s(Vec<i32>),
    F32s(Vec<f32>),
    Strs(Vec<String>),
    Bools(Vec<bool>),
}

/// A tensor to write: name, dims (innermost first), ggml type id, bytes.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

impl Tensor {
    /// An f32 tensor.
    pub fn f32(name: &str, dims: &[u64], values: &[f32]) -> Self {
        Tensor {
            name: name.into(),
            dims: dims.to_vec(),
            type_id: 0,
            data: values.iter().flat_map(|value| value.to_le_bytes()).collect(),
        }
    }
}

/// A GGUF file under construction.
#[derive(Debug, Clone, Default)]
pub struct GgufBuilder {
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<Tensor>,
    pub alignment: u64,
}

impl GgufBuilder {
    pub fn new() -> Self {
        GgufBuilder { metadata: Vec::new(), tensors: Vec::new(), alignment: 32 }
    }

    /// Add a metadata entry, replacing one with the same key.
    pub fn meta(mut self, key: &str, value: Value) -> Self {
        self.metadata.retain(|(existing, _)| existing != key);
        self.metadata.push((key.into(), value));
        self
    }

    /// Add a metadata entry even if the key is already there (a corrupt
    /// file).
    pub fn duplicate_meta(mut self, key: &str, value: Value) -> Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Drop a metadata entry.
    pub fn without_meta(mut self, key: &str) -> Self {
        self.metadata.retain(|(existing, _)| existing != key);
        self
    }

    /// Drop a tensor.
    pub fn without_tensor(mut self, name: &str) -> Self {
        self.tensors.retain(|tensor| tensor.name != name);
        self
    }

    /// Add a tensor, replacing one with the same name.
    pub fn tensor(mut self, tensor: Tensor) -> Self {
        self.tensors.retain(|existing| existing.name != tensor.name);
        self.tensors.push(tensor);
        self
    }

    /// This file cut into `n` shards as llama.cpp's `gguf-split` cuts a
    /// model: tensors in order, at most ⌈tensors / n⌉ to a shard, all the
    /// metadata in the first, and in every shard `split.no` and
    /// `split.count` (u16) and `split.tensors.count` (i32) after it. Later
    /// shards have the default alignment, as they carry no
    /// `general.alignment`.
    pub fn split(&self, n: usize) -> Vec<GgufBuilder> {
        let per_shard = self.tensors.len().div_ceil(n).max(1);
        let mut chunks: Vec<&[Tensor]> = self.tensors.chunks(per_shard).collect();
        chunks.resize(n, &[]);
        chunks
            .into_iter()
            .enumerate()
            .map(|(no, tensors)| {
                let mut metadata = if no == 0 { self.metadata.clone() } else { Vec::new() };
                metadata.extend([
                    ("split.no".to_owned(), Value::U16(no as u16)),
                    ("split.count".to_owned(), Value::U16(n as u16)),
                    ("split.tensors.count".to_owned(), Value::I32(self.tensors.len() as i32)),
                ]);
                let alignment = if no == 0 { self.alignment } else { 32 };
                GgufBuilder { metadata, tensors: tensors.to_vec(), alignment }
            })
            .collect()
    }

    /// [`GgufBuilder::split`] written to `dir` under gguf-split's names,
    /// `PREFIX-00001-of-0000N.gguf` and on; their paths in order.
    pub fn write_split(&self, dir: &std::path::Path, prefix: &str, n: usize) -> Vec<std::path::PathBuf> {
        self.split(n)
            .iter()
            .enumerate()
            .map(|(no, shard)| {
                let path = dir.join(format!("{prefix}-{:05}-of-{n:05}.gguf", no + 1));
                std::fs::write(&path, shard.build()).expect("write a shard");
                path
            })
            .collect()
    }

    /// The file's bytes; tensor offsets are laid out in order, aligned.
    pub fn build(&self) -> Vec<u8> {
        let infos: Vec<TensorInfo> = self
            .tensors
            .iter()
            .map(|t| TensorInfo { name: &t.name, dims: &t.dims, type_id: t.type_id, bytes: t.data.len() as u64 })
            .collect();
        let (mut out, offsets) = header(&self.metadata, &infos, self.alignment);
        let data_start = out.len() as u64;
        for (tensor, offset) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + offset) as usize, 0);
            out.extend_from_slice(&tensor.data);
        }
        out
    }
}

/// A tensor's header entry, for files whose data is streamed rather than
/// held (see `shapes`).
#[derive(Debug, Clone, Copy)]
pub struct TensorInfo<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
    pub type_id: u32,
    pub bytes: u64,
}

/// A GGUF header padded to where the data starts, and each tensor's
/// offset from there (in order, aligned).
pub fn header(metadata: &[(String, Value)], tensors: &[TensorInfo], alignment: u64) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        string(&mut out, key);
        write_value(&mut out, value);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for tensor in tensors {
        string(&mut out, tensor.name);
        out.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
        for dim in tensor.dims {
            out.extend_from_slice(&dim.to_le_bytes());
        }
        out.extend_from_slice(&tensor.type_id.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + tensor.bytes).div_ceil(alignment) * alignment;
    }
    let data_start = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(data_start as usize, 0);
    (out, offsets)
}

fn string(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(value.as_bytes());
}

fn array_header(out: &mut Vec<u8>, element_type: u32, len: usize) {
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&element_type.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U16(value) => {
            out.extend_from_slice(&2u32.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        }
        Value::U32(value) => {
            out.extend_from_slice(&4u32.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        }
        Value::I32(value) => {
            out.extend_from_slice(&5u32.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        }
        Value::F32(value) => {
            out.extend_from_slice(&6u32.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        }
        Value::Bool(value) => {
            out.extend_from_slice(&7u32.to_le_bytes());
            out.push(u8::from(*value));
        }
        Value::Str(value) => {
            out.extend_from_slice(&8u32.to_le_bytes());
            string(out, value);
        }
        Value::U32s(values) => {
            array_header(out, 4, values.len());
            values.iter().for_each(|value| out.extend_from_slice(&value.to_le_bytes()));
        }
        Value::I32s(values) => {
            array_header(out, 5, values.len());
            values.iter().for_each(|value| out.extend_from_slice(&value.to_le_bytes()));
        }
        Value::F32s(values) => {
            array_header(out, 6, values.len());
            values.iter().for_each(|value| out.extend_from_slice(&value.to_le_bytes()));
        }
        Value::Strs(values) => {
            array_header(out, 8, values.len());
            values.iter().for_each(|value| string(out, value));
        }
        Value::Bools(values) => {
            array_header(out, 7, values.len());
            values.iter().for_each(|value| out.push(u8::from(*value)));
        }
    }
}

/// A small deterministic PRNG (SplitMix64) for seeded weights.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-scale, scale).
    pub fn uniform(&mut self, scale: f32) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }

    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform(scale)).collect()
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next_u64() % n as u64) as usize }
    }

    /// True once in `n` times.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One of `items`, which must not be empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Shape of a synthetic transformer.
#[derive(Debug, Clone)]
pub struct TinyModel {
    pub arch: &'static str,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub sections: Option<[i32; 4]>,
    /// Token texts (default `t0`, `t1`, …).
    pub tokens: Option<Vec<String>>,
    /// A mixture of experts in place of each layer's MLP.
    pub experts: Option<TinyExperts>,
    pub seed: u64,
}

/// The experts of a [`TinyModel`], in llama.cpp's layout: a router
/// (`ffn_gate_inp`), 3-D `ffn_{gate,up,down}_exps` and, where `shared` is
/// set, a shared expert of that width with its gate (`ffn_*_shexp`).
#[derive(Debug, Clone, Copy)]
pub struct TinyExperts {
    pub count: usize,
    pub used: usize,
    /// Each expert's width, written as `expert_feed_forward_length`
    /// except on `llama` (Mixtral), whose experts are `n_ff` wide.
    pub n_ff: usize,
    pub shared: Option<usize>,
}

impl TinyExperts {
    /// Layer `layer`'s expert tensors, for a model `n_embd` wide.
    fn tensors(&self, builder: GgufBuilder, layer: usize, n_embd: u64, rng: &mut Rng) -> GgufBuilder {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        let (count, f) = (self.count as u64, self.n_ff as u64);
        let weights = |n_in: u64, n: u64, rng: &mut Rng| rng.vec(n as usize, 1.0 / (n_in as f32).sqrt());
        // A router three times as wide as the other matrices spreads the
        // experts' probabilities, so that rows rarely choose between near
        // ties.
        let router: Vec<f32> = weights(n_embd, n_embd * count, rng).iter().map(|w| 3.0 * w).collect();
        let builder = builder
            .tensor(Tensor::f32(&name("ffn_gate_inp.weight"), &[n_embd, count], &router))
            .tensor(Tensor::f32(
                &name("ffn_gate_exps.weight"),
                &[n_embd, f, count],
                &weights(n_embd, n_embd * f * count, rng),
            ))
            .tensor(Tensor::f32(
                &name("ffn_up_exps.weight"),
                &[n_embd, f, count],
                &weights(n_embd, n_embd * f * count, rng),
            ))
            .tensor(Tensor::f32(
                &name("ffn_down_exps.weight"),
                &[f, n_embd, count],
                &weights(f, n_embd * f * count, rng),
            ));
        let Some(width) = self.shared else { return builder };
        let s = width as u64;
        builder
            .tensor(Tensor::f32(&name("ffn_gate_inp_shexp.weight"), &[n_embd], &weights(n_embd, n_embd, rng)))
            .tensor(Tensor::f32(&name("ffn_gate_shexp.weight"), &[n_embd, s], &weights(n_embd, n_embd * s, rng)))
            .tensor(Tensor::f32(&name("ffn_up_shexp.weight"), &[n_embd, s], &weights(n_embd, n_embd * s, rng)))
            .tensor(Tensor::f32(&name("ffn_down_shexp.weight"), &[s, n_embd], &weights(s, n_embd * s, rng)))
    }

    /// The experts' metadata under `arch`'s keys.
    fn meta(&self, builder: GgufBuilder, arch: &str) -> GgufBuilder {
        let builder = builder
            .meta(&format!("{arch}.expert_count"), Value::U32(self.count as u32))
            .meta(&format!("{arch}.expert_used_count"), Value::U32(self.used as u32));
        let builder = match arch {
            "llama" => builder,
            _ => builder.meta(&format!("{arch}.expert_feed_forward_length"), Value::U32(self.n_ff as u32)),
        };
        match self.shared {
            Some(width) => builder.meta(&format!("{arch}.expert_shared_feed_forward_length"), Value::U32(width as u32)),
            None => builder,
        }
    }
}

impl TinyModel {
    /// A tiny llama with a byte-level vocabulary of `n_vocab` tokens.
    pub fn llama(seed: u64) -> Self {
        TinyModel {
            arch: "llama",
            n_vocab: 64,
            n_embd: 32,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 64,
            sections: None,
            tokens: None,
            experts: None,
            seed,
        }
    }

    /// The shape of specs' synthetic pairs (reference §6): 64 wide, heads
    /// of 16, a vocabulary of 32.
    pub fn recipe(arch: &'static str, seed: u64) -> Self {
        TinyModel { arch, n_vocab: 32, n_embd: 64, n_layer: 2, n_head: 4, n_head_kv: 2, n_ff: 128, ..Self::llama(seed) }
    }

    /// The model as a GGUF file with seeded random f32 weights.
    pub fn build(&self) -> GgufBuilder {
        let mut rng = Rng::new(self.seed);
        let arch = self.arch;
        let head_dim = self.n_embd / self.n_head;
        let kv_dim = head_dim * self.n_head_kv;
        let (e, v, f) = (self.n_embd as u64, self.n_vocab as u64, self.n_ff as u64);
        let tokens: Vec<String> =
            self.tokens.clone().unwrap_or_else(|| (0..self.n_vocab).map(|id| format!("t{id}")).collect());
        let mut builder = GgufBuilder::new()
            .meta("general.architecture", Value::Str(arch.into()))
            .meta(&format!("{arch}.context_length"), Value::U32(512))
            .meta(&format!("{arch}.embedding_length"), Value::U32(self.n_embd as u32))
            .meta(&format!("{arch}.block_count"), Value::U32(self.n_layer as u32))
            .meta(&format!("{arch}.feed_forward_length"), Value::U32(self.n_ff as u32))
            .meta(&format!("{arch}.attention.head_count"), Value::U32(self.n_head as u32))
            .meta(&format!("{arch}.attention.head_count_kv"), Value::U32(self.n_head_kv as u32))
            .meta(&format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
            .meta(&format!("{arch}.rope.freq_base"), Value::F32(10000.0))
            .meta("tokenizer.ggml.model", Value::Str("gpt2".into()))
            .meta("tokenizer.ggml.tokens", Value::Strs(tokens))
            .meta("tokenizer.ggml.merges", Value::Strs(Vec::new()));
        if let Some(sections) = self.sections {
            builder = builder.meta(&format!("{arch}.rope.dimension_sections"), Value::I32s(sections.to_vec()));
        }
        let matrix = |name: String, n_in: u64, n_out: u64, rng: &mut Rng| {
            let scale = 1.0 / (n_in as f32).sqrt();
            Tensor::f32(&name, &[n_in, n_out], &rng.vec((n_in * n_out) as usize, scale))
        };
        let dflash = arch == "dflash";
        if !dflash {
            builder = builder.tensor(matrix("token_embd.weight".into(), e, v, &mut rng));
        }
        builder = builder.tensor(Tensor::f32("output_norm.weight", &[e], &vec![1.0; self.n_embd]));
        let qkv_bias = matches!(arch, "qwen2" | "qwen2vl" | "glm4" | "glm4moe" | "qwen2moe");
        let qwen3 = matches!(arch, "qwen3" | "qwen3vl" | "dflash" | "gemma3" | "qwen3moe" | "qwen3vlmoe");
        // OLMo 2: no pre-norms, Q/K norms over the whole vectors, post-norms;
        // Granite: its one required multiplier.
        let olmo2 = arch == "olmo2";
        let post_norms = matches!(arch, "gemma2" | "gemma3" | "glm4" | "olmo2");
        if arch == "granite" {
            builder = builder.meta("granite.logit_scale", Value::F32(8.0));
        }
        for layer in 0..self.n_layer {
            let name = |suffix: &str| format!("blk.{layer}.{suffix}");
            let norm = |rng: &mut Rng, len: usize| rng.vec(len, 0.2).iter().map(|x| 1.0 + x).collect::<Vec<f32>>();
            builder = builder
                .tensor(Tensor::f32(&name("attn_norm.weight"), &[e], &norm(&mut rng, self.n_embd)))
                .tensor(matrix(name("attn_q.weight"), e, e, &mut rng))
                .tensor(matrix(name("attn_k.weight"), e, kv_dim as u64, &mut rng))
                .tensor(matrix(name("attn_v.weight"), e, kv_dim as u64, &mut rng))
                .tensor(matrix(name("attn_output.weight"), e, e, &mut rng))
                .tensor(Tensor::f32(&name("ffn_norm.weight"), &[e], &norm(&mut rng, self.n_embd)));
            builder = match self.experts {
                None => builder
                    .tensor(matrix(name("ffn_gate.weight"), e, f, &mut rng))
                    .tensor(matrix(name("ffn_up.weight"), e, f, &mut rng))
                    .tensor(matrix(name("ffn_down.weight"), f, e, &mut rng)),
                Some(experts) => experts.tensors(builder, layer, e, &mut rng),
            };
            if olmo2 {
                builder = builder
                    .without_tensor(&name("attn_norm.weight"))
                    .without_tensor(&name("ffn_norm.weight"))
                    .tensor(Tensor::f32(&name("attn_q_norm.weight"), &[e], &norm(&mut rng, self.n_embd)))
                    .tensor(Tensor::f32(&name("attn_k_norm.weight"), &[kv_dim as u64], &norm(&mut rng, kv_dim)));
            }
            if qkv_bias {
                builder = builder
                    .tensor(Tensor::f32(&name("attn_q.bias"), &[e], &rng.vec(self.n_embd, 0.1)))
                    .tensor(Tensor::f32(&name("attn_k.bias"), &[kv_dim as u64], &rng.vec(kv_dim, 0.1)))
                    .tensor(Tensor::f32(&name("attn_v.bias"), &[kv_dim as u64], &rng.vec(kv_dim, 0.1)));
            }
            if qwen3 {
                builder = builder
                    .tensor(Tensor::f32(&name("attn_q_norm.weight"), &[head_dim as u64], &norm(&mut rng, head_dim)))
                    .tensor(Tensor::f32(&name("attn_k_norm.weight"), &[head_dim as u64], &norm(&mut rng, head_dim)));
            }
            if post_norms {
                builder = builder
                    .tensor(Tensor::f32(&name("post_attention_norm.weight"), &[e], &norm(&mut rng, self.n_embd)))
                    .tensor(Tensor::f32(&name("post_ffw_norm.weight"), &[e], &norm(&mut rng, self.n_embd)));
            }
        }
        if let Some(experts) = self.experts {
            builder = experts.meta(builder, arch);
        }
        if olmo2 {
            // Its head is never tied.
            builder = builder.tensor(matrix("output.weight".into(), e, v, &mut rng));
        }
        builder
    }

    /// A DFlash draft of this shape for a target of width `target_embd`
    /// tapped at `target_layers`: Qwen3-style layers, `fc` and
    /// `enc.output_norm`, no embeddings or LM head of its own (borrowed),
    /// mask token = the last id, block of `block_size`, legacy rope (no
    /// sections).
    pub fn dflash(&self, target_layers: &[i32], target_embd: usize, block_size: u32) -> GgufBuilder {
        let draft = TinyModel { arch: "dflash", ..self.clone() };
        let mut rng = Rng::new(self.seed ^ 0xdf1a5);
        let fc_in = (target_layers.len() * target_embd) as u64;
        let fc = rng.vec(fc_in as usize * self.n_embd, 1.0 / (fc_in as f32).sqrt());
        draft
            .build()
            .meta("dflash.target_layers", Value::I32s(target_layers.to_vec()))
            .meta("dflash.block_size", Value::U32(block_size))
            .meta("tokenizer.ggml.mask_token_id", Value::U32(self.n_vocab as u32 - 1))
            .meta("dflash.attention.key_length", Value::U32((self.n_embd / self.n_head) as u32))
            .meta("dflash.attention.value_length", Value::U32((self.n_embd / self.n_head) as u32))
            .tensor(Tensor::f32("fc.weight", &[fc_in, self.n_embd as u64], &fc))
            .tensor(Tensor::f32("enc.output_norm.weight", &[self.n_embd as u64], &vec![1.0; self.n_embd]))
    }
}
