//! Native tests. Most scenarios run the policy against [`Sim`], a tiny
//! engine that applies each decision the way the host does (validating it
//! first) and records what happened to every request, step by step.

use std::collections::BTreeMap;

use sluice_plugin_api::testing::{ViewBuilder, request, tokens_used};
use sluice_plugin_api::{EndReason, Prefill, RequestInfo, SettingValue, rules};

use super::*;

fn policy() -> Cohort {
    Cohort::configure(&Settings::default()).expect("defaults are valid")
}

fn policy_with(pairs: &[(&str, SettingValue)]) -> Cohort {
    Cohort::configure(&Settings::from_pairs(pairs.iter().cloned())).expect("settings are valid")
}

/// What happened to a request in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Admitted,
    /// The prompt finished: the slot is `ready`, its logits held.
    PromptDone,
    /// A token was sampled and emitted (streamed, or kept for the response).
    Token,
    Ended(EndReason),
}

/// A scripted engine: slots, a budget, a clock, and a log of events.
struct Sim {
    slots: u32,
    budget: u32,
    step: u64,
    now_ms: u64,
    ms_per_step: u64,
    occupied: BTreeMap<u32, (Phase, RequestInfo)>,
    waiting: Vec<RequestInfo>,
    ended: Vec<(u64, Option<u32>, EndReason)>,
    log: Vec<(u64, u64, Event)>,
    decisions: Vec<Decision>,
}

impl Sim {
    fn new(slots: u32, budget: u32) -> Self {
        Sim {
            slots,
            budget,
            step: 0,
            now_ms: 0,
            ms_per_step: 10,
            occupied: BTreeMap::new(),
            waiting: Vec::new(),
            ended: Vec::new(),
            log: Vec::new(),
            decisions: Vec::new(),
        }
    }

    fn arrive(&mut self, request: RequestInfo) -> &mut Self {
        self.waiting.push(request.arrived(self.now_ms));
        self
    }

    fn cancel(&mut self, id: u64) {
        if let Some(at) = self.waiting.iter().position(|waiting| waiting.id == id) {
            self.waiting.remove(at);
            self.ended.push((id, None, EndReason::Cancelled));
        } else if let Some(slot) = self.slot_of(id) {
            self.end(slot, EndReason::Cancelled);
        } else {
            panic!("request {id} is neither waiting nor running");
        }
    }

    fn slot_of(&self, id: u64) -> Option<u32> {
        self.occupied.iter().find(|(_, (_, request))| request.id == id).map(|(&slot, _)| slot)
    }

    fn phase_of(&self, id: u64) -> Option<Phase> {
        self.occupied.values().find(|(_, request)| request.id == id).map(|(phase, _)| *phase)
    }

    fn end(&mut self, slot: u32, reason: EndReason) {
        let (_, request) = self.occupied.remove(&slot).expect("slot is occupied");
        self.ended.push((request.id, Some(slot), reason));
        self.log.push((self.step, request.id, Event::Ended(reason)));
    }

    fn view(&self) -> StepView {
        let mut builder = ViewBuilder::new(self.slots, self.budget).at(self.step, self.now_ms);
        for (&slot, &(phase, request)) in &self.occupied {
            builder = builder.occupied(slot, phase, request);
        }
        for &request in &self.waiting {
            builder = builder.waiting(request);
        }
        for &(id, slot, reason) in &self.ended {
            builder = builder.ended(id, slot, reason);
        }
        builder.build()
    }

    /// One step: ask the policy, check the decision like the host, apply it.
    fn step(&mut self, policy: &mut Cohort) -> Decision {
        let view = self.view();
        let decision = policy.step(&view);
        if let Err(broken) = rules::validate(&view, &decision, 0) {
            panic!("step {}: invalid decision {decision:?}: {broken}\nview: {view:?}", self.step);
        }
        self.apply(&decision);
        self.decisions.push(decision.clone());
        decision
    }

