//! Cost of one policy step through the sandbox at 64 occupied slots and 64
//! waiting requests: lower the engine's view, call `continuous` or the
//! default `chunked`, lift its decision and validate it (the view itself is built outside the timing:
//! the engine builds it whatever the policy); and what 1 or 4 shadow
//! policies add to a step (each called, validated and compared).
//! `cargo xtask bench plugins`.

use std::sync::Mutex;
use std::time::Duration;

use sluice_engine::FaultRules;
use sluice_engine::policy::{OccupiedSlot, Phase, RequestInfo, SchedulingPolicy, StepCosts, StepView, WaitingRequest};
use sluice_engine::shadow::Shadows;
use sluice_plugin_api::rules;
use sluice_plugin_host::{PluginHost, PluginLimits, PluginSource, WasmPolicy, builtin_policy};

const SLOTS: u32 = 64;
const WAITING: u64 = 64;

fn main() {
    divan::main();
}

fn request(id: u64, prompt_done: u32) -> RequestInfo {
    RequestInfo {
        id,
        prompt_tokens: 100,
        prompt_done,
        prompt_cached: 0,
        generated: 3,
        max_tokens: 128,
        adapter_group: 0,
        priority: 0,
        arrival_ms: id,
    }
}

/// The view the engine would build at a busy step: every slot taken (a
/// quarter still prefilling), as many requests queued.
fn busy_view(step: u64) -> StepView {
    let occupied = (0..SLOTS)
        .map(|slot| {
            let phase = if slot % 4 == 0 { Phase::Prefilling } else { Phase::Decoding };
            let done = if phase == Phase::Prefilling { 40 } else { 100 };
            OccupiedSlot { slot, phase, request: request(u64::from(slot), done) }
        })
        .collect();
    let waiting =
        (0..WAITING).map(|index| WaitingRequest { request: request(1000 + index, 0), slot_hint: None }).collect();
    StepView {
        step,
        now_ms: step * 10,
        token_budget: 2048,
        // What the engine measured for the default model on 2 cores.
        costs: StepCosts {
            measured_steps: 500,
            base_ns: 4_970_000,
            prefill_token_ns: 1_560_000,
            decode_row_ns: 2_080_000,
            attention_kpair_ns: 1_990_000,
        },
        free_slots: Vec::new(),
        occupied,
        waiting,
        ended: Vec::new(),
    }
}

fn builtin(host: &PluginHost, name: &str) -> WasmPolicy {
    let (name, bytes) = builtin_policy(name).expect("built-in");
    WasmPolicy::load(host, PluginSource::Builtin(name), bytes, Vec::new(), PluginLimits::default()).expect("loads")
}

#[divan::bench(args = ["continuous", "chunked"])]
fn policy_step_64_occupied_64_waiting(bencher: divan::Bencher, name: &str) {
    let host = PluginHost::new().expect("host starts");
    let mut policy = builtin(&host, name);
    let mut step = 0;
    bencher
        .with_inputs(|| {
            step += 1;
            busy_view(step)
        })
        .bench_local_refs(|view| {
            let decision = policy.step(view).expect("built-ins never fault");
            rules::validate(view, &decision, 0).expect("built-ins decide validly");
            assert_eq!(decision.decode.len(), 48);
            decision
        });
}

/// The shadows' share of a step at 64 + 64: `n` candidates (of
/// `continuous`, `cohort`, `prefill-first`, `priority`) shown the view the
/// active `continuous` decided, with a budget that never skips one.
#[divan::bench(args = [1, 4])]
fn shadows_per_step_64_occupied_64_waiting(bencher: divan::Bencher, n: usize) {
    let host = PluginHost::new().expect("host starts");
    let mut active = builtin(&host, "continuous");
    let mut shadows = Shadows::new(Duration::from_secs(1), FaultRules::default());
    let records = Mutex::new(Vec::new());
    for name in ["continuous", "cohort", "prefill-first", "priority"].into_iter().take(n) {
        shadows.attach(Box::new(builtin(&host, name)), &records).expect("attached");
    }
    let mut step = 0;
    bencher
        .with_inputs(|| {
            step += 1;
            let view = busy_view(step);
            let decision = active.step(&view).expect("continuous never faults");
            (view, decision)
        })
        .bench_local_refs(|(view, decision)| shadows.observe(view, decision, &records));
    let records = records.into_inner().expect("records");
    assert!(records.iter().all(|record| record.quarantined.is_none() && record.skipped == 0), "{records:?}");
}
