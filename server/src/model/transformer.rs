//! The decoder-only transformer shared by llama, qwen2, qwen3 and the text
//! path of qwen2vl/qwen3vl: RMSNorm, rotary attention with grouped KV heads
//! (q/k norms on qwen3, q/k/v biases on qwen2), SwiGLU feed-forward. Loading
//! checks every tensor the architecture needs and makes the weights resident
//! on the model's [`Backend`]; running it is `forward`'s business.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_kernels::backend::{Backend, MatrixSource};
use sluice_kernels::ops::{self, HeadShape, Rope};
use sluice_kernels::quant::{DType, dequantize_row};

use super::dflash::DflashParams;
use super::gguf::{GgufError, GgufFile};
use super::hparams::{Architecture, HParams, HParamsError, RopeStyle};
use super::lora::{self, Adapter};

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    HParams(#[from] HParamsError),
    #[error("tensor {name:?}: {problem}")]
    Tensor { name: String, problem: String },
    #[error("LoRA adapter {}: {problem}", path.display())]
    Adapter { path: PathBuf, problem: String },
}

/// A weight matrix resident on the backend, with its shape.
pub(super) struct Weight<B: Backend> {
    pub(super) matrix: B::Matrix,
    pub(super) n_in: usize,
    pub(super) n_out: usize,
}

pub(super) struct Layer<B: Backend> {
    pub(super) attn_norm: B::Vector,
    pub(super) q: Weight<B>,
    pub(super) k: Weight<B>,
    pub(super) v: Weight<B>,
    pub(super) q_bias: Option<B::Vector>,
    pub(super) k_bias: Option<B::Vector>,
    pub(super) v_bias: Option<B::Vector>,
    pub(super) q_norm: Option<B::Vector>,
    pub(super) k_norm: Option<B::Vector>,
    pub(super) output: Weight<B>,
    pub(super) ffn_norm: B::Vector,
    pub(super) gate: Weight<B>,
    pub(super) up: Weight<B>,
    pub(super) down: Weight<B>,
}

/// A loaded model: hyper-parameters, and its weights on a backend.
pub struct Transformer<B: Backend> {
    pub(super) backend: Arc<B>,
    pub(super) file: GgufFile,
    pub(super) hparams: HParams,
    /// A DFlash draft without its own uses its target's.
    pub(super) token_embd: Option<Arc<Weight<B>>>,
    pub(super) output_norm: B::Vector,
    /// A DFlash draft without its own uses its target's LM head.
    pub(super) output: Option<Arc<Weight<B>>>,
    pub(super) layers: Vec<Layer<B>>,
    /// A DFlash draft's feature fusion: `fc` (the target taps, concatenated,
    /// to n_embd), then RMSNorm with `enc.output_norm`.
    pub(super) fusion: Option<(Weight<B>, B::Vector)>,
    pub(super) rope: Rope,
    pub(super) heads: HeadShape,
    /// LoRA adapters, by id (load order).
    pub(super) adapters: Vec<Adapter<B>>,
}

impl<B: Backend> Transformer<B> {
    /// Open a GGUF file and load it onto `backend`.
    pub fn load(path: &Path, backend: Arc<B>) -> Result<Self, LoadError> {
        Self::from_file(GgufFile::open(path)?, backend)
    }

    pub fn from_file(file: GgufFile, backend: Arc<B>) -> Result<Self, LoadError> {
        Self::lending(file, backend, None)
    }

