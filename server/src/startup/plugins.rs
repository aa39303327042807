//! Plugin sources read once for everyone: the configured policy (at start,
//! on reloads, in the lab and the benchmarks), its fallback, and the draft
//! fixups.

use std::borrow::Cow;
use std::path::PathBuf;

use crate::config::{OnFault, PolicyConfig, SpeculativeConfig};
use crate::engine::policy::SchedulingPolicy;
use crate::engine::shadow::MAX_SHADOWS;
use crate::engine::{FallbackPolicy, FaultRules};
use crate::plugins::{
    LoadError, PluginHost, PluginLimits, PluginSource, WasmFixup, WasmPolicy, builtin_fixup, builtin_policy,
    settings_from_toml,
};

/// Why a plugin could not be loaded; the message names the plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{0}")]
    Config(String),
    #[error("no built-in plugin `{0}`")]
    NoBuiltin(String),
    #[error("{}: cannot read plugin: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// Which table a built-in name is looked up in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    Scheduler,
    DraftFixup,
}

/// A plugin's component: embedded for a built-in, read from disk for a path.
pub fn read_plugin(source: &PluginSource, world: World) -> Result<Cow<'static, [u8]>, PluginError> {
    match source {
        PluginSource::Builtin(name) => {
            let builtin = match world {
                World::Scheduler => builtin_policy(name),
                World::DraftFixup => builtin_fixup(name),
            };
            builtin.map(|(_, bytes)| Cow::Borrowed(bytes)).ok_or_else(|| PluginError::NoBuiltin((*name).to_owned()))
        }
        PluginSource::Path(path) => {
            std::fs::read(path).map(Cow::Owned).map_err(|error| PluginError::Read { path: path.clone(), error })
        }
    }
}

/// Load, check and configure the policy `config` names, with its limits and
/// settings.
pub fn load_policy(host: &PluginHost, config: &PolicyConfig) -> Result<WasmPolicy, PluginError> {
    let source = config.source().map_err(PluginError::Config)?;
    let bytes = read_plugin(&source, World::Scheduler)?;
    let settings = settings_from_toml(&config.settings).map_err(PluginError::Config)?;
    Ok(WasmPolicy::load(host, source, &bytes, settings, config.limits())?)
}

/// Load the shadow policies `config` lists (`[[policy.shadow]]`), each
/// under the active policy's limits.
pub fn load_shadows(host: &PluginHost, config: &PolicyConfig) -> Result<Vec<WasmPolicy>, PluginError> {
    if config.shadow.len() > MAX_SHADOWS {
        return Err(PluginError::Config(format!(
            "`[[policy.shadow]]` lists {} policies; at most {MAX_SHADOWS} run as shadows",
            config.shadow.len()
        )));
    }
    config
        .shadow
        .iter()
        .map(|shadow| {
            load_policy(host, &config.for_shadow(shadow))
                .map_err(|error| PluginError::Config(format!("shadow policy `{}`: {error}", shadow.plugin)))
        })
        .collect()
}

/// Load a draft-fixup component from `source`.
pub fn load_fixup(host: &PluginHost, source: PluginSource, limits: PluginLimits) -> Result<WasmFixup, PluginError> {
    let bytes = read_plugin(&source, World::DraftFixup)?;
    Ok(WasmFixup::load(host, source, &bytes, limits)?)
}

/// The fixups `[speculative]` lists, in order.
pub fn load_fixups(
    host: &PluginHost,
    config: &SpeculativeConfig,
    limits: PluginLimits,
) -> Result<Vec<WasmFixup>, PluginError> {
    let sources = config.fixup_sources().map_err(PluginError::Config)?;
    sources.into_iter().map(|source| load_fixup(host, source, limits)).collect()
}

/// What the supervisor falls back to after a quarantine: the built-in
/// `continuous`, under `config`'s limits.
pub fn fallback(host: &PluginHost, config: &PolicyConfig) -> FallbackPolicy {
    let host = host.clone();
    let config = PolicyConfig { plugin: "continuous".into(), settings: toml::Table::new(), ..config.clone() };
    Box::new(move || match load_policy(&host, &config) {
        Ok(policy) => Some(Box::new(policy) as Box<dyn SchedulingPolicy>),
        Err(error) => {
            tracing::error!(%error, "cannot load the fallback policy");
            None
        }
    })
}

/// The supervisor's rules from `[policy]`.
pub fn fault_rules(config: &PolicyConfig) -> FaultRules {
    let on_fault = match config.on_fault {
        OnFault::FailClosed => crate::engine::OnFault::FailClosed,
        OnFault::Fallback => crate::engine::OnFault::Fallback,
    };
    FaultRules { on_fault, stall_steps: config.stall_steps }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_come_from_their_world_and_paths_from_disk() {
        let policy = read_plugin(&PluginSource::Builtin("continuous"), World::Scheduler).expect("built in");
        assert!(policy.starts_with(b"\0asm"));
        let wrong = read_plugin(&PluginSource::Builtin("continuous"), World::DraftFixup).unwrap_err();
        assert_eq!(wrong.to_string(), "no built-in plugin `continuous`");
        let missing = read_plugin(&PluginSource::Path("/nonexistent/p.wasm".into()), World::Scheduler).unwrap_err();
        assert!(missing.to_string().starts_with("/nonexistent/p.wasm: cannot read plugin"), "{missing}");
    }

    #[test]
    fn the_fault_rules_follow_the_policy_section() {
        let config = PolicyConfig { on_fault: OnFault::Fallback, stall_steps: 9, ..PolicyConfig::default() };
        assert_eq!(fault_rules(&config), FaultRules { on_fault: crate::engine::OnFault::Fallback, stall_steps: 9 });
        assert_eq!(fault_rules(&PolicyConfig::default()), FaultRules::default());
    }
}
