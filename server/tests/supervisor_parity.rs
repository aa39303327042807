//! One supervisor for the engine and the lab: the same faulty policy
//! (`plugins/dist/chaos.wasm`, every fault it knows) run through the lab's
//! simulator and through the live engine gives the same fault decisions —
//! the same steps, reasons and actions, under `fail-closed` and `fallback`.

use std::path::PathBuf;
use std::sync::Arc;

use sluice::config::PolicyConfig;
use sluice::lab::sim::{CostModel, EngineShape, simulate};
use sluice::lab::workload::TraceRequest;
use sluice::startup::{fallback, fault_rules, load_policy};
use sluice_engine::request::{Event, GenerationRequest};
use sluice_engine::sampling::SamplingParams;
use sluice_engine::supervisor::Supervisor;
use sluice_engine::{EngineConfig, EngineHandle, FaultAction, FaultEvent, OnFault};
use sluice_kernels::backend::CpuBackend;
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_model::{Model, Transformer};
use sluice_plugin_host::PluginHost;
use sluice_tests::gguf_writer::TinyModel;

const FAULTS: [&str; 8] =
    ["trap", "loop", "memory", "stall", "admit-missing", "decode-not-ready", "prefill-not-prefilling", "over-budget"];
const SLOTS: usize = 2;
const BUDGET: usize = 32;
const REQUESTS: usize = 4;
const PROMPT: usize = 20;
const MAX_TOKENS: usize = 24;

fn chaos(fault: &str, on_fault: OnFault) -> PolicyConfig {
    let plugin = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/dist/chaos.wasm"));
    let settings: toml::Table =
        toml::from_str(&format!("fault = \"{fault}\"\nafter_step = 6\n")).expect("valid settings");
    PolicyConfig {
        plugin: plugin.display().to_string(),
        on_fault,
        stall_steps: 16,
        // A spinning policy must run out of fuel, deterministically, long
        // before any wall-clock deadline on a busy machine.
        deadline_ms: 10_000,
        settings,
        ..PolicyConfig::default()
    }
}

/// What a fault journal says, without the free-text details.
fn decisions(events: &[FaultEvent]) -> Vec<(u64, &'static str, FaultAction)> {
    events.iter().map(|event| (event.step, event.reason, event.action.clone())).collect()
}

fn simulated(host: &PluginHost, config: &PolicyConfig) -> Vec<FaultEvent> {
    let policy = load_policy(host, config).expect("chaos loads");
    let mut supervisor = Supervisor::new(Box::new(policy), fallback(host, config), fault_rules(config));
    let trace: Vec<TraceRequest> = (0..REQUESTS)
        .map(|_| TraceRequest {
            arrival_ms: 0.0,
            prompt_tokens: PROMPT as u32,
            max_tokens: MAX_TOKENS as u32,
            adapter: None,
            priority: 0,
            prompt: None,
        })
        .collect();
    let cost = CostModel { base_ms: 1.0, prefill_token_ms: 0.05, decode_token_ms: 0.2, attention_kpair_ms: 0.0 };
    let run = simulate(&mut supervisor, &trace, EngineShape { slots: SLOTS, token_budget: BUDGET as u32 }, cost);
    run.faults
}

/// The live engine's fault journal, or `None` when the engine stepped
/// before the last request was queued (a busy machine descheduled the
/// test between submissions): the simulator has every request arrive
/// before its first step, so only such a run compares.
fn live(
    host: &PluginHost,
    config: &PolicyConfig,
    model: &Arc<dyn Model>,
    tokenizer: &Arc<Tokenizer>,
) -> Option<Vec<FaultEvent>> {
    let policy = load_policy(host, config).expect("chaos loads");
    let engine_config = EngineConfig {
        slots: SLOTS,
        ctx: 128,
        batch_tokens: BUDGET,
        faults: fault_rules(config),
        ..EngineConfig::default()
    };
    let engine = EngineHandle::start(
        Arc::clone(model),
        Arc::clone(tokenizer),
        Box::new(policy),
        fallback(host, config),
        engine_config,
        None,
    )
    .expect("engine starts");
    let receivers: Vec<_> = (0..REQUESTS)
        .map(|index| {
            let prompt = (0..PROMPT).map(|i| ((index * 7 + i * 3) % 60) as u32 + 1).collect();
            let mut request = GenerationRequest::new(prompt);
            request.n_predict = Some(MAX_TOKENS);
            request.ignore_eos = true;
            request.cache_prompt = false;
            request.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
            engine.submit(request).ok().map(|(_, events)| events)
        })
        .collect::<Option<_>>()?;
    if engine.shared().metrics.steps_total.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        return None;
    }
    for mut events in receivers {
        loop {
            match events.blocking_recv().expect("the request ends") {
                Event::Done(_) | Event::Failed(_) => break,
                Event::Started { .. } | Event::Progress(_) | Event::Token(_) => {}
            }
        }
    }
    Some(engine.faults())
}

#[test]
fn the_simulator_and_the_engine_decide_every_fault_alike() {
    let host = PluginHost::new().expect("host");
    let file = GgufFile::from_bytes(TinyModel::llama(3).build().build()).expect("valid gguf");
    let model: Arc<dyn Model> = Arc::new(Transformer::from_file(file, Arc::new(CpuBackend::new(1))).expect("loads"));
    let tokenizer = Arc::new(Tokenizer::from_gguf(model.file()).expect("tokenizer"));
    for on_fault in [OnFault::FailClosed, OnFault::Fallback] {
        for fault in FAULTS {
            let config = chaos(fault, on_fault);
            let sim = simulated(&host, &config);
            let engine = (0..5)
                .find_map(|_| live(&host, &config, &model, &tokenizer))
                .unwrap_or_else(|| panic!("{fault}, {on_fault:?}: the engine stepped before the last arrival 5 times"));
            assert_eq!(decisions(&sim), decisions(&engine), "{fault}, {on_fault:?}:\nsim {sim:#?}\nengine {engine:#?}");
            // Each run ends in a quarantine after one retry: never vacuous.
            let last = match on_fault {
                OnFault::FailClosed => FaultAction::FailClosed,
                OnFault::Fallback => FaultAction::Fallback("continuous".into()),
            };
            let actions: Vec<FaultAction> = sim.iter().map(|event| event.action.clone()).collect();
            assert_eq!(actions, [FaultAction::Retry, last], "{fault}, {on_fault:?}: {sim:#?}");
        }
    }
}
