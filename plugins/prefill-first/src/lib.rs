//! `prefill-first`: admit and prefill before decoding, like TGI's default
//! scheduling.
//!
//! Every step: admit waiting requests first-come first-served into free
//! slots, spend the budget on prefill chunks in slot order, and only then
//! decode ready and decoding slots (slot order) with what is left.
//!
//! Why: a new request reaches its first token as early as possible, and
//! slots fill up quickly, which is what TTFT and throughput under bursty
//! load reward. The trade-off, to be measured rather than hidden: while
//! prompts use up the whole budget, decoding stops for everyone, so
//! inter-token latency spikes whenever long prompts arrive. Decode is not
//! starved forever: prefill needs a prompt in a slot, new prompts need free
//! slots, and slots free up only when requests end, so a stall lasts at most
//! as long as prefilling the prompts of the slots (plus whatever replaces
//! requests cancelled meanwhile). With a budget much larger than the slot
//! count (the usual case) prefill rarely takes all of it and decode runs
//! alongside. `continuous` or `cohort` are the policies to compare it with.
//!
//! A ready slot (prompt done, logits held) that gets no budget simply keeps
//! its logits until a later step; nothing is lost.
//!
//! No settings, no state between steps.

use sluice_plugin_api::{Decision, Policy, Settings, StepView, export_policy};

/// Prefill before decode; see the crate documentation.
pub struct PrefillFirst;

impl Policy for PrefillFirst {
    fn configure(settings: &Settings) -> Result<Self, String> {
        settings.expect_only(&[])?;
        Ok(PrefillFirst)
    }

    fn step(&mut self, view: &StepView) -> Decision {
        let mut budget = view.token_budget;
        let mut decision = Decision::default();
        decision.admit_fifo_and_prefill(view, &mut budget);
        decision.decode_ready(view, &mut budget);
        decision
    }
}

export_policy!(PrefillFirst);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plugin_api::SettingValue;
    use sluice_plugin_api::testing::{ViewBuilder, request, tokens_used};
    use sluice_plugin_api::{Admit, Phase, Prefill};

    fn policy() -> PrefillFirst {
        PrefillFirst::configure(&Settings::default()).expect("no settings is valid")
    }

    #[test]
    fn prefill_takes_the_budget_before_decode() {
        let view = ViewBuilder::new(4, 64)
            .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
            .occupied(1, Phase::Prefilling, request(2, 100).done(40))
            .occupied(2, Phase::Ready, request(3, 8).done(8))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 60 }]);
        assert_eq!(decision.decode, vec![0, 2], "decode gets what prefill left");
        assert_eq!(tokens_used(&decision), 62);
    }

    #[test]
    fn decode_waits_while_prefill_uses_the_whole_budget() {
        let view = ViewBuilder::new(3, 64)
            .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
            .occupied(2, Phase::Ready, request(2, 8).done(8))
            .waiting(request(3, 500))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 3, slot: 1 }]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 64 }]);
        assert!(decision.decode.is_empty(), "the documented trade-off: {decision:?}");
    }

    #[test]
    fn partial_leftover_decodes_in_slot_order() {
        let view = ViewBuilder::new(4, 30)
            .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1))
            .occupied(1, Phase::Prefilling, request(2, 40).done(12))
            .occupied(2, Phase::Decoding, request(3, 4).done(4).generated(1))
            .occupied(3, Phase::Ready, request(4, 4).done(4))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 28 }]);
        assert_eq!(decision.decode, vec![0, 2]);
        assert_eq!(tokens_used(&decision), 30);
    }

    #[test]
    fn admits_fifo_into_free_slots_and_prefills_in_slot_order() {
        let view = ViewBuilder::new(3, 100)
            .occupied(1, Phase::Decoding, request(1, 4).done(4).generated(1))
            .waiting(request(7, 80))
            .waiting(request(8, 80))
            .waiting(request(9, 80))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 7, slot: 0 }, Admit { request_id: 8, slot: 2 }]);
        assert_eq!(decision.prefill, vec![Prefill { slot: 0, tokens: 80 }, Prefill { slot: 2, tokens: 20 }]);
        assert!(decision.decode.is_empty());
    }

    #[test]
    fn decode_resumes_once_prompts_are_done() {
        // A long prompt stalls decode for ceil(500 / 64) steps, then both
        // slots decode every step: the stall is bounded by the prompts.
        let mut done = 0;
        let mut stalled = 0;
        while done < 500 {
            let view = ViewBuilder::new(2, 64)
                .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1))
                .occupied(1, Phase::Prefilling, request(2, 500).done(done))
                .build();
            let decision = policy().step(&view);
            if decision.decode.is_empty() {
                stalled += 1;
            }
            done += decision.prefill.iter().map(|chunk| chunk.tokens).sum::<u32>();
        }
        assert_eq!(stalled, 7, "the last chunk (52 tokens) leaves room to decode");
        let view = ViewBuilder::new(2, 64)
            .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(2))
            .occupied(1, Phase::Ready, request(2, 500).done(500))
            .build();
        assert_eq!(policy().step(&view).decode, vec![0, 1]);
    }

    #[test]
    fn with_budget_to_spare_it_schedules_like_continuous() {
        let view = ViewBuilder::new(4, 512)
            .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(5))
            .occupied(1, Phase::Prefilling, request(2, 100).done(40))
            .occupied(3, Phase::Ready, request(3, 8).done(8))
            .waiting(request(4, 30))
            .build();
        let mut continuous = continuous::Continuous::configure(&Settings::default()).expect("valid");
        assert_eq!(policy().step(&view), continuous.step(&view));
    }

    #[test]
    fn cached_prompt_tokens_are_not_granted_again_and_empty_chunks_never() {
        let mut waiting = request(5, 50);
        waiting.prompt_cached = 32;
        waiting.prompt_done = 32;
        let view =
            ViewBuilder::new(2, 512).occupied(0, Phase::Prefilling, request(1, 8).done(8)).waiting(waiting).build();
        let decision = policy().step(&view);
        assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 18 }]);
    }

    #[test]
    fn zero_budget_admits_but_grants_no_tokens() {
        let view = ViewBuilder::new(2, 0)
            .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1))
            .waiting(request(2, 4))
            .build();
        let decision = policy().step(&view);
        assert_eq!(decision.admit, vec![Admit { request_id: 2, slot: 1 }]);
        assert_eq!(tokens_used(&decision), 0);
    }

    #[test]
    fn idle_engine_gets_an_empty_decision() {
        assert_eq!(policy().step(&ViewBuilder::new(2, 512).build()), Decision::default());
    }

    #[test]
    fn settings_are_refused() {
        let settings = Settings::from_pairs([("decode_share", SettingValue::Float(0.5))]);
        let error = PrefillFirst::configure(&settings).err().expect("prefill-first takes no settings");
        assert!(error.contains("`decode_share`") && error.contains("takes no settings"), "{error}");
    }
}
