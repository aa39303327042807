//! What the engine thread and its handles share: the engine's settings, the
//! commands the handles send, and the state the engine publishes for the
//! HTTP layer.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::Duration;

use sluice_kernels::backend::KvTypes;
use sluice_model::window::WindowPool;

use super::delivery::{EventSender, Queue, QueueTicket};
use super::metrics::Metrics;
use super::policy::{Phase, SchedulingPolicy};
use super::request::{EngineError, GenerationRequest, RequestId};
use super::shadow::ShadowRecord;
use super::slot_store::SlotAction;
use super::supervisor::{FaultEvent, FaultRules, Health};
use super::trace::TraceRecorder;

/// The engine's settings (`startup` builds them from `[engine]` and the
/// policy's fault rules).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Sequences decoded together (llama-server `-np`).
    pub slots: usize,
    /// Context of each slot in tokens (llama-server `-c`, as with its
    /// unified KV cache: every slot may use all of it).
    pub ctx: usize,
    /// Most tokens one step may process (llama-server `-b`).
    pub batch_tokens: usize,
    /// Most rows one forward pass runs (llama-server `-ub`).
    pub ubatch_tokens: usize,
    /// Tokens per KV-cache block.
    pub kv_block_tokens: usize,
    /// How the KV cache holds keys and values (llama-server `-ctk`, `-ctv`).
    pub kv_types: KvTypes,
    /// Share prompt prefixes between requests.
    pub prefix_cache: bool,
    /// Sliding-window layers keep every cell, as the others do, instead of
    /// freeing those older than their window (llama-server
    /// `--swa-full`): more KV memory, but the prefix cache and slot files
    /// work on such models (see `engine::kv`).
    pub swa_full: bool,
    /// Most MiB of KV the prefix cache keeps for finished requests; `None`
    /// = as much as the pool has free.
    pub cache_mib: Option<u64>,
    /// Prompt tokens between the prefix cache's snapshots of a recurrent
    /// model's state (rounded up to whole KV blocks; 0 = none but those
    /// near a prompt's end and where a request ends; see
    /// `engine::state_cache`).
    pub state_snapshot_tokens: usize,
    /// Shift a full context instead of stopping the request (see
    /// `engine::shift`).
    pub context_shift: bool,
    /// Most requests waiting for a slot; more are refused with 503.
    pub queue_limit: usize,
    /// Most bytes of a request's events its client may leave unread before
    /// the request is ended (see `engine::delivery`).
    pub stream_window_bytes: usize,
    /// How the policy's faults are handled.
    pub faults: FaultRules,
    /// Most time the shadow policies may take per step, all together.
    pub shadow_budget: Duration,
}

impl EngineConfig {
    /// KV blocks and cells per block: room for every slot's whole context,
    /// plus one block per slot for a partial tail shared copy-on-write.
    pub fn kv_blocks(&self) -> (usize, usize) {
        let block_tokens = self.kv_block_tokens.max(1);
        ((self.slots * self.ctx).div_ceil(block_tokens) + self.slots, block_tokens)
    }

    /// For a model whose window layers see `window` positions: that window
    /// and the blocks of the window layers' own store (each slot's window
    /// plus a step's rows), unless `swa_full` keeps every cell or the
    /// store would be no smaller than the paged one.
    pub fn window_blocks(&self, window: Option<usize>) -> Option<(usize, usize)> {
        let window = window.filter(|_| !self.swa_full)?;
        let (n_blocks, block_tokens) = self.kv_blocks();
        // A step gives a slot at most the batch's tokens (the policy's
        // budget; a verification's drafts share it), and a slot reserves one
        // cell past its pass before its blocks slide.
        let blocks =
            WindowPool::blocks_per_sequence(window, block_tokens, self.batch_tokens).checked_mul(self.slots)?;
        (blocks < n_blocks).then_some((window, blocks))
    }
}

impl Default for EngineConfig {
    /// llama-server's defaults where it has them (and `config/sluice.toml`'s).
    fn default() -> Self {
        EngineConfig {
            slots: 4,
            ctx: 4096,
            batch_tokens: 512,
            ubatch_tokens: 512,
            kv_block_tokens: 16,
            kv_types: KvTypes::default(),
            prefix_cache: true,
            swa_full: false,
            cache_mib: Some(8192),
            state_snapshot_tokens: 8192,
            context_shift: false,
            queue_limit: 256,
            stream_window_bytes: 16 << 20,
            faults: FaultRules::default(),
            shadow_budget: DEFAULT_SHADOW_BUDGET,
        }
    }
}

