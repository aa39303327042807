//! The engine's bookkeeping under faults, with native policies that fault
//! on cue: the waiting count survives a fail-closed with submissions still
//! in flight, and a dead engine thread is reported, not hidden.

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use sluice_engine::policy::{Decision, PolicyFault, SchedulingPolicy, StepView};
use sluice_engine::request::{Event, GenerationRequest};
use sluice_engine::sampling::SamplingParams;
use sluice_engine::{EngineConfig, EngineHandle, Health, SubmitError};
use sluice_kernels::backend::CpuBackend;
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_model::{Model, Transformer};
use sluice_tests::gguf_writer::TinyModel;

/// `continuous`'s rules, natively: first come, first served.
struct Fifo;

impl SchedulingPolicy for Fifo {
    fn name(&self) -> &str {
        "fifo"
    }

    fn step(&mut self, view: &StepView) -> Result<Decision, PolicyFault> {
        let mut decision = Decision::default();
        let mut budget = view.token_budget;
        decision.decode_ready(view, &mut budget);
        decision.admit_fifo_and_prefill(view, &mut budget);
        Ok(decision)
    }

    fn reset(&mut self) {}
}

/// Waits for the test's go (while the test submits more), then faults, or
/// panics.
struct OnCue {
    go: Arc<Mutex<mpsc::Receiver<()>>>,
    panics: bool,
}

impl SchedulingPolicy for OnCue {
    fn name(&self) -> &str {
        "on-cue"
    }

    fn step(&mut self, _view: &StepView) -> Result<Decision, PolicyFault> {
        if let Ok(go) = self.go.lock() {
            let _ = go.recv_timeout(Duration::from_secs(30));
        }
        assert!(!self.panics, "the policy panicked on cue");
        Err(PolicyFault { reason: "trap", detail: "faulted on cue".into() })
    }

    fn reset(&mut self) {}
}

fn engine(policy: Box<dyn SchedulingPolicy>, queue_limit: usize) -> EngineHandle {
    let file = GgufFile::from_bytes(TinyModel::recipe("llama", 5).build().build()).expect("parses");
    let model: Arc<dyn Model> = Arc::new(Transformer::from_file(file, Arc::new(CpuBackend::new(1))).expect("loads"));
    let tokenizer = Arc::new(Tokenizer::from_gguf(model.file()).expect("tokenizer"));
    let config = EngineConfig { slots: 1, ctx: 128, queue_limit, ..EngineConfig::default() };
    EngineHandle::start(model, tokenizer, policy, Box::new(|| None), config, None).expect("engine")
}

fn request() -> GenerationRequest {
    let mut request = GenerationRequest::new(vec![1, 2, 3, 4]);
    request.n_predict = Some(4);
    request.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    request
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    for _ in 0..3000 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn a_fail_closed_with_submissions_in_flight_leaves_the_queue_count_exact() {
    let (go, cue) = mpsc::channel();
    let engine = engine(Box::new(OnCue { go: Arc::new(Mutex::new(cue)), panics: false }), 8);
    let (_, mut first) = engine.submit(request()).expect("queued");
    // The engine is inside the policy's step now, or about to be: these
    // wait in its command channel while the policy fails closed.
    let later: Vec<_> = (0..5).map(|_| engine.submit(request()).expect("queued").1).collect();
    drop(go);
    assert!(matches!(first.blocking_recv(), Some(Event::Failed(_))));
    for mut events in later {
        assert!(matches!(events.blocking_recv(), Some(Event::Failed(_))), "refused after the fail-closed");
    }
    assert!(matches!(engine.health(), Health::FailedClosed { .. }));
    wait_for("the queue to empty", || engine.shared().queue.waiting() == 0);

    engine.replace_policy(Box::new(Fifo), Duration::from_secs(10)).expect("replaced");
    assert_eq!(engine.health(), Health::Ok);
    let queued: Vec<_> = (0..8).map(|_| engine.submit(request()).expect("the queue has room again")).collect();
    for (_, mut events) in queued {
        while let Some(event) = events.blocking_recv() {
            if matches!(event, Event::Done(_)) {
                break;
            }
            assert!(!matches!(event, Event::Failed(_)), "{event:?}");
        }
    }
    wait_for("the queue to empty", || engine.shared().queue.waiting() == 0);
}

#[test]
fn a_dead_engine_thread_is_reported_and_refuses_requests() {
    let (go, cue) = mpsc::channel();
    let engine = engine(Box::new(OnCue { go: Arc::new(Mutex::new(cue)), panics: true }), 8);
    let (_, mut running) = engine.submit(request()).expect("queued");
    drop(go);
    assert_eq!(running.blocking_recv(), None, "its channel ends with the engine");
    wait_for("the engine to be reported stopped", || matches!(engine.health(), Health::Stopped { .. }));
    let Health::Stopped { reason } = engine.health() else { unreachable!() };
    assert!(reason.contains("the policy panicked on cue"), "{reason}");
    let refused = engine.submit(request()).expect_err("refused");
    assert!(matches!(&refused, SubmitError::Unavailable(why) if why.contains("engine stopped")), "{refused:?}");
}
