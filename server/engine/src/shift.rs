//! Context shift (llama-server's `--context-shift`): a slot whose context is
//! full drops the older part of what follows its kept tokens and goes on
//! generating.
//!
//! llama.cpp moves the surviving cells down and rotates their stored keys
//! by the distance moved. sluice instead prefills the surviving tokens
//! again, borrowing what it can from the prefix cache (the kept head). That
//! costs a prefill per shift, but the KV it leaves is exactly what a fresh
//! request with those tokens would have: one arithmetic whatever the shift
//! history (batch invariance holds across shifts), and no drift from
//! rotating keys that were already rounded to the store's precision.

use super::kv::{BlockManager, OutOfBlocks};
use super::policy::Phase;
use super::request::IMAGE_ROW;
use super::slot::Active;

/// Which cells a shift keeps: the first `keep`, then all after
/// `keep + discard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cut {
    pub keep: usize,
    pub discard: usize,
}

/// llama-server's cut for a slot of `ctx` cells holding `cells`: `n_keep`
/// prompt tokens (all of them when `None`; one more for a BOS the tokenizer
/// adds, at most `ctx - 4`) stay, then `n_discard` go (0 = half of the
/// rest), leaving at least one. `None` when nothing can go.
pub(super) fn cut(
    cells: usize,
    ctx: usize,
    n_prompt: usize,
    n_keep: Option<usize>,
    n_discard: usize,
    bos: bool,
) -> Option<Cut> {
    let keep = (n_keep.unwrap_or(n_prompt) + usize::from(bos)).min(ctx.saturating_sub(4));
    let left = cells.saturating_sub(keep);
    let discard = if n_discard > 0 { n_discard } else { left / 2 };
    let discard = discard.min(left.saturating_sub(1));
    (discard > 0).then_some(Cut { keep, discard })
}

/// Whether a request can be shifted at all: image rows cannot be moved
/// (their positions are the image's grid), as in llama-server.
pub(super) fn shiftable(active: &Active) -> bool {
    active.request.images.is_empty() && active.tokens.iter().all(|&token| token & IMAGE_ROW == 0)
}

/// Shift `active`, whose `tokens` are its written cells followed by the
/// token sampled last (not yet run): the cells `cut` spares and that token
/// become the slot's new prompt, prefilled from the longest cached prefix.
/// Returns the block copy the admission needs (see
/// [`super::kv::Admission::copy`]).
pub(super) fn apply(
    active: &mut Active,
    cut: Cut,
    blocks: &mut BlockManager,
) -> Result<Option<(u32, u32)>, OutOfBlocks> {
    let Cut { keep, discard } = cut;
    let mut sequence = active.tokens[..keep].to_vec();
    sequence.extend_from_slice(&active.tokens[keep + discard..]);
    let (cacheable, root) = (active.blocks.cacheable(), active.blocks.root());
    blocks.release(std::mem::take(&mut active.blocks));
    let admission = blocks.admit(root, &sequence, cacheable, usize::MAX)?;
    let cached = admission.cached_tokens;
    active.tokens = sequence[..cached].to_vec();
    active.request.prompt = sequence;
    active.blocks = admission.blocks;
    active.prompt_done = cached;
    active.cells = cached;
    active.held_logits.clear();
    active.draft.trim(cached);
    active.phase = Phase::Prefilling;
    active.truncated = true;
    Ok(admission.copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_follows_llama_server() {
        // n_keep 0, no BOS: half of the full context goes.
        assert_eq!(cut(255, 256, 8, Some(0), 0, false), Some(Cut { keep: 0, discard: 127 }));
        // A BOS the tokenizer adds is kept on top of n_keep.
        assert_eq!(cut(255, 256, 8, Some(0), 0, true), Some(Cut { keep: 1, discard: 127 }));
        // n_keep -1 keeps the whole prompt.
        assert_eq!(cut(255, 256, 100, None, 0, false), Some(Cut { keep: 100, discard: 77 }));
        // n_discard is honoured but always leaves one cell after the kept ones.
        assert_eq!(cut(255, 256, 8, Some(10), 50, false), Some(Cut { keep: 10, discard: 50 }));
        assert_eq!(cut(255, 256, 8, Some(10), 500, false), Some(Cut { keep: 10, discard: 244 }));
        // n_keep is capped at ctx - 4.
        assert_eq!(cut(255, 256, 300, None, 0, false), Some(Cut { keep: 252, discard: 1 }));
    }

    #[test]
    fn nothing_to_cut_is_none() {
        assert_eq!(cut(3, 256, 3, None, 0, false), None, "every cell is kept");
        assert_eq!(cut(1, 256, 0, Some(0), 0, false), None, "one cell left: nothing may go");
    }
}
