//! Hostile plugins against the wasmtime host. Each plugin is a core module
//! written in WAT against the canonical ABI of `plugin-api/wit`, turned into
//! a component here with `wit-component`, so each misbehaviour is exact.
//!
//! Every runtime case asserts the exact fault kind and that the next call
//! works on a fresh instance.

use sluice_engine::policy::{Decision, StepView};
use sluice_plugin_host::{LoadError, PluginFault, PluginHost, PluginLimits, PluginSource, WasmFixup, WasmPolicy};

use sluice_tests::plugin_fixtures::{
    BENIGN, FIXUP_WIT, OK, SCHEDULER_WIT, componentize, fixup_module, policy_module, version,
};

fn scheduler(hostile: &str) -> Vec<u8> {
    componentize(&policy_module(version(), hostile, OK, ""), SCHEDULER_WIT, "scheduler")
}

fn limits() -> PluginLimits {
    PluginLimits { fuel: 2_000_000, deadline_ms: 20_000, memory_mb: 4 }
}

fn load(host: &PluginHost, bytes: &[u8], limits: PluginLimits) -> Result<WasmPolicy, LoadError> {
    WasmPolicy::load(host, PluginSource::Path("hostile.wasm".into()), bytes, Vec::new(), limits)
}

fn view(step: u64) -> StepView {
    StepView {
        step,
        now_ms: 0,
        token_budget: 512,
        costs: Default::default(),
        free_slots: vec![0, 1],
        occupied: Vec::new(),
        waiting: Vec::new(),
        ended: Vec::new(),
    }
}

fn calls_seen(decision: Decision) -> Vec<u32> {
    assert!(decision.admit.is_empty() && decision.prefill.is_empty());
    decision.decode
}

/// Step 0 works, step 1 faults with the expected fault, step 2 works again
/// on a fresh instance (its call counter restarted).
fn assert_faults_then_recovers(hostile: &str, limits: PluginLimits, expected: PluginFault) {
    let host = PluginHost::new().expect("host starts");
    let mut policy = load(&host, &scheduler(hostile), limits).expect("fixture loads");
    assert_eq!(policy.decide(&view(0)).map(calls_seen), Ok(vec![1]));
    assert_eq!(policy.decide(&view(1)), Err(expected));
    assert_eq!(policy.decide(&view(2)).map(calls_seen), Ok(vec![1]), "fresh instance after the fault");
    assert_eq!(policy.decide(&view(3)).map(calls_seen), Ok(vec![2]), "the fresh instance keeps its state");
}

#[test]
fn a_benign_fixture_counts_its_calls() {
    let host = PluginHost::new().expect("host starts");
    let mut policy = load(&host, &scheduler(BENIGN), limits()).expect("fixture loads");
    let seen: Vec<_> = (0..3).map(|step| policy.decide(&view(step * 2)).map(calls_seen)).collect();
    assert_eq!(seen, vec![Ok(vec![1]), Ok(vec![2]), Ok(vec![3])]);
}

#[test]
fn an_infinite_loop_runs_out_of_fuel() {
    let limits = limits();
    assert_faults_then_recovers("(loop $spin (br $spin))", limits, PluginFault::Fuel(limits.fuel));
}

#[test]
fn an_infinite_loop_with_ample_fuel_hits_the_deadline() {
    let limits = PluginLimits { fuel: u64::MAX / 2, deadline_ms: 30, ..limits() };
    assert_faults_then_recovers("(loop $spin (br $spin))", limits, PluginFault::Deadline(30));
}

#[test]
fn a_memory_bomb_hits_the_memory_cap() {
    let limits = limits();
    let bomb = "(loop $grow (drop (memory.grow (i32.const 16))) (br $grow))";
    assert_faults_then_recovers(bomb, limits, PluginFault::Memory(limits.memory_mb));
}