    fn apply(&mut self, decision: &Decision) {
        self.ended.clear();
        for admit in &decision.admit {
            let at = self.waiting.iter().position(|waiting| waiting.id == admit.request_id).expect("validated");
            let request = self.waiting.remove(at);
            self.occupied.insert(admit.slot, (Phase::Prefilling, request));
            self.log.push((self.step, request.id, Event::Admitted));
        }
        for chunk in &decision.prefill {
            let (phase, request) = self.occupied.get_mut(&chunk.slot).expect("validated");
            request.prompt_done += chunk.tokens;
            if request.prompt_remaining() == 0 {
                *phase = Phase::Ready;
                self.log.push((self.step, request.id, Event::PromptDone));
            }
        }
        for &slot in &decision.decode {
            let (phase, request) = self.occupied.get_mut(&slot).expect("validated");
            *phase = Phase::Decoding;
            request.generated += 1;
            let (id, finished) = (request.id, request.generated >= request.max_tokens);
            self.log.push((self.step, id, Event::Token));
            if finished {
                self.end(slot, EndReason::Completed);
            }
        }
        self.step += 1;
        self.now_ms += self.ms_per_step;
    }

    /// Step until nothing is left to do (or `limit` steps).
    fn run(&mut self, policy: &mut Cohort, limit: u64) {
        let start = self.step;
        while !self.idle() {
            assert!(self.step - start < limit, "still busy after {limit} steps");
            self.step(policy);
        }
    }

    fn idle(&self) -> bool {
        self.occupied.is_empty() && self.waiting.is_empty()
    }

    fn events(&self, id: u64) -> Vec<(u64, Event)> {
        self.log.iter().filter(|(_, request, _)| *request == id).map(|&(step, _, event)| (step, event)).collect()
    }

    fn first(&self, id: u64, event: Event) -> Option<u64> {
        self.events(id).into_iter().find(|&(_, what)| what == event).map(|(step, _)| step)
    }

    fn tokens(&self, id: u64) -> Vec<u64> {
        self.events(id).into_iter().filter(|&(_, what)| what == Event::Token).map(|(step, _)| step).collect()
    }
}

// ---- (a)–(h) of the spec -------------------------------------------------

#[test]
fn a_equal_prompts_start_tg_together() {
    let mut sim = Sim::new(4, 64);
    for id in 1..=3 {
        sim.arrive(request(id, 100).max_tokens(5));
    }
    sim.run(&mut policy(), 100);
    let first_tokens: Vec<Vec<u64>> = (1..=3).map(|id| sim.tokens(id)).collect();
    assert_eq!(first_tokens[0].len(), 5);
    assert!(first_tokens.iter().all(|tokens| *tokens == first_tokens[0]), "{first_tokens:?}");
    // Every decode step of the cohort decodes every member.
    for decision in sim.decisions.iter().filter(|decision| !decision.decode.is_empty()) {
        assert_eq!(decision.decode, vec![0, 1, 2]);
        assert!(decision.prefill.is_empty());
    }
}

#[test]
fn b_early_finisher_holds_and_emits_nothing_until_the_last_prompt_is_done() {
    let mut sim = Sim::new(2, 64);
    sim.arrive(request(1, 10).max_tokens(3)).arrive(request(2, 200).max_tokens(3));
    let mut policy = policy();
    sim.step(&mut policy);
    assert_eq!(sim.phase_of(1), Some(Phase::Ready), "the short prompt is done in the first step");
    while sim.phase_of(2) == Some(Phase::Prefilling) {
        let decision = sim.step(&mut policy);
        assert!(decision.decode.is_empty(), "nothing is sampled while a member prefills: {decision:?}");
        assert_eq!(sim.phase_of(1), Some(Phase::Ready), "the early finisher holds its logits");
    }
    sim.run(&mut policy, 100);
    let long_done = sim.first(2, Event::PromptDone).expect("prompt done");
    assert_eq!(sim.tokens(1), vec![long_done + 1, long_done + 2, long_done + 3]);
    assert_eq!(sim.tokens(2), sim.tokens(1));
}

