//! The policy side of the server: the plugin host, where the configuration
//! came from (for reloads), and the active policy's configuration.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::config::{Config, Overrides, PolicyConfig};
use crate::startup::{PluginError, load_policy};
use sluice_plugin_host::{PluginHost, WasmPolicy};

/// The plugin host, the policy configuration's origin and the active one.
pub struct Policies {
    host: PluginHost,
    config_file: Option<PathBuf>,
    flags: Overrides,
    active: Mutex<PolicyConfig>,
}

impl Policies {
    pub fn new(host: PluginHost, config_file: Option<PathBuf>, flags: Overrides, active: PolicyConfig) -> Self {
        Policies { host, config_file, flags, active: Mutex::new(active) }
    }

    /// The plugin host (shared by policies and draft fixups).
    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// The active policy's configuration (its shadows included).
    pub fn active(&self) -> PolicyConfig {
        self.active.lock().map(|active| active.clone()).unwrap_or_default()
    }

    pub(super) fn edit(&self, change: impl FnOnce(&mut PolicyConfig)) {
        if let Ok(mut active) = self.active.lock() {
            change(&mut active);
        }
    }

    /// Load `config`'s policy and make it the one `/props` reports.
    pub fn load(&self, config: PolicyConfig) -> Result<WasmPolicy, PluginError> {
        let policy = load_policy(&self.host, &config)?;
        if let Ok(mut active) = self.active.lock() {
            *active = config;
        }
        Ok(policy)
    }

    /// The `[policy]` section as it stands now: the config file read again,
    /// with the command-line flags applied over it.
    pub fn reread(&self) -> Result<PolicyConfig, PluginError> {
        let mut config = match &self.config_file {
            Some(path) => Config::load(path).map_err(|error| PluginError::Config(error.to_string()))?,
            None => Config::default(),
        };
        config.apply(&self.flags).map_err(PluginError::Config)?;
        Ok(config.policy)
    }
}
