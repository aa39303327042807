//! DFlash draft metadata: which target layers feed it, its block size, mask
//! token and attention mode (the network itself is the `dflash` family's,
//! in `families/dflash.rs`).

use super::gguf::{GgufError, GgufFile};
use super::hparams::HParamsError;

/// The `general.architecture` of DFlash drafts.
pub const ARCHITECTURE: &str = "dflash";

/// The DFlash-specific settings of a draft file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DflashParams {
    /// Target layers whose *inputs* feed the draft (`n_layer` = the last
    /// layer's output), in feature order.
    pub target_layers: Vec<usize>,
    /// Tokens per drafted block: the sampled token and `block_size - 1`
    /// masks.
    pub block_size: usize,
    /// `tokenizer.ggml.mask_token_id`.
    pub mask_token: Option<u32>,
    /// Causal attention inside the block (default: bidirectional).
    pub causal: bool,
}

/// Largest block accepted (a hostile file must not size huge batches).
const MAX_BLOCK: u32 = 256;

impl DflashParams {
    pub fn from_gguf(file: &GgufFile) -> Result<Self, HParamsError> {
        const LAYERS: &str = "dflash.target_layers";
        let layers = match file.get(LAYERS) {
            None => return Err(GgufError::MissingKey(LAYERS.into()).into()),
            Some(_) => file.ints(LAYERS)?,
        };
        if layers.is_empty() || layers.iter().any(|&layer| !(0..=1024).contains(&layer)) {
            return Err(HParamsError::Invalid {
                key: LAYERS.into(),
                value: format!("{layers:?}"),
                problem: "must list 1 or more layer ids in 0..=1024".into(),
            });
        }
        let block_size = file.opt_u32("dflash.block_size")?.unwrap_or(16);
        if !(2..=MAX_BLOCK).contains(&block_size) {
            return Err(HParamsError::Invalid {
                key: "dflash.block_size".into(),
                value: block_size.to_string(),
                problem: format!("must be 2..={MAX_BLOCK}"),
            });
        }
        Ok(DflashParams {
            target_layers: layers.iter().map(|&layer| layer as usize).collect(),
            block_size: block_size as usize,
            mask_token: file.opt_u32("tokenizer.ggml.mask_token_id")?,
            causal: file.opt_bool("dflash.attention.causal")?.unwrap_or(false),
        })
    }
}
