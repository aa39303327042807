//! `scheduler`-world components behind the engine's policy seam: a
//! [`WasmPolicy`] is a [`SchedulingPolicy`] whose sandbox faults become the
//! engine's [`PolicyFault`]s.

use wasmtime::Store;
use wasmtime::component::Linker;

use super::component::{self, LoadError, PluginSource};
use super::fault::PluginFault;
use super::host::{self, PluginHost};
use super::limits::{PluginLimits, StoreState};
use super::policy_types::Setting;
use crate::engine::policy::{Admit, Decision, PolicyFault, Prefill, RequestInfo, SchedulingPolicy, StepView};

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../plugin-api/wit",
        world: "scheduler",
        additional_derives: [PartialEq],
    });
}

use bindings::exports::sluice::plugin::policy as wire;
use bindings::{Scheduler, SchedulerPre};

/// A live instance: its store and bindings.
struct Instance {
    store: Store<StoreState>,
    bindings: Scheduler,
    /// The wire view, kept between steps so its columns reuse their memory.
    wire_view: wire::StepView,
}

/// A scheduling policy running in the sandbox. Instances are created from a
/// pre-linked component, so replacing a faulted one costs an instantiation
/// and a `configure` call, not a compilation.
pub struct WasmPolicy {
    name: String,
    host: PluginHost,
    pre: SchedulerPre<StoreState>,
    limits: PluginLimits,
    settings: Vec<Setting>,
    /// `None` after a fault: the next call builds a fresh instance.
    instance: Option<Instance>,
}

impl WasmPolicy {
    /// Load, check and configure a policy. Any failure, including a
    /// `configure` error or a fault during it, refuses the policy.
    pub fn load(
        host: &PluginHost,
        source: PluginSource,
        bytes: &[u8],
        settings: Vec<Setting>,
        limits: PluginLimits,
    ) -> Result<Self, LoadError> {
        let component = component::load(host, &source, bytes, "policy")?;
        let linker = Linker::new(host.engine());
        let mismatch = |error: wasmtime::Error| LoadError::Mismatch {
            plugin: source.clone(),
            export: format!("sluice:plugin/policy@{}", component::PACKAGE_VERSION),
            error: format!("{error:#}"),
        };
        let instance_pre = linker.instantiate_pre(&component).map_err(mismatch)?;
        let pre = SchedulerPre::new(instance_pre).map_err(mismatch)?;
        let name = match &source {
            PluginSource::Builtin(name) => (*name).to_owned(),
            PluginSource::Path(path) => path.display().to_string(),
        };
        let mut policy = WasmPolicy { name, host: host.clone(), pre, limits, settings, instance: None };
        policy.instantiate().map_err(|error| match error {
            InstanceError::Fault(fault) => LoadError::Instantiate { plugin: source.clone(), fault },
            InstanceError::Refused(message) => LoadError::Configure { plugin: source.clone(), message },
            InstanceError::Mismatch(message) => mismatch(wasmtime::Error::msg(message)),
        })?;
        Ok(policy)
    }

    /// Build a fresh instance and configure it.
    fn instantiate(&mut self) -> Result<&mut Instance, InstanceError> {
        self.instance = None;
        let limits = self.limits;
        let mut store = self.host.store(limits)?;
        let bindings =
            self.pre.instantiate(&mut store).map_err(|error| match PluginFault::classify(error, &limits) {
                // Not a fault of running code: the exports' types differ from
                // the host's (checked when the typed functions are looked up).
                PluginFault::Malformed(message) => InstanceError::Mismatch(message),
                fault => InstanceError::Fault(fault),
            })?;
        host::arm(&mut store, limits)?;
        bindings
            .sluice_plugin_policy()
            .call_configure(&mut store, &self.settings)
            .map_err(|error| PluginFault::classify(error, &limits))?
            .map_err(InstanceError::Refused)?;
        Ok(self.instance.insert(Instance { store, bindings, wire_view: empty_wire_view() }))
    }
}

enum InstanceError {
    Fault(PluginFault),
    Refused(String),
    Mismatch(String),
}

impl From<PluginFault> for InstanceError {
    fn from(fault: PluginFault) -> Self {
        InstanceError::Fault(fault)
    }
}

impl SchedulingPolicy for WasmPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, view: &StepView) -> Result<Decision, PolicyFault> {
        self.decide(view).map_err(PolicyFault::from)
    }

    fn reset(&mut self) {
        self.instance = None;
    }
}

impl From<PluginFault> for PolicyFault {
    fn from(fault: PluginFault) -> Self {
        PolicyFault { reason: fault.reason(), detail: fault.to_string() }
    }
}

