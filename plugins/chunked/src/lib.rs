//! `chunked`: continuous batching with a bounded step time, after
//! Sarathi-Serve's stall-free batching.
//!
//! Every step: decode every ready or decoding slot (slot order, as
//! `continuous`), admit waiting requests first-come first-served into free
//! slots, then grant prefill chunks, oldest request first, only while the
//! step-cost model says the step stays within its bound. Under `continuous` a long
//! prompt takes the whole token budget beside the decodes, so one step can
//! last seconds on a small machine and every stream in it stalls that long
//! between two tokens; here the prompt is cut into chunks the bound allows
//! and the streams keep their pace.
//!
//! The bound: while slots decode, a step may last `max_stretch` (default 2)
//! times what its decodes alone cost, so no stream waits more than about
//! two of its usual gaps between two tokens, on any hardware; and never
//! more than `target_step_ms` (default 100), which alone bounds a step
//! without decodes (so that several prompts progress together and new
//! arrivals join soon). A lone prompt with nothing else in flight takes the
//! whole token budget, as under `continuous`. So that prompts always
//! progress, the first chunk of a step may exceed the bound up to
//! `min_chunk` tokens (default 8).
//!
//! The cost model: a step costs `base + prefill token × prefill tokens +
//! decode row × decode rows + attention kpair × attended (query, key)
//! pairs / 1000`. The host measures its four terms on the steps it runs and
//! sends them in every view (`StepView::costs`); until it has measured
//! them, and whenever settings name any of `base_ms`, `prefill_token_ms`,
//! `decode_token_ms`, `attention_kpair_ms` (the others then default to a
//! calibration of the default model on a 2-core machine), the settings'
//! model is used instead. No state between steps.

use sluice_plugin_api::{Decision, Phase, Policy, Prefill, RequestInfo, Settings, StepCosts, StepView, export_policy};

/// The step-cost model's coefficients, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cost {
    base_ms: f64,
    prefill_token_ms: f64,
    decode_token_ms: f64,
    attention_kpair_ms: f64,
}

impl Cost {
    /// A prefill chunk of `tokens` after `done` cells: each token attends
    /// to the cells before it and to the chunk's earlier tokens and itself.
    fn chunk_ms(&self, tokens: u32, done: u32) -> f64 {
        let (p, d) = (f64::from(tokens), f64::from(done));
        self.prefill_token_ms * p + self.attention_kpair_ms * (p * d + p * (p + 1.0) / 2.0) / 1000.0
    }

    /// The host's measured model, once it has one.
    fn measured(costs: &StepCosts) -> Option<Cost> {
        let ms = |ns: u32| f64::from(ns) / 1e6;
        (costs.measured_steps > 0).then(|| Cost {
            base_ms: ms(costs.base_ns),
            prefill_token_ms: ms(costs.prefill_token_ns),
            decode_token_ms: ms(costs.decode_row_ns),
            attention_kpair_ms: ms(costs.attention_kpair_ns),
        })
    }

    /// The largest chunk after `done` cells that costs at most `ms`.
    fn chunk_within(&self, ms: f64, done: u32) -> u32 {
        if ms <= 0.0 {
            return 0;
        }
        // chunk_ms(p) = a·p² + b·p with a = k/2000, b = t + k·(d + ½)/1000.
        let a = self.attention_kpair_ms / 2000.0;
        let b = self.prefill_token_ms + self.attention_kpair_ms * (f64::from(done) + 0.5) / 1000.0;
        let p = if a > 0.0 { (-b + (b * b + 4.0 * a * ms).sqrt()) / (2.0 * a) } else { ms / b.max(f64::MIN_POSITIVE) };
        // Rounding may land one token past the bound.
        let mut tokens = p.floor().clamp(0.0, f64::from(u32::MAX)) as u32;
        while tokens > 0 && self.chunk_ms(tokens, done) > ms {
            tokens -= 1;
        }
        tokens
    }
}

/// Decodes first, prefill within the step's bound; see the crate
/// documentation.
pub struct Chunked {
    target_ms: f64,
    max_stretch: f64,
    min_chunk: u32,
    /// The settings' cost model, when they name one.
    pinned: Option<Cost>,
}

