//! What a family declares (the leaf the family files and the registry
//! share): the [`Family`] trait, [`Outer`], and [`Uniform`], the family
//! whose layers are all of one kind.

use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, YarnBounds};
use crate::layer::LayerKind;
use crate::weights::LoadError;

/// What a family declares about a file of its architecture.
pub(crate) trait Family: Sync {
    /// Its `general.architecture` name, also its metadata keys' prefix.
    fn name(&self) -> &'static str;

    /// Its rotary style, given the rotated width (`rope.dimension_count`).
    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError>;

    /// YaRN's correction bounds and magnitude multiplier: llama.cpp's
    /// defaults, unless the family reads its files' `rope.scaling.yarn_*`.
    fn yarn(&self, _file: &GgufFile) -> Result<YarnBounds, HParamsError> {
        Ok(YarnBounds::default())
    }

    /// The kind of each of the `hp.n_layer` layers, in order.
    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError>;

    /// What surrounds its layers.
    fn outer(&self, _file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        Ok(Outer::plain(hp))
    }

    /// Whether its files may carry no vocabulary (a draft using its
    /// target's).
    fn vocabulary_optional(&self) -> bool {
        false
    }
}

/// The embedding table, the LM head and anything in front of the layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outer {
    /// The embedding table and LM head may be missing from the file, lent
    /// by the target model it drafts for.
    pub(crate) lent: bool,
    /// Rows of the LM head: the vocabulary, or a reduced one's size.
    pub(crate) head_rows: usize,
    /// Features fused in front of the layers (a DFlash draft's target
    /// taps): their concatenated width, projected by `fc.weight` to
    /// `n_embd` and normed by `enc.output_norm.weight`.
    pub(crate) fusion: Option<usize>,
    /// Token embeddings are multiplied by this (Gemma: `√n_embd`,
    /// Granite: `embedding_scale`).
    pub(crate) embed_scale: Option<f32>,
    /// Logits are multiplied by this (Granite: the f32 reciprocal of
    /// `logit_scale`, as llama.cpp multiplies rather than divides).
    pub(crate) logit_scale: Option<f32>,
    /// Logits are soft-capped at this, `cap · tanh(logit / cap)`.
    pub(crate) logit_softcap: Option<f32>,
    /// Llama 4's query temperature: after RoPE, a row at position `pos`
    /// has its queries multiplied by `1 + t · ln(⌊pos / n_ctx_orig⌋ + 1)`.
    pub(crate) q_temperature: Option<f32>,
}

impl Outer {
    /// The model's own embedding table and a head over its vocabulary,
    /// nothing else.
    pub(crate) fn plain(hp: &HParams) -> Self {
        Outer {
            lent: false,
            head_rows: hp.n_vocab,
            fusion: None,
            embed_scale: None,
            logit_scale: None,
            logit_softcap: None,
            q_temperature: None,
        }
    }
}

/// A family whose layers are all of one kind and whose rotary style
/// follows from its metadata alone: most dense families are one of these.
pub(super) struct Uniform {
    pub(super) name: &'static str,
    pub(super) rope: fn(&GgufFile, usize) -> Result<RopeStyle, HParamsError>,
    pub(super) layer: LayerKind,
}

impl Family for Uniform {
    fn name(&self) -> &'static str {
        self.name
    }

    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError> {
        (self.rope)(file, n_rot)
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok(vec![self.layer; hp.n_layer])
    }
}
