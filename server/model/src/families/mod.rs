//! The model families sluice runs, one file each, and their registry.
//!
//! A family reads what is its own in a GGUF file — its rotary style, the
//! kind of each layer, what surrounds the layers — and declares it; the
//! shared blocks (`crate::blocks`) do the loading and the arithmetic. Adding
//! a family is a new file here (for most, one [`Uniform`] constant) and a
//! line in [`FAMILIES`]; a layer no block
//! runs yet is a new [`Mixer`](super::layer::Mixer) or
//! [`Ffn`](super::layer::Ffn) variant with its block.
//!
//! | file | `general.architecture` | what is its own |
//! |---|---|---|
//! | `llama.rs` | `llama` | adjacent-pair RoPE |
//! | `qwen2.rs` | `qwen2` | NEOX RoPE, Q/K/V biases |
//! | `qwen3.rs` | `qwen3` | NEOX RoPE, Q/K norms |
//! | `qwen2vl.rs` | `qwen2vl` | Qwen2 with M-RoPE (contiguous sections) |
//! | `qwen3vl.rs` | `qwen3vl` | Qwen3 with interleaved M-RoPE |
//! | `dflash.rs` | `dflash` | a DFlash draft: Qwen3 layers, lent embeddings and head, feature fusion |

mod dflash;
mod llama;
mod qwen2;
mod qwen2vl;
mod qwen3;
mod qwen3vl;

use super::gguf::GgufFile;
use super::hparams::{Architecture, HParams, HParamsError, RopeStyle};
use super::layer::LayerKind;
use super::weights::LoadError;

/// What a family declares about a file of its architecture.
pub(crate) trait Family: Sync {
    /// Its `general.architecture` name, also its metadata keys' prefix.
    fn name(&self) -> &'static str;

    /// Its rotary style, given the rotated width (`rope.dimension_count`).
    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError>;

    /// The kind of each of the `hp.n_layer` layers, in order.
    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError>;

    /// What surrounds its layers.
    fn outer(&self, _file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        Ok(Outer { lent: false, head_rows: hp.n_vocab, fusion: None })
    }

    /// Whether its files may carry no vocabulary (a draft using its
    /// target's).
    fn vocabulary_optional(&self) -> bool {
        false
    }
}

/// The embedding table, the LM head and anything in front of the layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

static FAMILIES: [&dyn Family; 6] =
    [&llama::LLAMA, &qwen2::QWEN2, &qwen3::QWEN3, &qwen2vl::QWEN2VL, &qwen3vl::QWEN3VL, &dflash::Dflash];

/// The family of `arch` (every [`Architecture`] names one).
pub(crate) fn of(arch: Architecture) -> Result<&'static dyn Family, HParamsError> {
    find(arch.name())
}

fn find(name: &str) -> Result<&'static dyn Family, HParamsError> {
    FAMILIES.iter().copied().find(|family| family.name() == name).ok_or_else(|| HParamsError::Architecture {
        name: name.into(),
        supported: FAMILIES.map(|family| family.name()).join(", "),
    })
}

/// A family whose layers are all of one kind and whose rotary style
/// follows from its metadata alone: most dense families are one of these.
struct Uniform {
    name: &'static str,
    rope: fn(&GgufFile, usize) -> Result<RopeStyle, HParamsError>,
    layer: LayerKind,
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

impl HParams {
    /// The hyper-parameters of a file of any family sluice runs; another
    /// architecture is refused, naming those it runs.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, HParamsError> {
        let family = find(file.str("general.architecture")?)?;
        let arch = Architecture::named(family.name());
        HParams::read(file, arch, family.vocabulary_optional(), |n_rot| family.rope(file, n_rot))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_kernels::backend::CpuBackend;
    use sluice_tests::gguf_writer::{GgufBuilder, TinyModel, Value};

    use super::FAMILIES;
    use crate::Transformer;
    use crate::gguf::GgufFile;
    use crate::hparams::HParams;
    use crate::layer::{Cache, Mixer};

    /// A tiny file of the family `name`, three layers.
    fn tiny(name: &'static str) -> GgufBuilder {
        let model = TinyModel { n_layer: 3, ..TinyModel::recipe(name, 7) };
        match name {
            "dflash" => model.dflash(&[1], model.n_embd, 4),
            "qwen2vl" | "qwen3vl" => TinyModel { sections: Some([4, 2, 2, 0]), ..model }.build(),
            _ => model.build(),
        }
    }

    fn load(builder: &GgufBuilder) -> Result<Transformer<CpuBackend>, String> {
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        Transformer::from_file(file, Arc::new(CpuBackend::new(1))).map_err(|error| error.to_string())
    }

    #[test]
    fn every_family_loads_and_its_layers_keep_what_their_kind_declares() {
        for family in FAMILIES {
            let model = load(&tiny(family.name())).unwrap_or_else(|error| panic!("{}: {error}", family.name()));
            let kinds = family.layers(&model.file, &model.hparams).expect("declared");
            assert_eq!(kinds.len(), 3, "{}", family.name());
            let paged = kinds.iter().filter(|kind| kind.mixer.cache() == Cache::Paged).count();
            assert_eq!(model.caches.paged, paged, "{}", family.name());
            assert!(kinds.iter().all(|kind| matches!(kind.mixer, Mixer::Attention(_))));
        }
    }

    #[test]
    fn names_are_unique_and_an_unknown_architecture_is_refused_naming_them() {
        let mut names: Vec<_> = FAMILIES.iter().map(|family| family.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
        let gemma = tiny("llama").meta("general.architecture", Value::Str("gemma3".into()));
        let file = GgufFile::from_bytes(gemma.build()).expect("parses");
        let error = HParams::from_gguf(&file).expect_err("refused").to_string();
        assert_eq!(
            error,
            "general.architecture = \"gemma3\" is not supported (llama, qwen2, qwen3, qwen2vl, qwen3vl, dflash)"
        );
    }

    #[test]
    fn a_tensor_a_layer_kind_requires_is_named_when_missing() {
        for (name, missing) in [("qwen2", "blk.2.attn_v.bias"), ("qwen3", "blk.0.attn_k_norm.weight")] {
            let error = load(&tiny(name).without_tensor(missing)).err().expect("refused");
            assert_eq!(error, format!("tensor {missing:?}: missing"), "{name}");
        }
    }
}