/// A prompt that may get a prefill grant this step.
struct Chunk {
    /// Arrival, then request id: the order of grants.
    age: (u64, u64),
    slot: u32,
    remaining: u32,
    done: u32,
}

impl Chunk {
    fn of(slot: u32, request: &RequestInfo) -> Self {
        Chunk {
            age: (request.arrival_ms, request.id),
            slot,
            remaining: request.prompt_remaining(),
            done: request.prompt_done,
        }
    }
}

/// The cost coefficients' settings, in [`Cost`]'s order.
const COST_KEYS: [&str; 4] = ["base_ms", "prefill_token_ms", "decode_token_ms", "attention_kpair_ms"];

impl Policy for Chunked {
    fn configure(settings: &Settings) -> Result<Self, String> {
        settings.expect_only(&[&["target_step_ms", "max_stretch", "min_chunk"][..], &COST_KEYS[..]].concat())?;
        let mut named = [None; 4];
        for (value, key) in named.iter_mut().zip(COST_KEYS) {
            *value = settings.optional_float(key, 0.0..=1e6)?;
        }
        let pinned = named.iter().any(Option::is_some).then(|| {
            let [base, prefill, decode, attention] = named;
            Cost {
                base_ms: base.unwrap_or(DEFAULT_COST.base_ms),
                prefill_token_ms: prefill.unwrap_or(DEFAULT_COST.prefill_token_ms),
                decode_token_ms: decode.unwrap_or(DEFAULT_COST.decode_token_ms),
                attention_kpair_ms: attention.unwrap_or(DEFAULT_COST.attention_kpair_ms),
            }
        });
        Ok(Chunked {
            target_ms: settings.float("target_step_ms", 100.0, 1.0..=1e6)?,
            max_stretch: settings.float("max_stretch", 2.0, 1.0..=1e6)?,
            min_chunk: settings.integer("min_chunk", 8, 1..=1 << 20)? as u32,
            pinned,
        })
    }

    fn step(&mut self, view: &StepView) -> Decision {
        let mut budget = view.token_budget;
        let mut decision = Decision::default();
        decision.decode_ready(view, &mut budget);
        let cost = self.pinned.or_else(|| Cost::measured(&view.costs)).unwrap_or(DEFAULT_COST);
        // What the decodes cost: a row each, attending to its whole context.
        // `decode_ready` took the first ready or decoding slots, in order.
        let decoding = view
            .occupied
            .iter()
            .filter(|slot| matches!(slot.phase, Phase::Ready | Phase::Decoding))
            .take(decision.decode.len());
        let decode_pairs: f64 =
            decoding.map(|slot| f64::from(slot.request.prompt_tokens) + f64::from(slot.request.generated)).sum();
        let mut spent = cost.base_ms
            + cost.decode_token_ms * decision.decode.len() as f64
            + cost.attention_kpair_ms * decode_pairs / 1000.0;
        // The prefilling slots and this step's admissions, oldest request
        // first: the allowance goes where the client has waited longest.
        let mut chunks: Vec<Chunk> = view
            .occupied
            .iter()
            .filter(|slot| slot.phase == Phase::Prefilling)
            .map(|slot| Chunk::of(slot.slot, &slot.request))
            .collect();
        let waiting = view.waiting.iter().map(|waiting| &waiting.request);
        for (request, &slot) in waiting.zip(&view.free_slots) {
            decision.admit.push(sluice_plugin_api::Admit { request_id: request.id, slot });
            chunks.push(Chunk::of(slot, request));
        }
        chunks.sort_unstable_by_key(|chunk| chunk.age);
        let alone = chunks.len() == 1 && view.waiting.len() == decision.admit.len();
        let bound = if !decision.decode.is_empty() {
            self.target_ms.min(self.max_stretch * spent)
        } else if alone {
            // One prompt and nothing else in flight: a shorter step would
            // protect no one and cost the prompt a step's fixed cost per
            // chunk, so it runs as `continuous` runs it.
            f64::INFINITY
        } else {
            self.target_ms
        };
        for Chunk { slot, remaining, done, .. } in chunks {
            let mut tokens = cost.chunk_within(bound - spent, done);
            if decision.prefill.is_empty() {
                tokens = tokens.max(self.min_chunk);
            }
            let tokens = tokens.min(remaining).min(budget);
            if tokens == 0 {
                break;
            }
            decision.prefill.push(Prefill { slot, tokens });
            budget -= tokens;
            spent += cost.chunk_ms(tokens, done);
        }
        decision
    }
}

