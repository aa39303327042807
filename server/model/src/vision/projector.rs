//! A projector (mmproj) file of llama.cpp's `clip` format for the Qwen2-VL
//! and Qwen2.5-VL towers: its hyper-parameters, and its weights checked
//! against them and made resident on the text model's backend.

use std::sync::Arc;

use sluice_kernels::backend::{Backend, MatrixSource, SharedBytes};
use sluice_kernels::ops::{Gelu, HeadShape, Rope, RopeKind};
use sluice_kernels::quant::{DType, dequantize_row};

use super::image::{ImageSpec, row_pixels};
use crate::gguf::GgufFile;
use crate::weights::{LoadError, Weight, host_vector, tensor_problem, vector, weight};

/// The towers sluice runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectorKind {
    /// `qwen2vl_merger`: LayerNorm, a plain MLP, full attention.
    Qwen2Vl,
    /// `qwen2.5vl_merger`: RMSNorm, a gated MLP, window attention in all
    /// but every `n_wa_pattern`-th block.
    Qwen25Vl,
}

impl ProjectorKind {
    fn from_name(name: &str) -> Result<Self, LoadError> {
        match name {
            "qwen2vl_merger" => Ok(Self::Qwen2Vl),
            // An older converter's name for Qwen2.5-Omni's vision tower.
            "qwen2.5vl_merger" | "qwen2.5o" => Ok(Self::Qwen25Vl),
            other => Err(hparam(
                "clip.projector_type",
                format!("projector type {other:?} is not supported (sluice runs qwen2vl_merger and qwen2.5vl_merger)"),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen2Vl => "qwen2vl_merger",
            Self::Qwen25Vl => "qwen2.5vl_merger",
        }
    }
}

/// What a projector is, for the log, `/props` and the preprocessing.
#[derive(Clone, Debug, PartialEq)]
pub struct ProjectorInfo {
    pub kind: ProjectorKind,
    pub image: ImageSpec,
    pub n_embd: usize,
    pub n_layer: usize,
    /// Width of its output rows: the text model's embedding width.
    pub n_out: usize,
    /// Window attention: every `pattern`-th block attends to the whole
    /// image, the others within windows of `side × side` output rows.
    pub windows: Option<Windows>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub pattern: usize,
    pub side: usize,
}

/// A norm: LayerNorm (weight and bias on the host) or RMSNorm.
pub(super) enum Norm<B: Backend> {
    Layer { weight: Vec<f32>, bias: Vec<f32> },
    Rms { weight: B::Vector, bias: Option<B::Vector> },
}

/// The feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Activation {
    Gelu(Gelu),
    /// `silu(gate) · up`.
    SwiGlu,
}

pub(super) struct Linear<B: Backend> {
    pub(super) weight: Weight<B>,
    pub(super) bias: Option<B::Vector>,
}

pub(super) struct Block<B: Backend> {
    pub(super) ln1: Norm<B>,
    pub(super) q: Linear<B>,
    pub(super) k: Linear<B>,
    pub(super) v: Linear<B>,
    pub(super) output: Linear<B>,
    pub(super) ln2: Norm<B>,
    pub(super) up: Linear<B>,
    pub(super) gate: Option<Linear<B>>,
    pub(super) down: Linear<B>,
}

/// A loaded tower.
pub struct Projector<B: Backend> {
    pub(super) backend: Arc<B>,
    pub(super) info: ProjectorInfo,
    /// The two temporal patch kernels of a still image, summed: `n_embd`
    /// rows of `3 × patch × patch` (channel, row, column).
    pub(super) patch: Weight<B>,
    pub(super) pre_norm: Option<Norm<B>>,
    pub(super) blocks: Vec<Block<B>>,
    pub(super) post_norm: Option<Norm<B>>,
    pub(super) activation: Activation,
    pub(super) eps: f32,
    pub(super) heads: HeadShape,
    pub(super) rope: Rope,
    /// The merger: 2 × 2 patches concatenated, `mm.0`, GELU, `mm.2`.
    pub(super) merge_in: Linear<B>,
    pub(super) merge_out: Linear<B>,
}

fn hparam(key: &str, problem: impl std::fmt::Display) -> LoadError {
    tensor_problem(key, &problem.to_string())
}

fn count(file: &GgufFile, key: &str) -> Result<usize, LoadError> {
    match file.u32(key)? {
        0 => Err(hparam(key, "must be positive")),
        n => Ok(n as usize),
    }
}

/// The image mean or standard deviation: three finite values (the
/// deviations positive).
fn statistic(file: &GgufFile, key: &str, positive: bool) -> Result<[f32; 3], LoadError> {
    let values = file.floats(key)?;
    let values: [f32; 3] =
        values.try_into().map_err(|values: Vec<f32>| hparam(key, format!("{} values, expected 3", values.len())))?;
    if values.iter().any(|v| !v.is_finite() || (positive && *v <= 0.0)) {
        return Err(hparam(key, format!("{values:?} must be finite{}", if positive { " and positive" } else { "" })));
    }
    Ok(values)
}

impl<B: Backend> Projector<B> {
    /// Load `file` onto `backend` for a text model `n_text_embd` wide.
    pub fn load(file: &GgufFile, backend: Arc<B>, n_text_embd: usize) -> Result<Self, LoadError> {
        let architecture = file.str("general.architecture")?;
        if architecture != "clip" {
            return Err(hparam("general.architecture", format!("{architecture:?} is not a projector (\"clip\")")));
        }
        if file.opt_bool("clip.has_vision_encoder")? == Some(false) {
            return Err(hparam("clip.has_vision_encoder", "the file has no vision encoder"));
        }
        let type_name = match file.opt_str("clip.projector_type")? {
            Some(name) => name,
            None => file.str("clip.vision.projector_type")?,
        };
        let kind = ProjectorKind::from_name(type_name)?;
        let n_embd = count(file, "clip.vision.embedding_length")?;
        let n_head = count(file, "clip.vision.attention.head_count")?;
        let n_layer = count(file, "clip.vision.block_count")?;
        let patch_size = count(file, "clip.vision.patch_size")?;
        let eps = file.opt_f32("clip.vision.attention.layer_norm_epsilon")?.unwrap_or(1e-6);
        let merge = file.opt_u32("clip.vision.spatial_merge_size")?.unwrap_or(2);
        if merge != 2 {
            return Err(hparam("clip.vision.spatial_merge_size", format!("{merge}: these towers merge 2 × 2 patches")));
        }
        let head_dim = n_embd / n_head;
        if head_dim * n_head != n_embd || !head_dim.is_multiple_of(4) {
            return Err(hparam(
                "clip.vision.attention.head_count",
                format!("{n_head} heads do not split width {n_embd} into heads of a multiple of 4"),
            ));
        }
        let heads =
            HeadShape::new(n_head, n_head, head_dim).map_err(|e| hparam("clip.vision.attention.head_count", e))?;
        let rope = Rope::new(head_dim, head_dim, 10_000.0, 1.0, RopeKind::Vision)
            .map_err(|e| hparam("clip.vision.attention.head_count", e))?;
        let windows = match (kind, file.opt_u32("clip.vision.n_wa_pattern")?) {
            (ProjectorKind::Qwen2Vl, _) | (ProjectorKind::Qwen25Vl, Some(0)) => None,
            (ProjectorKind::Qwen25Vl, None) => {
                return Err(hparam("clip.vision.n_wa_pattern", "missing (qwen2.5vl_merger needs it)"));
            }
            (ProjectorKind::Qwen25Vl, Some(pattern)) => {
                let size = file.opt_u32("clip.vision.window_size")?.filter(|&size| size > 0).unwrap_or(112) as usize;
                let side = size / patch_size / 2;
                if side == 0 {
                    return Err(hparam("clip.vision.window_size", format!("{size} is smaller than 2 patches")));
                }
                Some(Windows { pattern: pattern as usize, side })
            }
        };
        // Qwen's preprocessor: 8 to 4096 output rows' worth of pixels.
        let image = ImageSpec {
            patch_size: patch_size as u32,
            merge,
            min_pixels: row_pixels(patch_size as u32, merge, 8),
            max_pixels: row_pixels(patch_size as u32, merge, 4096),
            mean: statistic(file, "clip.vision.image_mean", false)?,
            std: statistic(file, "clip.vision.image_std", true)?,
        };
        let activation = match (file.opt_bool("clip.use_gelu")?, file.opt_bool("clip.use_silu")?) {
            (Some(true), Some(true)) => return Err(hparam("clip.use_silu", "both clip.use_gelu and clip.use_silu")),
            (Some(true), _) => Activation::Gelu(Gelu::Tanh),
            (_, Some(true)) => Activation::SwiGlu,
            _ => Activation::Gelu(Gelu::Quick),
        };
        let n_ff = file.opt_u32("clip.vision.feed_forward_length")?.map(|n| n as usize);
        let loader = Loader { file, backend: &*backend, n_embd, n_ff, kind };
        if file.tensor("v.patch_embd.bias").is_some() || file.tensor("v.class_embd").is_some() {
            return Err(hparam("v.patch_embd.bias", "these towers have no patch bias or class embedding"));
        }
        let patch = loader.patch_kernel(patch_size)?;
        let blocks = (0..n_layer).map(|layer| loader.block(layer, activation)).collect::<Result<Vec<_>, _>>()?;
        let merge_in = loader.linear_any("mm.0", 4 * n_embd)?;
        let merge_out = loader.linear("mm.2", merge_in.weight.n_out, n_text_embd)?;
        let info = ProjectorInfo { kind, image, n_embd, n_layer, n_out: n_text_embd, windows };
        Ok(Projector {
            info,
            patch,
            pre_norm: loader.optional_norm("v.pre_ln")?,
            blocks,
            post_norm: loader.optional_norm("v.post_ln")?,
            activation,
            eps,
            heads,
            rope,
            merge_in,
            merge_out,
            backend,
        })
    }

