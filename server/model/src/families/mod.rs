//! The model families sluice runs, one file each, and their registry.
//!
//! A family reads what is its own in a GGUF file — its rotary style, the
//! kind of each layer, what surrounds the layers — and declares it; the
//! shared blocks (`crate::blocks`) do the loading and the arithmetic. Adding
//! a family is a new file here (for most, one `family::Uniform` constant) and a
//! line in [`FAMILIES`]; a layer no block
//! runs yet is a new [`Mixer`](super::layer::Mixer) or
//! [`Ffn`](super::layer::Ffn) variant with its block.
//!
//! | file | `general.architecture` | what is its own |
//! |---|---|---|
//! | `llama.rs` | `llama` | adjacent-pair RoPE; experts where the file has them (Mixtral) |
//! | `qwen2.rs` | `qwen2` | NEOX RoPE, Q/K/V biases |
//! | `qwen3.rs` | `qwen3` | NEOX RoPE, Q/K norms |
//! | `qwen2vl.rs` | `qwen2vl` | Qwen2 with M-RoPE (contiguous sections) |
//! | `qwen3vl.rs` | `qwen3vl` | Qwen3 with interleaved M-RoPE |
//! | `dflash.rs` | `dflash` | a DFlash draft: Qwen3 layers, lent embeddings and head, feature fusion |
//! | `gemma2.rs` | `gemma2` | Gemma 3's layers without Q/K norms, soft-capped scores and logits, every other layer local |
//! | `mistral3.rs` | `mistral3` | Llama's layers, YaRN bounds from the file, Llama 4's query temperature |
//! | `gemma3.rs` | `gemma3` | NEOX RoPE, Q/K norms, pre-scaled Q, post-norms, GeGLU, scaled embeddings, local layers with a sliding window and their own RoPE base |
//! | `phi3.rs` | `phi3` | NEOX RoPE (partial where the file says), pre-scaled Q, fused Q/K/V and gate/up, LongRoPE factors, no sliding window |
//! | `glm4.rs` | `glm4` | adjacent-pair RoPE over part of each head, Q/K/V biases, post-norms, fused gate/up, trailing multi-token-prediction layers skipped |
//! | `smollm3.rs` | `smollm3` | Llama's layers, every fourth without RoPE |
//! | `granite.rs` | `granite` | Llama's layers, scaled embeddings, residuals, scores and logits by the file's multipliers |
//! | `olmo2.rs` | `olmo2` | NEOX RoPE, post-norms only, Q/K norms over the whole vector, an untied head, optional local layers (OLMo 3) |
//! | `qwen3moe.rs` | `qwen3moe` | Qwen3's attention, experts with renormalized weights |
//! | `qwen3vlmoe.rs` | `qwen3vlmoe` | Qwen3-MoE's layers with interleaved M-RoPE (Qwen3-VL-MoE's text path) |
//! | `qwen2moe.rs` | `qwen2moe` | Qwen2's attention, experts and a gated shared expert |
//! | `glm4moe.rs` | `glm4moe` | NEOX RoPE over part of each head, leading dense layers, experts chosen by sigmoid scores with a selection bias (optionally in groups), renormalized and scaled, ungated shared experts |
//! | `gpt_oss.rs` | `gpt-oss` | biases everywhere, attention sinks, every other layer local, experts weighed by a softmax over the chosen, clamped SwiGLU |
//! | `qwen35.rs` | `qwen35`, `qwen35moe` | Gated DeltaNet layers with a gated full-attention layer every fourth (Q/K norms, interleaved M-RoPE over part of each head); `qwen35moe`: experts and a gated shared expert |
//!
//! `sliding.rs` reads which layers of a sliding-window family are local;
//! `experts.rs` reads a mixture-of-experts family's expert counts and widths.

mod dflash;
mod experts;
mod family;
mod gemma2;
mod gemma3;
mod glm4;
mod glm4moe;
mod gpt_oss;
mod granite;
mod llama;
mod mistral3;
mod olmo2;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen2vl;
mod qwen3;
mod qwen35;
mod qwen3moe;
mod qwen3vl;
mod qwen3vlmoe;
mod sliding;
mod smollm3;

use super::gguf::GgufFile;
use super::hparams::{Architecture, HParams, HParamsError};
pub(crate) use family::Family;

pub(super) static FAMILIES: [&dyn Family; 22] = [
    &llama::Llama,
    &qwen2::QWEN2,
    &qwen3::QWEN3,
    &qwen2vl::QWEN2VL,
    &qwen3vl::QWEN3VL,
    &dflash::Dflash,
    &gemma2::Gemma2,
    &gemma3::Gemma3,
    &mistral3::Mistral3,
    &phi3::Phi3,
    &glm4::GLM4,
    &smollm3::Smollm3,
    &granite::Granite,
    &olmo2::Olmo2,
    &qwen3moe::QWEN3MOE,
    &qwen2moe::QWEN2MOE,
    &gpt_oss::GptOss,
    &glm4moe::Glm4Moe,
    &qwen35::QWEN35,
    &qwen35::QWEN35MOE,
    &qwen35::QWEN3NEXT,
    &qwen3vlmoe::QWEN3VLMOE,
];

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

impl HParams {
    /// The hyper-parameters of a file of any family sluice runs; another
    /// architecture is refused, naming those it runs.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, HParamsError> {
        let family = find(file.str("general.architecture")?)?;
        let arch = Architecture::named(family.name());
        let hp = HParams::read(file, arch, family.vocabulary_optional(), |n_rot| family.rope(file, n_rot))?;
        Ok(HParams { yarn: family.yarn(file)?, ..hp })
    }
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::{TinyModel, Value};

    use super::FAMILIES;
    use crate::gguf::GgufFile;
    use crate::hparams::HParams;

    #[test]
    fn names_are_unique_and_an_unknown_architecture_is_refused_naming_them() {
        let mut names: Vec<_> = FAMILIES.iter().map(|family| family.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
        let llama = TinyModel { n_layer: 3, ..TinyModel::recipe("llama", 7) }.build();
        let other = llama.meta("general.architecture", Value::Str("mamba".into()));
        let file = GgufFile::from_bytes(other.build()).expect("parses");
        let error = HParams::from_gguf(&file).expect_err("refused").to_string();
        assert_eq!(
            error,
            "general.architecture = \"mamba\" is not supported (llama, qwen2, qwen3, qwen2vl, qwen3vl, dflash, gemma2, gemma3, mistral3, phi3, glm4, smollm3, granite, olmo2, qwen3moe, qwen2moe, gpt-oss, glm4moe, qwen35, qwen35moe, qwen3next, qwen3vlmoe)"
        );
    }
}
