//! The embedded built-in policies run through the real host.

use sluice_engine::policy::{
    Admit, Decision, OccupiedSlot, Phase, Prefill, RequestInfo, SchedulingPolicy, StepCosts, StepView, WaitingRequest,
};
use sluice_plugin_host::policy_types::{Setting, SettingValue};
use sluice_plugin_host::{LoadError, PluginHost, PluginLimits, PluginSource, WasmPolicy, builtin_policy};

fn request(id: u64, prompt_tokens: u32, prompt_done: u32) -> RequestInfo {
    RequestInfo { max_tokens: 16, ..sluice_plugin_api::testing::request(id, prompt_tokens).done(prompt_done) }
}

fn load(name: &'static str, settings: Vec<Setting>) -> Result<WasmPolicy, LoadError> {
    let host = PluginHost::new().expect("host starts");
    let (name, bytes) = builtin_policy(name).expect("built-in exists");
    WasmPolicy::load(&host, PluginSource::Builtin(name), bytes, settings, PluginLimits::default())
}

#[test]
fn continuous_decides_through_the_sandbox_as_it_does_natively() {
    let mut policy = load("continuous", Vec::new()).expect("loads");
    let view = StepView {
        step: 3,
        now_ms: 1000,
        token_budget: 100,
        costs: Default::default(),
        free_slots: vec![0, 2],
        occupied: vec![
            OccupiedSlot { slot: 1, phase: Phase::Decoding, request: request(1, 4, 4) },
            OccupiedSlot { slot: 3, phase: Phase::Prefilling, request: request(2, 50, 20) },
        ],
        waiting: vec![
            WaitingRequest { request: request(7, 80, 0), slot_hint: None },
            WaitingRequest { request: request(8, 80, 0), slot_hint: Some(2) },
            WaitingRequest { request: request(9, 80, 0), slot_hint: None },
        ],
        ended: Vec::new(),
    };
    let expected = Decision {
        admit: vec![Admit { request_id: 7, slot: 0 }, Admit { request_id: 8, slot: 2 }],
        prefill: vec![Prefill { slot: 0, tokens: 80 }, Prefill { slot: 2, tokens: 19 }],
        decode: vec![1],
    };
    assert_eq!(policy.step(&view), Ok(expected.clone()));
    // Deterministic: the same view gives the same decision, also after a reset.
    policy.reset();
    assert_eq!(policy.step(&view), Ok(expected));
}

#[test]
fn continuous_refuses_settings_by_name() {
    let settings = vec![Setting { key: "max_members".into(), value: SettingValue::Integer(3) }];
    let error = load("continuous", settings).err().expect("refused");
    assert_eq!(
        error.to_string(),
        "built-in plugin `continuous`: settings refused: unknown setting `max_members`: this policy takes no settings"
    );
}

#[test]
fn chunked_sizes_its_chunks_from_the_costs_the_host_measured() {
    let settings = vec![Setting { key: "max_stretch".into(), value: SettingValue::Integer(1000) }];
    let mut policy = load("chunked", settings).expect("loads");
    let view = |costs| StepView {
        step: 7,
        now_ms: 70,
        token_budget: 4096,
        costs,
        free_slots: Vec::new(),
        occupied: vec![
            OccupiedSlot { slot: 0, phase: Phase::Decoding, request: request(1, 10, 10) },
            OccupiedSlot { slot: 1, phase: Phase::Prefilling, request: request(2, 4000, 0) },
        ],
        waiting: Vec::new(),
        ended: Vec::new(),
    };
    // 1 ms the decode row, 2 ms a prefill token: (100 - 1) / 2 tokens fit
    // the default 100 ms target.
    let measured = StepCosts {
        measured_steps: 12,
        base_ns: 0,
        prefill_token_ns: 2_000_000,
        decode_row_ns: 1_000_000,
        attention_kpair_ns: 0,
    };
    let decision = policy.step(&view(measured)).expect("decides");
    assert_eq!(decision.decode, vec![0]);
    assert_eq!(decision.prefill, vec![Prefill { slot: 1, tokens: 49 }]);
    // Twice as fast a machine: twice the chunk, less the decode's share.
    let faster = StepCosts { prefill_token_ns: 1_000_000, ..measured };
    assert_eq!(policy.step(&view(faster)).expect("decides").prefill, vec![Prefill { slot: 1, tokens: 99 }]);
}
