//! `scheduler`-world components behind the engine's policy seam.

use wasmtime::Store;
use wasmtime::component::Linker;

use super::component::{self, LoadError, PluginSource};
use super::fault::PluginFault;
use super::host::{self, PluginHost, PluginLimits, StoreState};
use super::policy_types::{Decision, Setting, StepView};
use crate::engine::policy::SchedulingPolicy;

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../plugin-api/wit",
        world: "scheduler",
        additional_derives: [PartialEq],
    });
}

use bindings::{Scheduler, SchedulerPre};

/// A live instance: its store and bindings.
struct Instance {
    store: Store<StoreState>,
    bindings: Scheduler,
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
        })?;
        Ok(policy)
    }

    /// Build a fresh instance and configure it.
    fn instantiate(&mut self) -> Result<&mut Instance, InstanceError> {
        self.instance = None;
        let limits = self.limits;
        let mut store = self.host.store(limits)?;
        let bindings = self.pre.instantiate(&mut store).map_err(|error| PluginFault::classify(error, &limits))?;
        host::arm(&mut store, limits)?;
        bindings
            .sluice_plugin_policy()
            .call_configure(&mut store, &self.settings)
            .map_err(|error| PluginFault::classify(error, &limits))?
            .map_err(InstanceError::Refused)?;
        Ok(self.instance.insert(Instance { store, bindings }))
    }
}

enum InstanceError {
    Fault(PluginFault),
    Refused(String),
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

    fn step(&mut self, view: &StepView) -> Result<Decision, PluginFault> {
        let limits = self.limits;
        let instance = match self.instance.as_mut() {
            Some(instance) => instance,
            None => self.instantiate().map_err(|error| match error {
                InstanceError::Fault(fault) => fault,
                // It accepted the same settings before: refusing them now
                // is the plugin misbehaving, not the operator's input.
                InstanceError::Refused(message) => PluginFault::Malformed(format!("configure refused: {message}")),
            })?,
        };
        host::arm(&mut instance.store, limits)?;
        let result = instance.bindings.sluice_plugin_policy().call_step(&mut instance.store, view);
        result.map_err(|error| {
            self.instance = None;
            PluginFault::classify(error, &limits)
        })
    }

    fn reset(&mut self) {
        self.instance = None;
    }
}
