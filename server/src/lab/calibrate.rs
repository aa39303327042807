//! `sluice bench calibrate`: times real forward passes over a grid of step
//! mixes (prefill chunk sizes, decode batch sizes, context lengths) and
//! fits the simulator's [`CostModel`] to them by least squares.

use std::time::Instant;

use std::sync::Arc;

use sluice_kernels::backend::KvTypes;

use sluice_model::batch::{Batch, BatchRow, RowInput, text_position};
use sluice_model::{ForwardError, Model};

use sluice_engine::step_cost::{CostFit, CostModel, StepWork};

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

/// The least-squares fit of the samples at equal weights (see
/// [`CostFit`]); `None` when they do not determine the four terms.
pub fn fit(samples: &[Sample]) -> Option<CostModel> {
    let mut fit = CostFit::new(1.0);
    for sample in samples {
        fit.add(&sample.work, sample.ms);
    }
    fit.model()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::step_cost::testing::{assert_close, step};

    #[test]
    fn the_fit_recovers_a_known_model() {
        let truth = CostModel { base_ms: 1.5, prefill_token_ms: 0.2, decode_token_ms: 0.7, attention_kpair_ms: 0.01 };
        let samples: Vec<Sample> = default_grid()
            .into_iter()
            .map(|(prefill, decode, context)| {
                let work = step(prefill, u64::from(context), decode);
                Sample { work, ms: truth.step_ms(&work) }
            })
            .collect();
        assert_close(fit(&samples).expect("determined"), truth);
        assert_eq!(fit(&samples[..2]), None);
    }
}
