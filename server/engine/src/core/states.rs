//! Where a model with recurrent layers meets the prefix cache and drafts:
//! prompts admitted from a state snapshot, the cells of a pass where
//! snapshots are taken, the one a finished request leaves (see
//! `engine::state_cache`), and the states a verification may have to put
//! back (see `Active::replay`).

use std::collections::HashMap;

use sluice_model::StateSnapshot;

use super::Engine;
use crate::batch::Work;
use crate::kv::{Admission, OutOfBlocks};
use crate::slot::Active;

/// Prompts shorter than this are computed again rather than given a pass
/// of their own for a snapshot before their end.
const MIN_END_SNAPSHOT: usize = 64;

/// A snapshot a pass takes: before batch row `row`, slot `slot`'s state
/// holds `cells` cells.
pub(super) struct Stop {
    pub row: usize,
    pub slot: usize,
    pub cells: usize,
}

impl Engine {
    /// Prompt tokens the prefix cache would serve `prompt` under the chain
    /// from `root`: for a model with recurrent layers, only up to a state
    /// snapshot.
    pub(super) fn cached_prefix(&self, root: u64, prompt: &[u32]) -> usize {
        let available = self.blocks.cached_prefix(root, prompt);
        match &self.states {
            Some(states) => states.resumable(root, prompt, available),
            None => available,
        }
    }

    /// Admit `prompt` into `slot`'s blocks, borrowing its cached prefix when
    /// `use_cache`; with recurrent layers, up to the longest snapshot whose
    /// state is then put in the slot.
    pub(super) fn admit_blocks(
        &mut self,
        root: u64,
        prompt: &[u32],
        use_cache: bool,
        slot: usize,
    ) -> Result<Admission, OutOfBlocks> {
        let Some(states) = self.states.as_mut() else {
            let admission = self.blocks.admit(root, prompt, use_cache, usize::MAX)?;
            self.copy_block(admission.copy);
            return Ok(admission);
        };
        let available = if use_cache { self.blocks.cached_prefix(root, prompt) } else { 0 };
        let state = states.resume(root, prompt, available);
        let limit = state.as_ref().map_or(0, |state| state.cells as usize);
        let admission = self.blocks.admit(root, prompt, use_cache, limit)?;
        let resumed = match &state {
            Some(state) if admission.cached_tokens == limit => self.context.write_state(slot as u32, state),
            _ => Ok(()),
        };
        if let Err(error) = resumed {
            // Computed whole instead; the blocks it borrowed go back.
            tracing::warn!(%error, slot, "a recurrent state snapshot could not be restored");
            self.blocks.release(admission.blocks);
            return self.blocks.admit(root, prompt, use_cache, 0);
        }
        self.copy_block(admission.copy);
        Ok(admission)
    }

    /// The snapshots `work`'s prompt chunks take. A chunk's own last row
    /// needs no pass to end there (no other rows change its state): that
    /// snapshot is taken after the batch's last row.
    pub(super) fn snapshot_stops(&self, work: &[Work]) -> Vec<Stop> {
        let Some(states) = &self.states else { return Vec::new() };
        let mut stops = Vec::new();
        let mut first_row = 0;
        for item in work {
            if let (&Work::Prefill { slot, start, tokens }, Some(active)) = (item, &self.slots[item.slot()])
                && active.blocks.cacheable()
            {
                let n_prompt = active.request.prompt.len();
                let until = if n_prompt >= MIN_END_SNAPSHOT { n_prompt } else { 0 };
                for cells in states.points(start, start + tokens, until) {
                    let row = (cells < start + tokens).then_some(first_row + cells - start);
                    stops.push((row, slot, cells));
                }
            }
            first_row += item.rows();
        }
        stops.into_iter().map(|(row, slot, cells)| Stop { row: row.unwrap_or(first_row), slot, cells }).collect()
    }

    /// Keep the snapshots a pass took, now that the blocks under them are
    /// committed.
    pub(super) fn keep_snapshots(&mut self, taken: Vec<(usize, StateSnapshot)>) {
        let Some(states) = self.states.as_mut() else { return };
        for (slot, state) in taken {
            let Some(active) = &self.slots[slot] else { continue };
            if let Some(tokens) = active.tokens.get(..state.cells as usize) {
                states.insert(active.blocks.root(), tokens, state);
            }
        }
    }

    /// The recurrent states of the slots whose drafts `work` verifies, as
    /// they are before the pass.
    pub(super) fn states_before_verification(&self, work: &[Work]) -> HashMap<usize, StateSnapshot> {
        if self.model.recurrent_state_bytes().is_none() {
            return HashMap::new();
        }
        work.iter()
            .filter_map(|item| match item {
                Work::Decode { slot, drafts, .. } if !drafts.is_empty() => {
                    self.context.read_state(*slot as u32).map(|state| (*slot, state))
                }
                _ => None,
            })
            .collect()
    }

    /// Keep the state of a request that ends, at every cell it wrote.
    pub(super) fn keep_final_state(&mut self, slot: usize, active: &Active) {
        let Some(states) = self.states.as_mut() else { return };
        if !active.blocks.cacheable() {
            return;
        }
        let (Some(tokens), Some(state)) = (active.tokens.get(..active.cells), self.context.read_state(slot as u32))
        else {
            return;
        };
        states.insert(active.blocks.root(), tokens, state);
    }
}
