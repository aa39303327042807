//! The discrete-event simulator: the real policy (a loaded `.wasm`
//! component) schedules a workload on a model of the engine whose step
//! times come from a [`CostModel`] calibrated on the real backend.
//!
//! It mirrors the engine's step: the same view, the engine's own policy
//! supervisor (validation, retry on a fresh instance, quarantine, fail
//! closed or fall back, stall detection), a decode grant emits its token
//! when the step starts, a prefill that finishes a prompt leaves the slot
//! `ready` with its logits held. Time only advances by modelled step costs,
//! so a run is a pure function of the workload, the policy and the cost
//! model.

use std::collections::VecDeque;

use serde::Serialize;

use sluice_plugin_api::rules::has_runnable_work;

use super::stats::RequestRecord;
use super::workload::TraceRequest;
use sluice_engine::policy::{
    Decision, EndReason, EndedRequest, OccupiedSlot, Phase, RequestInfo, StepView, WaitingRequest,
};
use sluice_engine::step_cost::CostFit;
pub use sluice_engine::step_cost::{CostModel, StepWork};
use sluice_engine::supervisor::{FaultAction, FaultEvent, Observer, Supervisor, Verdict};

/// The engine being simulated (the policy's fault rules are the
/// supervisor's).
#[derive(Clone, Copy, Debug)]
pub struct EngineShape {
    pub slots: usize,
    pub token_budget: u32,
}

/// One stretch of a slot in one phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseSpan {
    pub slot: usize,
    pub request: usize,
    pub phase: &'static str,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// A simulated run.
#[derive(Clone, Debug, Serialize)]
pub struct SimRun {
    pub records: Vec<RequestRecord>,
    pub steps: u64,
    /// FNV-1a over every decision in order: equal runs have equal hashes.
    pub decision_hash: String,
    pub timeline: Vec<PhaseSpan>,
    /// (time, requests waiting) after each step.
    pub queue: Vec<(f64, usize)>,
    /// The fault that quarantined the policy, if one did.
    pub fault: Option<String>,
    /// Every fault and what the supervisor did about it, in order.
    #[serde(skip)]
    pub faults: Vec<FaultEvent>,
}

struct SimSlot {
    request: usize,
    phase: Phase,
    prompt_done: u32,
    generated: u32,
    phase_since: f64,
}

impl SimSlot {
    /// The stretch of the current phase, ending at `at`.
    fn span(&self, slot: usize, at: f64) -> PhaseSpan {
        PhaseSpan { slot, request: self.request, phase: phase_name(self.phase), start_ms: self.phase_since, end_ms: at }
    }
}

struct Simulator<'a> {
    trace: &'a [TraceRequest],
    adapter_groups: Vec<u32>,
    shape: EngineShape,
    cost: CostModel,
    /// What the policy sees of the costs: fitted to the simulated steps as
    /// the engine fits its own.
    measured: CostFit,
    now: f64,
    step: u64,
    next_arrival: usize,
    waiting: VecDeque<usize>,
    slots: Vec<Option<SimSlot>>,
    ended: Vec<EndedRequest>,
    records: Vec<RequestRecord>,
    timeline: Vec<PhaseSpan>,
    queue: Vec<(f64, usize)>,
    hash: DecisionHash,
}

/// Runs `trace` under the policy `supervisor` runs until every request has
/// ended (or the policy failed closed).
pub fn simulate(supervisor: &mut Supervisor, trace: &[TraceRequest], shape: EngineShape, cost: CostModel) -> SimRun {
    let mut sim = Simulator {
        trace,
        adapter_groups: adapter_groups(trace),
        shape,
        cost,
        measured: CostFit::online(),
        now: 0.0,
        step: 0,
        next_arrival: 0,
        waiting: VecDeque::new(),
        slots: (0..shape.slots).map(|_| None).collect(),
        ended: Vec::new(),
        records: trace
            .iter()
            .map(|request| RequestRecord {
                arrival_ms: request.arrival_ms,
                prompt_tokens: request.prompt_tokens,
                ..RequestRecord::default()
            })
            .collect(),
        timeline: Vec::new(),
        queue: Vec::new(),
        hash: DecisionHash::default(),
    };
    let mut journal = Journal::default();
    sim.run(supervisor, &mut journal);
    let fault = journal
        .0
        .iter()
        .find(|event| event.action != FaultAction::Retry)
        .map(|event| format!("step {}: {}: {}", event.step, event.reason, event.detail));
    SimRun {
        records: sim.records,
        steps: sim.step,
        decision_hash: sim.hash.hex(),
        timeline: sim.timeline,
        queue: sim.queue,
        fault,
        faults: journal.0,
    }
}

