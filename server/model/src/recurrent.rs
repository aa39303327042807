//! What a model's recurrent layers (Gated DeltaNet) keep per sequence: a
//! fixed-size state per layer, beside the paged KV of its attention
//! layers, in *state slots* that each batch names per sequence
//! (`Batch::states`).
//!
//! A state holds a sequence's first `cells` cells and can only move
//! forward: a pass's rows of a sequence must be consecutive cells that
//! start at 0 (a new sequence: the state is cleared) or at the state's
//! `cells`. Anything else is refused before a row is computed, since
//! there is no earlier state to go back to. A pass that fails part-way
//! leaves its sequences' states unusable (they must start again at 0),
//! never silently wrong.

use sluice_kernels::ops::{DeltaShape, DeltaState};

use crate::batch::{Batch, ForwardError, StateSnapshot};

/// The recurrent layers' states of every slot a context has been asked
/// for; a slot's memory is taken the first time a batch names it.
pub(crate) struct RecurrentStore {
    /// Each recurrent layer's shape, in layer order.
    shapes: Vec<DeltaShape>,
    slots: Vec<Option<Slot>>,
}

struct Slot {
    /// Cells its states hold; `None` while a pass is changing them.
    cells: Option<u32>,
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

/// A sequence's rows in one pass: its state slot, the rows in cell order,
/// and the cell the first of them writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) slot: usize,
    pub(crate) rows: Vec<usize>,
    pub(crate) start: u32,
}

impl RecurrentStore {
    pub(crate) fn new(shapes: Vec<DeltaShape>) -> Self {
        RecurrentStore { shapes, slots: Vec::new() }
    }

    /// Bytes of one sequence's states, every recurrent layer.
    pub(crate) fn bytes_per_sequence(shapes: &[DeltaShape]) -> usize {
        shapes.iter().map(|shape| (shape.conv_state() + shape.delta_state()) * size_of::<f32>()).sum()
    }

    /// The runs of `batch`'s sequences, checked against their states.
    pub(crate) fn plan(&self, batch: &Batch) -> Result<Vec<Run>, ForwardError> {
        let mut runs: Vec<Option<Run>> = vec![None; batch.block_tables.len()];
        for (row, entry) in batch.rows.iter().enumerate() {
            let slot = *batch.states.get(entry.seq).ok_or(ForwardError::State { row, seq: entry.seq })? as usize;
            let run = runs.get_mut(entry.seq).ok_or(ForwardError::Sequence { row, seq: entry.seq })?;
            let run = run.get_or_insert_with(|| Run { slot, rows: Vec::new(), start: entry.cell });
            let expected = run.start as usize + run.rows.len();
            if entry.cell as usize != expected {
                return Err(ForwardError::StateCell { row, cell: entry.cell, expected: expected as u32 });
            }
            run.rows.push(row);
        }
        let runs: Vec<Run> = runs.into_iter().flatten().collect();
        for (index, run) in runs.iter().enumerate() {
            let held = self.slots.get(run.slot).and_then(Option::as_ref).and_then(|slot| slot.cells).unwrap_or(0);
            if run.start != 0 && run.start != held {
                return Err(ForwardError::StateCell { row: run.rows[0], cell: run.start, expected: held });
            }
            if runs[..index].iter().any(|other| other.slot == run.slot) {
                return Err(ForwardError::SharedState { row: run.rows[0], slot: run.slot });
            }
        }
        Ok(runs)
    }

    /// Ready the runs' slots for a pass: a slot's memory is taken when
    /// first named, and cleared where its run starts a sequence.
    pub(crate) fn begin(&mut self, runs: &[Run]) {
        for run in runs {
            if self.slots.len() <= run.slot {
                self.slots.resize_with(run.slot + 1, || None);
            }
            let shapes = &self.shapes;
            let slot = self.slots[run.slot].get_or_insert_with(|| Slot {
                cells: Some(0),
                layers: shapes
                    .iter()
                    .map(|shape| (vec![0.0; shape.conv_state()], vec![0.0; shape.delta_state()]))
                    .collect(),
            });
            if run.start == 0 {
                for (conv, delta) in &mut slot.layers {
                    conv.fill(0.0);
                    delta.fill(0.0);
                }
            }
            slot.cells = None;
        }
    }