impl WasmPolicy {
    /// One `step` call in the sandbox, with the sandbox's own account of a
    /// fault; a fault discards the instance.
    pub fn decide(&mut self, view: &StepView) -> Result<Decision, PluginFault> {
        let limits = self.limits;
        let instance = match self.instance.as_mut() {
            Some(instance) => instance,
            None => self.instantiate().map_err(|error| match error {
                InstanceError::Fault(fault) => fault,
                // It accepted the same settings before: refusing them now
                // is the plugin misbehaving, not the operator's input.
                InstanceError::Refused(message) => PluginFault::Malformed(format!("configure refused: {message}")),
                InstanceError::Mismatch(message) => PluginFault::Malformed(message),
            })?,
        };
        host::arm(&mut instance.store, limits)?;
        fill_wire_view(view, &mut instance.wire_view);
        let result = instance.bindings.sluice_plugin_policy().call_step(&mut instance.store, &instance.wire_view);
        result.map(from_wire).map_err(|error| {
            self.instance = None;
            PluginFault::classify(error, &limits)
        })
    }
}

fn empty_wire_view() -> wire::StepView {
    let table = || wire::RequestTable {
        id: Vec::new(),
        prompt_tokens: Vec::new(),
        prompt_done: Vec::new(),
        prompt_cached: Vec::new(),
        generated: Vec::new(),
        max_tokens: Vec::new(),
        adapter_group: Vec::new(),
        priority: Vec::new(),
        arrival_ms: Vec::new(),
    };
    wire::StepView {
        step: 0,
        now_ms: 0,
        token_budget: 0,
        free_slots: Vec::new(),
        occupied_slots: Vec::new(),
        occupied_phases: Vec::new(),
        occupied: table(),
        waiting: table(),
        waiting_slot_hints: Vec::new(),
        ended: Vec::new(),
    }
}

/// Write the view into the wire's columns (see `request-table` in the WIT),
/// reusing their allocations.
fn fill_wire_view(view: &StepView, wire: &mut wire::StepView) {
    use sluice_plugin_api::{EndReason, NO_SLOT_HINT, Phase};
    wire.step = view.step;
    wire.now_ms = view.now_ms;
    wire.token_budget = view.token_budget;
    refill(&mut wire.free_slots, view.free_slots.iter().copied());
    refill(&mut wire.occupied_slots, view.occupied.iter().map(|slot| slot.slot));
    refill(
        &mut wire.occupied_phases,
        view.occupied.iter().map(|slot| match slot.phase {
            Phase::Prefilling => wire::Phase::Prefilling,
            Phase::Ready => wire::Phase::Ready,
            Phase::Decoding => wire::Phase::Decoding,
        }),
    );
    fill_table(&mut wire.occupied, view.occupied.iter().map(|slot| &slot.request));
    fill_table(&mut wire.waiting, view.waiting.iter().map(|waiting| &waiting.request));
    refill(&mut wire.waiting_slot_hints, view.waiting.iter().map(|waiting| waiting.slot_hint.unwrap_or(NO_SLOT_HINT)));
    refill(
        &mut wire.ended,
        view.ended.iter().map(|ended| wire::EndedRequest {
            request_id: ended.request_id,
            slot: ended.slot,
            reason: match ended.reason {
                EndReason::Completed => wire::EndReason::Completed,
                EndReason::Cancelled => wire::EndReason::Cancelled,
                EndReason::Failed => wire::EndReason::Failed,
            },
        }),
    );
}

fn fill_table<'a>(table: &mut wire::RequestTable, requests: impl Iterator<Item = &'a RequestInfo> + Clone) {
    refill(&mut table.id, requests.clone().map(|request| request.id));
    refill(&mut table.prompt_tokens, requests.clone().map(|request| request.prompt_tokens));
    refill(&mut table.prompt_done, requests.clone().map(|request| request.prompt_done));
    refill(&mut table.prompt_cached, requests.clone().map(|request| request.prompt_cached));
    refill(&mut table.generated, requests.clone().map(|request| request.generated));
    refill(&mut table.max_tokens, requests.clone().map(|request| request.max_tokens));
    refill(&mut table.adapter_group, requests.clone().map(|request| request.adapter_group));
    refill(&mut table.priority, requests.clone().map(|request| request.priority));
    refill(&mut table.arrival_ms, requests.map(|request| request.arrival_ms));
}

fn refill<T>(column: &mut Vec<T>, values: impl Iterator<Item = T>) {
    column.clear();
    column.extend(values);
}

fn from_wire(decision: wire::Decision) -> Decision {
    Decision {
        admit: decision
            .admit
            .into_iter()
            .map(|admit| Admit { request_id: admit.request_id, slot: admit.slot })
            .collect(),
        prefill: decision
            .prefill
            .into_iter()
            .map(|prefill| Prefill { slot: prefill.slot, tokens: prefill.tokens })
            .collect(),
        decode: decision.decode,
    }
}
