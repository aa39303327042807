//! Paged KV bookkeeping: which blocks each sequence uses, and the prefix
//! cache. Full blocks are keyed by a chained hash of every token up to
//! their end, refcounted, and shared between sequences; a block that no
//! sequence uses stays cached until its memory is needed (least recently
//! used first). A finished sequence's last, partly written block is cached
//! too, so a prompt reuses its longest cached prefix down to the token
//! (the block where it ends is copied, never shared). The KV memory itself
//! is the model's `KvStore`.
//!
//! A chain starts from a root: 0 for KV computed without LoRA adapters,
//! else a key of the adapter configuration (`engine::adapters`), so KV is
//! only ever reused under the configuration that computed it.
//!
//! A model's sliding-window layers may keep their cells in a store of
//! their own ([`BlockManager::with_window`]): each sequence then also has a
//! window table whose blocks older than the window go back to that store's
//! pool as the sequence grows ([`BlockManager::slide`]). Those blocks are
//! gone when a later prompt would resume the sequence, so such a manager
//! neither borrows from nor offers to the prefix cache: every prompt is
//! computed whole (llama.cpp without `--swa-full` re-processes prompts the
//! same way). `--swa-full` keeps every window cell with the paged ones
//! instead, and the prefix cache with them.
//!
//! A model with recurrent layers resumes a prompt only where a snapshot of
//! its recurrent state was also kept (`engine::state_cache`): the engine
//! caps what a prompt borrows at that point ([`BlockManager::admit`]'s
//! `limit`).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use sluice_model::window::{WindowPool, WindowTable};

/// A sequence's blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqBlocks {
    /// Block ids, in cell order.
    pub table: Vec<u32>,
    /// Chain hash of each full block written so far.
    hashes: Vec<u64>,
    /// Tokens written into the block after the full ones.
    tail: Vec<u32>,
    /// Whether this sequence's blocks are offered to the prefix cache.
    cacheable: bool,
    /// The chain's root: its adapter configuration's key.
    root: u64,
    /// Its window layers' blocks, where they have a store of their own.
    window: WindowTable,
}

impl SeqBlocks {
    /// Its window layers' blocks, in cell order (see [`WindowTable`]).
    pub fn window_table(&self) -> &[u32] {
        &self.window.table
    }

    /// Whether its blocks are offered to the prefix cache.
    pub fn cacheable(&self) -> bool {
        self.cacheable
    }

    /// The key of the adapter configuration its KV was computed under.
    pub fn root(&self) -> u64 {
        self.root
    }

    /// A sequence whose KV is written from elsewhere (a restored slot,
    /// computed under the configuration keyed `root`): committed and
    /// released, its blocks stay in the prefix cache.
    pub fn restored(root: u64) -> Self {
        SeqBlocks { cacheable: true, root, ..SeqBlocks::default() }
    }
}

/// What admitting a sequence borrowed from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub blocks: SeqBlocks,
    /// Prompt tokens whose KV is already there.
    pub cached_tokens: usize,
    /// A shared block the sequence must write into: copy `from` into `to`
    /// (every layer) before the next forward pass.
    pub copy: Option<(u32, u32)>,
}

/// Out of KV blocks, even after evicting every unreferenced cached block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the KV cache is full ({n_blocks} blocks of {block_tokens} tokens all in use)")]
pub struct OutOfBlocks {
    pub n_blocks: usize,
    pub block_tokens: usize,
}

/// Block usage for metrics and leak checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockStats {
    /// Referenced by at least one sequence.
    pub used: usize,
    /// Held only by the prefix cache (reusable, evictable).
    pub cached: usize,
    /// Holding nothing.
    pub free: usize,
}

/// The cached blocks a prompt starts with.
struct Matched {
    /// Blocks matching whole, with their chain keys.
    whole: Vec<(u32, u64)>,
    /// After them, the cached block (full or partial) sharing the most
    /// tokens with the rest of the prompt, and how many it shares.
    partial: Option<(u32, usize)>,
}

impl Matched {
    fn tokens(&self, block_tokens: usize) -> usize {
        self.whole.len() * block_tokens + self.partial.map_or(0, |(_, n)| n)
    }
}