#[test]
fn c_late_compatible_arrival_joins_before_sealing_but_not_after() {
    let mut sim = Sim::new(4, 64);
    let mut policy = policy();
    sim.arrive(request(1, 200).max_tokens(2));
    sim.step(&mut policy);
    sim.arrive(request(2, 50).max_tokens(2));
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit, vec![Admit { request_id: 2, slot: 1 }], "joins before sealing");
    // Run until the first prompt is done: that seals the cohort.
    while sim.first(2, Event::PromptDone).is_none() && sim.first(1, Event::PromptDone).is_none() {
        sim.step(&mut policy);
    }
    sim.arrive(request(3, 10).max_tokens(2));
    while sim.occupied.len() == 2 {
        let decision = sim.step(&mut policy);
        assert!(decision.admit.is_empty(), "no one joins a sealed cohort: {decision:?}");
    }
    sim.run(&mut policy, 100);
    let cohort_done = sim.first(1, Event::Ended(EndReason::Completed)).expect("completed");
    assert_eq!(sim.tokens(1), sim.tokens(2), "the joiner decodes with the cohort");
    assert_eq!(sim.first(3, Event::Admitted), Some(cohort_done + 1), "the late arrival forms the next cohort");
}

#[test]
fn c_an_arrival_seen_in_the_sealing_step_joins_one_seen_after_does_not() {
    // The sealing step is the one whose prefill completes the first prompt.
    let mut sim = Sim::new(3, 64);
    let mut policy = policy();
    sim.arrive(request(1, 80).max_tokens(1));
    sim.step(&mut policy);
    sim.arrive(request(2, 30).max_tokens(1));
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit, vec![Admit { request_id: 2, slot: 1 }]);
    assert_eq!(decision.prefill, vec![Prefill { slot: 0, tokens: 16 }, Prefill { slot: 1, tokens: 30 }]);
    sim.arrive(request(3, 8).max_tokens(1));
    let decision = sim.step(&mut policy);
    assert!(decision.admit.is_empty(), "sealed: {decision:?}");
    assert_eq!(decision.decode, vec![0, 1]);
    sim.run(&mut policy, 100);
    assert!(sim.first(3, Event::Admitted) > sim.first(1, Event::Ended(EndReason::Completed)));
}

#[test]
fn d_incompatible_adapter_group_waits_for_the_next_cohort_without_blocking() {
    let mut sim = Sim::new(4, 64);
    let mut policy = policy();
    sim.arrive(request(1, 100).max_tokens(2));
    sim.arrive(request(2, 30).group(7).max_tokens(2));
    sim.arrive(request(3, 100).max_tokens(2));
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit, vec![Admit { request_id: 1, slot: 0 }, Admit { request_id: 3, slot: 1 }]);
    // An incompatible arrival during formation does not join either.
    sim.arrive(request(4, 30).group(7).max_tokens(2));
    let decision = sim.step(&mut policy);
    assert!(decision.admit.is_empty(), "{decision:?}");
    sim.run(&mut policy, 100);
    let first_cohort_done = sim.first(3, Event::Ended(EndReason::Completed)).expect("completed");
    assert_eq!(sim.first(2, Event::Admitted), Some(first_cohort_done + 1));
    assert_eq!(sim.first(4, Event::Admitted), Some(first_cohort_done + 1), "same group: same cohort");
    assert_eq!(sim.tokens(2), sim.tokens(4));
}

#[test]
fn d_the_oldest_waiting_request_leads_the_next_cohort_so_no_group_starves() {
    let mut sim = Sim::new(2, 64);
    let mut policy = policy();
    sim.arrive(request(1, 10).max_tokens(1));
    sim.arrive(request(2, 10).group(1).max_tokens(1));
    sim.arrive(request(3, 10).max_tokens(1));
    sim.arrive(request(4, 10).max_tokens(1));
    sim.run(&mut policy, 100);
    let admitted = |id| sim.first(id, Event::Admitted).expect("admitted");
    assert_eq!(admitted(1), admitted(3));
    assert!(admitted(2) > admitted(1), "request 2 leads the second cohort");
    assert!(admitted(4) > admitted(2), "group 0 does not jump ahead of the older group-1 request");
}

