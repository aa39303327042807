//! Draft decoding (docs/draft-fixups.md tells how a draft is paired with
//! its target before it gets here). A drafter proposes up to `n_max` tokens
//! per decoding slot; the target runs the slot's sampled token and the
//! drafts in one pass and keeps each draft its own sampler picks (see
//! `Emitter::verify`), so the output is exactly what plain decoding gives,
//! with the same random stream.
//!
//! Drafters keep their KV in stores indexed by the *target's* block tables
//! (same block size, same block count): trimming after a rejection, prefix
//! sharing, copy-on-write and eviction all follow the target's bookkeeping,
//! and a drafter only tracks how many cells of a sequence it has written.

mod dflash;
mod simple;

pub use dflash::DflashDrafter;
pub use simple::SimpleDrafter;

use sluice_model::ForwardError;
use sluice_model::batch::Layout;

/// Drafting limits (`[speculative]`, `--spec-draft-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftSettings {
    /// Most tokens drafted per slot and step.
    pub n_max: usize,
    /// Fewer drafted tokens than this are not worth verifying.
    pub n_min: usize,
    /// Drafting stops at the first token the drafter gives less than this
    /// probability.
    pub p_min: f32,
}

/// A drafter and its limits, owned by the engine.
pub struct Speculation {
    pub drafter: Box<dyn Drafter>,
    pub settings: DraftSettings,
}

/// A drafter's progress on one sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftState {
    /// Leading cells of the sequence whose draft KV is valid.
    pub cells: usize,
}

impl DraftState {
    /// A sequence that starts with `cached` cells borrowed from the prefix
    /// cache, whose draft KV was written by the request that cached them.
    pub fn new(cached: usize) -> Self {
        DraftState { cells: cached }
    }

    /// The target kept only `cells` cells: later draft KV is stale.
    pub fn trim(&mut self, cells: usize) {
        self.cells = self.cells.min(cells);
    }
}

/// One sequence to draft for.
pub struct DraftRequest<'a> {
    pub state: &'a mut DraftState,
    /// The sequence's KV blocks (the target's table).
    pub table: &'a [u32],
    /// Where its cells sit.
    pub layout: &'a Layout,
    /// Every token of the sequence: all but the last have target KV; the
    /// last is the sampled token the target runs next.
    pub tokens: &'a [u32],
    /// Most tokens to draft for this sequence this step.
    pub n_max: usize,
    /// The drafts, filled by the drafter.
    pub drafts: Vec<u32>,
}

impl DraftRequest<'_> {
    /// Cells with target KV; the sampled token goes into the next one.
    pub fn cells(&self) -> usize {
        self.tokens.len() - 1
    }
}

/// Target rows that became part of a sequence, for drafters that learn
/// from the target's hidden states (DFlash's context injection).
pub struct CommittedRows<'a> {
    pub state: &'a mut DraftState,
    pub table: &'a [u32],
    pub layout: &'a Layout,
    /// The first committed cell; rows are consecutive cells from here.
    pub first_cell: usize,
    /// Their rows in the target batch whose taps are passed alongside.
    pub batch_rows: std::ops::Range<usize>,
}

/// Why a drafter could not draft (the step goes on without drafts).
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error("draft forward pass: {0}")]
    Forward(#[from] ForwardError),
}

/// A source of draft tokens.
pub trait Drafter: Send {
    /// `draft-simple` or `dflash`.
    fn kind(&self) -> &'static str;

    /// Target layers whose input hidden states this drafter needs from every
    /// target pass (`Batch::taps`); empty when it needs none.
    fn taps(&self) -> &[usize] {
        &[]
    }

    /// Fill `drafts` of every request, one batched pass per draft depth.
    fn draft(&mut self, requests: &mut [DraftRequest<'_>], settings: &DraftSettings) -> Result<(), DraftError>;

    /// The target committed these rows; `taps` are that pass's outputs for
    /// [`Drafter::taps`] (n_rows × n_embd each).
    fn commit(&mut self, _rows: &mut [CommittedRows<'_>], _taps: &[Vec<f32>]) -> Result<(), DraftError> {
        Ok(())
    }

    /// The target copied a KV block (copy-on-write of a shared tail).
    fn copy_block(&mut self, from: u32, to: u32);
}

/// The most likely token of `logits` and its probability.
pub fn most_likely(logits: &[f32]) -> (u32, f32) {
    let mut best = 0;
    for (index, &logit) in logits.iter().enumerate() {
        if logit > logits[best] {
            best = index;
        }
    }
    let max = logits.get(best).copied().unwrap_or(0.0);
    let sum: f32 = logits.iter().map(|&logit| (logit - max).exp()).sum();
    (best as u32, if sum > 0.0 { 1.0 / sum } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_likely_takes_the_first_maximum_and_its_softmax_probability() {
        let (token, prob) = most_likely(&[0.0, 2.0, 2.0, -1.0]);
        assert_eq!(token, 1);
        let expected = 1.0 / (2.0 + (-2.0f32).exp() + (-3.0f32).exp());
        assert!((prob - expected).abs() < 1e-6, "{prob} vs {expected}");
    }

    #[test]
    fn trimming_never_extends_the_valid_cells() {
        let mut state = DraftState::new(4);
        state.trim(9);
        assert_eq!(state.cells, 4);
        state.trim(2);
        assert_eq!(state.cells, 2);
    }
}
