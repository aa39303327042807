//! `draft-fixup`-world components: run once per draft/target pair.

use wasmtime::component::Linker;

use super::component::{self, LoadError, PluginSource};
use super::fault::PluginFault;
use super::fixup_types::{Edit, ModelInfo};
use super::host::PluginHost;
use super::limits::{PluginLimits, StoreState};

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../../plugin-api/wit",
        world: "draft-fixup",
        additional_derives: [PartialEq],
    });
}

use bindings::DraftFixupPre;

/// Why a fixup produced no edits to apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FixupError {
    #[error("{plugin}: refused the draft: {message}")]
    Refused { plugin: String, message: String },
    #[error("{plugin}: {fault}")]
    Fault { plugin: String, fault: PluginFault },
}

/// A loaded draft-metadata fixup.
pub struct WasmFixup {
    name: String,
    host: PluginHost,
    pre: DraftFixupPre<StoreState>,
    limits: PluginLimits,
}

impl WasmFixup {
    /// Load and check a fixup component.
    pub fn load(
        host: &PluginHost,
        source: PluginSource,
        bytes: &[u8],
        limits: PluginLimits,
    ) -> Result<Self, LoadError> {
        let component = component::load(host, &source, bytes, "fixup")?;
        let mismatch = |error: wasmtime::Error| LoadError::Mismatch {
            plugin: source.clone(),
            export: format!("sluice:plugin/fixup@{}", component::PACKAGE_VERSION),
            error: format!("{error:#}"),
        };
        let instance_pre = Linker::new(host.engine()).instantiate_pre(&component).map_err(mismatch)?;
        let pre = DraftFixupPre::new(instance_pre).map_err(mismatch)?;
        Ok(WasmFixup { name: source.to_string(), host: host.clone(), pre, limits })
    }

    /// The fixup's name for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run the fixup on a fresh instance.
    pub fn run(&self, target: &ModelInfo, draft: &ModelInfo) -> Result<Vec<Edit>, FixupError> {
        let fault = |fault: PluginFault| FixupError::Fault { plugin: self.name.clone(), fault };
        let limits = self.limits;
        let mut store = self.host.store(limits).map_err(fault)?;
        let bindings =
            self.pre.instantiate(&mut store).map_err(|error| fault(PluginFault::classify(error, &limits)))?;
        super::host::arm(&mut store, limits).map_err(fault)?;
        bindings
            .sluice_plugin_fixup()
            .call_fixup(&mut store, target, draft)
            .map_err(|error| fault(PluginFault::classify(error, &limits)))?
            .map_err(|message| FixupError::Refused { plugin: self.name.clone(), message })
    }
}