#[test]
fn e_member_cancelled_during_pp_releases_the_others() {
    let mut sim = Sim::new(3, 32);
    let mut policy = policy();
    sim.arrive(request(1, 10).max_tokens(2));
    sim.arrive(request(3, 12).max_tokens(2));
    sim.arrive(request(2, 500).max_tokens(2));
    sim.step(&mut policy);
    sim.step(&mut policy);
    assert_eq!(sim.phase_of(1), Some(Phase::Ready));
    assert_eq!(sim.phase_of(3), Some(Phase::Ready));
    assert_eq!(sim.phase_of(2), Some(Phase::Prefilling));
    assert!(sim.step(&mut policy).decode.is_empty(), "held while member 2 prefills");
    sim.cancel(2);
    let decision = sim.step(&mut policy);
    assert_eq!(decision.decode, vec![0, 1], "the cancelled straggler releases the others");
    sim.run(&mut policy, 100);
    assert_eq!(sim.tokens(1).len(), 2);
    assert_eq!(sim.tokens(1), sim.tokens(3));
}

#[test]
fn e_member_failing_during_pp_releases_the_others_too() {
    let mut sim = Sim::new(2, 32);
    let mut policy = policy();
    sim.arrive(request(1, 10).max_tokens(1));
    sim.arrive(request(2, 500).max_tokens(1));
    sim.step(&mut policy);
    let slot = sim.slot_of(2).expect("running");
    sim.end(slot, EndReason::Failed);
    assert_eq!(sim.step(&mut policy).decode, vec![0]);
}

#[test]
fn e_cohort_whose_members_all_terminate_before_tg_simply_ends() {
    let mut sim = Sim::new(2, 16);
    let mut policy = policy();
    sim.arrive(request(1, 10).max_tokens(1));
    sim.arrive(request(2, 100).max_tokens(1));
    sim.step(&mut policy);
    sim.step(&mut policy);
    sim.arrive(request(3, 10).max_tokens(1));
    assert!(sim.step(&mut policy).admit.is_empty(), "sealed");
    sim.cancel(1);
    sim.cancel(2);
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit, vec![Admit { request_id: 3, slot: 0 }], "the next cohort forms at once");
    assert!(decision.decode.is_empty());
    sim.run(&mut policy, 10);
    assert!(sim.tokens(1).is_empty() && sim.tokens(2).is_empty());
    assert_eq!(sim.tokens(3).len(), 1);
}

#[test]
fn f_new_pp_waits_for_the_tg_cohort_to_drain() {
    let mut sim = Sim::new(3, 64);
    let mut policy = policy();
    sim.arrive(request(1, 10).max_tokens(2));
    sim.arrive(request(2, 10).max_tokens(20));
    sim.step(&mut policy);
    sim.arrive(request(3, 10).max_tokens(1));
    // Member 1 finishes early; its slot is free but nothing is admitted
    // or prefilled until member 2 is done as well.
    while sim.slot_of(2).is_some() {
        let decision = sim.step(&mut policy);
        assert!(decision.admit.is_empty() && decision.prefill.is_empty(), "{decision:?}");
    }
    let drained = sim.first(2, Event::Ended(EndReason::Completed)).expect("completed");
    assert!(sim.first(1, Event::Ended(EndReason::Completed)) < Some(drained));
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit, vec![Admit { request_id: 3, slot: 0 }]);
    assert_eq!(sim.first(3, Event::Admitted), Some(drained + 1));
}

#[test]
fn g_phase_order_and_tokens_do_not_depend_on_how_results_are_delivered() {
    // The view carries no streaming flag: streaming and non-streaming
    // requests are scheduled identically, so the same trace gives the same
    // decisions (hence the same tokens) and every member goes through
    // admitted → prompt done (held) → tokens → ended, in that order.
    let trace = |sim: &mut Sim, policy: &mut Cohort| {
        sim.arrive(request(1, 40).max_tokens(3));
        sim.arrive(request(2, 90).max_tokens(4));
        sim.step(policy);
        sim.arrive(request(3, 20).max_tokens(2));
        sim.run(policy, 100);
    };
    let (mut streaming, mut buffered) = (Sim::new(4, 32), Sim::new(4, 32));
    trace(&mut streaming, &mut policy());
    trace(&mut buffered, &mut policy());
    assert_eq!(streaming.decisions, buffered.decisions);
    assert_eq!(streaming.log, buffered.log);
    for id in 1..=3 {
        let events: Vec<Event> = streaming.events(id).into_iter().map(|(_, event)| event).collect();
        let tokens = events.iter().filter(|event| **event == Event::Token).count();
        let mut expected = vec![Event::Admitted, Event::PromptDone];
        expected.extend(std::iter::repeat_n(Event::Token, tokens));
        expected.push(Event::Ended(EndReason::Completed));
        assert_eq!(events, expected, "request {id}");
    }
}

