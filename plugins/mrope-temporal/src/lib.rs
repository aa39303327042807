//! `mrope-temporal`: give a legacy DFlash draft (no
//! `dflash.rope.dimension_sections`) temporal-only M-RoPE sections
//! `[n_rot/2, 0, 0, 0]` when its target uses M-RoPE.
//!
//! Such a draft otherwise keeps 1-D positions, and the first text token
//! after an image (whose position jumps by the image's size) is rejected
//! mid-request. With every rotary pair on the temporal component, text at
//! `[p, p, p, 0]` rotates exactly as NEOX at `p`, so the draft's numerics
//! are unchanged while its positions may jump.
//!
//! | draft | target | edits |
//! |---|---|---|
//! | explicit sections (not all zero) | any | none |
//! | DSV4 (`dflash.hyper_connection.count` > 0) | any | none |
//! | legacy | text-only | none |
//! | legacy | M-RoPE (MROPE or IMROPE) | sections `[n_rot/2, 0, 0, 0]` |
//! | legacy, invalid rotary dims | M-RoPE | refused |

use sluice_plugin_api::{Edit, Fixup, MetaEntry, MetaValue, ModelInfo, export_fixup};

pub const SECTIONS: &str = "dflash.rope.dimension_sections";

pub struct MropeTemporal;

impl Fixup for MropeTemporal {
    fn fixup(target: &ModelInfo, draft: &ModelInfo) -> Result<Vec<Edit>, String> {
        if draft.architecture != "dflash"
            || ints(draft, SECTIONS).is_some_and(|sections| sections.iter().any(|&section| section != 0))
            || int(draft, "dflash.hyper_connection.count")?.unwrap_or(0) > 0
            || !uses_mrope(target)
        {
            return Ok(Vec::new());
        }
        let n_rot = checked_n_rot(draft)?;
        Ok(vec![Edit::Set(MetaEntry { key: SECTIONS.into(), value: MetaValue::IntArray(vec![n_rot / 2, 0, 0, 0]) })])
    }
}

export_fixup!(MropeTemporal);

/// Whether the target's text positions have four components: the
/// architectures whose graphs apply M-RoPE, with sections that are used.
fn uses_mrope(target: &ModelInfo) -> bool {
    let arch = target.architecture.as_str();
    let sections = ints(target, &format!("{arch}.rope.dimension_sections")).unwrap_or_default();
    let section = |index: usize| sections.get(index).copied().unwrap_or(0);
    match arch {
        "qwen2vl" | "qwen3vl" | "qwen3vlmoe" | "qwen35" | "qwen35moe" | "paddleocr" => {
            sections.iter().any(|&section| section != 0)
        }
        // These store sections but use M-RoPE only with temporal and
        // height sections both set.
        "glm4" | "glm4moe" | "hunyuan-vl" => section(0) > 0 && section(1) > 0,
        _ => false,
    }
}

/// The draft's rotary dimension count, if M-RoPE can rotate it: key and
/// value heads of one size, `n_rot` even and in `1..=head`, and no
/// per-frequency factors (the M-RoPE path applies none).
fn checked_n_rot(draft: &ModelInfo) -> Result<i64, String> {
    let required = |key: &str| int(draft, key)?.ok_or_else(|| format!("{key} is missing"));
    let n_embd = required("dflash.embedding_length")?;
    let n_head = required("dflash.attention.head_count")?;
    if n_head <= 0 {
        return Err(format!("dflash.attention.head_count = {n_head} must be positive"));
    }
    let head_k = int(draft, "dflash.attention.key_length")?.unwrap_or(n_embd / n_head);
    let head_v = int(draft, "dflash.attention.value_length")?.unwrap_or(n_embd / n_head);
    if head_k != head_v {
        return Err(format!(
            "dflash.attention.key_length = {head_k} differs from dflash.attention.value_length = {head_v}: \
             temporal-only M-RoPE needs one head size"
        ));
    }
    let n_rot = int(draft, "dflash.rope.dimension_count")?.unwrap_or(head_k);
    if n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_k {
        return Err(format!(
            "dflash.rope.dimension_count = {n_rot} cannot be rotated as M-RoPE: it must be even and in 1..={head_k}"
        ));
    }
    if draft.tensors.iter().any(|tensor| tensor.name == "rope_freqs.weight") {
        return Err("the draft has rope_freqs.weight, which the M-RoPE path does not apply".into());
    }
    Ok(n_rot)
}

fn value<'a>(model: &'a ModelInfo, key: &str) -> Option<&'a MetaValue> {
    model.metadata.iter().find(|entry| entry.key == key).map(|entry| &entry.value)
}

fn int(model: &ModelInfo, key: &str) -> Result<Option<i64>, String> {
    match value(model, key) {
        None => Ok(None),
        Some(MetaValue::Int(value)) => Ok(Some(*value)),
        Some(MetaValue::Uint(value)) => {
            i64::try_from(*value).map(Some).map_err(|_| format!("{key} = {value} is out of range"))
        }
        Some(other) => Err(format!("{key} is {other:?}, expected an integer")),
    }
}

