//! A mixture-of-experts family's expert layout, read as llama.cpp reads
//! it: `<arch>.expert_count` experts, `<arch>.expert_used_count` run per
//! row, each `<arch>.expert_feed_forward_length` wide (where the family
//! has the key; else `feed_forward_length`), and a gated shared expert of
//! `<arch>.expert_shared_feed_forward_length` where the family has one.

use super::family::Family;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, invalid};
use crate::layer::{Attention, ExpertMlp, Experts, Ffn, Gating, LayerKind, Shared};
use crate::weights::LoadError;

/// A family whose every layer is one attention and experts, which its
/// files must have (Qwen's MoE families).
pub(super) struct Moe {
    pub(super) name: &'static str,
    pub(super) rope: fn(&GgufFile, usize) -> Result<RopeStyle, HParamsError>,
    pub(super) attention: Attention,
    pub(super) layout: Layout,
}

impl Family for Moe {
    fn name(&self) -> &'static str {
        self.name
    }

    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError> {
        (self.rope)(file, n_rot)
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let key = format!("{}.expert_count", self.name);
        let experts = experts(file, self.name, hp, self.layout)?
            .ok_or_else(|| invalid(&key, "absent", format!("a {} model has experts", self.name)))?;
        let layer = LayerKind { ffn: Ffn::Experts(experts), ..LayerKind::plain(self.attention) };
        Ok(vec![layer; hp.n_layer])
    }
}

/// llama.cpp's bound on a file's experts (`LLAMA_MAX_EXPERTS`).
const MAX_EXPERTS: u32 = 1024;

/// How a family's experts are laid out beyond the counts in its files.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    /// The expert width has a key of its own; without it a family's
    /// experts are `feed_forward_length / expert_used_count` wide (Qwen's
    /// MoE families). `false`: they are `feed_forward_length` wide
    /// (Mixtral on `llama`).
    pub(super) own_width: bool,
    pub(super) normalized: bool,
    /// A gated shared expert, by default `feed_forward_length` wide.
    pub(super) shared: bool,
    pub(super) gating: Gating,
    pub(super) mlp: ExpertMlp,
    pub(super) biases: bool,
}

impl Layout {
    /// Experts `expert_feed_forward_length` wide, a softmax router, SwiGLU
    /// MLPs, no biases, no renormalization, no shared expert.
    pub(super) const PLAIN: Layout = Layout {
        own_width: true,
        normalized: false,
        shared: false,
        gating: Gating::Softmax,
        mlp: ExpertMlp::SwiGlu,
        biases: false,
    };
}