/// What a run reports of the fault that quarantined its policy.
fn quarantine_message(event: &FaultEvent) -> String {
    format!("step {}: {}", event.step, event.detail)
}

/// The simulator hears only about faults.
#[derive(Default)]
struct Journal(Vec<FaultEvent>);

impl Observer for Journal {
    fn fault(&mut self, event: &FaultEvent) {
        self.0.push(event.clone());
    }
}

/// FNV-1a over a run's decisions, each with its step: equal runs have equal
/// hashes (the simulator's and `sluice lab replay`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionHash(u64);

impl Default for DecisionHash {
    fn default() -> Self {
        DecisionHash(0xcbf2_9ce4_8422_2325)
    }
}

impl DecisionHash {
    fn fnv(&mut self, value: u64) {
        for byte in value.to_le_bytes() {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn add(&mut self, step: u64, decision: &Decision) {
        self.fnv(step);
        for admit in &decision.admit {
            self.fnv(admit.request_id);
            self.fnv(u64::from(admit.slot));
        }
        self.fnv(u64::MAX);
        for prefill in &decision.prefill {
            self.fnv(u64::from(prefill.slot));
            self.fnv(u64::from(prefill.tokens));
        }
        self.fnv(u64::MAX);
        for &slot in &decision.decode {
            self.fnv(u64::from(slot));
        }
    }

    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// Time that passes on a step that grants nothing: the engine sleeps 1 ms
/// so that a policy waiting on the clock does not spin.
const IDLE_STEP_MS: f64 = 1.0;

impl Simulator<'_> {
    fn run(&mut self, supervisor: &mut Supervisor, journal: &mut Journal) {
        loop {
            self.arrive();
            let view = self.view();
            if !has_runnable_work(&view) {
                match self.trace.get(self.next_arrival) {
                    Some(next) => {
                        self.now = self.now.max(next.arrival_ms);
                        continue;
                    }
                    None => return,
                }
            }
            let verdict = supervisor.decide(&view, journal);
            if verdict == Verdict::Closed {
                let message = journal.0.last().map(quarantine_message).unwrap_or_default();
                self.fail_everything(&message);
                return;
            }
            self.ended.clear();
            self.step += 1;
            match verdict {
                Verdict::Run(decision) => {
                    self.hash_decision(&decision);
                    self.apply(&decision);
                    self.queue.push((self.now, self.waiting.len()));
                }
                Verdict::Wait => {
                    self.hash_decision(&Decision::default());
                    self.now += IDLE_STEP_MS;
                }
                // `Closed` was handled above.
                Verdict::Stalled | Verdict::Closed => self.hash_decision(&Decision::default()),
            }
        }
    }

    fn arrive(&mut self) {
        while let Some(request) = self.trace.get(self.next_arrival)
            && request.arrival_ms <= self.now
        {
            self.waiting.push_back(self.next_arrival);
            self.next_arrival += 1;
        }
    }

    fn info(&self, index: usize, prompt_done: u32, generated: u32) -> RequestInfo {
        let request = &self.trace[index];
        RequestInfo {
            id: index as u64,
            prompt_tokens: request.prompt_tokens,
            prompt_done,
            prompt_cached: 0,
            generated,
            max_tokens: request.max_tokens,
            adapter_group: self.adapter_groups[index],
            priority: request.priority,
            arrival_ms: request.arrival_ms as u64,
        }
    }

    fn view(&self) -> StepView {
        let mut free_slots = Vec::new();
        let mut occupied = Vec::new();
        for (slot, state) in self.slots.iter().enumerate() {
            match state {
                Some(state) => occupied.push(OccupiedSlot {
                    slot: slot as u32,
                    phase: state.phase,
                    request: self.info(state.request, state.prompt_done, state.generated),
                }),
                None => free_slots.push(slot as u32),
            }
        }
        StepView {
            step: self.step,
            now_ms: self.now as u64,
            token_budget: self.shape.token_budget,
            costs: self.measured.costs(),
            free_slots,
            occupied,
            waiting: self
                .waiting
                .iter()
                .map(|&index| WaitingRequest { request: self.info(index, 0, 0), slot_hint: None })
                .collect(),
            ended: self.ended.clone(),
        }
    }

    fn hash_decision(&mut self, decision: &Decision) {
        self.hash.add(self.step, decision);
    }

    fn set_phase(&mut self, slot: usize, phase: Phase, at: f64) {
        if let Some(state) = self.slots[slot].as_mut() {
            if state.phase == phase {
                return;
            }
            self.timeline.push(state.span(slot, at));
            state.phase = phase;
            state.phase_since = at;
        }
    }

    fn end(&mut self, slot: usize, reason: EndReason, at: f64) {
        if let Some(state) = self.slots[slot].take() {
            self.timeline.push(state.span(slot, at));
            self.records[state.request].end_ms = at;
            self.ended.push(EndedRequest { request_id: state.request as u64, slot: Some(slot as u32), reason });
        }
    }

    fn apply(&mut self, decision: &Decision) {
        let start = self.now;
        for admit in &decision.admit {
            let index = admit.request_id as usize;
            self.waiting.retain(|&waiting| waiting != index);
            self.slots[admit.slot as usize] = Some(SimSlot {
                request: index,
                phase: Phase::Prefilling,
                prompt_done: 0,
                generated: 0,
                phase_since: start,
            });
        }
        let mut work = StepWork::default();
        let mut finished_prompts = Vec::new();
        for prefill in &decision.prefill {
            let slot = prefill.slot as usize;
            let Some(state) = self.slots[slot].as_mut() else { continue };
            work.add_rows(u64::from(state.prompt_done), prefill.tokens, false);
            state.prompt_done += prefill.tokens;
            if state.prompt_done >= self.trace[state.request].prompt_tokens {
                finished_prompts.push(slot);
            }
        }
        for &slot in &decision.decode {
            let slot = slot as usize;
            let Some(state) = self.slots[slot].as_mut() else { continue };
            // The token is sampled from held logits and emitted as the step starts.
            self.records[state.request].token_ms.push(start);
            state.generated += 1;
            let context = u64::from(state.prompt_done + state.generated - 1);
            if state.generated >= self.trace[state.request].max_tokens {
                self.end(slot, EndReason::Completed, start);
            } else {
                work.add_rows(context, 1, true);
                self.set_phase(slot, Phase::Decoding, start);
            }
        }
        let ms = self.cost.step_ms(&work);
        self.measured.add(&work, ms);
        self.now += ms;
        for slot in finished_prompts {
            self.set_phase(slot, Phase::Ready, self.now);
        }
    }

    fn fail_everything(&mut self, message: &str) {
        for slot in 0..self.slots.len() {
            if let Some(state) = &self.slots[slot] {
                self.records[state.request].error = Some(message.to_owned());
            }
            self.end(slot, EndReason::Failed, self.now);
        }
        for index in self.waiting.drain(..).chain(self.next_arrival..self.trace.len()) {
            self.records[index].error = Some(message.to_owned());
            self.records[index].end_ms = self.now.max(self.trace[index].arrival_ms);
        }
        self.next_arrival = self.trace.len();
    }
}

/// Requests with the same adapter name share a group; no adapter is group 0,
/// the others are numbered in order of first appearance.
fn adapter_groups(trace: &[TraceRequest]) -> Vec<u32> {
    let mut names: Vec<&str> = Vec::new();
    trace
        .iter()
        .map(|request| match request.adapter.as_deref() {
            None => 0,
            Some(name) => match names.iter().position(|&other| other == name) {
                Some(position) => position as u32 + 1,
                None => {
                    names.push(name);
                    names.len() as u32
                }
            },
        })
        .collect()
}

pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Prefilling => "prefilling",
        Phase::Ready => "ready",
        Phase::Decoding => "decoding",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::supervisor::{FaultRules, OnFault};
    use sluice_plugin_host::{PluginHost, PluginLimits, PluginSource, WasmPolicy, builtin_policy};

    fn continuous() -> Supervisor {
        let host = PluginHost::new().expect("host");
        let (_, bytes) = builtin_policy("continuous").expect("built in");
        let policy =
            WasmPolicy::load(&host, PluginSource::Builtin("continuous"), bytes, Vec::new(), PluginLimits::default())
                .expect("loads");
        let rules = FaultRules { on_fault: OnFault::FailClosed, stall_steps: 8 };
        Supervisor::new(Box::new(policy), Box::new(|| None), rules)
    }

    const COST: CostModel =
        CostModel { base_ms: 2.0, prefill_token_ms: 0.1, decode_token_ms: 1.0, attention_kpair_ms: 0.0 };
    const SHAPE: EngineShape = EngineShape { slots: 2, token_budget: 64 };

    fn request(arrival_ms: f64, prompt_tokens: u32, max_tokens: u32) -> TraceRequest {
        TraceRequest { arrival_ms, prompt_tokens, max_tokens, adapter: None, priority: 0, prompt: None }
    }

    #[test]
    fn one_request_follows_the_engine_step_by_step() {
        let run = simulate(&mut continuous(), &[request(5.0, 100, 3)], SHAPE, COST);
        assert_eq!(run.fault, None);
        // Prefill 64 (2 + 6.4 ms), prefill 36 (2 + 3.6 ms), then three decode
        // grants: each token is emitted as its step starts; the last one
        // ends the request without another forward pass.
        let record = &run.records[0];
        assert_eq!(record.token_ms, vec![19.0, 22.0, 25.0]);
        assert_eq!(record.end_ms, 25.0);
        assert_eq!(run.steps, 5);
        let phases: Vec<(&str, f64, f64)> =
            run.timeline.iter().map(|span| (span.phase, span.start_ms, span.end_ms)).collect();
        assert_eq!(phases, vec![("prefilling", 5.0, 19.0), ("ready", 19.0, 19.0), ("decoding", 19.0, 25.0)]);
    }

    #[test]
    fn runs_are_deterministic_and_hash_their_decisions() {
        let trace: Vec<TraceRequest> =
            (0..6).map(|i| request(f64::from(i) * 3.0, 20 + 10 * i as u32, 4 + i as u32)).collect();
        let first = simulate(&mut continuous(), &trace, SHAPE, COST);
        let second = simulate(&mut continuous(), &trace, SHAPE, COST);
        assert_eq!(first.decision_hash, second.decision_hash);
        assert_eq!(first.records, second.records);
        assert!(first.records.iter().all(|record| record.error.is_none()));
        for (record, request) in first.records.iter().zip(&trace) {
            assert_eq!(record.output_tokens(), request.max_tokens as usize);
        }
        let shorter = simulate(&mut continuous(), &trace[..5], SHAPE, COST);
        assert_ne!(first.decision_hash, shorter.decision_hash);
    }

    #[test]
    fn attention_pairs_count_every_query_key_pair() {
        let mut work = StepWork::default();
        work.add_rows(0, 3, false); // rows see 1, 2, 3 cells
        work.add_rows(10, 1, true); // one row sees 11 cells
        assert_eq!((work.prefill_tokens, work.decode_tokens, work.attention_pairs), (3, 1, 17));
    }

    #[test]
    fn adapter_groups_number_names_by_first_appearance() {
        let mut trace = vec![request(0.0, 1, 1); 4];
        trace[1].adapter = Some("b".into());
        trace[2].adapter = Some("a".into());
        trace[3].adapter = Some("b".into());
        assert_eq!(adapter_groups(&trace), vec![0, 1, 2, 1]);
    }
}
