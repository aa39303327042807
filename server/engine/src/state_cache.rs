//! The prefix cache's recurrent-state snapshots, for a model with recurrent
//! layers (Gated DeltaNet). Cached KV alone cannot resume such a model: its
//! recurrent layers carry one state per sequence that only moves forward.
//! So the engine copies a sequence's state at chosen cells, and a prompt
//! resumes from the longest prefix that has both its KV blocks cached and
//! a snapshot at its end; everything after it is computed.
//!
//! Snapshots are taken (see [`StateCache::points`]):
//! - every `every` tokens of a prompt (`--checkpoint-min-step`, rounded up
//!   to whole KV blocks), so prompts that share a long start resume near
//!   where they part;
//! - [`END_MARGIN`] tokens before a prompt's end, so the same prompt sent
//!   again, or the next turn of a chat whose template rewrites the last few
//!   tokens (an assistant header, a thinking tag), resumes near its end;
//! - when a request ends, at every cell it wrote, so the next turn of a
//!   conversation resumes after the answer.
//!
//! A snapshot is filed under the chain key of the last whole KV block
//! before its end (the chain root inside the first block), with every
//! token it covers, compared on lookup. Snapshots hold host memory and are
//! bounded by `--cache-ram` bytes of their own, least recently used dropped
//! first; one whose blocks the KV cache dropped is never served and ages
//! out the same way.

use std::collections::{BTreeMap, HashMap};

use sluice_model::StateSnapshot;

use super::kv::chain;

/// Tokens before a prompt's end where its snapshot is taken (llama-server
/// checkpoints 4 tokens before the end too).
pub const END_MARGIN: usize = 4;

struct Entry {
    /// Every token the state has seen.
    tokens: Vec<u32>,
    state: StateSnapshot,
    last_use: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        (self.tokens.len() + self.state.values.len()) * 4
    }
}

pub struct StateCache {
    block_tokens: usize,
    /// Tokens between a prompt's snapshots (a whole number of blocks; 0 =
    /// none).
    every: usize,
    /// Most bytes the snapshots may hold; `None`: no bound.
    limit: Option<usize>,
    entries: HashMap<u64, Vec<Entry>>,
    /// Entries by last use: the chain key they are filed under.
    lru: BTreeMap<u64, u64>,
    clock: u64,
    bytes: usize,
}

impl StateCache {
    /// Snapshots every `every` prompt tokens (rounded up to whole blocks of
    /// `block_tokens`; 0 = none), at most `limit` bytes of them.
    pub fn new(block_tokens: usize, every: usize, limit: Option<usize>) -> Self {
        let block_tokens = block_tokens.max(1);
        StateCache {
            block_tokens,
            every: every.div_ceil(block_tokens) * block_tokens,
            limit,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            bytes: 0,
        }
    }

    /// Tokens between a prompt's snapshots.
    pub fn every(&self) -> usize {
        self.every
    }

    /// Snapshots held and their bytes.
    pub fn usage(&self) -> (usize, usize) {
        (self.lru.len(), self.bytes)
    }

    /// The cells in `start + 1..=end` where a prompt of `prompt_len` tokens
    /// computed from `start` to `end` is snapshotted, ascending.
    pub fn points(&self, start: usize, end: usize, prompt_len: usize) -> Vec<usize> {
        let near_end = prompt_len.checked_sub(END_MARGIN).filter(|&cell| cell > start && cell <= end);
        let mut points: Vec<usize> = match self.every {
            0 => Vec::new(),
            every => (start / every + 1..).map(|k| k * every).take_while(|&cell| cell <= end).collect(),
        };
        if let Some(cell) = near_end.filter(|cell| !points.contains(cell)) {
            points.push(cell);
            points.sort_unstable();
        }
        points
    }

    /// Where, under the chain from `root`, the snapshot with the longest
    /// prefix of `prompt` no longer than `available` tokens is.
    fn find(&self, root: u64, prompt: &[u32], available: usize) -> Option<(u64, usize)> {
        let available = available.min(prompt.len());
        let mut best: Option<(u64, usize, usize)> = None;
        let mut key = root;
        for whole in 0..=available / self.block_tokens {
            if whole > 0 {
                key = chain(key, &prompt[(whole - 1) * self.block_tokens..whole * self.block_tokens]);
            }
            let Some(entries) = self.entries.get(&key) else { continue };
            for (index, entry) in entries.iter().enumerate() {
                let cells = entry.tokens.len();
                if cells <= available
                    && best.is_none_or(|(_, _, most)| cells > most)
                    && prompt.starts_with(&entry.tokens)
                {
                    best = Some((key, index, cells));
                }
            }
        }
        best.map(|(key, index, _)| (key, index))
    }

    /// Tokens of `prompt` a snapshot would resume, of the `available` its
    /// cached KV covers.
    pub fn resumable(&self, root: u64, prompt: &[u32], available: usize) -> usize {
        self.held(root, prompt, available).map_or(0, |state| state.cells as usize)
    }

    /// That snapshot (it holds its `cells` first tokens of `prompt`).
    pub fn held(&self, root: u64, prompt: &[u32], available: usize) -> Option<&StateSnapshot> {
        let (key, index) = self.find(root, prompt, available)?;
        Some(&self.entries[&key][index].state)
    }