pub struct BlockManager {
    block_tokens: usize,
    refcount: Vec<u32>,
    /// Per block: its key in `index`, if cached whole.
    key: Vec<Option<u64>>,
    /// Per cached block: its tokens (fewer than a block's for a partly
    /// written one), checked on lookup (hash collisions).
    tokens: Vec<Vec<u32>>,
    index: HashMap<u64, u32>,
    /// Per cached block: the chain key of the blocks before it.
    parent: Vec<Option<u64>>,
    /// Cached blocks, full and partial, by the chain key before them.
    children: HashMap<u64, Vec<u32>>,
    free: Vec<u32>,
    /// Unreferenced cached blocks by last use.
    lru: BTreeMap<u64, u32>,
    /// Most blocks `lru` may hold (`--cache-ram`); the least recently used
    /// beyond go back to the free list.
    cache_limit: usize,
    last_use: Vec<u64>,
    clock: u64,
    hits: u64,
    /// The window layers' own blocks, if they have a store of their own.
    window: Option<WindowPool>,
    /// Prompts may borrow cached blocks and sequences offer theirs.
    prefix_cache: bool,
}

pub(crate) fn chain(previous: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: stable for the life of the process, and the
    // tokens are checked on every hit anyway.
    let mut hasher = std::hash::DefaultHasher::new();
    previous.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

impl BlockManager {
    pub fn new(n_blocks: usize, block_tokens: usize) -> Self {
        BlockManager {
            block_tokens,
            refcount: vec![0; n_blocks],
            key: vec![None; n_blocks],
            tokens: vec![Vec::new(); n_blocks],
            index: HashMap::new(),
            parent: vec![None; n_blocks],
            children: HashMap::new(),
            free: (0..n_blocks as u32).rev().collect(),
            lru: BTreeMap::new(),
            cache_limit: usize::MAX,
            last_use: vec![0; n_blocks],
            clock: 0,
            hits: 0,
            window: None,
            prefix_cache: true,
        }
    }

    /// A manager whose sequences also take window blocks from `pool`, and
    /// which keeps no prefix cache (see the module's doc).
    pub fn with_window(self, pool: WindowPool) -> Self {
        BlockManager { window: Some(pool), prefix_cache: false, ..self }
    }

    /// Whether window layers' old cells are freed (and prompts are never
    /// served from the prefix cache).
    pub fn frees_window_cells(&self) -> bool {
        self.window.is_some()
    }

    /// Window blocks in use, if the window layers have a store of their
    /// own.
    pub fn window_used(&self) -> Option<usize> {
        self.window.as_ref().map(WindowPool::used)
    }

    /// Window blocks in all, if the window layers have a store of their
    /// own.
    pub fn window_blocks(&self) -> Option<usize> {
        self.window.as_ref().map(WindowPool::n_blocks)
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Keep at most `blocks` unreferenced blocks cached.
    pub fn limit_cache(&mut self, blocks: usize) {
        self.cache_limit = blocks;
        self.trim_cache();
    }

    fn trim_cache(&mut self) {
        while self.lru.len() > self.cache_limit {
            let Some((_, block)) = self.lru.pop_first() else { return };
            self.forget(block);
            self.free.push(block);
        }
    }

    fn n_blocks(&self) -> usize {
        self.refcount.len()
    }

    /// Prefix-cache hits (cached tokens served) so far.
    pub fn hit_tokens(&self) -> u64 {
        self.hits
    }

    /// The cached blocks matching the start of `tokens` in the chain from
    /// `root`.
    fn matching_blocks(&self, root: u64, tokens: &[u32]) -> Matched {
        let mut found = Vec::new();
        let mut previous = root;
        for block_tokens in tokens.chunks_exact(self.block_tokens) {
            let key = chain(previous, block_tokens);
            match self.index.get(&key) {
                Some(&block) if self.tokens[block as usize] == block_tokens => found.push((block, key)),
                _ => break,
            }
            previous = key;
        }
        let rest = &tokens[found.len() * self.block_tokens..];
        let shared = |block: u32| self.tokens[block as usize].iter().zip(rest).take_while(|(a, b)| a == b).count();
        let partial = self
            .children
            .get(&previous)
            .into_iter()
            .flatten()
            .map(|&block| (block, shared(block)))
            .max_by_key(|&(_, n)| n);
        Matched { whole: found, partial: partial.filter(|&(_, n)| n > 0) }
    }

    /// The cached blocks holding the longest cached prefix of `tokens`, in
    /// cell order, and that prefix's length (the last block may hold only
    /// part of it, or more).
    pub fn cached_run(&self, root: u64, tokens: &[u32]) -> (Vec<u32>, usize) {
        let matched = self.matching_blocks(root, tokens);
        let n = matched.tokens(self.block_tokens);
        let blocks = matched.whole.iter().map(|&(block, _)| block).chain(matched.partial.map(|(block, _)| block));
        (blocks.collect(), n)
    }

    /// Drop these cached blocks from the cache (an erased slot's); blocks a
    /// sequence uses, and ids that are not cached blocks, are left alone.
    pub fn evict(&mut self, blocks: &[u32]) {
        for &block in blocks {
            let Some(&last_use) = self.last_use.get(block as usize) else { continue };
            if self.refcount[block as usize] > 0 || self.lru.get(&last_use) != Some(&block) {
                continue;
            }
            self.lru.remove(&last_use);
            self.forget(block);
            self.free.push(block);
        }
    }

    /// Prompt tokens the cache would serve for `prompt` (at most all but the
    /// last: the last token is computed to produce logits).
    pub fn cached_prefix(&self, root: u64, prompt: &[u32]) -> usize {
        self.matching_blocks(root, prompt).tokens(self.block_tokens).min(prompt.len().saturating_sub(1))
    }

    /// Start a sequence for `prompt` whose KV is computed under the adapter
    /// configuration keyed `root`, borrowing its longest cached prefix, up
    /// to `limit` tokens, when `use_cache`.
    pub fn admit(
        &mut self,
        root: u64,
        prompt: &[u32],
        use_cache: bool,
        limit: usize,
    ) -> Result<Admission, OutOfBlocks> {
        let use_cache = use_cache && self.prefix_cache;
        let mut blocks = SeqBlocks { cacheable: use_cache, root, ..SeqBlocks::default() };
        let matched =
            if use_cache { self.matching_blocks(root, prompt) } else { Matched { whole: Vec::new(), partial: None } };
        let cached_tokens = matched.tokens(self.block_tokens).min(prompt.len().saturating_sub(1)).min(limit);
        let Matched { whole: matching, partial } = matched;
        let full = cached_tokens / self.block_tokens;
        for &(block, key) in &matching[..full] {
            self.borrow(block);
            blocks.table.push(block);
            blocks.hashes.push(key);
        }
        let mut copy = None;
        if !cached_tokens.is_multiple_of(self.block_tokens) {
            // The cached prefix ends inside a cached block that this
            // sequence will write: give it a private copy.
            // A prefix past the whole blocks it borrows ends in the next
            // whole match or, after the last, in the best partial one.
            let shared = matching.get(full).map(|&(block, _)| block).or(partial.map(|(block, _)| block));
            let (Some(shared), Some(private)) = (shared, self.allocate()) else {
                self.release(blocks);
                return Err(self.out_of_blocks());
            };
            blocks.table.push(private);
            copy = Some((shared, private));
        }
        self.hits += cached_tokens as u64;
        Ok(Admission { blocks, cached_tokens, copy })
    }

    fn out_of_blocks(&self) -> OutOfBlocks {
        OutOfBlocks { n_blocks: self.n_blocks(), block_tokens: self.block_tokens }
    }

    fn touch(&mut self, block: u32) {
        self.clock += 1;
        self.last_use[block as usize] = self.clock;
    }

    fn borrow(&mut self, block: u32) {
        let index = block as usize;
        if self.refcount[index] == 0 {
            self.lru.remove(&self.last_use[index]);
        }
        self.refcount[index] += 1;
        self.touch(block);
    }

    /// A block for new cells: a free one, else the least recently used
    /// cached block no sequence references.
    fn allocate(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let (_, block) = self.lru.pop_first()?;
                self.forget(block);
                block
            }
        };
        self.refcount[block as usize] = 1;
        self.touch(block);
        Some(block)
    }

    /// Take a cached block out of the index and the chains.
    fn forget(&mut self, block: u32) {
        if let Some(key) = self.key[block as usize].take() {
            self.index.remove(&key);
        }
        if let Some(parent) = self.parent[block as usize].take()
            && let Some(siblings) = self.children.get_mut(&parent)
        {
            siblings.retain(|&sibling| sibling != block);
            if siblings.is_empty() {
                self.children.remove(&parent);
            }
        }
        self.tokens[block as usize].clear();
    }

    /// Make `blocks` hold at least `cells` cells.
    pub fn reserve(&mut self, blocks: &mut SeqBlocks, cells: usize) -> Result<(), OutOfBlocks> {
        while blocks.table.len() * self.block_tokens < cells {
            let block = self.allocate().ok_or_else(|| self.out_of_blocks())?;
            blocks.table.push(block);
        }
        if let Some(pool) = &mut self.window {
            pool.reserve(&mut blocks.window, cells)
                .map_err(|full| OutOfBlocks { n_blocks: full.n_blocks, block_tokens: self.block_tokens })?;
        }
        Ok(())
    }

    /// Return the window blocks a sequence that keeps `cells` cells no
    /// longer reads. Called with the cells kept after a pass, never with
    /// cells a pass wrote ahead (rejected drafts), so a rollback finds its
    /// window whole.
    pub fn slide(&mut self, blocks: &mut SeqBlocks, cells: usize) {
        if let Some(pool) = &mut self.window {
            pool.slide(&mut blocks.window, cells);
        }
    }

    /// Offer the sequence's newly completed full blocks to the prefix
    /// cache; `tokens` are all tokens whose KV has been written.
    pub fn commit(&mut self, blocks: &mut SeqBlocks, tokens: &[u32]) {
        if !blocks.cacheable {
            return;
        }
        let full = tokens.len() / self.block_tokens;
        while blocks.hashes.len() < full {
            let index = blocks.hashes.len();
            let previous = blocks.hashes.last().copied().unwrap_or(blocks.root);
            let block_tokens = &tokens[index * self.block_tokens..(index + 1) * self.block_tokens];
            let key = chain(previous, block_tokens);
            blocks.hashes.push(key);
            let block = blocks.table[index];
            if self.key[block as usize].is_none() && !self.index.contains_key(&key) {
                self.index.insert(key, block);
                self.key[block as usize] = Some(key);
                self.tokens[block as usize] = block_tokens.to_vec();
                self.adopt(block, previous);
            }
        }
        blocks.tail = tokens[full * self.block_tokens..].to_vec();
    }

    /// List a cached block under the chain key of the blocks before it.
    fn adopt(&mut self, block: u32, parent: u64) {
        self.parent[block as usize] = Some(parent);
        self.children.entry(parent).or_default().push(block);
    }

    /// Cache a finished sequence's partly written block, unless a cached
    /// block after the same prefix already holds at least its tokens.
    fn keep_tail(&mut self, block: u32, parent: u64, tail: Vec<u32>) -> bool {
        let covered = self
            .children
            .get(&parent)
            .into_iter()
            .flatten()
            .any(|&other| self.tokens[other as usize].starts_with(&tail));
        if tail.is_empty() || covered {
            return false;
        }
        self.tokens[block as usize] = tail;
        self.adopt(block, parent);
        true
    }

    /// End a sequence: its blocks go back to the cache (if cached) or the
    /// free list once no other sequence uses them.
    pub fn release(&mut self, blocks: SeqBlocks) {
        let SeqBlocks { table, hashes, tail, cacheable, root, window } = blocks;
        if let Some(pool) = &mut self.window {
            pool.release(window);
        }
        let parent = hashes.last().copied().unwrap_or(root);
        let mut tail = cacheable.then_some(tail);
        for (position, block) in table.into_iter().enumerate() {
            let index = block as usize;
            self.refcount[index] -= 1;
            if self.refcount[index] > 0 {
                continue;
            }
            let cached_tail =
                position == hashes.len() && tail.take().is_some_and(|tail| self.keep_tail(block, parent, tail));
            if self.key[index].is_some() || cached_tail {
                self.touch(block);
                self.lru.insert(self.last_use[index], block);
            } else {
                self.free.push(block);
            }
        }
        self.trim_cache();
    }

    pub fn stats(&self) -> BlockStats {
        let used = self.refcount.iter().filter(|count| **count > 0).count();
        BlockStats { used, cached: self.lru.len(), free: self.free.len() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 31 + salt).collect()
    }

    #[test]
    fn a_second_request_borrows_the_full_blocks_of_the_first() {
        let mut manager = BlockManager::new(16, 4);
        let prompt = tokens(10, 0);
        let mut first = manager.admit(0, &prompt, true, usize::MAX).expect("room");
        assert_eq!(first.cached_tokens, 0);
        manager.reserve(&mut first.blocks, 10).expect("room");
        manager.commit(&mut first.blocks, &prompt);
        assert_eq!(manager.cached_prefix(0, &prompt), 8);
        let second = manager.admit(0, &prompt, true, usize::MAX).expect("room");
        assert_eq!(second.cached_tokens, 8);
        assert_eq!(second.blocks.table, first.blocks.table[..2]);
        assert_eq!(second.copy, None);
        manager.release(first.blocks);
        manager.release(second.blocks);
        // The two whole blocks and the first's partly written third.
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 3, free: 13 });
    }

    #[test]
    fn a_fully_cached_prompt_copies_its_last_block() {
        let mut manager = BlockManager::new(8, 4);
        let prompt = tokens(8, 1);
        let mut first = manager.admit(0, &prompt, true, usize::MAX).expect("room");
        manager.reserve(&mut first.blocks, 8).expect("room");
        manager.commit(&mut first.blocks, &prompt);
        manager.release(first.blocks.clone());
        let second = manager.admit(0, &prompt, true, usize::MAX).expect("room");
        assert_eq!(second.cached_tokens, 7, "the last token is always computed");
        let (from, to) = second.copy.expect("copy on write");
        assert_eq!(from, first.blocks.table[1]);
        assert_eq!(second.blocks.table, vec![first.blocks.table[0], to]);
        manager.release(second.blocks);
        assert_eq!(manager.stats().used, 0);
        // Capped where a recurrent state was kept: whole blocks, or a copy
        // of the one the cap ends in.
        let capped = manager.admit(0, &prompt, true, 4).expect("room");
        assert_eq!((capped.cached_tokens, capped.copy, capped.blocks.table.len()), (4, None, 1));
        manager.release(capped.blocks);
        let capped = manager.admit(0, &prompt, true, 2).expect("room");
        assert_eq!(capped.cached_tokens, 2);
        assert_eq!(capped.copy.map(|(from, _)| from), Some(first.blocks.table[0]));
        manager.release(capped.blocks);
        assert_eq!(manager.admit(0, &prompt, true, 0).expect("room").cached_tokens, 0);
    }

    #[test]
    fn cache_prompt_false_neither_borrows_nor_offers() {
        let mut manager = BlockManager::new(8, 4);
        let prompt = tokens(8, 2);
        let mut first = manager.admit(0, &prompt, false, usize::MAX).expect("room");
        manager.reserve(&mut first.blocks, 8).expect("room");
        manager.commit(&mut first.blocks, &prompt);
        assert_eq!(manager.cached_prefix(0, &prompt), 0);
        manager.release(first.blocks);
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 0, free: 8 });
    }

    #[test]
    fn unreferenced_cached_blocks_are_evicted_lru_before_refusing() {
        let mut manager = BlockManager::new(4, 2);
        let old = tokens(4, 3);
        let newer = tokens(4, 4);
        for prompt in [&old, &newer] {
            let mut seq = manager.admit(0, prompt, true, usize::MAX).expect("room");
            manager.reserve(&mut seq.blocks, 4).expect("room");
            manager.commit(&mut seq.blocks, prompt);
            manager.release(seq.blocks);
        }
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 4, free: 0 });
        let mut third = manager.admit(0, &tokens(4, 5), true, usize::MAX).expect("room");
        manager.reserve(&mut third.blocks, 4).expect("evicts the two oldest");
        assert_eq!(manager.cached_prefix(0, &old), 0, "the least recently used prompt was evicted");
        assert_eq!(manager.cached_prefix(0, &newer), 3);
        let mut fourth = manager.admit(0, &tokens(6, 6), true, usize::MAX).expect("admission needs no block");
        let error = manager.reserve(&mut fourth.blocks, 6).expect_err("live sequences hold everything");
        assert_eq!(error, OutOfBlocks { n_blocks: 4, block_tokens: 2 });
        manager.release(third.blocks);
        manager.release(fourth.blocks);
        assert_eq!(manager.stats().used, 0);
    }

    /// Run a sequence over `prompt` plus `generated` tokens and end it.
    fn run(manager: &mut BlockManager, prompt: &[u32], generated: &[u32]) -> Vec<u32> {
        let mut seq = manager.admit(0, prompt, true, usize::MAX).expect("room");
        let written = [prompt, generated].concat();
        manager.reserve(&mut seq.blocks, written.len() + 1).expect("room");
        manager.commit(&mut seq.blocks, &written);
        let table = seq.blocks.table.clone();
        manager.release(seq.blocks);
        table
    }

    #[test]
    fn a_repeated_short_prompt_reuses_all_but_its_last_token() {
        let mut manager = BlockManager::new(8, 16);
        let prompt = tokens(9, 7);
        let first = run(&mut manager, &prompt, &[500, 501, 502]);
        assert_eq!(manager.cached_prefix(0, &prompt), 8, "llama-server reuses 8 of a repeated 9-token prompt");
        let second = manager.admit(0, &prompt, true, usize::MAX).expect("room");
        assert_eq!(second.cached_tokens, 8);
        let (from, to) = second.copy.expect("the partial block is copied, never shared");
        assert_eq!((from, second.blocks.table.clone()), (first[0], vec![to]));
        manager.release(second.blocks);
        assert_eq!(manager.stats().used, 0);
    }

    #[test]
    fn a_prompt_diverging_inside_a_block_reuses_up_to_the_token() {
        let mut manager = BlockManager::new(16, 4);
        let a = tokens(10, 8);
        let first = run(&mut manager, &a, &[]);
        let b = [&a[..6], &[999, 998, 997][..]].concat();
        assert_eq!(manager.cached_prefix(0, &b), 6);
        let second = manager.admit(0, &b, true, usize::MAX).expect("room");
        assert_eq!(second.blocks.table[0], first[0], "the whole first block is shared");
        assert_eq!(second.copy.map(|(from, _)| from), Some(first[1]), "the second is copied");
        // Past the whole blocks, the partial tail of `a` (tokens 8 and 9).
        let c = [&a[..9], &[5][..]].concat();
        assert_eq!(manager.cached_prefix(0, &c), 9);
        manager.release(second.blocks);
        assert_eq!(manager.stats().used, 0);
    }

    #[test]
    fn the_cache_keeps_at_most_its_limit_least_recently_used_first() {
        let mut manager = BlockManager::new(16, 4);
        let (old, new) = (tokens(8, 1), tokens(8, 2));
        run(&mut manager, &old, &[]);
        run(&mut manager, &new, &[]);
        assert_eq!(manager.stats().cached, 4);
        manager.limit_cache(2);
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 2, free: 14 });
        assert_eq!(manager.cached_prefix(0, &old), 0, "the older prompt went first");
        assert_eq!(manager.cached_prefix(0, &new), 7);
        // Releasing keeps to the limit too.
        run(&mut manager, &tokens(12, 3), &[]);
        assert_eq!(manager.stats().cached, 2);
        manager.limit_cache(0);
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 0, free: 16 });
    }

    #[test]
    fn tails_are_cached_once_and_evicted_like_whole_blocks() {
        let mut manager = BlockManager::new(3, 4);
        let prompt = tokens(6, 9);
        run(&mut manager, &prompt, &[]);
        run(&mut manager, &prompt, &[]);
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 2, free: 1 }, "one whole block, one tail");
        // A sequence needing every block evicts the cached ones, tails too.
        let mut other = manager.admit(0, &tokens(12, 10), true, usize::MAX).expect("room");
        manager.reserve(&mut other.blocks, 12).expect("evicts the cached blocks");
        assert_eq!(manager.cached_prefix(0, &prompt), 0);
        manager.release(other.blocks);
        assert_eq!(manager.cached_prefix(0, &prompt), 0, "an uncommitted sequence caches nothing");
    }

    #[test]
    fn a_finished_sequence_is_found_evicted_and_restored() {
        let mut manager = BlockManager::new(8, 4);
        let written = tokens(10, 11);
        let table = run(&mut manager, &written[..6], &written[6..]);
        assert_eq!(manager.cached_run(0, &written), (table[..3].to_vec(), 10), "two whole blocks and the tail");
        assert_eq!(manager.cached_run(0, &written[..5]), (table[..2].to_vec(), 5), "ends inside the second block");
        // A live sequence keeps its borrowed block through an eviction.
        let live = manager.admit(0, &written[..5], true, usize::MAX).expect("room");
        manager.evict(&table);
        assert_eq!(manager.cached_run(0, &written), (table[..1].to_vec(), 4));
        manager.release(live.blocks);
        manager.evict(&table);
        manager.evict(&[table[0], 99]);
        assert_eq!(manager.cached_run(0, &written), (Vec::new(), 0));
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 0, free: 8 });
        // Restored KV: blocks reserved, written (by the caller), committed.
        let mut restored = SeqBlocks::restored(0);
        manager.reserve(&mut restored, written.len()).expect("room");
        let blocks = restored.table.clone();
        manager.commit(&mut restored, &written);
        manager.release(restored);
        assert_eq!(manager.cached_run(0, &written), (blocks, 10));
        assert_eq!(manager.cached_prefix(0, &written), 9);
    }

    #[test]
    fn different_prefixes_do_not_match_even_with_equal_later_blocks() {
        let mut manager = BlockManager::new(8, 2);
        let a = vec![1, 2, 3, 4];
        let b = vec![9, 9, 3, 4];
        let mut seq = manager.admit(0, &a, true, usize::MAX).expect("room");
        manager.reserve(&mut seq.blocks, 4).expect("room");
        manager.commit(&mut seq.blocks, &a);
        assert_eq!(manager.cached_prefix(0, &b), 0);
        assert_eq!(manager.cached_prefix(0, &[1, 2, 3, 4, 5]), 4);
        manager.release(seq.blocks);
    }

    #[test]
    fn kv_of_one_adapter_configuration_is_never_reused_for_another() {
        let mut manager = BlockManager::new(16, 4);
        let prompt = tokens(10, 0);
        let (base, adapted) = (0, 0x5eed);
        let mut first = manager.admit(adapted, &prompt, true, usize::MAX).expect("room");
        manager.reserve(&mut first.blocks, 10).expect("room");
        manager.commit(&mut first.blocks, &prompt);
        manager.release(first.blocks);
        assert_eq!(manager.cached_prefix(base, &prompt), 0, "computed under another configuration");
        assert_eq!(manager.admit(base, &prompt, true, usize::MAX).expect("room").cached_tokens, 0);
        assert_eq!(manager.cached_prefix(adapted, &prompt), 9, "the same configuration shares, tail too");
        assert_eq!(manager.cached_run(adapted, &prompt).1, 10);
    }

    #[test]
    fn a_window_manager_frees_old_window_blocks_and_caches_no_prefix() {
        let (window, block_tokens) = (8, 4);
        let per_sequence = WindowPool::blocks_per_sequence(window, block_tokens, 4);
        let mut manager = BlockManager::new(16, block_tokens).with_window(WindowPool::new(per_sequence, 4, window));
        let written = tokens(30, 12);
        let mut seq = manager.admit(0, &written[..10], true, usize::MAX).expect("room");
        for cells in [10, 14, 18, 22, 26, 30] {
            manager.reserve(&mut seq.blocks, cells).expect("a window and a pass fit");
            manager.commit(&mut seq.blocks, &written[..cells]);
            manager.slide(&mut seq.blocks, cells);
        }
        // After 30 cells the next row reads cells 23..=30: blocks 5 to 7.
        assert_eq!(manager.window_used(), Some(3));
        assert_eq!(seq.blocks.window_table()[..5], [0; 5], "freed entries name block 0");
        assert_eq!(manager.stats(), BlockStats { used: 8, cached: 0, free: 8 }, "paged layers keep every cell");
        manager.release(seq.blocks);
        assert_eq!(manager.window_used(), Some(0));
        assert_eq!(manager.window_blocks(), Some(per_sequence));
        assert_eq!(manager.stats(), BlockStats { used: 0, cached: 0, free: 16 }, "nothing offered to the cache");
        assert_eq!(manager.admit(0, &written, true, usize::MAX).expect("room").cached_tokens, 0);
    }

    /// The server's stores for one 32k-token slot of a Gemma 3-shaped
    /// model (five window layers of 1024 to one global, default batch):
    /// under a quarter of the block-layers of keeping every cell.
    #[test]
    fn a_32k_slot_of_a_gemma3_shaped_model_allocates_under_a_quarter_of_all_global() {
        let config = crate::EngineConfig { slots: 1, ctx: 32 * 1024, ..crate::EngineConfig::default() };
        let (n_blocks, _) = config.kv_blocks();
        let (window, window_blocks) = config.window_blocks(Some(1024)).expect("window cells are freed");
        assert_eq!((n_blocks, window, window_blocks), (2049, 1024, 97));
        let (windowed, all_global) = (n_blocks + 5 * window_blocks, 6 * n_blocks);
        assert!(windowed * 4 <= all_global, "{windowed} of {all_global}");
        assert_eq!(crate::EngineConfig { swa_full: true, ..config.clone() }.window_blocks(Some(1024)), None);
        assert_eq!(crate::EngineConfig { ctx: 1024, ..config }.window_blocks(Some(1024)), None, "no smaller");
    }
}
