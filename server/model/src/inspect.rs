//! What a file is to sluice without loading its weights, for `sluice model
//! info`: its family and each layer's kind as the family declares them, or
//! the first thing that makes sluice refuse it (an architecture it does not
//! run, a hyper-parameter out of range).

use std::fmt;

use super::families;
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::layer::{Attention, ExpertMlp, Experts, Ffn, Gating, LayerKind, Mixer, Shared};
use super::weights::LoadError;

/// A file's family and the kinds of its layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The family's name (its `general.architecture`).
    pub family: &'static str,
    pub n_layer: usize,
    /// Each kind of layer the file has, described, with the indices of its
    /// layers, in order of first appearance.
    pub layers: Vec<(String, Vec<usize>)>,
}

/// The family and layer kinds of `file`, or why sluice refuses it.
pub fn summarize(file: &GgufFile) -> Result<Summary, LoadError> {
    let hp = HParams::from_gguf(file)?;
    let family = families::of(hp.arch)?;
    let mut layers: Vec<(String, Vec<usize>)> = Vec::new();
    for (index, kind) in family.layers(file, &hp)?.into_iter().enumerate() {
        let kind = kind.to_string();
        match layers.iter_mut().find(|(seen, _)| *seen == kind) {
            Some((_, indices)) => indices.push(index),
            None => layers.push((kind, vec![index])),
        }
    }
    Ok(Summary { family: family.name(), n_layer: hp.n_layer, layers })
}

/// Layer indices as ranges: `0-4, 6-10, 12`.
pub fn ranges(indices: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &index in indices {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == index => *end = index,
            _ => runs.push((index, index)),
        }
    }
    let run = |&(start, end): &(usize, usize)| if start == end { start.to_string() } else { format!("{start}-{end}") };
    runs.iter().map(run).collect::<Vec<_>>().join(", ")
}

/// Each new mixer or feed-forward names itself here: the compiler asks for
/// it when a variant is added.
impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mixer {
            Mixer::Attention(Attention {
                qkv_bias,
                qk_norm,
                qk_norm_whole,
                rotary,
                score_scale,
                q_scale,
                softcap,
                window,
                own_rope,
                output_bias,
                sinks,
                output_gate,
            }) => {
                match window {
                    Some(window) => write!(f, "sliding-window attention ({window} positions)")?,
                    None => f.write_str("attention")?,
                }
                let qk_norm = match qk_norm_whole {
                    true => (qk_norm, "whole-vector Q/K norms"),
                    false => (qk_norm, "Q/K norms"),
                };
                let mut extras: Vec<String> = [
                    (qkv_bias, "Q/K/V biases"),
                    (output_bias, "an output bias"),
                    qk_norm,
                    (!rotary, "no RoPE"),
                    (sinks, "sinks"),
                    (output_gate, "an output gate"),
                ]
                .into_iter()
                .filter(|&(set, _)| set)
                .map(|(_, name)| name.to_string())
                .collect();
                extras.extend(q_scale.map(|scale| format!("Q scaled by {scale}")));
                extras.extend(score_scale.map(|scale| format!("scores scaled by {scale}")));
                extras.extend(softcap.map(|cap| format!("scores soft-capped at {cap}")));
                extras.extend(own_rope.map(|rope| format!("RoPE base {}", rope.base)));
                if !extras.is_empty() {
                    write!(f, " with {}", extras.join(" and "))?;
                }
            }
            Mixer::DeltaNet(shape) => write!(
                f,
                "Gated DeltaNet ({} key and {} value heads of {}{}, convolution over {} positions)",
                shape.k_heads,
                shape.v_heads,
                shape.head,
                if shape.grouped { " in groups" } else { "" },
                shape.conv
            )?,
        }
        match self.ffn {
            Ffn::SwiGlu => f.write_str(", SwiGLU feed-forward")?,
            Ffn::GeGlu => f.write_str(", GELU-gated feed-forward")?,
            Ffn::Experts(experts) => {
                let Experts {
                    count,
                    used,
                    n_ff,
                    gating,
                    selection_bias,
                    groups,
                    normalized,
                    scale,
                    shared,
                    mlp,
                    biases,
                } = experts;
                let mlp = match mlp {
                    ExpertMlp::SwiGlu => "SwiGLU",
                    ExpertMlp::ClampedSwiGlu => "clamped SwiGLU",
                };
                let biased = if biases { " biased" } else { "" };
                write!(f, ", {used} of {count}{biased} {mlp} experts of width {n_ff}")?;
                match gating {
                    Gating::Softmax => {}
                    Gating::SoftmaxOfChosen => f.write_str(" (softmax over the chosen)")?,
                    Gating::Sigmoid => f.write_str(" (sigmoid scores)")?,
                }
                if selection_bias {
                    f.write_str(" (chosen with a bias)")?;
                }
                if let Some((n_groups, used_groups)) = groups {
                    write!(f, " (from the best {used_groups} of {n_groups} groups)")?;
                }
                if normalized {
                    f.write_str(" (weights renormalized)")?;
                }
                if let Some(scale) = scale {
                    write!(f, " (weights scaled by {scale})")?;
                }
                if let Some(Shared { width, gated }) = shared {
                    let gated = if gated { "gated " } else { "" };
                    write!(f, " and a {gated}shared expert of width {width}")?;
                }
            }
        }
        if !self.pre_norms {
            f.write_str(", no pre-norms")?;
        }
        if self.post_norms {
            f.write_str(", post-norms")?;
        }
        if let Some(scale) = self.residual_scale {
            write!(f, ", residuals scaled by {scale}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::{TinyModel, Value};

    use super::{Summary, ranges, summarize};
    use crate::gguf::GgufFile;

    fn summary(builder: &sluice_tests::gguf_writer::GgufBuilder) -> Result<Summary, String> {
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        summarize(&file).map_err(|error| error.to_string())
    }

    #[test]
    fn a_file_names_its_family_and_each_layer_kind() {
        let qwen3 = TinyModel { n_layer: 3, ..TinyModel::recipe("qwen3", 2) }.build();
        let expected = Summary {
            family: "qwen3",
            n_layer: 3,
            layers: vec![("attention with Q/K norms, SwiGLU feed-forward".into(), vec![0, 1, 2])],
        };
        assert_eq!(summary(&qwen3), Ok(expected));
        let qwen2 = summary(&TinyModel::recipe("qwen2", 2).build()).expect("runs");
        assert_eq!(qwen2.layers[0].0, "attention with Q/K/V biases, SwiGLU feed-forward");
        let llama = summary(&TinyModel::recipe("llama", 2).build()).expect("runs");
        assert_eq!(llama.layers[0].0, "attention, SwiGLU feed-forward");
    }

    #[test]
    fn a_refused_architecture_is_named_with_those_sluice_runs() {
        let mamba = TinyModel::recipe("llama", 2).build().meta("general.architecture", Value::Str("mamba".into()));
        let error = summary(&mamba).expect_err("refused");
        assert!(error.starts_with("general.architecture = \"mamba\" is not supported (llama, qwen2, "), "{error}");
    }

    #[test]
    fn layer_indices_read_as_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12]), "0-4, 6-10, 12");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "");
    }
}
