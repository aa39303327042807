//! Hyper-parameters per architecture, read from GGUF metadata and checked
//! for consistency before any buffer is sized from them.

use super::gguf::{GgufError, GgufFile};

/// A model family, by the GGUF `general.architecture` name it reads (also
/// the prefix of its metadata keys). Only the family registry
/// (`model::families`) makes one, so every value names a family sluice runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture(&'static str);

impl Architecture {
    pub(crate) const fn named(name: &'static str) -> Self {
        Architecture(name)
    }

    pub fn name(self) -> &'static str {
        self.0
    }

    /// The key `<architecture>.<suffix>`.
    pub(crate) fn key(self, suffix: &str) -> String {
        format!("{}.{suffix}", self.0)
    }
}

/// How rotary position embedding pairs and positions work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1), one position (llama; its converter
    /// permutes Q and K to match).
    Norm,
    /// Pairs (i, i + n_rot/2), one position (qwen2, qwen3).
    Neox,
    /// NEOX pairing, four position components, contiguous sections (qwen2vl).
    MRope([u32; 4]),
    /// NEOX pairing, four position components, interleaved sections (qwen3vl).
    IMRope([u32; 4]),
}

impl RopeStyle {
    /// Whether positions have four components.
    pub fn is_multimodal(self) -> bool {
        matches!(self, RopeStyle::MRope(_) | RopeStyle::IMRope(_))
    }
}

/// How the file says its rotary embedding was stretched past the trained
/// context (`rope.scaling.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingType {
    /// `none`: no scaling, whatever the factor says.
    None,
    /// `linear` (the default): positions divided by `rope.scaling.factor`.
    Linear,
    /// `yarn`: per-pair blend of scaled and unscaled angles.
    Yarn,
    /// `longrope`: per-pair factors chosen by the context size.
    LongRope,
}

/// YaRN's correction bounds (pairs turning more than `beta_fast` times
/// over the original context keep their angle, fewer than `beta_slow` are
/// fully scaled) and the multiplier of its magnitude term.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnBounds {
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub log_multiplier: f32,
}

impl Default for YarnBounds {
    /// llama.cpp's.
    fn default() -> Self {
        YarnBounds { beta_fast: 32.0, beta_slow: 1.0, log_multiplier: 0.0 }
    }
}

/// Everything the forward pass needs to size and run a model.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    pub arch: Architecture,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    /// Layers run: `block_count` less `nextn_predict_layers`.
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_freq_scale: f32,
    pub rope_scaling: RopeScalingType,
    /// `rope.scaling.attn_factor`: multiplies every rotary cosine and sine.
    pub rope_attn_factor: f32,
    /// `rope.scaling.original_context_length`: the context before scaling.
    pub n_ctx_orig: usize,
    /// Read where the family reads them ([`YarnBounds`]'s defaults else).
    pub yarn: YarnBounds,
    pub n_rot: usize,
    pub rope: RopeStyle,
}

/// Why a model's hyper-parameters were refused.
#[derive(Debug, thiserror::Error)]
pub enum HParamsError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("general.architecture = {name:?} is not supported ({supported})")]
    Architecture { name: String, supported: String },
    #[error("{key} = {value}: {problem}")]
    Invalid { key: String, value: String, problem: String },
}

/// Upper bounds that keep a hostile file from sizing huge buffers.
const MAX_DIM: u32 = 1 << 20;
const MAX_LAYERS: u32 = 1024;

