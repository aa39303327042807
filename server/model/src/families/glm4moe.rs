//! `glm4moe`: GLM-4.5 and GLM-4.5-Air (and GLM-4.6/4.7, Solar Open).
//! NEOX RoPE over `rope.dimension_count` elements of each head, Q/K/V
//! biases and Q/K norms where the file has them, the feed-forward's
//! pre-norm named `post_attention_norm`, the first
//! `leading_dense_block_count` layers a dense SwiGLU MLP and the others
//! experts: sigmoid scores (or the `expert_gating_func` the file names)
//! with a selection bias (`exp_probs_b`), optional groups, weights
//! renormalized (`expert_weights_norm`) and scaled
//! (`expert_weights_scale`), and `expert_shared_count` ungated shared
//! experts as one MLP. The trailing `nextn_predict_layers` layers
//! (multi-token prediction) are not run.

use super::experts::{Layout, experts};
use super::family::Family;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, invalid};
use crate::layer::{Attention, Ffn, Gating, LayerKind, Shared};
use crate::weights::LoadError;

pub(super) struct Glm4Moe;

const NAME: &str = "glm4moe";

/// The pre-norm of every layer's feed-forward.
const FFN_NORM: &str = "post_attention_norm.weight";

impl Family for Glm4Moe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn rope(&self, file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        let key = format!("{NAME}.rope.dimension_sections");
        match file.get(&key) {
            Some(_) => Err(invalid(&key, "present", "M-RoPE (GLM-4.5V) is not supported".into())),
            None => Ok(RopeStyle::Neox),
        }
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let key = |name: &str| format!("{NAME}.{name}");
        let gating = match file.opt_u32(&key("expert_gating_func"))? {
            None | Some(0 | 2) => Gating::Sigmoid,
            Some(1) => Gating::Softmax,
            Some(3) => Gating::SoftmaxOfChosen,
            Some(other) => {
                let why = "must be 1 (softmax), 2 (sigmoid) or 3 (softmax of the chosen)".into();
                return Err(invalid(&key("expert_gating_func"), other, why).into());
            }
        };
        let normalized = file.opt_bool(&key("expert_weights_norm"))?.unwrap_or(false);
        let layout = Layout { gating, normalized, ..Layout::PLAIN };
        let experts = experts(file, NAME, hp, layout)?
            .ok_or_else(|| invalid(&key("expert_count"), "absent", "a glm4moe model has experts".into()))?;
        let scale = match file.opt_f32(&key("expert_weights_scale"))? {
            None => None,
            Some(scale) if scale == 0.0 || scale == 1.0 => None,
            Some(scale) if scale.is_finite() => Some(scale),
            Some(scale) => return Err(invalid(&key("expert_weights_scale"), scale, "must be finite".into()).into()),
        };
        let shared_count = file.u32(&key("expert_shared_count"))? as usize;
        let shared = (shared_count > 0).then_some(Shared { width: shared_count * experts.n_ff, gated: false });
        let experts = Ffn::Experts(crate::layer::Experts {
            selection_bias: true,
            groups: groups(file, experts.count, experts.used)?,
            scale,
            shared,
            ..experts
        });
        let dense = file.opt_u32(&key("leading_dense_block_count"))?.unwrap_or(0) as usize;
        let layer = LayerKind { ffn_norm: FFN_NORM, ..LayerKind::plain(Attention::full(false, false)) };
        Ok((0..hp.n_layer).map(|i| LayerKind { ffn: if i < dense { Ffn::SwiGlu } else { experts }, ..layer }).collect())
    }
}

/// `expert_group_count` groups of which a row chooses from the best
/// `expert_group_used_count`, as llama.cpp checks them; `None` for one
/// group or none.
fn groups(file: &GgufFile, count: usize, used: usize) -> Result<Option<(usize, usize)>, HParamsError> {
    let (count_key, used_key) = (format!("{NAME}.expert_group_count"), format!("{NAME}.expert_group_used_count"));
    let n_groups = file.opt_u32(&count_key)?.unwrap_or(0) as usize;
    if n_groups <= 1 {
        return Ok(None);
    }
    if !count.is_multiple_of(n_groups) || count / n_groups < 2 {
        return Err(invalid(
            &count_key,
            n_groups,
            format!("must divide the {count} experts into groups of two or more"),
        ));
    }
    let used_groups = file.u32(&used_key)? as usize;
    if used_groups == 0 || used_groups >= n_groups || used_groups * (count / n_groups) < used {
        return Err(invalid(
            &used_key,
            used_groups,
            format!("must be 1..{n_groups} and its groups hold the {used} experts a row uses"),
        ));
    }
    Ok(Some((n_groups, used_groups)))
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::Value;
    use sluice_tests::models::tiny_family;

    use super::groups;
    use crate::gguf::GgufFile;

    fn read(count: u32, used: u32) -> Result<Option<(usize, usize)>, String> {
        let model = tiny_family("glm4moe").expect("a tiny GLM-4.5");
        let model = model.meta("glm4moe.expert_group_count", Value::U32(count));
        let model = model.meta("glm4moe.expert_group_used_count", Value::U32(used));
        let file = GgufFile::from_bytes(model.build()).expect("parses");
        groups(&file, 8, 2).map_err(|error| error.to_string())
    }

    #[test]
    fn groups_are_checked_as_llama_cpp_checks_them() {
        assert_eq!(read(4, 2), Ok(Some((4, 2))));
        assert_eq!(read(1, 1), Ok(None));
        assert_eq!(
            read(3, 1).unwrap_err(),
            "glm4moe.expert_group_count = 3: must divide the 8 experts into groups of two or more"
        );
        assert_eq!(
            read(8, 1).unwrap_err(),
            "glm4moe.expert_group_count = 8: must divide the 8 experts into groups of two or more"
        );
        assert_eq!(
            read(4, 4).unwrap_err(),
            "glm4moe.expert_group_used_count = 4: must be 1..4 and its groups hold the 2 experts a row uses"
        );
    }
}
