//! Cost of one policy step through the sandbox: build the view of 64
//! occupied slots and 64 waiting requests, call `continuous`, decode the
//! decision. `cargo xtask bench plugins`.

use sluice::engine::policy::{OccupiedSlot, Phase, RequestInfo, SchedulingPolicy, StepView, WaitingRequest};
use sluice::plugins::{PluginHost, PluginLimits, PluginSource, WasmPolicy, builtin_policy};

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
        free_slots: Vec::new(),
        occupied,
        waiting,
        ended: Vec::new(),
    }
}

#[divan::bench]
fn continuous_step_64_occupied_64_waiting(bencher: divan::Bencher) {
    let host = PluginHost::new().expect("host starts");
    let (name, bytes) = builtin_policy("continuous").expect("built-in");
    let mut policy = WasmPolicy::load(&host, PluginSource::Builtin(name), bytes, Vec::new(), PluginLimits::default())
        .expect("continuous loads");
    let mut step = 0;
    bencher.bench_local(|| {
        step += 1;
        let view = busy_view(step);
        let decision = policy.step(&view).expect("continuous never faults");
        assert_eq!(decision.decode.len(), 48);
        decision
    });
}