#[test]
fn unreachable_is_a_trap() {
    let expected = PluginFault::Trap("wasm trap: wasm `unreachable` instruction executed".into());
    assert_faults_then_recovers("(unreachable)", limits(), expected);
}

#[test]
fn a_decision_pointing_out_of_bounds_is_malformed() {
    let out_of_bounds = "(i32.store (i32.const 64) (i32.const 0xfffff000)) (i32.store (i32.const 68) (i32.const 4096))
        (i64.store (i32.const 72) (i64.const 0)) (i64.store (i32.const 80) (i64.const 0)) (return (i32.const 64))";
    let host = PluginHost::new().expect("host starts");
    let mut policy = load(&host, &scheduler(out_of_bounds), limits()).expect("fixture loads");
    assert_eq!(policy.decide(&view(0)).map(calls_seen), Ok(vec![1]));
    match policy.decide(&view(1)) {
        Err(PluginFault::Malformed(message)) => assert!(message.contains("out of bounds"), "{message}"),
        other => panic!("expected a malformed-result fault, got {other:?}"),
    }
    assert_eq!(policy.decide(&view(2)).map(calls_seen), Ok(vec![1]));
}

#[test]
fn a_result_pointer_outside_memory_is_malformed() {
    let host = PluginHost::new().expect("host starts");
    let mut policy = load(&host, &scheduler("(return (i32.const 0x7ffffff0))"), limits()).expect("fixture loads");
    assert!(matches!(policy.decide(&view(1)), Err(PluginFault::Malformed(_))));
    assert_eq!(policy.decide(&view(2)).map(calls_seen), Ok(vec![1]));
}

#[test]
fn configure_rejecting_its_settings_refuses_the_policy() {
    // result<_, string>: discriminant 1 at 512, the error string at 256.
    let reject = "(i32.store (i32.const 512) (i32.const 1)) (i32.store (i32.const 516) (i32.const 256))
        (i32.store (i32.const 520) (i32.const 32)) (i32.const 512)";
    let bytes = componentize(&policy_module(version(), BENIGN, reject, ""), SCHEDULER_WIT, "scheduler");
    let host = PluginHost::new().expect("host starts");
    let error = load(&host, &bytes, limits()).err().expect("refused");
    assert!(matches!(error, LoadError::Configure { .. }), "{error:?}");
    assert_eq!(error.to_string(), "hostile.wasm: settings refused: `max_members` must be at least 1");
}

#[test]
fn configure_trapping_refuses_the_policy_with_the_fault() {
    let bytes = componentize(&policy_module(version(), BENIGN, "(unreachable)", ""), SCHEDULER_WIT, "scheduler");
    let host = PluginHost::new().expect("host starts");
    let error = load(&host, &bytes, limits()).err().expect("refused");
    assert!(matches!(error, LoadError::Instantiate { fault: PluginFault::Trap(_), .. }), "{error:?}");
}

#[test]
fn a_draft_fixup_component_is_not_a_scheduler() {
    let fixup = componentize(&fixup_module(OK), FIXUP_WIT, "draft-fixup");
    let host = PluginHost::new().expect("host starts");
    let error = load(&host, &fixup, limits()).err().expect("refused");
    assert_eq!(error.to_string(), "hostile.wasm: is a `draft-fixup` plugin, expected a `scheduler` plugin");
}

#[test]
fn the_right_world_at_another_version_is_refused() {
    // A plugin built for the previous version of the interface.
    let wit = SCHEDULER_WIT.replace(&format!("sluice:plugin@{}", version()), "sluice:plugin@0.1.0");
    let bytes = componentize(&policy_module("0.1.0", BENIGN, OK, ""), &wit, "scheduler");
    let host = PluginHost::new().expect("host starts");
    let error = load(&host, &bytes, limits()).err().expect("refused");
    assert_eq!(
        error.to_string(),
        "hostile.wasm: built for sluice:plugin@0.1.0, but this host implements sluice:plugin@0.3.0"
    );
}

