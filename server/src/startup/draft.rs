//! Pairing a draft with its target, before any of the draft's context (KV,
//! buffers, batches) exists (docs/draft-fixups.md): run the `draft-fixup`
//! plugins on the draft's metadata (in memory only), resolve and re-validate
//! its rotary settings, check that the two models fit together, and only
//! then build the drafter. Every refusal is an error that stops the server
//! from starting.

use std::path::PathBuf;
use std::sync::Arc;

use sluice_kernels::backend::BackendError;

use super::plugins::load_fixups;
use crate::config::{SpecType, SpeculativeConfig};
use sluice_engine::EngineConfig;
use sluice_engine::speculative::{DflashDrafter, DraftSettings, Drafter, SimpleDrafter, Speculation};
use sluice_model::dflash::{self, DflashParams};
use sluice_model::gguf::{GgufError, GgufFile, MetaArray, MetaValue, TensorInfo};
use sluice_model::hparams::{HParams, HParamsError};
use sluice_model::{LoadError, Model};
use sluice_plugin_host::fixup_types::{self as wire, Edit, ModelInfo};
use sluice_plugin_host::{FixupError, PluginHost, PluginLimits, WasmFixup};

/// The configured draft, paired with `target` (fixups run on `host` under
/// `limits`, checks passed) before any of its context exists; `None`
/// without a draft. An error names the draft file.
pub fn load_speculation(
    config: &SpeculativeConfig,
    host: &PluginHost,
    limits: PluginLimits,
    target: &Arc<dyn Model>,
    engine: &EngineConfig,
) -> Result<Option<Speculation>, (PathBuf, String)> {
    let Some(path) = config.draft_model.clone() else { return Ok(None) };
    let failed = |error: String| (path.clone(), error);
    let requested = match config.kind {
        SpecType::None => None,
        SpecType::DraftSimple => Some(DraftKind::Simple),
        SpecType::DraftDflash => Some(DraftKind::Dflash),
    };
    let fixups = load_fixups(host, config, limits).map_err(|error| failed(error.to_string()))?;
    let file = GgufFile::open(&path).map_err(|error| failed(error.to_string()))?;
    let paired = pair(target.as_ref(), file, requested, &fixups).map_err(|error| failed(error.to_string()))?;
    let kind = paired.kind();
    let (n_blocks, block_tokens) = engine.kv_blocks();
    let drafter = paired.into_drafter(target, n_blocks, block_tokens).map_err(|error| failed(error.to_string()))?;
    let settings = DraftSettings { n_max: config.n_max as usize, n_min: config.n_min as usize, p_min: config.p_min };
    tracing::info!(kind = kind.name(), draft = %path.display(), n_max = settings.n_max, "speculative decoding on");
    Ok(Some(Speculation { drafter, settings }))
}

/// The two kinds of drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    /// A small model of the target's family and vocabulary.
    Simple,
    /// A DFlash block drafter (GGUF architecture `dflash`).
    Dflash,
}

impl DraftKind {
    pub fn name(self) -> &'static str {
        match self {
            DraftKind::Simple => "draft-simple",
            DraftKind::Dflash => "dflash",
        }
    }
}

/// Why a draft cannot be paired with the target.
#[derive(Debug, thiserror::Error)]
pub enum PairingError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    HParams(#[from] HParamsError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Fixup(#[from] FixupError),
    #[error("cannot create the draft's context: {0}")]
    Context(#[from] BackendError),
    #[error("fixup {plugin}: may not edit {key:?} (only `{prefix}.*` keys of the draft)")]
    Edit { plugin: String, key: String, prefix: String },
    #[error("the speculative type is {requested} but the draft's architecture is {arch:?} ({actual})")]
    Kind { requested: &'static str, arch: String, actual: &'static str },
    #[error("{0}")]
    Mismatch(String),
}

/// An edit a fixup made, for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedEdit {
    pub plugin: String,
    pub key: String,
    /// The new value, or `None` for a removed key.
    pub value: Option<String>,
}

/// A draft whose metadata is final and checked against the target; the
/// only way to a drafter.
pub struct PairedDraft {
    file: GgufFile,
    kind: DraftKind,
    hparams: HParams,
    pub edits: Vec<AppliedEdit>,
}

impl PairedDraft {
    pub fn kind(&self) -> DraftKind {
        self.kind
    }

    pub fn hparams(&self) -> &HParams {
        &self.hparams
    }