/// `sluice bench calibrate` of the default model (SmolLM2-135M Q4_1) on a
/// 2-core AMD EPYC (Zen 4) VM, rounded: the model until the host has
/// measured one.
const DEFAULT_COST: Cost =
    Cost { base_ms: 3.6, prefill_token_ms: 1.48, decode_token_ms: 1.87, attention_kpair_ms: 3.5 };

export_policy!(Chunked);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plugin_api::testing::{ViewBuilder, request, tokens_used};
    use sluice_plugin_api::{Admit, SettingValue};

    /// 1 ms a prefill token, 1 ms a decode row, nothing else: easy sums.
    /// Only `target_step_ms` bounds the step.
    fn policy(target: i64) -> Chunked {
        stretched(target, 1_000_000)
    }

    fn stretched(target: i64, max_stretch: i64) -> Chunked {
        let settings = Settings::from_pairs([
            ("target_step_ms", SettingValue::Integer(target)),
            ("max_stretch", SettingValue::Integer(max_stretch)),
            ("min_chunk", SettingValue::Integer(4)),
            ("base_ms", SettingValue::Integer(0)),
            ("prefill_token_ms", SettingValue::Integer(1)),
            ("decode_token_ms", SettingValue::Integer(1)),
            ("attention_kpair_ms", SettingValue::Integer(0)),
        ]);
        Chunked::configure(&settings).expect("valid settings")
    }

    #[test]
    fn decodes_first_then_prefill_up_to_the_target() {
        let view = ViewBuilder::new(4, 512)
            .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
            .occupied(1, Phase::Prefilling, request(2, 1000).done(40))
            .occupied(2, Phase::Ready, request(3, 8).done(8))
            .build();
        let decision = policy(50).step(&view);
        assert_eq!(decision.decode, vec![0, 2]);
        // 2 ms of decodes leave 48 for the prompt.
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 48 }]);
    }

    #[test]
    fn admits_fifo_and_spreads_the_allowance_in_slot_order() {
        let view = ViewBuilder::new(3, 512)
            .occupied(1, Phase::Decoding, request(1, 4).done(4).generated(1))
            .waiting(request(7, 30))
            .waiting(request(8, 80))
            .build();
        let decision = policy(61).step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 7, slot: 0 }, Admit { request_id: 8, slot: 2 }]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 0, tokens: 30 }, Prefill { slot: 2, tokens: 30 }]);
        assert_eq!(tokens_used(&decision), 61);
    }

    #[test]
    fn a_step_over_the_target_still_gets_the_minimum_chunk() {
        let mut view = ViewBuilder::new(12, 512).occupied(11, Phase::Prefilling, request(50, 100));
        for slot in 0..11 {
            view = view.occupied(slot, Phase::Decoding, request(u64::from(slot), 4).done(4).generated(3));
        }
        let decision = policy(10).step(&view.build());
        assert_eq!(decision.decode.len(), 11);
        assert_eq!(decision.prefill, vec![Prefill { slot: 11, tokens: 4 }], "min_chunk, and only one chunk");
    }

    #[test]
    fn the_oldest_prompt_gets_its_chunk_first() {
        let view = ViewBuilder::new(3, 512)
            .occupied(0, Phase::Prefilling, request(9, 100).arrived(500))
            .occupied(2, Phase::Prefilling, request(4, 100).arrived(200))
            .waiting(request(12, 100).arrived(100))
            .build();
        let decision = policy(130).step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 12, slot: 1 }]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 100 }, Prefill { slot: 2, tokens: 30 }]);
    }

    #[test]
    fn the_token_budget_still_bounds_everything() {
        let view = ViewBuilder::new(2, 20)
            .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1))
            .occupied(1, Phase::Prefilling, request(2, 500))
            .build();
        let decision = policy(1000).step(&view);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 19 }]);
    }

    #[test]
    fn while_slots_decode_a_step_lasts_at_most_max_stretch_times_their_decodes() {
        let decoding = ViewBuilder::new(4, 512)
            .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
            .occupied(1, Phase::Decoding, request(2, 10).done(10).generated(5))
            .occupied(2, Phase::Prefilling, request(3, 1000))
            .build();
        // 2 ms of decodes, stretched 3 times: 4 ms for the prompt.
        assert_eq!(stretched(100, 3).step(&decoding).prefill, vec![Prefill { slot: 2, tokens: 4 }]);
        assert_eq!(stretched(100, 10).step(&decoding).prefill, vec![Prefill { slot: 2, tokens: 18 }]);
        // The target still caps a stretched step.
        assert_eq!(stretched(12, 10).step(&decoding).prefill, vec![Prefill { slot: 2, tokens: 10 }]);
        // Nothing decoding: only the target bounds the prompts' step…
        let two =
            ViewBuilder::new(4, 512).occupied(2, Phase::Prefilling, request(3, 1000)).waiting(request(4, 30)).build();
        let decision = stretched(100, 3).step(&two);
        assert_eq!(decision.admit, vec![Admit { request_id: 4, slot: 0 }]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 2, tokens: 100 }]);
        // …and a lone prompt with nothing else in flight takes the budget.
        let alone = ViewBuilder::new(4, 512).occupied(2, Phase::Prefilling, request(3, 1000)).build();
        assert_eq!(stretched(100, 3).step(&alone).prefill, vec![Prefill { slot: 2, tokens: 512 }]);
    }

    #[test]
    fn the_hosts_measured_costs_size_the_chunks_unless_settings_name_a_model() {
        let view = |costs| {
            ViewBuilder::new(2, 4096)
                .costs(costs)
                .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
                .occupied(1, Phase::Prefilling, request(2, 4000))
                .build()
        };
        let settings = Settings::from_pairs([("max_stretch", SettingValue::Integer(1000))]);
        let mut measuring = Chunked::configure(&settings).expect("valid settings");
        // 2 ms a prefill token, 1 ms a decode row: (100 - 1) / 2 tokens.
        let measured = StepCosts {
            measured_steps: 40,
            base_ns: 0,
            prefill_token_ns: 2_000_000,
            decode_row_ns: 1_000_000,
            attention_kpair_ns: 0,
        };
        assert_eq!(measuring.step(&view(measured)).prefill, vec![Prefill { slot: 1, tokens: 49 }]);
        // Nothing measured yet: the default model.
        let decode_ms =
            DEFAULT_COST.base_ms + DEFAULT_COST.decode_token_ms + DEFAULT_COST.attention_kpair_ms * 15.0 / 1000.0;
        let expected = DEFAULT_COST.chunk_within(100.0 - decode_ms, 0);
        assert_eq!(measuring.step(&view(StepCosts::default())).prefill, vec![Prefill { slot: 1, tokens: expected }]);
        // A model in the settings wins over the measured one.
        assert_eq!(policy(100).step(&view(measured)).prefill, vec![Prefill { slot: 1, tokens: 99 }]);
    }

    #[test]
    fn attention_shrinks_chunks_deep_in_a_prompt() {
        let cost = Cost { base_ms: 0.0, prefill_token_ms: 1.0, decode_token_ms: 0.0, attention_kpair_ms: 10.0 };
        let (shallow, deep) = (cost.chunk_within(100.0, 0), cost.chunk_within(100.0, 4000));
        assert!(shallow > deep && deep > 0, "{shallow} {deep}");
        for (tokens, done) in [(shallow, 0), (deep, 4000)] {
            assert!(cost.chunk_ms(tokens, done) <= 100.0 && cost.chunk_ms(tokens + 1, done) > 100.0);
        }
    }

    #[test]
    fn settings_are_checked_by_name_and_range() {
        let unknown = Settings::from_pairs([("max_members", SettingValue::Integer(2))]);
        assert!(Chunked::configure(&unknown).err().is_some_and(|error| error.contains("max_members")));
        let zero = Settings::from_pairs([("target_step_ms", SettingValue::Integer(0))]);
        assert!(Chunked::configure(&zero).err().is_some_and(|error| error.contains("target_step_ms")));
        assert!(Chunked::configure(&Settings::default()).is_ok());
    }
}
