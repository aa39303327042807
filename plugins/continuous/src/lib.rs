//! `continuous`: llama.cpp-like continuous batching, the policy a faulted
//! one falls back to (`policy.on_fault = "fallback"`).
//!
//! Every step: decode every ready or decoding slot (in slot order while the
//! budget lasts), admit waiting requests first-come first-served into free
//! slots, then spend what is left of the budget on prefill chunks in slot
//! order.

use sluice_plugin_api::{Decision, Policy, Settings, StepView, export_policy};

/// The policy has no settings and no state between steps.
pub struct Continuous;

impl Policy for Continuous {
    fn configure(settings: &Settings) -> Result<Self, String> {
        settings.expect_only(&[])?;
        Ok(Continuous)
    }

    fn step(&mut self, view: &StepView) -> Decision {
        let mut budget = view.token_budget;
        let mut decision = Decision::default();
        decision.decode_ready(view, &mut budget);
        decision.admit_fifo_and_prefill(view, &mut budget);
        decision
    }
}

export_policy!(Continuous);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plugin_api::SettingValue;
    use sluice_plugin_api::testing::{ViewBuilder, request, tokens_used};
    use sluice_plugin_api::{Admit, Phase, Prefill};

    fn policy() -> Continuous {
        Continuous::configure(&Settings::default()).expect("no settings is valid")
    }

    #[test]
    fn decodes_every_ready_and_decoding_slot_and_prefills_the_rest() {
        let view = ViewBuilder::new(4, 64)
            .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
            .occupied(1, Phase::Prefilling, request(2, 100).done(40))
            .occupied(2, Phase::Ready, request(3, 8).done(8))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.decode, vec![0, 2]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 60 }]);
        assert!(decision.admit.is_empty());
        assert_eq!(tokens_used(&decision), 62);
    }

    #[test]
    fn admits_fifo_into_free_slots_and_splits_the_budget_in_slot_order() {
        let view = ViewBuilder::new(3, 100)
            .occupied(1, Phase::Decoding, request(1, 4).done(4).generated(1))
            .waiting(request(7, 80))
            .waiting(request(8, 80))
            .waiting(request(9, 80))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 7, slot: 0 }, Admit { request_id: 8, slot: 2 }]);
        assert_eq!(decision.decode, vec![1]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 0, tokens: 80 }, Prefill { slot: 2, tokens: 19 }]);
        assert_eq!(tokens_used(&decision), 100);
    }

    #[test]
    fn cached_prompt_tokens_are_not_granted_again() {
        let mut waiting = request(5, 50);
        waiting.prompt_cached = 32;
        waiting.prompt_done = 32;
        let view = ViewBuilder::new(1, 512).waiting(waiting).build();
        let decision = policy().step(&view);
        assert_eq!(decision.prefill, vec![Prefill { slot: 0, tokens: 18 }]);
    }

    #[test]
    fn decode_never_exceeds_a_tiny_budget() {
        let view = ViewBuilder::new(3, 2)
            .occupied(0, Phase::Decoding, request(1, 1).done(1))
            .occupied(1, Phase::Decoding, request(2, 1).done(1))
            .occupied(2, Phase::Decoding, request(3, 1).done(1))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.decode, vec![0, 1]);
        assert!(decision.prefill.is_empty());
    }

    #[test]
    fn idle_engine_gets_an_empty_decision() {
        let decision = policy().step(&ViewBuilder::new(2, 512).build());
        assert_eq!(decision, Decision::default());
    }

    #[test]
    fn settings_are_refused() {
        let settings = Settings::from_pairs([("max_members", SettingValue::Integer(2))]);
        let error = Continuous::configure(&settings).err().expect("continuous takes no settings");
        assert!(error.contains("max_members"), "{error}");
    }
}