fn ints(model: &ModelInfo, key: &str) -> Option<Vec<i64>> {
    match value(model, key)? {
        MetaValue::IntArray(values) => Some(values.clone()),
        // A scalar is broadcast to all four sections (as GGUF loaders do).
        MetaValue::Int(value) => Some(vec![*value; 4]),
        MetaValue::Uint(value) => Some(vec![i64::try_from(*value).unwrap_or(i64::MAX); 4]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plugin_api::TensorInfo;

    fn entry(key: &str, value: MetaValue) -> MetaEntry {
        MetaEntry { key: key.into(), value }
    }

    fn target(arch: &str, sections: Option<Vec<i64>>) -> ModelInfo {
        let mut metadata = vec![entry(&format!("{arch}.embedding_length"), MetaValue::Uint(64))];
        if let Some(sections) = sections {
            metadata.push(entry(&format!("{arch}.rope.dimension_sections"), MetaValue::IntArray(sections)));
        }
        ModelInfo { architecture: arch.into(), metadata, tensors: Vec::new() }
    }

    /// The reference recipe's legacy draft: 64 wide, 4 heads of 16.
    fn draft(extra: &[(&str, MetaValue)]) -> ModelInfo {
        let mut metadata = vec![
            entry("dflash.embedding_length", MetaValue::Uint(64)),
            entry("dflash.attention.head_count", MetaValue::Uint(4)),
            entry("dflash.attention.key_length", MetaValue::Uint(16)),
            entry("dflash.attention.value_length", MetaValue::Uint(16)),
        ];
        for (key, value) in extra {
            metadata.retain(|entry| entry.key != *key);
            metadata.push(entry(key, value.clone()));
        }
        ModelInfo { architecture: "dflash".into(), metadata, tensors: Vec::new() }
    }

    fn temporal(n_pairs: i64) -> Vec<Edit> {
        vec![Edit::Set(entry(SECTIONS, MetaValue::IntArray(vec![n_pairs, 0, 0, 0])))]
    }

    #[test]
    fn a_legacy_draft_of_an_mrope_or_imrope_target_gets_temporal_sections() {
        for target in [target("qwen2vl", Some(vec![2, 3, 3, 0])), target("qwen3vl", Some(vec![4, 2, 2, 0]))] {
            assert_eq!(MropeTemporal::fixup(&target, &draft(&[])), Ok(temporal(8)), "{}", target.architecture);
        }
        // n_rot/2, not head/2, when the draft rotates part of the head.
        let partial = draft(&[("dflash.rope.dimension_count", MetaValue::Uint(8))]);
        assert_eq!(MropeTemporal::fixup(&target("qwen2vl", Some(vec![2, 1, 1, 0])), &partial), Ok(temporal(4)));
        // An explicit all-zero array counts as no sections.
        let zeros = draft(&[(SECTIONS, MetaValue::IntArray(vec![0, 0, 0, 0]))]);
        assert_eq!(MropeTemporal::fixup(&target("qwen3vl", Some(vec![4, 2, 2, 0])), &zeros), Ok(temporal(8)));
    }

    #[test]
    fn explicit_sections_stay_verbatim_canonical_or_not() {
        let mrope = target("qwen2vl", Some(vec![2, 3, 3, 0]));
        for sections in [vec![8, 0, 0, 0], vec![5, 0, 0, 0], vec![2, 3, 3, 0]] {
            let explicit = draft(&[(SECTIONS, MetaValue::IntArray(sections.clone()))]);
            assert_eq!(MropeTemporal::fixup(&mrope, &explicit), Ok(Vec::new()), "{sections:?}");
        }
    }

    #[test]
    fn dsv4_drafts_and_text_only_targets_are_left_alone() {
        let dsv4 = draft(&[("dflash.hyper_connection.count", MetaValue::Uint(4))]);
        assert_eq!(MropeTemporal::fixup(&target("qwen2vl", Some(vec![2, 3, 3, 0])), &dsv4), Ok(Vec::new()));
        for text in [
            target("qwen3", None),
            target("llama", None),
            target("qwen2vl", Some(vec![0, 0, 0, 0])),
            // glm4 stores sections but rotates 1-D unless t and h are set.
            target("glm4", Some(vec![8, 0, 0, 0])),
            // Sections on an architecture that never uses M-RoPE.
            target("ernie4_5", Some(vec![2, 3, 3, 0])),
        ] {
            assert_eq!(MropeTemporal::fixup(&text, &draft(&[])), Ok(Vec::new()), "{}", text.architecture);
        }
        assert_eq!(MropeTemporal::fixup(&target("glm4", Some(vec![8, 4, 4, 0])), &draft(&[])), Ok(temporal(8)));
        // Not a DFlash draft: nothing to do.
        let mut simple = draft(&[]);
        simple.architecture = "qwen3".into();
        assert_eq!(MropeTemporal::fixup(&target("qwen2vl", Some(vec![2, 3, 3, 0])), &simple), Ok(Vec::new()));
    }

    #[test]
    fn invalid_rotary_dimensions_are_refused_for_mrope_targets_only() {
        let mrope = target("qwen2vl", Some(vec![2, 3, 3, 0]));
        let freqs = ModelInfo {
            tensors: vec![TensorInfo { name: "rope_freqs.weight".into(), dtype: "F32".into(), shape: vec![8] }],
            ..draft(&[])
        };
        let cases = [
            (draft(&[("dflash.rope.dimension_count", MetaValue::Uint(15))]), "must be even"),
            (draft(&[("dflash.rope.dimension_count", MetaValue::Uint(0))]), "must be even"),
            (draft(&[("dflash.rope.dimension_count", MetaValue::Uint(32))]), "in 1..=16"),
            (draft(&[("dflash.attention.value_length", MetaValue::Uint(8))]), "differs from"),
            (freqs, "rope_freqs.weight"),
        ];
        for (bad, expected) in cases {
            let refused = MropeTemporal::fixup(&mrope, &bad).expect_err("refused");
            assert!(refused.contains(expected), "{refused}");
            // A text-only target never needs the inference.
            assert_eq!(MropeTemporal::fixup(&target("qwen3", None), &bad), Ok(Vec::new()));
        }
    }
}
