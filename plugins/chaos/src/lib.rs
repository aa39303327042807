//! `chaos`: a fault-injection policy for drills and tests of the host's
//! fault handling (retry on a fresh instance, quarantine, `fail-closed` or
//! `fallback`, reload). Not a built-in: load it by path
//! (`plugins/dist/chaos.wasm`).
//!
//! Until the engine's step counter reaches `after_step` it schedules
//! plainly (decode every ready or decoding slot, admit FIFO, prefill whole
//! prompts in slot order within the budget). From then on every step
//! commits the configured `fault`. The trigger is the host's step number,
//! not a counter of its own, so a fresh instance after a fault misbehaves
//! again and the host quarantines the policy, as a real broken policy
//! would be.
//!
//! Faults: `trap` (a panic), `loop` (spins until fuel or the deadline runs
//! out), `memory` (allocates past any sane limit), `stall` (grants nothing),
//! and decisions that break a validation rule: `admit-missing` (a request
//! that is not waiting), `decode-not-ready` (a slot that is not ready),
//! `prefill-not-prefilling` (a slot that is not prefilling) and
//! `over-budget` (decode grants on top of a budget already spent).

use sluice_plugin_api::{Admit, Decision, Phase, Policy, Prefill, Settings, StepView, export_policy};

const FAULTS: [&str; 8] =
    ["trap", "loop", "memory", "stall", "admit-missing", "decode-not-ready", "prefill-not-prefilling", "over-budget"];

pub struct Chaos {
    fault: &'static str,
    after_step: u64,
}

impl Policy for Chaos {
    fn configure(settings: &Settings) -> Result<Self, String> {
        settings.expect_only(&["fault", "after_step"])?;
        let fault = settings.choice("fault", "trap", &FAULTS)?;
        let after_step = settings.integer("after_step", 0, 0..=i64::MAX)? as u64;
        Ok(Chaos { fault, after_step })
    }

    fn step(&mut self, view: &StepView) -> Decision {
        let plain = plain(view);
        if view.step < self.after_step {
            return plain;
        }
        match self.fault {
            "trap" => panic!("chaos: trap at step {}", view.step),
            "loop" => {
                let mut spins = 0u64;
                // The host's fuel or deadline ends this; `black_box` keeps
                // the optimizer from proving it never ends.
                loop {
                    spins = std::hint::black_box(spins.wrapping_add(1));
                }
            }
            "memory" => {
                let hoard: Vec<u8> = vec![1; 1 << 30];
                std::hint::black_box(&hoard);
                plain
            }
            "stall" => Decision::default(),
            "admit-missing" => Decision {
                admit: vec![Admit { request_id: u64::MAX, slot: view.free_slots.first().copied().unwrap_or(0) }],
                ..plain
            },
            "decode-not-ready" => Decision { decode: vec![u32::MAX], ..Decision::default() },
            "prefill-not-prefilling" => {
                Decision { prefill: vec![Prefill { slot: u32::MAX, tokens: 1 }], ..Decision::default() }
            }
            _ => over_budget(view, plain),
        }
    }
}

/// Decode every ready or decoding slot, admit FIFO into free slots, prefill
/// whole prompts (or what the budget allows) in slot order.
fn plain(view: &StepView) -> Decision {
    let mut budget = view.token_budget;
    let mut decision = Decision::default();
    decision.decode_ready(view, &mut budget);
    decision.admit_fifo_and_prefill(view, &mut budget);
    decision
}

/// The plain decision with one more token than the budget: an extra
/// prefill token when a prompt has one left, else a whole-budget prefill of
/// nothing legal, which the host refuses as well.
fn over_budget(view: &StepView, mut plain: Decision) -> Decision {
    let used: u32 = plain.prefill.iter().map(|p| p.tokens).sum::<u32>() + plain.decode.len() as u32;
    let spare = view.token_budget.saturating_sub(used) + 1;
    match view.occupied.iter().find(|slot| slot.phase == Phase::Prefilling && !plain.decode.contains(&slot.slot)) {
        Some(slot) => {
            plain.prefill.retain(|p| p.slot != slot.slot);
            plain.prefill.push(Prefill { slot: slot.slot, tokens: slot.request.prompt_remaining().max(spare) });
            plain
        }
        None => Decision { prefill: vec![Prefill { slot: u32::MAX, tokens: spare }], ..plain },
    }
}

export_policy!(Chaos);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plugin_api::SettingValue;
    use sluice_plugin_api::testing::{ViewBuilder, request, tokens_used};

    fn chaos(fault: &str, after_step: i64) -> Chaos {
        let settings = Settings::from_pairs([
            ("fault", SettingValue::Text(fault.into())),
            ("after_step", SettingValue::Integer(after_step)),
        ]);
        Chaos::configure(&settings).expect("valid settings")
    }

    #[test]
    fn schedules_plainly_before_the_trigger_step() {
        let view = ViewBuilder::new(2, 64)
            .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1))
            .waiting(request(2, 100))
            .build();
        let decision = chaos("trap", 5).step(&view);
        assert_eq!(decision.decode, vec![0]);
        assert_eq!(decision.admit, vec![Admit { request_id: 2, slot: 1 }]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 63 }]);
        assert_eq!(tokens_used(&decision), 64);
    }

    #[test]
    fn rule_breaking_faults_break_their_rule() {
        let view = ViewBuilder::new(3, 16)
            .occupied(0, Phase::Prefilling, request(1, 40).done(8))
            .occupied(1, Phase::Decoding, request(2, 4).done(4).generated(1))
            .waiting(request(3, 10))
            .build();
        assert!(chaos("admit-missing", 0).step(&view).admit.iter().any(|a| a.request_id == u64::MAX));
        assert_eq!(chaos("decode-not-ready", 0).step(&view).decode, vec![u32::MAX]);
        assert_eq!(chaos("prefill-not-prefilling", 0).step(&view).prefill[0].slot, u32::MAX);
        assert!(tokens_used(&chaos("over-budget", 0).step(&view)) > 16);
        assert_eq!(chaos("stall", 0).step(&view), Decision::default());
    }

    #[test]
    fn settings_are_checked() {
        let unknown = Settings::from_pairs([("fault", SettingValue::Text("explode".into()))]);
        assert!(Chaos::configure(&unknown).err().is_some_and(|error| error.contains("fault")));
        let negative = Settings::from_pairs([("after_step", SettingValue::Integer(-1))]);
        assert!(Chaos::configure(&negative).err().is_some_and(|error| error.contains("after_step")));
    }
}