#[test]
fn h_cohort_of_one_behaves_like_a_plain_request() {
    let mut alone = Sim::new(4, 16);
    alone.arrive(request(1, 50).max_tokens(4));
    let mut reference = Sim::new(4, 16);
    reference.arrive(request(1, 50).max_tokens(4));
    let mut cohort = policy();
    let mut continuous = continuous::Continuous::configure(&Settings::default()).expect("valid");
    while !alone.idle() {
        let expected = continuous.step(&reference.view());
        reference.apply(&expected);
        assert_eq!(alone.step(&mut cohort), expected, "step {}", alone.step);
    }
    assert!(reference.idle());
    assert_eq!(alone.tokens(1).len(), 4);
}

// ---- settings ------------------------------------------------------------

#[test]
fn max_members_caps_formation_and_joins() {
    let mut sim = Sim::new(4, 64);
    let mut policy = policy_with(&[(MAX_MEMBERS, SettingValue::Integer(2))]);
    sim.arrive(request(1, 200).max_tokens(1));
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit.len(), 1);
    sim.arrive(request(2, 200).max_tokens(1)).arrive(request(3, 200).max_tokens(1));
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit, vec![Admit { request_id: 2, slot: 1 }], "one more fits under max_members");
    sim.run(&mut policy, 100);
    assert!(sim.first(3, Event::Admitted) > sim.first(2, Event::Ended(EndReason::Completed)));
}

#[test]
fn max_wait_releases_ready_members_and_stragglers_join_when_ready() {
    let mut sim = Sim::new(3, 20);
    let mut policy = policy_with(&[(MAX_WAIT_MS, SettingValue::Integer(35))]);
    sim.arrive(request(1, 10).max_tokens(30));
    sim.arrive(request(2, 200).max_tokens(30));
    sim.step(&mut policy); // t=0: member 1's prompt completes: sealed at 0.
    assert_eq!(sim.phase_of(1), Some(Phase::Ready));
    sim.arrive(request(3, 5).max_tokens(1));
    for _ in 0..3 {
        let decision = sim.step(&mut policy); // t=10, 20, 30: held.
        assert!(decision.decode.is_empty() && decision.admit.is_empty(), "{decision:?}");
    }
    let decision = sim.step(&mut policy); // t=40 ≥ 35: released.
    assert_eq!(decision.decode, vec![0]);
    assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 19 }], "the straggler keeps prefilling");
    while sim.phase_of(2) == Some(Phase::Prefilling) {
        let decision = sim.step(&mut policy);
        assert!(decision.admit.is_empty(), "still no admission: {decision:?}");
    }
    let decision = sim.step(&mut policy);
    assert_eq!(decision.decode, vec![0, 1], "the straggler decodes as soon as it is ready");
    sim.run(&mut policy, 200);
    assert!(sim.first(3, Event::Admitted) > sim.first(2, Event::Ended(EndReason::Completed)));
}

#[test]
fn max_wait_is_off_by_default() {
    let mut sim = Sim::new(2, 8);
    let mut policy = policy();
    sim.ms_per_step = 60_000;
    sim.arrive(request(1, 4).max_tokens(1));
    sim.arrive(request(2, 800).max_tokens(1));
    while sim.phase_of(2) == Some(Phase::Prefilling) {
        assert!(sim.step(&mut policy).decode.is_empty());
    }
}

