//! The step-cost model: what one step costs as a function of its work,
//! fitted by least squares to timed steps. The engine fits it online to the
//! steps it runs and hands it to the policy in every view
//! ([`StepView::costs`](super::policy::StepView)), so a latency-bounded
//! policy sizes its prefill chunks for the machine and model at hand;
//! `sluice bench calibrate` fits it offline to a grid of steps; the lab's
//! simulator times its steps with it.

use serde::{Deserialize, Serialize};

use super::policy::StepCosts;

/// Milliseconds one step takes: a fixed part, a part per prefill token, a
/// part per decode token, and a part per (query, key) pair of attention.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    pub base_ms: f64,
    pub prefill_token_ms: f64,
    pub decode_token_ms: f64,
    /// Per thousand attended (query, key) pairs.
    pub attention_kpair_ms: f64,
}

impl CostModel {
    pub fn step_ms(&self, work: &StepWork) -> f64 {
        if work.prefill_tokens == 0 && work.decode_tokens == 0 {
            return 0.0;
        }
        self.base_ms
            + self.prefill_token_ms * f64::from(work.prefill_tokens)
            + self.decode_token_ms * f64::from(work.decode_tokens)
            + self.attention_kpair_ms * work.attention_pairs as f64 / 1000.0
    }
}

/// What one step computes, as the cost model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepWork {
    pub prefill_tokens: u32,
    pub decode_tokens: u32,
    pub attention_pairs: u64,
}

impl StepWork {
    /// A chunk of `tokens` rows starting at cell `start` of a sequence.
    pub fn add_rows(&mut self, start: u64, tokens: u32, decode: bool) {
        if decode {
            self.decode_tokens += tokens;
        } else {
            self.prefill_tokens += tokens;
        }
        // Row i attends to cells 0..=start+i.
        let n = u64::from(tokens);
        self.attention_pairs += n * (start + 1) + n * n.saturating_sub(1) / 2;
    }

    fn features(&self) -> [f64; 4] {
        [1.0, f64::from(self.prefill_tokens), f64::from(self.decode_tokens), self.attention_pairs as f64 / 1000.0]
    }
}

/// A running least-squares fit of [`CostModel`] to timed steps.
///
/// Errors are relative (each step's equation is divided by its time), so a
/// one-token decode step weighs as much as a long prefill: an absolute fit
/// lets the long steps drive the fixed cost negative. Each new step scales
/// the weight of the earlier ones by `decay`, so the fit follows a machine
/// whose load changes; 1 keeps every step at full weight.
#[derive(Clone, Debug)]
pub struct CostFit {
    decay: f64,
    /// The weighted normal equations, augmented with their right-hand side.
    normal: [[f64; 5]; 4],
    steps: u64,
    /// The last fit that the steps determined, and how many steps it saw.
    fitted: Option<(CostModel, u64)>,
}

impl CostFit {
    pub fn new(decay: f64) -> Self {
        CostFit { decay, normal: [[0.0; 5]; 4], steps: 0, fitted: None }
    }

    /// The engine's fit (and the lab's, which mirrors it): a step's weight
    /// halves about every 350 steps, long enough that prefill stays
    /// measured through a stretch of decode-only steps.
    pub fn online() -> Self {
        CostFit::new(0.998)
    }

    /// Add a step that did `work` in `ms`; refits when the steps so far
    /// determine all four terms (otherwise the previous fit stands).
    pub fn add(&mut self, work: &StepWork, ms: f64) {
        if !(ms > 0.0 && ms.is_finite()) || (work.prefill_tokens == 0 && work.decode_tokens == 0) {
            return;
        }
        let x = work.features().map(|value| value / ms);
        for (i, row) in self.normal.iter_mut().enumerate() {
            for (j, cell) in row[..4].iter_mut().enumerate() {
                *cell = *cell * self.decay + x[i] * x[j];
            }
            row[4] = row[4] * self.decay + x[i];
        }
        self.steps += 1;
        if let Some(beta) = solve(self.normal) {
            let model = CostModel {
                base_ms: beta[0],
                prefill_token_ms: beta[1],
                decode_token_ms: beta[2],
                attention_kpair_ms: beta[3],
            };
            self.fitted = Some((model, self.steps));
        }
    }

    /// The latest determined fit.
    pub fn model(&self) -> Option<CostModel> {
        self.fitted.map(|(model, _)| model)
    }