    /// Create the draft's context: load its network on the target's
    /// backend and a KV store that mirrors the target's (`n_blocks` ×
    /// `block_tokens`).
    pub fn into_drafter(
        self,
        target: &Arc<dyn Model>,
        n_blocks: usize,
        block_tokens: usize,
    ) -> Result<Box<dyn Drafter>, PairingError> {
        let params = match self.kind {
            DraftKind::Dflash => Some(DflashParams::from_gguf(&self.file)?),
            DraftKind::Simple => None,
        };
        // Checked at pairing: every entry is a target token id.
        let d2t = self
            .file
            .tensor("d2t")
            .and_then(|d2t| self.file.integers(d2t))
            .map(|ids| ids.into_iter().map(|id| id as u32).collect());
        let draft = target.load_sibling(self.file)?;
        if draft.recurrent_state_bytes().is_some() {
            // Drafting writes cells ahead and takes them back, which a
            // recurrent state cannot (the target's verification can: the
            // engine replays what it kept).
            return Err(mismatch(format!(
                "the draft ({}) has recurrent layers: a draft model must attend through its KV cache alone",
                draft.hparams().arch.name()
            )));
        }
        tracing::info!(kind = self.kind.name(), n_blocks, block_tokens, "draft context created");
        Ok(match params {
            Some(params) => {
                let mask = params.mask_token.unwrap_or_default();
                Box::new(DflashDrafter::new(draft, params, mask, d2t, n_blocks, block_tokens)?)
            }
            None => Box::new(SimpleDrafter::new(draft, n_blocks, block_tokens)?),
        })
    }
}

/// Run `fixups` on `draft` and check it against `target`. `requested` is
/// the configured kind, if any (otherwise the draft's architecture decides).
pub fn pair(
    target: &dyn Model,
    mut draft: GgufFile,
    requested: Option<DraftKind>,
    fixups: &[WasmFixup],
) -> Result<PairedDraft, PairingError> {
    let arch = draft.str("general.architecture")?.to_owned();
    let kind = if arch == dflash::ARCHITECTURE { DraftKind::Dflash } else { DraftKind::Simple };
    if let Some(requested) = requested.filter(|requested| *requested != kind) {
        return Err(PairingError::Kind { requested: requested.name(), arch, actual: kind.name() });
    }
    let mut edits = Vec::new();
    let target_info = model_info(target.file());
    for fixup in fixups {
        for edit in fixup.run(&target_info, &model_info(&draft))? {
            let key = match &edit {
                Edit::Set(entry) => &entry.key,
                Edit::Remove(key) => key,
            };
            // A fixup reconciles the draft's own settings; it may not turn
            // the file into another model or rewrite its vocabulary.
            if !key.starts_with(&format!("{arch}.")) {
                return Err(PairingError::Edit { plugin: fixup.name().into(), key: key.clone(), prefix: arch });
            }
            let applied = match edit {
                Edit::Set(entry) => {
                    let value = from_wire(entry.value);
                    let shown = format!("{value:?}");
                    draft.set_metadata(&entry.key, value);
                    AppliedEdit { plugin: fixup.name().into(), key: entry.key, value: Some(shown) }
                }
                Edit::Remove(key) => {
                    draft.remove_metadata(&key);
                    AppliedEdit { plugin: fixup.name().into(), key, value: None }
                }
            };
            tracing::info!(
                fixup = applied.plugin,
                key = applied.key,
                value = applied.value.as_deref().unwrap_or("(removed)"),
                "draft metadata edited in memory"
            );
            edits.push(applied);
        }
    }
    // Everything below reads the edited metadata, re-validated from scratch.
    let hparams = HParams::from_gguf(&draft)?;
    let target_hp = target.hparams();
    match kind {
        DraftKind::Dflash => check_dflash(target, &draft, &hparams)?,
        DraftKind::Simple => check_vocabulary(target.file(), &draft, target_hp.n_vocab, hparams.n_vocab)?,
    }
    Ok(PairedDraft { file: draft, kind, hparams, edits })
}

fn mismatch(message: String) -> PairingError {
    PairingError::Mismatch(message)
}