#[test]
fn settings_are_validated_by_name() {
    let refuse = |pairs: &[(&str, SettingValue)]| {
        Cohort::configure(&Settings::from_pairs(pairs.iter().cloned())).expect_err("refused")
    };
    let error = refuse(&[(MAX_MEMBERS, SettingValue::Integer(0))]);
    assert!(error.contains("`max_members` = 0 is out of range"), "{error}");
    let error = refuse(&[(MAX_MEMBERS, SettingValue::Text("all".into()))]);
    assert!(error.contains("`max_members` must be an integer"), "{error}");
    let error = refuse(&[(MAX_WAIT_MS, SettingValue::Integer(0))]);
    assert!(error.contains("`max_wait_ms` = 0 is out of range"), "{error}");
    let error = refuse(&[(MAX_WAIT_MS, SettingValue::Float(1.5))]);
    assert!(error.contains("`max_wait_ms` must be an integer"), "{error}");
    let error = refuse(&[("max_wait", SettingValue::Integer(5))]);
    assert!(error.starts_with("unknown setting `max_wait`"), "{error}");
    assert!(error.contains("max_members, max_wait_ms"), "{error}");

    let configured = policy_with(&[(MAX_MEMBERS, SettingValue::Integer(3)), (MAX_WAIT_MS, SettingValue::Integer(250))]);
    assert_eq!((configured.max_members, configured.max_wait_ms), (3, Some(250)));
    assert_eq!((policy().max_members, policy().max_wait_ms), (u32::MAX, None));
}

// ---- budget --------------------------------------------------------------

#[test]
fn prefill_chunks_fill_the_budget_in_slot_order() {
    let view = ViewBuilder::new(4, 100)
        .occupied(2, Phase::Prefilling, request(1, 70).done(10))
        .occupied(0, Phase::Prefilling, request(2, 50).done(20))
        .waiting(request(3, 80))
        .build();
    let decision = policy().step(&view);
    assert_eq!(decision.admit, vec![Admit { request_id: 3, slot: 1 }]);
    assert_eq!(
        decision.prefill,
        vec![Prefill { slot: 0, tokens: 30 }, Prefill { slot: 1, tokens: 70 }],
        "slot 2 gets nothing this step"
    );
    assert_eq!(tokens_used(&decision), 100);
}

#[test]
fn decode_grants_stay_within_a_tiny_budget() {
    let view = ViewBuilder::new(3, 2)
        .occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1))
        .occupied(1, Phase::Ready, request(2, 4).done(4))
        .occupied(2, Phase::Decoding, request(3, 4).done(4).generated(1))
        .build();
    let decision = policy().step(&view);
    assert_eq!(decision.decode, vec![0, 1]);
    assert!(decision.prefill.is_empty());
}

#[test]
fn a_zero_budget_or_an_empty_engine_grants_nothing() {
    let view = ViewBuilder::new(2, 0).occupied(0, Phase::Prefilling, request(1, 4)).waiting(request(2, 4)).build();
    let decision = policy().step(&view);
    assert!(decision.prefill.is_empty() && decision.decode.is_empty(), "{decision:?}");
    assert_eq!(policy().step(&ViewBuilder::new(2, 64).build()), Decision::default());
}

#[test]
fn fully_prefilled_prompts_get_no_empty_chunk() {
    // A view the host should never send (prefilling with nothing left):
    // granting 0 tokens would be a fault, so nothing is granted for it.
    let view = ViewBuilder::new(2, 64)
        .occupied(0, Phase::Prefilling, request(1, 8).done(8))
        .occupied(1, Phase::Prefilling, request(2, 8).done(3))
        .build();
    assert_eq!(policy().step(&view).prefill, vec![Prefill { slot: 1, tokens: 5 }]);
}

// ---- fresh instances -----------------------------------------------------

/// Run a trace twice: once on one instance, once on a fresh instance every
/// step (as after a fault); the decisions must be the same.
fn same_decisions_on_fresh_instances(trace: impl Fn(&mut Sim, &mut dyn FnMut(&mut Sim) -> Decision)) {
    let mut kept_sim = Sim::new(4, 48);
    let mut kept = policy();
    trace(&mut kept_sim, &mut |sim| sim.step(&mut kept));
    let mut fresh_sim = Sim::new(4, 48);
    trace(&mut fresh_sim, &mut |sim| sim.step(&mut policy()));
    assert_eq!(kept_sim.decisions, fresh_sim.decisions);
    assert!(kept_sim.idle());
}