    /// Recurrent layer `layer`'s state in `slot` (readied by `begin`).
    pub(crate) fn state(&mut self, slot: usize, layer: usize) -> Option<DeltaState<'_>> {
        let (conv, delta) = self.slots.get_mut(slot)?.as_mut()?.layers.get_mut(layer)?;
        Some(DeltaState { conv, delta })
    }

    /// A copy of `slot`'s states, if it holds a usable one.
    pub(crate) fn read(&self, slot: usize) -> Option<StateSnapshot> {
        let held = self.slots.get(slot)?.as_ref()?;
        let cells = held.cells?;
        let mut values = Vec::with_capacity(self.values_per_sequence());
        for (conv, delta) in &held.layers {
            values.extend_from_slice(conv);
            values.extend_from_slice(delta);
        }
        Some(StateSnapshot { cells, values })
    }

    /// Put a copy [`RecurrentStore::read`] gave (of any slot) into `slot`:
    /// its next run starts at the snapshot's cells (or at 0).
    pub(crate) fn write(&mut self, slot: usize, snapshot: &StateSnapshot) -> Result<(), ForwardError> {
        let expected = self.values_per_sequence();
        if snapshot.values.len() != expected {
            return Err(ForwardError::StateSize { values: snapshot.values.len(), expected });
        }
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        let mut values = snapshot.values.as_slice();
        let layers = self
            .shapes
            .iter()
            .map(|shape| {
                let (conv, rest) = values.split_at(shape.conv_state());
                let (delta, rest) = rest.split_at(shape.delta_state());
                values = rest;
                (conv.to_vec(), delta.to_vec())
            })
            .collect();
        self.slots[slot] = Some(Slot { cells: Some(snapshot.cells), layers });
        Ok(())
    }

    fn values_per_sequence(&self) -> usize {
        self.shapes.iter().map(|shape| shape.conv_state() + shape.delta_state()).sum()
    }

    /// The runs' states now hold their rows too.
    pub(crate) fn commit(&mut self, runs: &[Run]) {
        for run in runs {
            if let Some(Some(slot)) = self.slots.get_mut(run.slot) {
                slot.cells = Some(run.start + run.rows.len() as u32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchRow, RowInput};

    const SHAPE: DeltaShape = DeltaShape { k_heads: 1, v_heads: 2, head: 4, conv: 3, grouped: false };

    fn batch(rows: &[(usize, u32)], states: Vec<u32>) -> Batch {
        let rows = rows
            .iter()
            .map(|&(seq, cell)| BatchRow {
                input: RowInput::Token(0),
                seq,
                cell,
                pos: crate::batch::text_position(cell),
                logits: false,
            })
            .collect();
        Batch { rows, block_tables: vec![Vec::new(); states.len()], states, ..Batch::default() }
    }

    #[test]
    fn sequences_start_at_zero_or_where_their_state_ends() {
        let mut store = RecurrentStore::new(vec![SHAPE; 2]);
        assert_eq!(RecurrentStore::bytes_per_sequence(&[SHAPE; 2]), 2 * (16 * 2 + 2 * 16) * 4);
        // Two sequences, interleaved rows, slots 3 and 1.
        let first = batch(&[(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)], vec![3, 1]);
        let runs = store.plan(&first).expect("new sequences");
        assert_eq!(
            runs,
            vec![Run { slot: 3, rows: vec![0, 2, 4], start: 0 }, Run { slot: 1, rows: vec![1, 3], start: 0 }]
        );
        store.begin(&runs);
        store.state(3, 1).expect("readied").delta[0] = 5.0;
        store.commit(&runs);
        // Slot 3 goes on from cell 3; slot 1 may not skip ahead or go back.
        let next = store.plan(&batch(&[(0, 3)], vec![3])).expect("continues");
        assert_eq!(next, vec![Run { slot: 3, rows: vec![0], start: 3 }]);
        assert_eq!(
            store.plan(&batch(&[(0, 3)], vec![1])),
            Err(ForwardError::StateCell { row: 0, cell: 3, expected: 2 })
        );
        assert_eq!(
            store.plan(&batch(&[(0, 0), (0, 2)], vec![1])),
            Err(ForwardError::StateCell { row: 1, cell: 2, expected: 1 })
        );
        assert_eq!(
            store.plan(&batch(&[(0, 0), (1, 0)], vec![1, 1])),
            Err(ForwardError::SharedState { row: 1, slot: 1 })
        );
        assert_eq!(store.plan(&batch(&[(0, 0)], Vec::new())).map(|_| ()), Err(ForwardError::State { row: 0, seq: 0 }));
        // Starting over clears the state; a pass that never commits leaves
        // the slot unusable but from 0.
        let restart = store.plan(&batch(&[(0, 0)], vec![3])).expect("starts over");
        store.begin(&restart);
        assert_eq!(store.state(3, 1).expect("readied").delta[0], 0.0);
        assert!(store.plan(&batch(&[(0, 1)], vec![3])).is_err());
        assert!(store.plan(&batch(&[(0, 0)], vec![3])).is_ok());
    }

    #[test]
    fn a_snapshot_resumes_in_any_slot() {
        let mut store = RecurrentStore::new(vec![SHAPE; 2]);
        assert!(store.read(0).is_none());
        let runs = store.plan(&batch(&[(0, 0), (0, 1)], vec![0])).expect("new sequence");
        store.begin(&runs);
        store.state(0, 0).expect("readied").conv[1] = 2.0;
        store.state(0, 1).expect("readied").delta[3] = 7.0;
        // Mid-pass, the state is nobody's to copy.
        assert!(store.read(0).is_none());
        store.commit(&runs);
        let snapshot = store.read(0).expect("committed");
        assert_eq!(snapshot.cells, 2);
        assert_eq!(snapshot.values.len(), 2 * (16 * 2 + 2 * 16));
        store.write(5, &snapshot).expect("same shapes");
        assert_eq!(store.read(5), Some(snapshot.clone()));
        assert_eq!(store.state(5, 1).expect("written").delta[3], 7.0);
        // Slot 5 goes on from cell 2, as slot 0 would.
        assert!(store.plan(&batch(&[(0, 2)], vec![5])).is_ok());
        let short = StateSnapshot { cells: 2, values: vec![0.0; 3] };
        assert_eq!(store.write(1, &short), Err(ForwardError::StateSize { values: 3, expected: 128 }));
    }
}