    /// The latest fit as the policy sees it: nanoseconds, negative terms
    /// (noise on a term too small to measure) as 0.
    pub fn costs(&self) -> StepCosts {
        let Some((model, steps)) = self.fitted else { return StepCosts::default() };
        let ns = |ms: f64| (ms * 1e6).round().clamp(0.0, f64::from(u32::MAX)) as u32;
        StepCosts {
            measured_steps: u32::try_from(steps).unwrap_or(u32::MAX),
            base_ns: ns(model.base_ms),
            prefill_token_ns: ns(model.prefill_token_ms),
            decode_row_ns: ns(model.decode_token_ms),
            attention_kpair_ns: ns(model.attention_kpair_ms),
        }
    }
}

/// Gaussian elimination with partial pivoting on an augmented 4×5 matrix,
/// after scaling it to a unit diagonal so that one threshold tells a
/// determined system from one whose steps never varied a term (for
/// example: no decode step seen yet).
fn solve(mut a: [[f64; 5]; 4]) -> Option<[f64; 4]> {
    let scale: [f64; 4] = std::array::from_fn(|i| a[i][i].sqrt());
    if scale.iter().any(|&s| !(s > 0.0 && s.is_finite())) {
        return None;
    }
    for (i, row) in a.iter_mut().enumerate() {
        for (j, cell) in row[..4].iter_mut().enumerate() {
            *cell /= scale[i] * scale[j];
        }
        row[4] /= scale[i];
    }
    for column in 0..4 {
        let pivot = (column..4).max_by(|&x, &y| a[x][column].abs().total_cmp(&a[y][column].abs()))?;
        if a[pivot][column].abs() < 1e-9 {
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
    Some(std::array::from_fn(|i| a[i][4] / a[i][i] / scale[i]))
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests {
    use super::testing::{assert_close, step};
    use super::*;

    const TRUTH: CostModel =
        CostModel { base_ms: 1.5, prefill_token_ms: 0.2, decode_token_ms: 0.7, attention_kpair_ms: 0.01 };

    #[test]
    fn nothing_is_reported_until_every_term_varied() {
        let mut fit = CostFit::new(0.99);
        // Prefill alone, at several sizes and depths: no decode row seen.
        for (prefill, context) in [(16, 0), (64, 0), (256, 512), (32, 1024)] {
            fit.add(&step(prefill, context, 0), TRUTH.step_ms(&step(prefill, context, 0)));
        }
        assert_eq!(fit.model(), None);
        assert_eq!(fit.costs(), StepCosts::default());
        let decodes = step(0, 300, 4);
        fit.add(&decodes, TRUTH.step_ms(&decodes));
        assert_close(fit.model().expect("determined"), TRUTH);
        assert_eq!(
            fit.costs(),
            StepCosts {
                measured_steps: 5,
                base_ns: 1_500_000,
                prefill_token_ns: 200_000,
                decode_row_ns: 700_000,
                attention_kpair_ns: 10_000
            }
        );
    }

    #[test]
    fn a_slower_machine_takes_over_the_fit() {
        let slower = CostModel { base_ms: 3.0, prefill_token_ms: 0.4, decode_token_ms: 1.4, attention_kpair_ms: 0.02 };
        let mut fit = CostFit::new(0.9);
        let shapes = [(16, 0, 0), (0, 100, 2), (64, 200, 1), (128, 40, 3), (8, 900, 4)];
        // Long enough on the slower machine that the first one's weight is
        // 0.9^300, below the comparison's tolerance.
        for (model, rounds) in [(TRUTH, 100), (slower, 300)] {
            for round in 0..rounds {
                let (prefill, context, decodes) = shapes[round % shapes.len()];
                let work = step(prefill, context, decodes);
                fit.add(&work, model.step_ms(&work));
            }
        }
        // A model that matches every step at every weight is the fit.
        assert_close(fit.model().expect("determined"), slower);
    }

    #[test]
    fn idle_and_untimed_steps_are_ignored() {
        let mut fit = CostFit::new(1.0);
        fit.add(&StepWork::default(), 5.0);
        fit.add(&step(10, 0, 1), 0.0);
        fit.add(&step(10, 0, 1), f64::NAN);
        assert_eq!(fit.steps, 0);
    }

    #[test]
    fn negative_terms_reach_the_policy_as_zero() {
        let mut fit = CostFit::new(1.0);
        fit.fitted = Some((CostModel { base_ms: -0.5, ..TRUTH }, 9));
        assert_eq!(fit.costs().base_ns, 0);
        assert_eq!(fit.costs().measured_steps, 9);
    }
}
