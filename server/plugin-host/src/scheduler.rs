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
use sluice_plugin_api::packed;

use sluice_engine::policy::{Admit, Decision, PolicyFault, Prefill, SchedulingPolicy, StepView};

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../../plugin-api/wit",
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
    /// The wire view, kept between steps so its words reuse their memory.
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
    wire::StepView {
        step: 0,
        now_ms: 0,
        token_budget: 0,
        costs: wire::StepCosts {
            measured_steps: 0,
            base_ns: 0,
            prefill_token_ns: 0,
            decode_row_ns: 0,
            attention_kpair_ns: 0,
        },
        occupied: 0,
        waiting: 0,
        free: 0,
        ended: 0,
        words: Vec::new(),
    }
}

/// Pack the view into the wire's words (see `step-view` in the WIT),
/// reusing their memory.
fn fill_wire_view(view: &StepView, wire: &mut wire::StepView) {
    let counts = packed::pack(view, &mut wire.words);
    wire.step = view.step;
    wire.now_ms = view.now_ms;
    wire.token_budget = view.token_budget;
    let costs = &view.costs;
    wire.costs = wire::StepCosts {
        measured_steps: costs.measured_steps,
        base_ns: costs.base_ns,
        prefill_token_ns: costs.prefill_token_ns,
        decode_row_ns: costs.decode_row_ns,
        attention_kpair_ns: costs.attention_kpair_ns,
    };
    wire.occupied = counts.occupied;
    wire.waiting = counts.waiting;
    wire.free = counts.free;
    wire.ended = counts.ended;
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
