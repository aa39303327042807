//! Every embedded built-in runs through the real sandbox: it loads,
//! configures with its defaults, and its decisions pass host validation.

use super::{BUILTIN_POLICIES, builtin_policy};
use crate::{PluginHost, PluginLimits, PluginSource, WasmPolicy};
use sluice_engine::policy::{Decision, OccupiedSlot, Phase, RequestInfo, SchedulingPolicy, StepView, WaitingRequest};
use sluice_plugin_api::rules::{has_runnable_work, validate};

fn request(id: u64, prompt_tokens: u32, max_tokens: u32, adapter_group: u32) -> RequestInfo {
    RequestInfo {
        max_tokens,
        adapter_group,
        priority: (id % 3) as i32,
        arrival_ms: id * 5,
        ..sluice_plugin_api::testing::request(id, prompt_tokens)
    }
}

fn load(host: &PluginHost, name: &'static str) -> WasmPolicy {
    let (name, bytes) = builtin_policy(name).expect("a built-in");
    WasmPolicy::load(host, PluginSource::Builtin(name), bytes, Vec::new(), PluginLimits::default())
        .unwrap_or_else(|error| panic!("{name}: {error}"))
}

#[test]
fn the_table_names_each_builtin_once() {
    let names: Vec<&str> = BUILTIN_POLICIES.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["continuous", "chunked", "cohort", "prefill-first", "priority"]);
    for (name, bytes) in BUILTIN_POLICIES {
        assert!(bytes.starts_with(b"\0asm"), "{name} is not wasm");
    }
    assert!(builtin_policy("fifo").is_none());
}

#[test]
fn every_builtin_loads_with_defaults_and_decides_a_simple_view_validly() {
    let host = PluginHost::new().expect("host starts");
    let view = StepView {
        step: 1,
        now_ms: 100,
        token_budget: 64,
        costs: Default::default(),
        free_slots: vec![1, 3],
        occupied: vec![
            OccupiedSlot {
                slot: 0,
                phase: Phase::Prefilling,
                request: RequestInfo { prompt_done: 10, ..request(1, 50, 8, 0) },
            },
            OccupiedSlot { slot: 2, phase: Phase::Prefilling, request: request(2, 20, 8, 0) },
        ],
        waiting: vec![
            WaitingRequest { request: request(3, 30, 8, 0), slot_hint: None },
            WaitingRequest { request: request(4, 30, 8, 1), slot_hint: Some(3) },
        ],
        ended: Vec::new(),
    };
    for (name, _) in BUILTIN_POLICIES {
        let mut policy = load(&host, name);
        assert_eq!(policy.name(), *name);
        let decision = policy.step(&view).unwrap_or_else(|fault| panic!("{name}: {fault}"));
        validate(&view, &decision, 0).unwrap_or_else(|invalid| panic!("{name}: {invalid}: {decision:?}"));
        assert_ne!(decision, Decision::default(), "{name} granted nothing");
    }
}

/// A tiny engine: applies each validated decision the way the engine does
/// and ends requests at their token limit.
struct Sim {
    slots: u32,
    occupied: Vec<OccupiedSlot>,
    waiting: Vec<WaitingRequest>,
    step: u64,
}

impl Sim {
    fn view(&self) -> StepView {
        StepView {
            step: self.step,
            now_ms: self.step * 10,
            token_budget: 48,
            costs: Default::default(),
            free_slots: (0..self.slots).filter(|slot| self.occupied.iter().all(|busy| busy.slot != *slot)).collect(),
            occupied: self.occupied.clone(),
            waiting: self.waiting.clone(),
            ended: Vec::new(),
        }
    }

    fn apply(&mut self, decision: &Decision) {
        for admit in &decision.admit {
            let at = self.waiting.iter().position(|waiting| waiting.request.id == admit.request_id).expect("valid");
            let request = self.waiting.remove(at).request;
            self.occupied.push(OccupiedSlot { slot: admit.slot, phase: Phase::Prefilling, request });
        }
        self.occupied.sort_by_key(|slot| slot.slot);
        for busy in &mut self.occupied {
            if let Some(chunk) = decision.prefill.iter().find(|chunk| chunk.slot == busy.slot) {
                busy.request.prompt_done += chunk.tokens;
                if busy.request.prompt_remaining() == 0 {
                    busy.phase = Phase::Ready;
                }
            }
            if decision.decode.contains(&busy.slot) {
                busy.phase = Phase::Decoding;
                busy.request.generated += 1;
            }
        }
        self.occupied.retain(|busy| busy.request.generated < busy.request.max_tokens);
        self.step += 1;
    }
}

#[test]
fn every_builtin_runs_a_mixed_workload_to_completion_in_the_sandbox() {
    let host = PluginHost::new().expect("host starts");
    for (name, _) in BUILTIN_POLICIES {
        let mut policy = load(&host, name);
        let waiting = (1..=8)
            .map(|id| WaitingRequest {
                request: request(id, 10 + 17 * id as u32 % 90, 1 + id as u32 % 5, (id % 2) as u32),
                slot_hint: None,
            })
            .collect();
        let mut sim = Sim { slots: 3, occupied: Vec::new(), waiting, step: 0 };
        while has_runnable_work(&sim.view()) {
            assert!(sim.step < 500, "{name}: still busy after 500 steps");
            let view = sim.view();
            let decision = policy.step(&view).unwrap_or_else(|fault| panic!("{name}: {fault}"));
            validate(&view, &decision, 0).unwrap_or_else(|invalid| panic!("{name}: step {}: {invalid}", sim.step));
            assert_ne!(decision, Decision::default(), "{name}: granted nothing at step {}", sim.step);
            sim.apply(&decision);
        }
        assert!(sim.waiting.is_empty() && sim.occupied.is_empty(), "{name}: work left over");
    }
}