/// What a handle asks of the engine thread.
pub(super) enum Command {
    Submit {
        id: RequestId,
        request: Box<GenerationRequest>,
        events: EventSender,
        /// Its place in the queue, held until it leaves the queue.
        ticket: QueueTicket,
    },
    Cancel(RequestId),
    /// Swap the policy; the sender hears once the swap is done.
    ReplacePolicy(Box<dyn SchedulingPolicy>, mpsc::Sender<()>),
    /// Save, restore or erase a slot's cache once the slot is idle.
    Slot {
        slot: usize,
        action: SlotAction,
    },
    /// End every waiting and running request with this error; the sender
    /// hears how many there were.
    EndAll(EngineError, mpsc::Sender<usize>),
    Shadow(ShadowCommand),
    /// Record every step to this trace from now on.
    Record(TraceRecorder),
}

/// Changes to the shadow policies; each sender hears the outcome.
pub(super) enum ShadowCommand {
    Attach(Box<dyn SchedulingPolicy>, mpsc::Sender<Result<(), String>>),
    Detach(String, mpsc::Sender<Result<(), String>>),
    /// Detach all, then attach these (a reload of the config file).
    Replace(Vec<Box<dyn SchedulingPolicy>>, mpsc::Sender<Result<(), String>>),
    Promote(String, mpsc::Sender<Result<Promoted, String>>),
}

/// A promotion done: the active policy's name and what became of the one
/// it replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promoted {
    pub active: String,
    pub previous: String,
    /// False when it could not be attached as a shadow (one of that name is).
    pub kept_as_shadow: bool,
}

/// `policy.shadow_budget_us`'s default.
pub const DEFAULT_SHADOW_BUDGET: Duration = Duration::from_micros(200);

/// A slot as `/slots` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotInfo {
    pub id: u32,
    pub n_ctx: usize,
    pub phase: Option<Phase>,
    pub request_id: Option<RequestId>,
    pub prompt_tokens: usize,
    pub prompt_done: usize,
    pub prompt_cached: usize,
    pub generated: usize,
    pub max_tokens: Option<usize>,
    pub priority: i32,
    pub adapter_group: u32,
    /// Its request's LoRA adapters: (id, scale).
    pub lora: Vec<(u32, f32)>,
}

/// How many recent policy faults the engine keeps for `/props`.
const FAULT_JOURNAL: usize = 32;

/// State the engine publishes for the HTTP layer.
#[derive(Debug)]
pub struct Shared {
    pub metrics: Metrics,
    pub health: Mutex<Health>,
    pub slots: Mutex<Vec<SlotInfo>>,
    pub policy_name: Mutex<String>,
    /// The requests waiting for a slot.
    pub queue: Queue,
    /// The LoRA adapters waiting requests use (ids, ascending).
    pub waiting_adapters: Mutex<Vec<u32>>,
    /// Why the engine thread stopped, once it has.
    pub stopped: OnceLock<String>,
    /// The server is stopping: new requests are refused.
    pub draining: AtomicBool,
    /// The most recent policy faults (`FAULT_JOURNAL` of them) and what was
    /// done about them.
    pub faults: Mutex<VecDeque<FaultEvent>>,
    /// What each attached shadow policy has shown, in attachment order.
    pub shadows: Mutex<Vec<ShadowRecord>>,
}

impl Shared {
    pub(super) fn new(policy_name: &str) -> Self {
        Shared {
            metrics: Metrics::default(),
            health: Mutex::new(Health::Ok),
            slots: Mutex::new(Vec::new()),
            policy_name: Mutex::new(policy_name.to_owned()),
            queue: Queue::default(),
            waiting_adapters: Mutex::new(Vec::new()),
            stopped: OnceLock::new(),
            draining: AtomicBool::new(false),
            faults: Mutex::new(VecDeque::with_capacity(FAULT_JOURNAL)),
            shadows: Mutex::new(Vec::new()),
        }
    }

    /// Publish the policy deciding now and the health.
    pub(super) fn set_policy(&self, name: &str, health: &Health) {
        if let Ok(mut current) = self.policy_name.lock() {
            name.clone_into(&mut current);
        }
        if let Ok(mut current) = self.health.lock() {
            current.clone_from(health);
        }
    }

    pub(super) fn record_fault(&self, event: &FaultEvent) {
        if let Ok(mut faults) = self.faults.lock() {
            if faults.len() == FAULT_JOURNAL {
                faults.pop_front();
            }
            faults.push_back(event.clone());
        }
    }
}