impl HParams {
    /// The hyper-parameters every family has, read under `arch`'s keys;
    /// `rope` gives the family's rotary style from the rotated width, and a
    /// family whose files may carry no vocabulary (a draft borrowing its
    /// target's) says so in `vocabulary_optional`.
    pub(crate) fn read(
        file: &GgufFile,
        arch: Architecture,
        vocabulary_optional: bool,
        rope: impl FnOnce(usize) -> Result<RopeStyle, HParamsError>,
    ) -> Result<Self, HParamsError> {
        let key = |suffix: &str| arch.key(suffix);
        let bounded = |suffix: &str, max: u32| -> Result<usize, HParamsError> {
            let name = key(suffix);
            let value = file.u32(&name)?;
            if value == 0 || value > max {
                return Err(invalid(&name, value, format!("must be 1..={max}")));
            }
            Ok(value as usize)
        };
        let n_embd = bounded("embedding_length", MAX_DIM)?;
        let n_layer =
            bounded("block_count", MAX_LAYERS)? - next_n(file, &key("nextn_predict_layers"), &key("block_count"))?;
        let n_head = bounded("attention.head_count", MAX_DIM)?;
        let n_head_kv = match file.opt_u32(&key("attention.head_count_kv"))? {
            None => n_head,
            Some(_) => bounded("attention.head_count_kv", MAX_DIM)?,
        };
        if n_head % n_head_kv != 0 {
            return Err(invalid(
                &key("attention.head_count_kv"),
                n_head_kv,
                format!("must divide head_count {n_head}"),
            ));
        }
        let head_dim = match file.opt_u32(&key("attention.key_length"))? {
            Some(_) => bounded("attention.key_length", MAX_DIM)?,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => return Err(invalid(&key("embedding_length"), n_embd, format!("not divisible by {n_head} heads"))),
        };
        if let Some(value_length) = file.opt_u32(&key("attention.value_length"))?
            && value_length as usize != head_dim
        {
            return Err(invalid(
                &key("attention.value_length"),
                value_length,
                format!("must equal key_length {head_dim}"),
            ));
        }
        let n_ff = bounded("feed_forward_length", MAX_DIM)?;
        let n_ctx_train = bounded("context_length", 1 << 24)?;
        let rms_eps = file.f32(&key("attention.layer_norm_rms_epsilon"))?;
        if !(rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(invalid(&key("attention.layer_norm_rms_epsilon"), rms_eps, "must be in (0, 1)".into()));
        }
        let rope_base = file.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
        if !(rope_base > 1.0 && rope_base.is_finite()) {
            return Err(invalid(&key("rope.freq_base"), rope_base, "must be a finite number > 1".into()));
        }
        let rope_scaling = match file.opt_str(&key("rope.scaling.type"))?.unwrap_or("linear") {
            "none" => RopeScalingType::None,
            "linear" => RopeScalingType::Linear,
            "yarn" => RopeScalingType::Yarn,
            "longrope" => RopeScalingType::LongRope,
            other => {
                return Err(invalid(&key("rope.scaling.type"), other, "must be none, linear, yarn or longrope".into()));
            }
        };
        let rope_freq_scale = match file.opt_f32(&key("rope.scaling.factor"))? {
            _ if rope_scaling == RopeScalingType::None => 1.0,
            // llama.cpp reads a zero factor as "unset".
            Some(0.0) => 1.0,
            Some(factor) if factor > 0.0 && factor.is_finite() => 1.0 / factor,
            Some(factor) => return Err(invalid(&key("rope.scaling.factor"), factor, "must be > 0".into())),
            None => 1.0,
        };
        let rope_attn_factor = match file.opt_f32(&key("rope.scaling.attn_factor"))? {
            Some(factor) if !(factor > 0.0 && factor.is_finite()) => {
                return Err(invalid(&key("rope.scaling.attn_factor"), factor, "must be a finite number > 0".into()));
            }
            factor => factor.unwrap_or(1.0),
        };
        let n_ctx_orig = match file.opt_u32(&key("rope.scaling.original_context_length"))? {
            Some(_) => bounded("rope.scaling.original_context_length", 1 << 24)?,
            None => n_ctx_train,
        };
        let n_rot = file.opt_u32(&key("rope.dimension_count"))?.map_or(head_dim, |n| n as usize);
        if n_rot == 0 || n_rot % 2 != 0 || n_rot > head_dim {
            return Err(invalid(&key("rope.dimension_count"), n_rot, format!("must be even and 1..={head_dim}")));
        }
        let rope = rope(n_rot)?;
        let n_vocab = match file.opt_u32(&key("vocab_size"))? {
            Some(n) => n as usize,
            None if vocabulary_optional && file.get("tokenizer.ggml.tokens").is_none() => 0,
            None => file.strs("tokenizer.ggml.tokens")?.len(),
        };
        if n_vocab == 0 && !vocabulary_optional {
            return Err(invalid("tokenizer.ggml.tokens", 0, "the vocabulary is empty".into()));
        }
        Ok(HParams {
            arch,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            rms_eps,
            rope_base,
            rope_freq_scale,
            rope_scaling,
            rope_attn_factor,
            n_ctx_orig,
            yarn: YarnBounds::default(),
            n_rot,
            rope,
        })
    }

    /// Width of one token's K (or V) across all KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of one token's Q across all heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}

/// How many trailing layers predict further tokens (multi-token
/// prediction) and are not run for the next one; they must leave at least
/// one layer of `block_count` to run.
fn next_n(file: &GgufFile, key: &str, block_count: &str) -> Result<usize, HParamsError> {
    let Some(n) = file.opt_u32(key)? else { return Ok(0) };
    let blocks = file.u32(block_count)?;
    if n >= blocks {
        return Err(invalid(key, n, format!("must be less than {block_count} {blocks}")));
    }
    Ok(n as usize)
}

pub(crate) fn invalid(key: &str, value: impl std::fmt::Display, problem: String) -> HParamsError {
    HParamsError::Invalid { key: key.into(), value: value.to_string(), problem }
}

/// `rope.dimension_sections`: four (or three, padded) pair counts that fit
/// in the rotated pairs.
pub(crate) fn sections(file: &GgufFile, key: &str, n_rot: usize) -> Result<[u32; 4], HParamsError> {
    let values = file.ints(key)?;
    if values.is_empty() || values.len() > 4 || values.iter().any(|value| !(0..=n_rot as i64).contains(value)) {
        return Err(invalid(key, format!("{values:?}"), format!("must be up to 4 counts in 0..={n_rot}")));
    }
    let mut sections = [0u32; 4];
    for (section, value) in sections.iter_mut().zip(values) {
        *section = *value as u32;
    }
    if sections.iter().sum::<u32>() == 0 {
        return Err(invalid(key, format!("{values:?}"), "all sections are zero".into()));
    }
    Ok(sections)
}