/// The DFlash pairing rules (docs/draft-fixups.md, "Checks at pairing").
fn check_dflash(target: &dyn Model, draft: &GgufFile, hparams: &HParams) -> Result<(), PairingError> {
    let target_hp = target.hparams();
    if target_hp.rope.is_multimodal() && !hparams.rope.is_multimodal() {
        return Err(mismatch(format!(
            "the target ({}) uses M-RoPE but the draft has 1-D positions (no dflash.rope.dimension_sections): text \
             after an image would be refused mid-request; enable the `mrope-temporal` fixup or convert the draft \
             with its sections",
            target_hp.arch.name()
        )));
    }
    if hparams.n_embd != target_hp.n_embd {
        return Err(mismatch(format!(
            "dflash.embedding_length = {} differs from the target's hidden size {}",
            hparams.n_embd, target_hp.n_embd
        )));
    }
    let params = DflashParams::from_gguf(draft)?;
    if let Some(layer) = params.target_layers.iter().find(|&&layer| layer > target_hp.n_layer) {
        return Err(mismatch(format!(
            "dflash.target_layers names layer {layer}; the target has {} layers (0..={} are valid)",
            target_hp.n_layer, target_hp.n_layer
        )));
    }
    let fc_inputs = draft.tensor("fc.weight").map(|fc| fc.dims.first().copied().unwrap_or(0));
    let expected = (params.target_layers.len() * target_hp.n_embd) as u64;
    match fc_inputs {
        None => return Err(mismatch("the draft has no fc.weight".into())),
        Some(inputs) if inputs != expected => {
            return Err(mismatch(format!(
                "fc.weight takes {inputs} inputs; {} target layers × target hidden size {} = {expected}",
                params.target_layers.len(),
                target_hp.n_embd
            )));
        }
        Some(_) => {}
    }
    // Variants and options the DFlash network here does not implement: run
    // as plain DFlash they would draft from the wrong function.
    const UNSUPPORTED_KEYS: [&str; 14] = [
        "dflash.conv_kernel_size",
        "dflash.conv_group_size",
        "dflash.selector_rank",
        "dflash.selector_top_k",
        "dflash.sample_from_anchor",
        "dflash.has_confidence_head",
        "dflash.embedding_scale",
        "dflash.logit_scale",
        "dflash.final_logit_softcapping",
        "dflash.attention.scale",
        "dflash.attention.value_scale",
        "dflash.hidden_activation",
        "dflash.attention.sliding_window",
        "dflash.attention.sliding_window_pattern",
    ];
    if let Some(key) = UNSUPPORTED_KEYS.iter().find(|key| draft.get(key).is_some()) {
        return Err(mismatch(format!("{key} is set: DFlash2, DSpark and this DFlash option are not supported")));
    }
    const UNSUPPORTED_TENSORS: [&str; 8] = [
        "attn_post_norm",
        "ffn_post_norm",
        "layer_output_scale",
        "attn_sinks",
        "attn_conv",
        "ffn_conv",
        "selector",
        "markov",
    ];
    if let Some(tensor) =
        draft.tensors().iter().find(|tensor| UNSUPPORTED_TENSORS.iter().any(|part| tensor.name.contains(part)))
    {
        return Err(mismatch(format!("tensor {}: this DFlash variant is not supported", tensor.name)));
    }
    if draft.tensor("rope_freqs.weight").is_some() {
        return Err(mismatch("the draft has rope_freqs.weight; per-frequency rope factors are not supported".into()));
    }
    match draft.tensor("d2t") {
        Some(d2t) => check_d2t(draft, d2t, target_hp.n_vocab)?,
        None if draft.tensor("output.weight").is_some() || draft.tensor("token_embd.weight").is_some() => {
            check_vocabulary(target.file(), draft, target_hp.n_vocab, hparams.n_vocab)?
        }
        None => {}
    }
    match params.mask_token {
        None => Err(mismatch("the draft has no tokenizer.ggml.mask_token_id".into())),
        Some(mask) if mask as usize >= target_hp.n_vocab => Err(mismatch(format!(
            "tokenizer.ggml.mask_token_id = {mask} is outside the target's vocabulary of {}",
            target_hp.n_vocab
        ))),
        Some(_) => Ok(()),
    }
}