    pub fn info(&self) -> &ProjectorInfo {
        &self.info
    }
}

struct Loader<'a, B: Backend> {
    file: &'a GgufFile,
    backend: &'a B,
    n_embd: usize,
    /// `clip.vision.feed_forward_length`, which the MLP matrices must match.
    n_ff: Option<usize>,
    kind: ProjectorKind,
}

impl<B: Backend> Loader<'_, B> {
    fn bias(&self, name: &str, len: usize) -> Result<Option<B::Vector>, LoadError> {
        let name = format!("{name}.bias");
        self.file.tensor(&name).map(|_| vector(self.backend, self.file, &name, len)).transpose()
    }

    /// `name.weight` of `[n_in, n_out]` and its bias, if any.
    fn linear(&self, name: &str, n_in: usize, n_out: usize) -> Result<Linear<B>, LoadError> {
        let weight = weight(self.backend, self.file, &format!("{name}.weight"), n_in, n_out)?;
        Ok(Linear { weight, bias: self.bias(name, n_out)? })
    }

    /// [`Loader::linear`] taking its output width from the file.
    fn linear_any(&self, name: &str, n_in: usize) -> Result<Linear<B>, LoadError> {
        let tensor_name = format!("{name}.weight");
        let tensor = self.file.tensor(&tensor_name).ok_or_else(|| tensor_problem(&tensor_name, "missing"))?;
        let n_out = match tensor.dims[..] {
            [_, n_out] if n_out > 0 => n_out as usize,
            _ => return Err(tensor_problem(&tensor_name, &format!("shape {:?}, expected [{n_in}, n]", tensor.dims))),
        };
        self.linear(name, n_in, n_out)
    }

    fn norm(&self, name: &str) -> Result<Norm<B>, LoadError> {
        let weight_name = format!("{name}.weight");
        let bias_name = format!("{name}.bias");
        Ok(match self.kind {
            ProjectorKind::Qwen2Vl => Norm::Layer {
                weight: host_vector(self.file, &weight_name, self.n_embd)?,
                bias: host_vector(self.file, &bias_name, self.n_embd)?,
            },
            ProjectorKind::Qwen25Vl => Norm::Rms {
                weight: vector(self.backend, self.file, &weight_name, self.n_embd)?,
                bias: self.bias(name, self.n_embd)?,
            },
        })
    }

    fn optional_norm(&self, name: &str) -> Result<Option<Norm<B>>, LoadError> {
        self.file.tensor(&format!("{name}.weight")).map(|_| self.norm(name)).transpose()
    }

    fn block(&self, layer: usize, activation: Activation) -> Result<Block<B>, LoadError> {
        let e = self.n_embd;
        let name = |part: &str| format!("v.blk.{layer}.{part}");
        let n_ff = |part: &str, index: usize| {
            let tensor_name = name(&format!("{part}.weight"));
            self.file.tensor(&tensor_name).map(|tensor| tensor.dims.get(index).copied().unwrap_or(0) as usize)
        };
        // Older conversions swapped the names of the up and down matrices;
        // their shapes tell (llama.cpp swaps them back the same way).
        let swapped = n_ff("ffn_down", 0) == Some(e) && n_ff("ffn_up", 1) == Some(e);
        let (up, down) = if swapped { ("ffn_down", "ffn_up") } else { ("ffn_up", "ffn_down") };
        let up_name = name(&format!("{up}.weight"));
        let ff = n_ff(up, 1).ok_or_else(|| tensor_problem(&up_name, "missing"))?;
        if let Some(want) = self.n_ff.filter(|&want| want != ff) {
            return Err(tensor_problem(
                &up_name,
                &format!("{ff} outputs, but clip.vision.feed_forward_length is {want}"),
            ));
        }
        let gate =
            self.file.tensor(&name("ffn_gate.weight")).map(|_| self.linear(&name("ffn_gate"), e, ff)).transpose()?;
        match (&gate, activation) {
            (Some(_), Activation::Gelu(_)) => {
                return Err(tensor_problem(&name("ffn_gate.weight"), "a gated feed-forward needs clip.use_silu"));
            }
            (None, Activation::SwiGlu) => {
                return Err(tensor_problem(&name("ffn_gate.weight"), "missing (clip.use_silu)"));
            }
            _ => {}
        }
        Ok(Block {
            ln1: self.norm(&name("ln1"))?,
            q: self.linear(&name("attn_q"), e, e)?,
            k: self.linear(&name("attn_k"), e, e)?,
            v: self.linear(&name("attn_v"), e, e)?,
            output: self.linear(&name("attn_out"), e, e)?,
            ln2: self.norm(&name("ln2"))?,
            up: self.linear(&name(up), e, ff)?,
            gate,
            down: self.linear(&name(down), ff, e)?,
        })
    }

    /// `v.patch_embd.weight` plus `v.patch_embd.weight.1` (a still image
    /// is both temporal frames), each `[patch, patch, 3, n_embd]`.
    fn patch_kernel(&self, patch_size: usize) -> Result<Weight<B>, LoadError> {
        let n_in = 3 * patch_size * patch_size;
        let mut sum = vec![0.0f32; n_in * self.n_embd];
        for name in ["v.patch_embd.weight", "v.patch_embd.weight.1"] {
            let tensor = self.file.tensor(name).ok_or_else(|| tensor_problem(name, "missing"))?;
            let want = [patch_size, patch_size, 3, self.n_embd].map(|d| d as u64);
            if tensor.dims != want {
                return Err(tensor_problem(name, &format!("shape {:?}, expected {want:?}", tensor.dims)));
            }
            let Some(dtype @ (DType::F32 | DType::F16 | DType::BF16)) = tensor.dtype.weights() else {
                return Err(tensor_problem(name, &format!("type {} for a patch kernel", tensor.dtype.name())));
            };
            let mut values = vec![0.0; sum.len()];
            dequantize_row(dtype, self.file.data(tensor), &mut values)
                .map_err(|error| tensor_problem(name, &error.to_string()))?;
            sum.iter_mut().zip(&values).for_each(|(sum, value)| *sum += value);
        }
        let bytes: Vec<u8> = sum.iter().flat_map(|value| value.to_le_bytes()).collect();
        let len = bytes.len();
        let bytes = SharedBytes::new(Arc::new(bytes), 0..len)
            .ok_or_else(|| tensor_problem("v.patch_embd.weight", "kernel bytes out of range"))?;
        let matrix = self
            .backend
            .matrix(MatrixSource { dtype: DType::F32, bytes, n_out: self.n_embd, n_in })
            .map_err(|error| tensor_problem("v.patch_embd.weight", &error.to_string()))?;
        Ok(Weight { matrix, n_in, n_out: self.n_embd })
    }
}
