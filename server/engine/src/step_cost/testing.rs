//! Helpers for tests of the step-cost fit, here and in the crates above
//! (cargo feature `testing`, which only test builds turn on).

use super::{CostModel, StepWork};

/// A prefill chunk and `decodes` decode rows, all at `context`.
pub fn step(prefill: u32, context: u64, decodes: u32) -> StepWork {
    let mut work = StepWork::default();
    work.add_rows(context, prefill, false);
    for _ in 0..decodes {
        work.add_rows(context, 1, true);
    }
    work
}

pub fn assert_close(got: CostModel, want: CostModel) {
    for (got, want) in [
        (got.base_ms, want.base_ms),
        (got.prefill_token_ms, want.prefill_token_ms),
        (got.decode_token_ms, want.decode_token_ms),
        (got.attention_kpair_ms, want.attention_kpair_ms),
    ] {
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }
}
