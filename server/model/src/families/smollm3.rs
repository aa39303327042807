//! `smollm3`: SmolLM3 text models. Llama's layers and adjacent-pair RoPE,
//! except that every fourth layer (3, 7, 11, … counting from 0) applies no
//! position embedding to Q and K. The period is fixed by the architecture
//! (llama.cpp's, too): the files carry no key for it.

use super::family::Family;
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle};
use crate::layer::{Attention, LayerKind};
use crate::weights::LoadError;

pub(super) struct Smollm3;

/// Every `NO_ROPE_PERIOD`-th layer has no RoPE.
const NO_ROPE_PERIOD: usize = 4;

impl Family for Smollm3 {
    fn name(&self) -> &'static str {
        "smollm3"
    }

    fn rope(&self, _file: &GgufFile, _n_rot: usize) -> Result<RopeStyle, HParamsError> {
        Ok(RopeStyle::Norm)
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok((0..hp.n_layer)
            .map(|layer| {
                let rotary = (layer + 1) % NO_ROPE_PERIOD != 0;
                LayerKind::plain(Attention { rotary, ..Attention::full(false, false) })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::TinyModel;

    use super::Smollm3;
    use crate::families::family::Family;
    use crate::gguf::GgufFile;
    use crate::hparams::HParams;

    #[test]
    fn every_fourth_layer_has_no_rope() {
        let file = GgufFile::from_bytes(TinyModel { n_layer: 9, ..TinyModel::recipe("smollm3", 5) }.build().build())
            .expect("parses");
        let hp = HParams::from_gguf(&file).expect("valid");
        let rotary: Vec<bool> = Smollm3
            .layers(&file, &hp)
            .expect("declared")
            .iter()
            .map(|layer| {
                let attention = layer.mixer.attention().expect("attention");
                attention.rotary
            })
            .collect();
        assert_eq!(rotary, [true, true, true, false, true, true, true, false, true]);
    }
}