/// A reduced-vocabulary head: `d2t[i]` is the target token of head row `i`.
fn check_d2t(draft: &GgufFile, d2t: &TensorInfo, n_target: usize) -> Result<(), PairingError> {
    let ids = draft
        .integers(d2t)
        .ok_or_else(|| mismatch(format!("d2t has type {}; it must hold integers (I32 or I64)", d2t.dtype.name())))?;
    if draft.tensor("token_embd.weight").is_some() {
        return Err(mismatch("a draft with d2t must borrow the target's token embeddings (it has its own)".into()));
    }
    let rows = draft.tensor("output.weight").and_then(|output| output.dims.get(1).copied());
    if rows != Some(ids.len() as u64) {
        return Err(mismatch(format!(
            "d2t has {} entries; output.weight must have as many rows (it has {})",
            ids.len(),
            rows.map_or("none".into(), |rows| rows.to_string())
        )));
    }
    match ids.iter().find(|&&id| !(0..n_target as i64).contains(&id)) {
        Some(id) => Err(mismatch(format!("d2t maps to token {id}, outside the target's vocabulary of {n_target}"))),
        None => Ok(()),
    }
}

/// Draft and target must give every token id the same text.
fn check_vocabulary(target: &GgufFile, draft: &GgufFile, n_target: usize, n_draft: usize) -> Result<(), PairingError> {
    if n_target != n_draft {
        return Err(mismatch(format!("the draft's vocabulary has {n_draft} tokens, the target's {n_target}")));
    }
    const TOKENS: &str = "tokenizer.ggml.tokens";
    if let (Ok(target_tokens), Ok(draft_tokens)) = (target.strs(TOKENS), draft.strs(TOKENS))
        && let Some(id) = target_tokens.iter().zip(draft_tokens).position(|(a, b)| a != b)
    {
        return Err(mismatch(format!(
            "token {id} is {:?} in the target and {:?} in the draft",
            target_tokens[id], draft_tokens[id]
        )));
    }
    Ok(())
}

/// What a fixup sees of a model: every metadata entry but the tokenizer's
/// large arrays, and the tensor table.
pub fn model_info(file: &GgufFile) -> ModelInfo {
    let metadata = file
        .metadata()
        .iter()
        .filter(|(key, value)| !(key.starts_with("tokenizer.ggml.") && matches!(value, MetaValue::Array(_))))
        .filter_map(|(key, value)| Some(wire::MetaEntry { key: key.clone(), value: to_wire(value)? }))
        .collect();
    let tensors = file
        .tensors()
        .iter()
        .map(|tensor| wire::TensorInfo {
            name: tensor.name.clone(),
            dtype: tensor.dtype.name().to_owned(),
            shape: tensor.dims.clone(),
        })
        .collect();
    ModelInfo { architecture: file.str("general.architecture").unwrap_or_default().to_owned(), metadata, tensors }
}

fn to_wire(value: &MetaValue) -> Option<wire::MetaValue> {
    Some(match value {
        MetaValue::Bool(value) => wire::MetaValue::Boolean(*value),
        MetaValue::F32(value) => wire::MetaValue::Float(f64::from(*value)),
        MetaValue::F64(value) => wire::MetaValue::Float(*value),
        MetaValue::Str(value) => wire::MetaValue::Text(value.clone()),
        MetaValue::U64(value) => wire::MetaValue::Uint(*value),
        MetaValue::Array(MetaArray::Ints(values)) => wire::MetaValue::IntArray(values.clone()),
        MetaValue::Array(MetaArray::Floats(values)) => wire::MetaValue::FloatArray(values.clone()),
        MetaValue::Array(MetaArray::Strs(values)) => wire::MetaValue::TextArray(values.clone()),
        // Booleans and huge unsigned arrays have no wire form.
        MetaValue::Array(MetaArray::Bools(_) | MetaArray::U64s(_)) => return None,
        other => wire::MetaValue::Int(other.as_i64()?),
    })
}

fn from_wire(value: wire::MetaValue) -> MetaValue {
    match value {
        wire::MetaValue::Boolean(value) => MetaValue::Bool(value),
        wire::MetaValue::Int(value) => MetaValue::I64(value),
        wire::MetaValue::Uint(value) => MetaValue::U64(value),
        wire::MetaValue::Float(value) => MetaValue::F64(value),
        wire::MetaValue::Text(value) => MetaValue::Str(value),
        wire::MetaValue::IntArray(values) => MetaValue::Array(MetaArray::Ints(values)),
        wire::MetaValue::FloatArray(values) => MetaValue::Array(MetaArray::Floats(values)),
        wire::MetaValue::TextArray(values) => MetaValue::Array(MetaArray::Strs(values)),
    }
}
