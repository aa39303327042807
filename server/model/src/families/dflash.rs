//! `dflash`: a DFlash block-diffusion draft. Qwen3 layers fed by fused
//! features of its target's hidden states; the embedding table and LM head
//! are its own or lent by the target, and a reduced-vocabulary head has
//! one row per `d2t` entry. Its DFlash settings (taps, block size) are
//! `model::dflash`'s.

use super::family::{Family, Outer};
use super::qwen3;
use crate::dflash::{ARCHITECTURE, DflashParams};
use crate::gguf::GgufFile;
use crate::hparams::{HParams, HParamsError, RopeStyle, invalid, sections};
use crate::layer::LayerKind;
use crate::weights::LoadError;

pub(super) struct Dflash;

impl Family for Dflash {
    fn name(&self) -> &'static str {
        ARCHITECTURE
    }

    fn rope(&self, file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError> {
        rope(file, n_rot)
    }

    fn layers(&self, _file: &GgufFile, hp: &HParams) -> Result<Vec<LayerKind>, LoadError> {
        Ok(vec![qwen3::QWEN3.layer; hp.n_layer])
    }

    fn outer(&self, file: &GgufFile, hp: &HParams) -> Result<Outer, LoadError> {
        let n_taps = DflashParams::from_gguf(file)?.target_layers.len();
        Ok(Outer {
            lent: true,
            head_rows: file.tensor("d2t").map_or(hp.n_vocab, |d2t| d2t.elements() as usize),
            fusion: Some(n_taps * hp.n_embd),
            ..Outer::plain(hp)
        })
    }

    fn vocabulary_optional(&self) -> bool {
        true
    }
}

/// A DFlash draft's rotary style, from the draft file alone (after any
/// fixup edits): explicit non-zero sections mean M-RoPE (contiguous, never
/// interleaved); otherwise NEOX with one position.
fn rope(file: &GgufFile, n_rot: usize) -> Result<RopeStyle, HParamsError> {
    const SECTIONS: &str = "dflash.rope.dimension_sections";
    if let Some(count) = file.opt_u32("dflash.hyper_connection.count")?
        && count > 0
    {
        return Err(invalid(
            "dflash.hyper_connection.count",
            count,
            "DSV4 DFlash backbones (hyper-connections, MLA, MoE) are not supported".into(),
        ));
    }
    match file.get(SECTIONS) {
        Some(_) if file.ints(SECTIONS)?.iter().any(|&section| section != 0) => {
            Ok(RopeStyle::MRope(sections(file, SECTIONS, n_rot)?))
        }
        _ => Ok(RopeStyle::Neox),
    }
}
