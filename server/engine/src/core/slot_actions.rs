//! Slot actions on the engine thread (see [`crate::slot_store`]):
//! save hands the slot's cached tokens and KV blocks to the caller, restore
//! writes given blocks into the store and the prefix cache, erase drops the
//! slot's cached blocks. The caller does the file I/O.
//!
//! A slot's cache is the last sequence that named it (`id_slot`), or ran
//! in it naming none: policies may place a request in another slot than
//! it names. An action on a busy slot (a running request will become its
//! cache) waits until that request ends, as llama-server defers it, and
//! runs before the policy admits more requests.

use std::collections::HashSet;

use super::Engine;
use crate::kv::SeqBlocks;
use crate::slot::Active;
use crate::slot_store::{KvLayout, SlotAction, SlotActionError, SlotFile};
use sluice_model::StateSnapshot;

impl Engine {
    /// What a slot file must match to be restored into this engine.
    pub(crate) fn kv_layout(&self) -> KvLayout {
        KvLayout::new(&*self.model, self.context.block_format(), self.blocks.block_tokens())
    }

    /// The slot whose cache a request running in `slot` becomes: the one
    /// it named (`id_slot`), as a policy may run it in another, else
    /// `slot`.
    pub(super) fn cache_slot(&self, slot: usize, active: &Active) -> usize {
        let named = active.request.id_slot.map(|named| named as usize);
        named.filter(|&named| named < self.slots.len()).unwrap_or(slot)
    }

    /// Run `action` on `slot` now if the slot is idle (no running request
    /// will become its cache), else once it is.
    pub(super) fn slot_action(&mut self, slot: usize, action: SlotAction) {
        let busy = |(at, active): (usize, &Option<Active>)| {
            active.as_ref().is_some_and(|active| self.cache_slot(at, active) == slot)
        };
        if slot >= self.slots.len() {
            action.fail(SlotActionError::NoSlot { slot, n_slots: self.slots.len() });
        } else if self.slots.iter().enumerate().any(busy) {
            self.deferred_slot_actions.push((slot, action));
        } else {
            // A caller that went away misses nothing: the action is done.
            match action {
                SlotAction::Save(reply) => drop(reply.send(self.save_slot(slot))),
                SlotAction::Restore(file, reply) => drop(reply.send(self.restore_slot(slot, file))),
                SlotAction::Erase(reply) => drop(reply.send(Ok(self.erase_slot(slot)))),
            }
        }
    }

    /// Run the deferred actions whose slots are idle now; forget those
    /// whose caller went away.
    pub(super) fn run_deferred_slot_actions(&mut self) {
        for (slot, action) in std::mem::take(&mut self.deferred_slot_actions) {
            if !action.abandoned() {
                self.slot_action(slot, action);
            }
        }
    }

    /// Whether actions wait for busy slots.
    pub(super) fn has_deferred_slot_actions(&self) -> bool {
        !self.deferred_slot_actions.is_empty()
    }

    /// Whether a slot file (the prefix cache's KV blocks) holds all a
    /// sequence of this model keeps.
    fn slot_files_hold_state(&self) -> Result<(), SlotActionError> {
        if self.blocks.frees_window_cells() {
            return Err(SlotActionError::Window);
        }
        Ok(())
    }

    /// The slot's tokens still in the prefix cache, and their blocks' bytes;
    /// with recurrent layers, up to its longest state snapshot, and that
    /// state.
    fn save_slot(&self, slot: usize) -> Result<SlotFile, SlotActionError> {
        self.slot_files_hold_state()?;
        let (root, tokens) = &self.slot_tokens[slot];
        let (mut blocks, mut n_tokens) = self.blocks.cached_run(*root, tokens);
        let mut state = Vec::new();
        if let Some(values) = self.model.recurrent_state_bytes().map(|bytes| bytes / 4) {
            let held = self.states.as_ref().and_then(|states| states.held(*root, tokens, n_tokens));
            n_tokens = held.map_or(0, |held| held.cells as usize);
            state = held.map_or_else(|| vec![0.0; values], |held| held.values.clone());
            blocks.truncate(n_tokens.div_ceil(self.blocks.block_tokens()));
        }
        let mut bytes = Vec::with_capacity(blocks.len() * self.context.block_format().bytes);
        for block in blocks {
            bytes.extend_from_slice(&self.context.read_block(block)?);
        }
        Ok(SlotFile { root: *root, tokens: tokens[..n_tokens].to_vec(), blocks: bytes, state })
    }

    /// Write the file's blocks into fresh blocks and cache them as a
    /// finished sequence of its tokens would be; the slot's cache is then
    /// those tokens.
    fn restore_slot(&mut self, slot: usize, file: SlotFile) -> Result<usize, SlotActionError> {
        if self.speculation.is_some() {
            // The drafter's KV for these cells would be another
            // sequence's: drafts would go on, but poorly.
            return Err(SlotActionError::Draft);
        }
        if !self.config.prefix_cache {
            return Err(SlotActionError::NoPrefixCache);
        }
        self.slot_files_hold_state()?;
        let SlotFile { root, tokens, blocks: bytes, state } = file;
        let block_bytes = self.context.block_format().bytes;
        let n_blocks = tokens.len().div_ceil(self.blocks.block_tokens());
        if tokens.len() > self.config.ctx || bytes.len() != n_blocks * block_bytes {
            return Err(SlotActionError::Malformed { n_tokens: tokens.len(), len: bytes.len() });
        }
        let mut sequence = SeqBlocks::restored(root);
        if self.blocks.reserve(&mut sequence, tokens.len()).is_err() {
            self.blocks.release(sequence);
            return Err(SlotActionError::NoRoom { n_tokens: tokens.len(), n_blocks });
        }
        for (&block, bytes) in sequence.table.iter().zip(bytes.chunks_exact(block_bytes.max(1))) {
            if let Err(error) = self.context.write_block(block, bytes) {
                // Uncommitted, the blocks go back to the free list.
                self.blocks.release(sequence);
                return Err(error.into());
            }
        }
        self.blocks.commit(&mut sequence, &tokens);
        self.blocks.release(sequence);
        if let Some(states) = self.states.as_mut() {
            states.insert(root, &tokens, StateSnapshot { cells: tokens.len() as u32, values: state });
        }
        let n_tokens = tokens.len();
        self.slot_tokens[slot] = (root, tokens);
        Ok(n_tokens)
    }

    /// Evict the slot's cached blocks but those a running request or
    /// another slot's cache also holds; how many of its tokens were cached.
    fn erase_slot(&mut self, slot: usize) -> usize {
        let (root, tokens) = std::mem::take(&mut self.slot_tokens[slot]);
        let (blocks, n_tokens) = self.blocks.cached_run(root, &tokens);
        let kept: HashSet<u32> =
            self.slot_tokens.iter().flat_map(|(root, others)| self.blocks.cached_run(*root, others).0).collect();
        let dropped: Vec<u32> = blocks.into_iter().filter(|block| !kept.contains(block)).collect();
        self.blocks.evict(&dropped);
        n_tokens
    }
}