/// The experts of `arch`'s files, or `None` where `expert_count` is
/// absent or 0 (a dense model).
pub(super) fn experts(
    file: &GgufFile,
    arch: &str,
    hp: &HParams,
    layout: Layout,
) -> Result<Option<Experts>, HParamsError> {
    let count_key = format!("{arch}.expert_count");
    let Some(count) = file.opt_u32(&count_key)?.filter(|&count| count > 0) else { return Ok(None) };
    if count > MAX_EXPERTS {
        return Err(invalid(&count_key, count, format!("must be at most {MAX_EXPERTS}")));
    }
    let used_key = format!("{arch}.expert_used_count");
    let used = file.u32(&used_key)?;
    if used == 0 || used > count {
        return Err(invalid(&used_key, used, format!("must be 1..={count} ({count_key})")));
    }
    let (count, used) = (count as usize, used as usize);
    let width = |key: &str, default: usize| -> Result<usize, HParamsError> {
        let key = format!("{arch}.{key}");
        match file.opt_u32(&key)? {
            Some(0) => Err(invalid(&key, 0, "must be positive".into())),
            Some(width) => Ok(width as usize),
            None if default > 0 => Ok(default),
            None => Err(invalid(&key, "absent", format!("feed_forward_length {} has no expert width", hp.n_ff))),
        }
    };
    let n_ff = match layout.own_width {
        true => width("expert_feed_forward_length", hp.n_ff / used)?,
        false => hp.n_ff,
    };
    let shared = layout
        .shared
        .then(|| width("expert_shared_feed_forward_length", hp.n_ff))
        .transpose()?
        .map(|width| Shared { width, gated: true });
    let Layout { normalized, gating, mlp, biases, .. } = layout;
    let (selection_bias, groups, scale) = (false, None, None);
    Ok(Some(Experts { count, used, n_ff, gating, selection_bias, groups, normalized, scale, shared, mlp, biases }))
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::{TinyModel, Value};

    use super::{Layout, experts};
    use crate::gguf::GgufFile;
    use crate::hparams::HParams;
    use crate::layer::{ExpertMlp, Experts, Gating, Shared};

    const QWEN: Layout = Layout { normalized: true, ..Layout::PLAIN };

    fn read(entries: &[(&str, u32)], layout: Layout) -> Result<Option<Experts>, String> {
        let model = TinyModel { n_layer: 1, ..TinyModel::recipe("qwen3", 3) }.build();
        let model = entries.iter().fold(model, |model, (key, value)| model.meta(key, Value::U32(*value)));
        let file = GgufFile::from_bytes(model.build()).expect("parses");
        let hp = HParams::from_gguf(&file).expect("valid");
        experts(&file, "qwen3", &hp, layout).map_err(|error| error.to_string())
    }

    #[test]
    fn counts_and_widths_come_from_the_file_or_llama_cpp_defaults() {
        assert_eq!(read(&[], QWEN), Ok(None), "dense");
        assert_eq!(read(&[("qwen3.expert_count", 0)], QWEN), Ok(None), "dense");
        let counts = [("qwen3.expert_count", 8), ("qwen3.expert_used_count", 2)];
        let expect = Experts {
            count: 8,
            used: 2,
            n_ff: 64,
            gating: Gating::Softmax,
            selection_bias: false,
            groups: None,
            normalized: true,
            scale: None,
            shared: None,
            mlp: ExpertMlp::SwiGlu,
            biases: false,
        };
        // feed_forward_length 128 over 2 used.
        assert_eq!(read(&counts, QWEN), Ok(Some(expect)));
        let own = [counts[0], counts[1], ("qwen3.expert_feed_forward_length", 24)];
        assert_eq!(read(&own, QWEN), Ok(Some(Experts { n_ff: 24, ..expect })));
        let mixtral = Layout { own_width: false, ..QWEN };
        assert_eq!(read(&own, mixtral), Ok(Some(Experts { n_ff: 128, ..expect })));
        let shared = Layout { shared: true, ..Layout::PLAIN };
        let with_shared = [counts[0], counts[1], ("qwen3.expert_shared_feed_forward_length", 40)];
        assert_eq!(
            read(&with_shared, shared),
            Ok(Some(Experts { normalized: false, shared: Some(Shared { width: 40, gated: true }), ..expect }))
        );
        assert_eq!(
            read(&counts, shared),
            Ok(Some(Experts { normalized: false, shared: Some(Shared { width: 128, gated: true }), ..expect }))
        );
    }

    #[test]
    fn impossible_counts_are_refused_naming_the_key() {
        let error = read(&[("qwen3.expert_count", 8), ("qwen3.expert_used_count", 9)], QWEN).unwrap_err();
        assert_eq!(error, "qwen3.expert_used_count = 9: must be 1..=8 (qwen3.expert_count)");
        let error = read(&[("qwen3.expert_count", 1025), ("qwen3.expert_used_count", 1)], QWEN).unwrap_err();
        assert_eq!(error, "qwen3.expert_count = 1025: must be at most 1024");
        let error = read(&[("qwen3.expert_count", 8)], QWEN).unwrap_err();
        assert!(error.contains("qwen3.expert_used_count"), "{error}");
        let zero = [("qwen3.expert_count", 8), ("qwen3.expert_used_count", 2), ("qwen3.expert_feed_forward_length", 0)];
        assert_eq!(read(&zero, QWEN).unwrap_err(), "qwen3.expert_feed_forward_length = 0: must be positive");
    }
}
