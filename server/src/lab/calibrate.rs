//! `sluice bench calibrate`: times real forward passes over a grid of step
//! mixes (prefill chunk sizes, decode batch sizes, context lengths) and
//! fits the simulator's [`CostModel`] to them by least squares.

use std::time::Instant;

use std::sync::Arc;

use sluice_kernels::backend::KvTypes;

use crate::model::batch::{Batch, BatchRow, RowInput, text_position};
use crate::model::{ForwardError, Model};

use super::sim::{CostModel, StepWork};

/// One timed step.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub work: StepWork,
    pub ms: f64,
}

const BLOCK_TOKENS: usize = 16;

/// Times one step of `prefill` tokens (one sequence, starting at cell
/// `context`) plus `decode` sequences of one token at cell `context`
/// each, the median of `reps` runs.
pub fn time_step(
    model: &Arc<dyn Model>,
    prefill: u32,
    decode: u32,
    context: u32,
    reps: usize,
) -> Result<Sample, ForwardError> {
    let sequences = decode as usize + usize::from(prefill > 0);
    let cells = context as usize + prefill.max(1) as usize;
    let blocks_per_seq = cells.div_ceil(BLOCK_TOKENS);
    // The cost model is fitted to the default f16 KV cache.
    let mut model_context = Arc::clone(model).context(sequences * blocks_per_seq, BLOCK_TOKENS, KvTypes::default())?;
    let mut batch = Batch::default();
    let mut work = StepWork::default();
    let n_vocab = model.hparams().n_vocab as u32;
    for seq in 0..sequences {
        batch.block_tables.push(((seq * blocks_per_seq) as u32..((seq + 1) * blocks_per_seq) as u32).collect());
        let rows = if prefill > 0 && seq == 0 { prefill } else { 1 };
        work.add_rows(u64::from(context), rows, !(prefill > 0 && seq == 0));
        for offset in 0..rows {
            let cell = context + offset;
            batch.rows.push(BatchRow {
                input: RowInput::Token((cell * 31 + seq as u32 * 7 + 1) % n_vocab),
                seq,
                cell,
                pos: text_position(cell),
                logits: offset + 1 == rows,
            });
        }
    }
    // The first pass warms caches and scratch buffers; it is not timed.
    model_context.forward(&batch)?;
    let mut times: Vec<f64> = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let started = Instant::now();
        model_context.forward(&batch)?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(Sample { work, ms: times[times.len() / 2] })
}

/// The grid `sluice bench calibrate` measures: (prefill, decode, context).
pub fn default_grid() -> Vec<(u32, u32, u32)> {
    let mut grid = Vec::new();
    for context in [0, 256, 1024] {
        for prefill in [0, 16, 64, 256] {
            for decode in [0, 1, 4, 8, 16] {
                if prefill + decode > 0 {
                    grid.push((prefill, decode, context));
                }
            }
        }
    }
    grid
}

/// Least squares fit of `ms ≈ base + a·prefill + b·decode + c·kpairs` in
/// relative terms: each sample's error is divided by its time, so a
/// one-token decode step weighs as much as a long prefill (an absolute fit
/// lets the long steps drive the fixed cost negative). `None` when the
/// samples do not determine the four terms.
pub fn fit(samples: &[Sample]) -> Option<CostModel> {
    let features = |work: &StepWork| {
        [1.0, f64::from(work.prefill_tokens), f64::from(work.decode_tokens), work.attention_pairs as f64 / 1000.0]
    };
    // Normal equations of the weighted problem: row and target scaled by 1/ms.
    let mut a = [[0.0f64; 5]; 4];
    for sample in samples.iter().filter(|sample| sample.ms > 0.0) {
        let x = features(&sample.work).map(|value| value / sample.ms);
        for i in 0..4 {
            for j in 0..4 {
                a[i][j] += x[i] * x[j];
            }
            a[i][4] += x[i];
        }
    }
    let beta = solve(a)?;
    Some(CostModel {
        base_ms: beta[0],
        prefill_token_ms: beta[1],
        decode_token_ms: beta[2],
        attention_kpair_ms: beta[3],
    })
}

/// Gaussian elimination with partial pivoting on an augmented 4×5 matrix.
fn solve(mut a: [[f64; 5]; 4]) -> Option<[f64; 4]> {
    for column in 0..4 {
        let pivot = (column..4).max_by(|&x, &y| a[x][column].abs().total_cmp(&a[y][column].abs()))?;
        if a[pivot][column].abs() < 1e-12 {
            return None;
        }
        a.swap(column, pivot);
        for row in 0..4 {
            if row != column {
                let factor = a[row][column] / a[column][column];
                let pivot_row = a[column];
                for (value, pivot) in a[row][column..].iter_mut().zip(&pivot_row[column..]) {
                    *value -= factor * pivot;
                }
            }
        }
    }
    Some(std::array::from_fn(|i| a[i][4] / a[i][i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_known_model() {
        let truth = CostModel { base_ms: 1.5, prefill_token_ms: 0.2, decode_token_ms: 0.7, attention_kpair_ms: 0.01 };
        let samples: Vec<Sample> = default_grid()
            .into_iter()
            .map(|(prefill, decode, context)| {
                let mut work = StepWork::default();
                work.add_rows(u64::from(context), prefill, false);
                for _ in 0..decode {
                    work.add_rows(u64::from(context), 1, true);
                }
                Sample { work, ms: truth.step_ms(&work) }
            })
            .collect();
        let fitted = fit(&samples).expect("determined");
        for (got, want) in [
            (fitted.base_ms, truth.base_ms),
            (fitted.prefill_token_ms, truth.prefill_token_ms),
            (fitted.decode_token_ms, truth.decode_token_ms),
            (fitted.attention_kpair_ms, truth.attention_kpair_ms),
        ] {
            assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        }
        assert_eq!(fit(&samples[..2]), None);
    }
}
