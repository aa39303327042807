//! `llama`: Llama 2 and 3 and the many models converted to their layout.
//! RoPE rotates adjacent pairs (the converter permutes Q and K to match);
//! a file with Q/K/V biases has them applied. A file with
//! `llama.expert_count` is a mixture of experts (Mixtral): experts as wide
//! as `feed_forward_length`, the chosen probabilities renormalized.

use super::experts::{Layout, experts};
use super::family::Family;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle};
use crate::layer::{Attention, Ffn, LayerKind};
use crate::weights::LoadError;

pub(super) struct Llama;

impl Family for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Norm)
    }

    fn layers(&self, file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        let plain = LayerKind::plain(Attention::full(false, false));
        let layout = Layout { own_width: false, normalized: true, ..Layout::PLAIN };
        let layer = match experts(file, self.name(), hp, layout)? {
            Some(experts) => LayerKind { ffn: Ffn::Experts(experts), ..plain },
            None => plain,
        };
        Ok(vec![layer; hp.n_layer])
    }
}