#[test]
fn the_right_names_with_other_types_are_refused() {
    let wit = SCHEDULER_WIT.replace("        decode: list<u32>,\n", "");
    let module = policy_module(version(), BENIGN, OK, "");
    let bytes = componentize(&module, &wit, "scheduler");
    let host = PluginHost::new().expect("host starts");
    let error = load(&host, &bytes, limits()).err().expect("refused");
    assert!(matches!(error, LoadError::Mismatch { .. }), "{error:?}");
    assert!(error.to_string().contains("`sluice:plugin/policy@0.3.0` does not match the host's interface"), "{error}");
}

#[test]
fn a_plugin_that_imports_a_function_is_refused() {
    let wit = SCHEDULER_WIT.replace("world scheduler {", "world scheduler {\n    import log: func(message: string);");
    let import = r#"(import "$root" "log" (func $log (param i32 i32)))"#;
    let module = policy_module(version(), "(call $log (i32.const 256) (i32.const 4))", OK, import);
    let bytes = componentize(&module, &wit, "scheduler");
    let host = PluginHost::new().expect("host starts");
    let error = load(&host, &bytes, limits()).err().expect("refused");
    assert!(matches!(error, LoadError::Imports { .. }), "{error:?}");
    assert!(error.to_string().contains("imports `log` (function); plugins may import nothing"), "{error}");
}

#[test]
fn not_wasm_and_core_modules_are_refused() {
    let host = PluginHost::new().expect("host starts");
    let text = load(&host, b"not wasm at all", limits()).err().expect("refused");
    assert!(matches!(text, LoadError::NotWasm { .. }), "{text:?}");
    let core = wat::parse_str(policy_module(version(), BENIGN, OK, "")).expect("parses");
    let core = load(&host, &core, limits()).err().expect("refused");
    assert!(matches!(core, LoadError::CoreModule { .. }), "{core:?}");
    let truncated = scheduler(BENIGN);
    // One byte short: the last section ends early. (A cut at a section
    // boundary would leave a valid, smaller component.)
    let truncated = load(&host, &truncated[..truncated.len() - 1], limits()).err().expect("refused");
    assert!(matches!(truncated, LoadError::Compile { .. }), "{truncated:?}");
}

#[test]
fn fixups_return_edits_refusals_and_faults() {
    use sluice_plugin_host::FixupError;
    use sluice_plugin_host::fixup_types::ModelInfo;
    let host = PluginHost::new().expect("host starts");
    let model = |architecture: &str| ModelInfo { architecture: architecture.into(), metadata: vec![], tensors: vec![] };
    let fixup = |body: &str| {
        let bytes = componentize(&fixup_module(body), FIXUP_WIT, "draft-fixup");
        WasmFixup::load(&host, PluginSource::Path("fixup.wasm".into()), &bytes, limits()).expect("fixup loads")
    };
    assert_eq!(fixup(OK).run(&model("qwen3vl"), &model("dflash")), Ok(vec![]));

    let refuse = "(i32.store (i32.const 512) (i32.const 1)) (i32.store (i32.const 516) (i32.const 256))
        (i32.store (i32.const 520) (i32.const 17)) (i32.const 512)";
    assert_eq!(
        fixup(refuse).run(&model("qwen3vl"), &model("dflash")),
        Err(FixupError::Refused { plugin: "fixup.wasm".into(), message: "draft has no rope".into() })
    );
    let trap = fixup("(unreachable)").run(&model("qwen3vl"), &model("dflash"));
    assert!(matches!(trap, Err(FixupError::Fault { fault: PluginFault::Trap(_), .. })), "{trap:?}");

    let as_fixup = WasmFixup::load(&host, PluginSource::Path("policy.wasm".into()), &scheduler(BENIGN), limits());
    let error = as_fixup.err().expect("a scheduler is not a fixup");
    assert_eq!(error.to_string(), "policy.wasm: is a `scheduler` plugin, expected a `draft-fixup` plugin");
}