    /// A copy of that snapshot, now the most recently used.
    pub fn resume(&mut self, root: u64, prompt: &[u32], available: usize) -> Option<StateSnapshot> {
        let (key, index) = self.find(root, prompt, available)?;
        let clock = self.tick();
        let entry = &mut self.entries.get_mut(&key)?[index];
        self.lru.remove(&entry.last_use);
        entry.last_use = clock;
        self.lru.insert(clock, key);
        Some(entry.state.clone())
    }

    /// Keep `state`, which has seen `tokens` under the chain from `root`.
    /// A state that does not hold exactly those tokens is not kept.
    pub fn insert(&mut self, root: u64, tokens: &[u32], state: StateSnapshot) {
        if tokens.is_empty() || state.cells as usize != tokens.len() {
            return;
        }
        let whole = (tokens.len() - 1) / self.block_tokens;
        let key = tokens[..whole * self.block_tokens].chunks_exact(self.block_tokens).fold(root, chain);
        let clock = self.tick();
        let entries = self.entries.entry(key).or_default();
        if let Some(entry) = entries.iter_mut().find(|entry| entry.tokens == tokens) {
            self.lru.remove(&entry.last_use);
            entry.last_use = clock;
            self.lru.insert(clock, key);
            return;
        }
        let entry = Entry { tokens: tokens.to_vec(), state, last_use: clock };
        if self.limit.is_some_and(|limit| entry.bytes() > limit) {
            return;
        }
        self.bytes += entry.bytes();
        entries.push(entry);
        self.lru.insert(clock, key);
        while self.limit.is_some_and(|limit| self.bytes > limit) {
            let Some((last_use, key)) = self.lru.pop_first() else { break };
            self.remove(key, last_use);
        }
    }

    fn remove(&mut self, key: u64, last_use: u64) {
        let Some(entries) = self.entries.get_mut(&key) else { return };
        if let Some(index) = entries.iter().position(|entry| entry.last_use == last_use) {
            self.bytes -= entries.swap_remove(index).bytes();
        }
        if entries.is_empty() {
            self.entries.remove(&key);
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(cells: usize, fill: f32) -> StateSnapshot {
        StateSnapshot { cells: cells as u32, values: vec![fill; 6] }
    }

    #[test]
    fn points_fall_every_n_blocks_and_before_the_end() {
        // 10 tokens between snapshots round up to 2 blocks of 8.
        let cache = StateCache::new(8, 10, None);
        assert_eq!(cache.every(), 16);
        assert_eq!(cache.points(0, 40, 40), vec![16, 32, 36]);
        assert_eq!(cache.points(16, 33, 40), vec![32]);
        assert_eq!(cache.points(33, 40, 40), vec![36]);
        assert_eq!(cache.points(36, 40, 40), Vec::<usize>::new());
        // A prompt ending 4 tokens after a multiple gets one snapshot there.
        assert_eq!(cache.points(0, 20, 20), vec![16]);
        assert_eq!(cache.points(0, 3, 3), Vec::<usize>::new());
        assert_eq!(StateCache::new(8, 0, None).points(0, 40, 40), vec![36]);
    }

    #[test]
    fn a_prompt_resumes_from_its_longest_snapshot_its_kv_covers() {
        let mut cache = StateCache::new(4, 8, None);
        let prompt: Vec<u32> = (0..20).collect();
        cache.insert(7, &prompt[..8], state(8, 1.0));
        cache.insert(7, &prompt[..13], state(13, 2.0));
        // Held only under its own root, and only with the cells it says.
        cache.insert(7, &prompt[..6], state(5, 3.0));
        assert_eq!(cache.usage(), (2, (8 + 6 + 13 + 6) * 4));
        assert_eq!(cache.resumable(7, &prompt, 19), 13);
        assert_eq!(cache.resumable(7, &prompt, 12), 8);
        assert_eq!(cache.resumable(7, &prompt, 7), 0);
        assert_eq!(cache.resumable(8, &prompt, 19), 0);
        assert_eq!(cache.resume(7, &prompt, 19), Some(state(13, 2.0)));
        // A prompt that parts from the snapshot's tokens inside its last
        // block falls back to the earlier one.
        let mut other = prompt.clone();
        other[10] = 99;
        assert_eq!(cache.resumable(7, &other, 19), 8);
        assert_eq!(cache.held(7, &prompt[..13], 13), Some(&state(13, 2.0)));
        assert_eq!(cache.held(7, &prompt[..12], 12), Some(&state(8, 1.0)));
    }

    #[test]
    fn the_least_recently_used_go_beyond_the_limit() {
        let prompt: Vec<u32> = (0..40).collect();
        // Each snapshot below takes (cells + 6) × 4 bytes: room for two.
        let mut cache = StateCache::new(4, 8, Some(100));
        cache.insert(0, &prompt[..4], state(4, 1.0));
        cache.insert(0, &prompt[..8], state(8, 2.0));
        // Using the first makes the second the one to go.
        assert!(cache.resume(0, &prompt[..5], 4).is_some());
        cache.insert(0, &prompt[..6], state(6, 3.0));
        assert_eq!(cache.usage(), (2, 40 + 48));
        assert_eq!(cache.resumable(0, &prompt, 39), 6);
        assert_eq!(cache.held(0, &prompt[..4], 4), Some(&state(4, 1.0)));
        // A snapshot larger than the whole bound is not kept.
        cache.insert(0, &prompt[..30], state(30, 4.0));
        assert_eq!(cache.usage(), (2, 88));
    }
}