    /// Load `file`; a DFlash draft takes what it lacks of the embedding
    /// table and the LM head from `target` (its weights, not copies).
    pub(super) fn lending(file: GgufFile, backend: Arc<B>, target: Option<&Self>) -> Result<Self, LoadError> {
        let hparams = HParams::from_gguf(&file)?;
        let hp = &hparams;
        let b = &*backend;
        let borrows = hp.arch == Architecture::Dflash;
        let lent = |pick: fn(&Self) -> &Option<Arc<Weight<B>>>| target.and_then(|target| pick(target).clone());
        let token_embd = match file.tensor("token_embd.weight") {
            None if borrows => lent(|target| &target.token_embd),
            _ => Some(Arc::new(weight(b, &file, "token_embd.weight", hp.n_embd, hp.n_vocab)?)),
        };
        // A reduced-vocabulary DFlash head has one row per `d2t` entry.
        let head_rows = file.tensor("d2t").filter(|_| borrows).map_or(hp.n_vocab, |d2t| d2t.elements() as usize);
        let output = match (file.tensor("output.weight"), &token_embd) {
            (Some(_), _) => Some(Arc::new(weight(b, &file, "output.weight", hp.n_embd, head_rows)?)),
            (None, _) if borrows => lent(|target| &target.output),
            // Tied embeddings: the LM head is the embedding table.
            (None, token_embd) => token_embd.clone(),
        };
        let output_norm = vector(b, &file, "output_norm.weight", hp.n_embd)?;
        let qwen2_biases = matches!(hp.arch, Architecture::Qwen2 | Architecture::Qwen2Vl);
        let qk_norms = matches!(hp.arch, Architecture::Qwen3 | Architecture::Qwen3Vl | Architecture::Dflash);
        let layers = (0..hp.n_layer)
            .map(|layer| {
                let name = |suffix: &str| format!("blk.{layer}.{suffix}");
                let optional = |suffix: &str, len: usize, present: bool| -> Result<Option<B::Vector>, LoadError> {
                    let tensor_name = name(suffix);
                    match file.tensor(&tensor_name) {
                        Some(_) => vector(b, &file, &tensor_name, len).map(Some),
                        None if present => Err(tensor_problem(&tensor_name, "missing")),
                        None => Ok(None),
                    }
                };
                Ok(Layer {
                    attn_norm: vector(b, &file, &name("attn_norm.weight"), hp.n_embd)?,
                    q: weight(b, &file, &name("attn_q.weight"), hp.n_embd, hp.q_dim())?,
                    k: weight(b, &file, &name("attn_k.weight"), hp.n_embd, hp.kv_dim())?,
                    v: weight(b, &file, &name("attn_v.weight"), hp.n_embd, hp.kv_dim())?,
                    q_bias: optional("attn_q.bias", hp.q_dim(), qwen2_biases)?,
                    k_bias: optional("attn_k.bias", hp.kv_dim(), qwen2_biases)?,
                    v_bias: optional("attn_v.bias", hp.kv_dim(), qwen2_biases)?,
                    q_norm: optional("attn_q_norm.weight", hp.head_dim, qk_norms)?,
                    k_norm: optional("attn_k_norm.weight", hp.head_dim, qk_norms)?,
                    output: weight(b, &file, &name("attn_output.weight"), hp.q_dim(), hp.n_embd)?,
                    ffn_norm: vector(b, &file, &name("ffn_norm.weight"), hp.n_embd)?,
                    gate: weight(b, &file, &name("ffn_gate.weight"), hp.n_embd, hp.n_ff)?,
                    up: weight(b, &file, &name("ffn_up.weight"), hp.n_embd, hp.n_ff)?,
                    down: weight(b, &file, &name("ffn_down.weight"), hp.n_ff, hp.n_embd)?,
                })
            })
            .collect::<Result<_, LoadError>>()?;
        let fusion = match hp.arch {
            Architecture::Dflash => {
                let n_taps = DflashParams::from_gguf(&file)?.target_layers.len();
                Some((
                    weight(b, &file, "fc.weight", n_taps * hp.n_embd, hp.n_embd)?,
                    vector(b, &file, "enc.output_norm.weight", hp.n_embd)?,
                ))
            }
            _ => None,
        };
        if file.tensor("rope_freqs.weight").is_some() {
            return Err(tensor_problem("rope_freqs.weight", "per-frequency rope factors are not supported yet"));
        }
        let rope = Rope::new(hp.head_dim, hp.n_rot, hp.rope_base, hp.rope_freq_scale, rope_kind(hp.rope))
            .map_err(|error| tensor_problem("rope", &error.to_string()))?;
        let heads = HeadShape::new(hp.n_head, hp.n_head_kv, hp.head_dim)
            .map_err(|error| tensor_problem("attention", &error.to_string()))?;
        let adapters = Vec::new();
        Ok(Transformer {
            backend,
            file,
            hparams,
            token_embd,
            output_norm,
            output,
            layers,
            fusion,
            rope,
            heads,
            adapters,
        })
    }

    /// Load LoRA adapters (ids in this order), each checked against this
    /// model's weights.
    pub fn with_adapters(mut self, paths: &[PathBuf]) -> Result<Self, LoadError> {
        for path in paths {
            let adapter = lora::load(&self, path)?;
            self.adapters.push(adapter);
        }
        Ok(self)
    }
}

fn rope_kind(style: RopeStyle) -> ops::RopeKind {
    match style {
        RopeStyle::Norm => ops::RopeKind::Norm,
        RopeStyle::Neox => ops::RopeKind::Neox,
        RopeStyle::MRope(sections) => ops::RopeKind::MRope { sections },
        RopeStyle::IMRope(sections) => ops::RopeKind::IMRope { sections },
    }
}

pub(super) fn tensor_problem(name: &str, problem: &str) -> LoadError {
    LoadError::Tensor { name: name.into(), problem: problem.into() }
}

/// A weight matrix of GGUF shape `[n_in, n_out]`, made resident.
pub(super) fn weight<B: Backend>(
    backend: &B,
    file: &GgufFile,
    name: &str,
    n_in: usize,
    n_out: usize,
) -> Result<Weight<B>, LoadError> {
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    if tensor.dims.len() != 2 || tensor.dims[0] != n_in as u64 || tensor.dims[1] != n_out as u64 {
        return Err(tensor_problem(name, &format!("shape {:?}, expected [{n_in}, {n_out}]", tensor.dims)));
    }
    let dtype = tensor
        .dtype
        .weights()
        .ok_or_else(|| tensor_problem(name, &format!("type {} is not a weight format", tensor.dtype.name())))?;
    let bytes = file.shared_data(tensor).ok_or_else(|| tensor_problem(name, "data outside the file"))?;
    let matrix = backend
        .matrix(MatrixSource { dtype, bytes, n_out, n_in })
        .map_err(|error| tensor_problem(name, &error.to_string()))?;
    Ok(Weight { matrix, n_in, n_out })
}

/// A small f32 (or f16/bf16) vector, dequantized and made resident.
pub(super) fn vector<B: Backend>(backend: &B, file: &GgufFile, name: &str, len: usize) -> Result<B::Vector, LoadError> {
    let values = host_vector(file, name, len)?;
    backend.vector(&values).map_err(|error| tensor_problem(name, &error.to_string()))
}

/// A small f32 (or f16/bf16) vector's values.
pub(super) fn host_vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
    let tensor = file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
    if tensor.elements() != len as u64 {
        return Err(tensor_problem(name, &format!("shape {:?}, expected [{len}]", tensor.dims)));
    }
    let Some(dtype @ (DType::F32 | DType::F16 | DType::BF16)) = tensor.dtype.weights() else {
        return Err(tensor_problem(name, &format!("type {} for a norm/bias vector", tensor.dtype.name())));
    };
    let mut values = vec![0.0; len];
    dequantize_row(dtype, file.data(tensor), &mut values).map_err(|error| tensor_problem(name, &error.to_string()))?;
    Ok(values)
}