#[test]
fn fresh_instances_decide_like_a_long_lived_one() {
    same_decisions_on_fresh_instances(|sim, step| {
        sim.arrive(request(1, 30).max_tokens(3));
        sim.arrive(request(2, 100).group(1).max_tokens(3));
        sim.arrive(request(3, 120).max_tokens(6));
        step(sim);
        sim.arrive(request(4, 10).max_tokens(2));
        step(sim);
        step(sim);
        sim.arrive(request(5, 10).max_tokens(2));
        sim.cancel(3);
        for _ in 0..100 {
            if sim.idle() {
                break;
            }
            step(sim);
        }
    });
}

#[test]
fn the_seal_outlives_the_member_that_sealed() {
    // Member 1 seals the cohort and is cancelled while member 2 still
    // prefills: nothing in the view shows the seal any more, the kept
    // state does.
    let mut sim = Sim::new(3, 16);
    let mut policy = policy();
    sim.arrive(request(1, 10).max_tokens(1));
    sim.arrive(request(2, 100).max_tokens(1));
    sim.step(&mut policy);
    sim.cancel(1);
    sim.arrive(request(3, 10).max_tokens(1));
    let decision = sim.step(&mut policy);
    assert!(decision.admit.is_empty(), "{decision:?}");
    sim.run(&mut policy, 100);
    assert!(sim.first(3, Event::Admitted) > sim.first(2, Event::Ended(EndReason::Completed)));
}

#[test]
fn the_seal_holds_even_if_the_sealing_member_ends_before_any_view_shows_it_ready() {
    let mut sim = Sim::new(3, 16);
    let mut policy = policy();
    sim.arrive(request(1, 16).max_tokens(1));
    sim.arrive(request(2, 100).max_tokens(1));
    assert_eq!(sim.step(&mut policy).prefill, vec![Prefill { slot: 0, tokens: 16 }]);
    sim.cancel(1);
    sim.arrive(request(3, 10).max_tokens(1));
    assert!(sim.step(&mut policy).admit.is_empty());
}

#[test]
fn a_fresh_instance_infers_the_phase_of_a_running_cohort() {
    // Holding: a member is ready, another prefills.
    let holding = ViewBuilder::new(4, 64)
        .occupied(0, Phase::Ready, request(1, 10).done(10))
        .occupied(1, Phase::Prefilling, request(2, 100).done(30))
        .waiting(request(3, 10))
        .build();
    assert_eq!(
        policy().step(&holding),
        Decision { prefill: vec![Prefill { slot: 1, tokens: 64 }], ..Default::default() }
    );
    // TG: a member decodes, another has just become ready (max_wait
    // straggler): both decode, nothing is admitted.
    let tg = ViewBuilder::new(4, 64)
        .occupied(0, Phase::Decoding, request(1, 10).done(10).generated(4))
        .occupied(2, Phase::Ready, request(2, 100).done(100))
        .waiting(request(3, 10))
        .build();
    assert_eq!(policy().step(&tg), Decision { decode: vec![0, 2], ..Default::default() });
    // Forming: nobody has finished a prompt: compatible requests join.
    let forming = ViewBuilder::new(4, 64)
        .occupied(1, Phase::Prefilling, request(1, 100).done(30).group(2))
        .waiting(request(3, 10))
        .waiting(request(4, 10).group(2))
        .build();
    assert_eq!(
        policy().step(&forming),
        Decision {
            admit: vec![Admit { request_id: 4, slot: 0 }],
            prefill: vec![Prefill { slot: 0, tokens: 10 }, Prefill { slot: 1, tokens: 54 }],
            decode: vec![]
        }
    );
}

