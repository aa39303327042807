//! The TOML configuration (`config/sluice.toml`) and its validation. Errors
//! name the file, the line and the key.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::plugins::{BUILTIN_POLICIES, PluginLimits, PluginSource, builtin_policy};

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub policy: PolicyConfig,
    #[serde(default)]
    pub log: LogConfig,
}

/// `[policy]`: which scheduling policy runs and under which limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A built-in policy name or a path to a `.wasm` component (relative
    /// paths are relative to the config file).
    pub plugin: String,
    /// What happens when the policy faults twice in a row.
    pub on_fault: OnFault,
    /// Steps in a row without any grant while work is runnable before the
    /// policy is considered stalled.
    pub stall_steps: u32,
    /// Fuel units per call.
    pub fuel: u64,
    /// Wall-clock bound per call, in milliseconds.
    pub deadline_ms: u64,
    /// Cap on the plugin's memory, in MiB.
    pub memory_mb: u64,
    /// `[policy.settings]`, passed to the policy's `configure`.
    pub settings: toml::Table,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            plugin: "continuous".into(),
            on_fault: OnFault::FailClosed,
            stall_steps: 64,
            fuel: PluginLimits::default().fuel,
            deadline_ms: PluginLimits::default().deadline_ms,
            memory_mb: PluginLimits::default().memory_mb,
            settings: toml::Table::new(),
        }
    }
}

/// `policy.on_fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFault {
    /// End every request with an error and refuse new ones until reloaded.
    FailClosed,
    /// Switch to the embedded `continuous` policy and report "degraded".
    Fallback,
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter, e.g. `info` or `sluice=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into() }
    }
}

/// A configuration error, naming the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl Config {
    /// Read and validate a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.into(), error })?;
        let mut config = Self::parse(&text).map_err(|message| ConfigError::Invalid { path: path.into(), message })?;
        // A relative plugin path means "next to the config file".
        if looks_like_path(&config.policy.plugin) {
            let plugin = Path::new(&config.policy.plugin);
            if plugin.is_relative() {
                let base = path.parent().unwrap_or(Path::new("."));
                config.policy.plugin = base.join(plugin).display().to_string();
            }
        }
        Ok(config)
    }

    /// Parse and validate config text; the error gives line and key.
    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Config = toml::from_str(text).map_err(|error| error.to_string().trim_end().to_owned())?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        let policy = &self.policy;
        policy.source()?;
        let positive = [
            ("policy.fuel", policy.fuel),
            ("policy.deadline_ms", policy.deadline_ms),
            ("policy.memory_mb", policy.memory_mb),
            ("policy.stall_steps", u64::from(policy.stall_steps)),
        ];
        match positive.iter().find(|(_, value)| *value == 0) {
            Some((key, _)) => Err(format!("`{key}` must be at least 1")),
            None => Ok(()),
        }
    }
}

impl PolicyConfig {
    /// The per-call sandbox limits.
    pub fn limits(&self) -> PluginLimits {
        PluginLimits { fuel: self.fuel, deadline_ms: self.deadline_ms, memory_mb: self.memory_mb }
    }

    /// Where the policy comes from: a built-in name or a file path.
    pub fn source(&self) -> Result<PluginSource, String> {
        if looks_like_path(&self.plugin) {
            return Ok(PluginSource::Path(PathBuf::from(&self.plugin)));
        }
        match builtin_policy(&self.plugin) {
            Some((name, _)) => Ok(PluginSource::Builtin(name)),
            None => {
                let names: Vec<&str> = BUILTIN_POLICIES.iter().map(|(name, _)| *name).collect();
                Err(format!(
                    "`policy.plugin` = \"{}\" is neither a built-in policy ({}) nor a path to a .wasm file",
                    self.plugin,
                    names.join(", ")
                ))
            }
        }
    }
}

fn looks_like_path(plugin: &str) -> bool {
    plugin.contains('/') || plugin.ends_with(".wasm")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_select_continuous_and_fail_closed() {
        let config = Config::parse("").expect("empty config is valid");
        assert_eq!(config.policy.source(), Ok(PluginSource::Builtin("continuous")));
        assert_eq!(config.policy.on_fault, OnFault::FailClosed);
        assert_eq!(config.policy.stall_steps, 64);
        assert_eq!(config.policy.limits(), PluginLimits::default());
    }

    #[test]
    fn limits_and_settings_are_read() {
        let config = Config::parse(
            "[policy]\nplugin = \"my/policy.wasm\"\non_fault = \"fallback\"\nfuel = 5\ndeadline_ms = 7\nmemory_mb = 3\n[policy.settings]\nmax_members = 4\n",
        )
        .expect("valid");
        assert_eq!(config.policy.source(), Ok(PluginSource::Path("my/policy.wasm".into())));
        assert_eq!(config.policy.on_fault, OnFault::Fallback);
        assert_eq!(config.policy.limits(), PluginLimits { fuel: 5, deadline_ms: 7, memory_mb: 3 });
        assert_eq!(config.policy.settings.get("max_members"), Some(&toml::Value::Integer(4)));
    }

    #[test]
    fn errors_name_line_and_key() {
        let unknown = Config::parse("[policy]\nplugin = \"continuous\"\nfule = 5\n").unwrap_err();
        assert!(unknown.contains("line 3") && unknown.contains("unknown field `fule`"), "{unknown}");
        let wrong_type = Config::parse("[policy]\n\nfuel = \"lots\"\n").unwrap_err();
        assert!(wrong_type.contains("line 3") && wrong_type.contains("fuel"), "{wrong_type}");
        let bad_fault = Config::parse("[policy]\non_fault = \"retry\"\n").unwrap_err();
        assert!(bad_fault.contains("line 2") && bad_fault.contains("fail-closed"), "{bad_fault}");
        let zero = Config::parse("[policy]\nmemory_mb = 0\n").unwrap_err();
        assert_eq!(zero, "`policy.memory_mb` must be at least 1");
        let unknown_builtin = Config::parse("[policy]\nplugin = \"fastest\"\n").unwrap_err();
        assert!(unknown_builtin.contains("\"fastest\" is neither a built-in policy (continuous"), "{unknown_builtin}");
    }

    #[test]
    fn relative_plugin_paths_resolve_against_the_config_file() {
        let dir = std::env::temp_dir().join(format!("sluice-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("sluice.toml");
        std::fs::write(&file, "[policy]\nplugin = \"plugins/mine.wasm\"\n").expect("write config");
        let config = Config::load(&file).expect("valid");
        assert_eq!(config.policy.source(), Ok(PluginSource::Path(dir.join("plugins/mine.wasm"))));
        let missing = Config::load(&dir.join("absent.toml")).unwrap_err().to_string();
        assert!(missing.contains("absent.toml: cannot read"), "{missing}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
