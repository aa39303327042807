//! The engine's side of draft decoding: asking the drafter for each
//! decoding slot's drafts within the step's budget, and telling it which
//! target rows each sequence kept.

use std::collections::HashMap;
use std::ops::Range;

use super::kv::BlockManager;
use super::slot::Active;
use super::speculative::{CommittedRows, DraftRequest, Speculation};

/// Drafts for the decoding `slots`, at most `budget` tokens in all, none
/// past a slot's context `ctx` or its generation limit.
pub(super) fn draft(
    speculation: &mut Speculation,
    slots: &mut [Option<Active>],
    blocks: &mut BlockManager,
    decoding: &[usize],
    mut budget: usize,
    ctx: usize,
) -> HashMap<usize, Vec<u32>> {
    let mut drafts = HashMap::new();
    let settings = speculation.settings;
    let mut requests = Vec::new();
    let mut requested = Vec::new();
    for (slot, active) in slots.iter_mut().enumerate() {
        let Some(active) = active.as_mut().filter(|_| decoding.contains(&slot)) else { continue };
        // Room for the drafts: the context, what is left to generate (the
        // sampled token is already counted) and the budget.
        let to_generate = active.request.n_predict.map_or(usize::MAX, |limit| limit.saturating_sub(active.generated));
        let mut n_max = settings.n_max.min(budget).min(to_generate).min(ctx.saturating_sub(active.cells + 1));
        if n_max < settings.n_min.max(1) || blocks.reserve(&mut active.blocks, active.cells + 1 + n_max).is_err() {
            n_max = 0;
        }
        budget -= n_max;
        requested.push(slot);
        let Active { draft, blocks, tokens, layout, .. } = active;
        requests.push(DraftRequest { state: draft, table: &blocks.table, layout, tokens, n_max, drafts: Vec::new() });
    }
    if let Err(error) = speculation.drafter.draft(&mut requests, &settings) {
        tracing::warn!(%error, drafter = speculation.drafter.kind(), "drafting failed; decoding without drafts");
        return drafts;
    }
    let mut drafted: Vec<(usize, Vec<u32>)> =
        requested.into_iter().zip(requests).map(|(slot, request)| (slot, request.drafts)).collect();
    for (slot, tokens) in &mut drafted {
        // A draft the grammar forbids would be rejected in verification:
        // it ends where the grammar stops allowing it.
        if let Some(constraint) = slots[*slot].as_mut().and_then(|active| active.constraint.as_mut()) {
            tokens.truncate(constraint.allowed_prefix(tokens));
        }
    }
    for (slot, tokens) in drafted {
        if tokens.len() >= settings.n_min.max(1) {
            drafts.insert(slot, tokens);
        }
    }
    drafts
}

/// A sequence's rows the target kept this step: (slot, first cell, rows of
/// the batch).
pub(super) type Committed = (usize, usize, Range<usize>);

/// Tell the drafter which target rows each sequence kept, with the pass's
/// hidden-state `taps`.
pub(super) fn commit(
    speculation: &mut Speculation,
    slots: &mut [Option<Active>],
    committed: &[Committed],
    taps: &[Vec<f32>],
) {
    if speculation.drafter.taps().is_empty() {
        return;
    }
    let mut rows = Vec::new();
    for (slot, active) in slots.iter_mut().enumerate() {
        let Some(active) = active.as_mut() else { continue };
        let Some((_, first_cell, batch_rows)) = committed.iter().find(|(committed, ..)| *committed == slot) else {
            continue;
        };
        rows.push(CommittedRows {
            state: &mut active.draft,
            table: &active.blocks.table,
            layout: &active.layout,
            first_cell: *first_cell,
            batch_rows: batch_rows.clone(),
        });
    }
    if let Err(error) = speculation.drafter.commit(&mut rows, taps) {
        tracing::warn!(%error, drafter = speculation.drafter.kind(), "draft context update failed");
    }
}