#[test]
fn kept_state_does_not_leak_into_the_next_cohort() {
    let mut sim = Sim::new(2, 64);
    let mut policy = policy_with(&[(MAX_WAIT_MS, SettingValue::Integer(10))]);
    sim.arrive(request(1, 8).max_tokens(1));
    sim.arrive(request(2, 300).max_tokens(1));
    sim.run(&mut policy, 100);
    // The next cohort must form, hold and release on its own account.
    sim.arrive(request(3, 8).max_tokens(2));
    sim.arrive(request(4, 100).max_tokens(2));
    sim.ms_per_step = 1;
    let decision = sim.step(&mut policy);
    assert_eq!(decision.admit.len(), 2);
    let decision = sim.step(&mut policy);
    assert!(decision.decode.is_empty(), "member 3 holds: {decision:?}");
}

// ---- randomized invariants -----------------------------------------------

/// A small deterministic generator (no dependencies).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound.max(1)
    }
}

/// Random arrivals, groups, lengths and cancellations; checks every step
/// that decisions are valid and the barrier holds, and that all work ends.
fn random_trace(seed: u64, fresh_every_step: bool, settings: &[(&str, SettingValue)]) {
    let mut rng = Lcg(seed);
    let slots = 1 + rng.below(4) as u32;
    let mut sim = Sim::new(slots, 8 + rng.below(120) as u32);
    let configure = || policy_with(settings);
    let bounded_wait = settings.iter().any(|(key, _)| *key == MAX_WAIT_MS);
    let cap = settings
        .iter()
        .find_map(|(key, value)| match value {
            SettingValue::Integer(members) if *key == MAX_MEMBERS => Some(*members as usize),
            _ => None,
        })
        .unwrap_or(usize::MAX);
    let mut kept = configure();
    let mut next_id = 1;
    for round in 0..400 {
        if round < 250 && rng.below(4) == 0 {
            let prompt = 1 + rng.below(150) as u32;
            let group = rng.below(3) as u32;
            sim.arrive(request(next_id, prompt).group(group).max_tokens(1 + rng.below(12) as u32));
            next_id += 1;
        }
        if rng.below(25) == 0 {
            let ids: Vec<u64> = sim.occupied.values().map(|(_, request)| request.id).collect();
            if let Some(&id) = ids.get(rng.below(ids.len() as u64 + 1) as usize) {
                sim.cancel(id);
            }
        }
        if sim.idle() {
            continue;
        }
        let before = sim.view();
        let decision = if fresh_every_step { sim.step(&mut configure()) } else { sim.step(&mut kept) };
        let runnable = !before.occupied.is_empty() || (!before.waiting.is_empty() && !before.free_slots.is_empty());
        assert!(!runnable || decision != Decision::default(), "stalled on {before:?}");
        let visibly_sealed = before.occupied.iter().any(decodable);
        assert!(!visibly_sealed || decision.admit.is_empty(), "admitted into a sealed cohort: {before:?}");
        let prefilling = before.occupied.iter().any(|slot| slot.phase == Phase::Prefilling);
        let decoding = before.occupied.iter().any(|slot| slot.phase == Phase::Decoding);
        let early = !decision.decode.is_empty() && prefilling && !decoding;
        assert!(!early || bounded_wait, "decoded before release: {before:?}");
        let mut groups: Vec<u32> = sim.occupied.values().map(|(_, request)| request.adapter_group).collect();
        groups.dedup();
        assert!(groups.len() <= 1, "mixed adapter groups in a cohort: {groups:?}");
        assert!(sim.occupied.len() <= cap, "more than {cap} members");
    }
    sim.run(&mut kept, 10_000);
}

#[test]
fn random_traces_keep_the_barrier_and_finish() {
    for seed in 0..200 {
        random_trace(seed, false, &[]);
    }
}

#[test]
fn random_traces_with_settings_keep_the_barrier_and_finish() {
    for seed in 0..200 {
        let settings = [
            (MAX_MEMBERS, SettingValue::Integer(1 + seed as i64 % 3)),
            (MAX_WAIT_MS, SettingValue::Integer(1 + seed as i64 % 50)),
        ];
        random_trace(seed, false, &settings);
        random_trace(seed, true, &settings);
    }
}

#[test]
fn random_traces_keep_the_barrier_on_fresh_instances() {
    for seed in 0..200 {
        random_trace(seed, true, &[]);
    }
}
