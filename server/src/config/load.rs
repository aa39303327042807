//! Reading a config file, and the checks serde cannot make: ranges,
//! combinations, names. Errors name the file, the line and the key.

use std::path::{Path, PathBuf};

use sluice_kernels::backend::Device;

use super::schema::{
    Config, DEFAULT_FIXUP, IMAGE_TOKENS, PolicyConfig, PolicySpec, SpecType, SpeculativeConfig, adapter_names,
};
use sluice_plugin_host::{BUILTIN_FIXUPS, BUILTIN_POLICIES, PluginLimits, PluginSource, builtin_fixup, builtin_policy};

/// A configuration error, naming the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A value that parsed but is not acceptable; `key` is its dotted name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub key: String,
    pub message: String,
}

impl Invalid {
    pub(super) fn new(key: &str, message: impl Into<String>) -> Self {
        Invalid { key: key.to_owned(), message: message.into() }
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

enum ParseError {
    /// From the TOML parser, which already names the line and the key.
    Toml(String),
    Invalid(Invalid),
}

impl Config {
    /// Read and validate a config file. Relative paths in it are made
    /// relative to the file's folder.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.into(), error })?;
        let mut config = match Self::parse_checked(&text) {
            Ok(config) => config,
            Err(ParseError::Toml(message)) => return Err(ConfigError::Invalid { path: path.into(), message }),
            Err(ParseError::Invalid(invalid)) => {
                let message = match line_of(&text, &invalid.key) {
                    Some(line) => format!("line {line}: {invalid}"),
                    None => invalid.to_string(),
                };
                return Err(ConfigError::Invalid { path: path.into(), message });
            }
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |file: &mut PathBuf| {
            if file.is_relative() {
                *file = base.join(&*file);
            }
        };
        if looks_like_path(&config.policy.plugin) && Path::new(&config.policy.plugin).is_relative() {
            config.policy.plugin = base.join(&config.policy.plugin).display().to_string();
        }
        if let Some(model) = config.model.path.as_mut() {
            resolve(model);
        }
        if let Some(draft) = config.speculative.draft_model.as_mut() {
            resolve(draft);
        }
        if let Some(mmproj) = config.model.mmproj.as_mut() {
            resolve(mmproj);
        }
        if let Some(folder) = config.server.slot_save_path.as_mut() {
            resolve(folder);
        }
        if let Some(folder) = config.policy.plugin_dir.as_mut() {
            resolve(folder);
        }
        if let Some(trace) = config.server.record_trace.as_mut() {
            resolve(trace);
        }
        for shadow in &mut config.policy.shadow {
            if looks_like_path(&shadow.plugin) && Path::new(&shadow.plugin).is_relative() {
                shadow.plugin = base.join(&shadow.plugin).display().to_string();
            }
        }
        for fixup in config.speculative.fixups.iter_mut().flatten() {
            if looks_like_path(fixup) && Path::new(fixup.as_str()).is_relative() {
                *fixup = base.join(&*fixup).display().to_string();
            }
        }
        config.lora.iter_mut().for_each(|lora| resolve(&mut lora.path));
        Ok(config)
    }

    /// Parse and validate config text; the error gives line and key.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::parse_checked(text).map_err(|error| match error {
            ParseError::Toml(message) => message,
            ParseError::Invalid(invalid) => invalid.to_string(),
        })
    }

    fn parse_checked(text: &str) -> Result<Self, ParseError> {
        let config: Config =
            toml::from_str(text).map_err(|error| ParseError::Toml(error.to_string().trim_end().to_owned()))?;
        config.validate().map_err(ParseError::Invalid)?;
        Ok(config)
    }

    /// Check values serde cannot: ranges, combinations, names.
    pub fn validate(&self) -> Result<(), Invalid> {
        let policy = &self.policy;
        policy.source().map_err(|message| Invalid::new("policy.plugin", message))?;
        for (index, shadow) in policy.shadow.iter().enumerate() {
            let key = format!("policy.shadow[{index}].plugin");
            policy_source(&shadow.plugin, &key).map_err(|message| Invalid::new("policy.shadow.plugin", message))?;
            if policy.shadow[..index].iter().any(|earlier| earlier.plugin == shadow.plugin) {
                let message = format!("`{key}` = \"{}\" is listed twice; a plugin runs as one shadow", shadow.plugin);
                return Err(Invalid::new("policy.shadow.plugin", message));
            }
        }
        let engine = &self.engine;
        let at_least_one = [
            ("policy.fuel", policy.fuel),
            ("policy.deadline_ms", policy.deadline_ms),
            ("policy.memory_mb", policy.memory_mb),
            ("policy.stall_steps", u64::from(policy.stall_steps)),
            ("policy.shadow_budget_us", policy.shadow_budget_us),
            ("server.record_trace_mb", self.server.record_trace_mb),
            ("engine.slots", engine.slots as u64),
            ("engine.batch_tokens", engine.batch_tokens as u64),
            ("engine.ubatch_tokens", engine.ubatch_tokens as u64),
            ("engine.kv_block_tokens", engine.kv_block_tokens as u64),
            ("engine.queue_limit", engine.queue_limit as u64),
            ("server.limits.body_bytes", self.server.limits.body_bytes as u64),
        ];
        if let Some((key, _)) = at_least_one.iter().find(|(_, value)| *value == 0) {
            return Err(Invalid::new(key, format!("`{key}` must be at least 1")));
        }
        if engine.cache_ram_mib < -1 {
            return Err(Invalid::new(
                "engine.cache_ram_mib",
                "`engine.cache_ram_mib` must be -1 (no bound), 0 (no prefix cache) or more",
            ));
        }
        if engine.slots > 1024 {
            return Err(Invalid::new("engine.slots", "`engine.slots` must be at most 1024"));
        }
        let model = &self.model;
        for (key, tokens) in
            [("model.image_min_tokens", model.image_min_tokens), ("model.image_max_tokens", model.image_max_tokens)]
        {
            if tokens.is_some_and(|tokens| !IMAGE_TOKENS.contains(&tokens)) {
                let (least, most) = (IMAGE_TOKENS.start(), IMAGE_TOKENS.end());
                return Err(Invalid::new(key, format!("`{key}` must be {least} to {most}")));
            }
        }
        if let (Some(least), Some(most)) = (model.image_min_tokens, model.image_max_tokens)
            && least > most
        {
            return Err(Invalid::new(
                "model.image_min_tokens",
                format!("`model.image_min_tokens` ({least}) must not exceed `model.image_max_tokens` ({most})"),
            ));
        }
        if let Err(error) = self.model.device.parse::<Device>() {
            return Err(Invalid::new("model.device", format!("`model.device`: {error}")));
        }
        if self.server.host.is_empty() {
            return Err(Invalid::new("server.host", "`server.host` must not be empty"));
        }
        if self.server.slot_save_path.as_ref().is_some_and(|folder| folder.as_os_str().is_empty()) {
            return Err(Invalid::new(
                "server.slot_save_path",
                "`server.slot_save_path` must not be empty (leave it out to serve without slot files)",
            ));
        }
        if self.server.api_key.as_deref() == Some("") {
            return Err(Invalid::new(
                "server.api_key",
                "`server.api_key` must not be empty (leave it out to serve without a key)",
            ));
        }
        let defaults = &self.defaults;
        if defaults.n_predict < -1 {
            return Err(Invalid::new("defaults.n_predict", "`defaults.n_predict` must be -1 (no limit) or more"));
        }
        if !defaults.temperature.is_finite() {
            return Err(Invalid::new("defaults.temperature", "`defaults.temperature` must be a finite number"));
        }
        let finite = [
            ("top_p", defaults.top_p),
            ("min_p", defaults.min_p),
            ("typical_p", defaults.typical_p),
            ("repeat_penalty", defaults.repeat_penalty),
            ("presence_penalty", defaults.presence_penalty),
            ("frequency_penalty", defaults.frequency_penalty),
        ];
        if let Some((key, _)) = finite.iter().find(|(_, value)| !value.is_finite()) {
            let key = format!("defaults.{key}");
            return Err(Invalid::new(&key, format!("`{key}` must be a finite number")));
        }
        if defaults.top_k < 0 {
            return Err(Invalid::new("defaults.top_k", "`defaults.top_k` must be 0 (off) or more"));
        }
        if defaults.repeat_last_n < -1 {
            return Err(Invalid::new(
                "defaults.repeat_last_n",
                "`defaults.repeat_last_n` must be -1 (the context) or more",
            ));
        }
        if !(-1..=i64::from(u32::MAX)).contains(&defaults.seed) {
            return Err(Invalid::new("defaults.seed", "`defaults.seed` must be -1 (random) or 0..=4294967295"));
        }
        let spec = &self.speculative;
        if spec.n_min > spec.n_max {
            return Err(Invalid::new(
                "speculative.n_min",
                format!("`speculative.n_min` ({}) must not exceed `speculative.n_max` ({})", spec.n_min, spec.n_max),
            ));
        }
        if !(0.0..=1.0).contains(&spec.p_min) {
            return Err(Invalid::new("speculative.p_min", "`speculative.p_min` must be in 0..=1"));
        }
        if spec.kind != SpecType::None && spec.draft_model.is_none() {
            return Err(Invalid::new("speculative.type", "`speculative.type` needs `speculative.draft_model`"));
        }
        spec.fixup_sources().map_err(|error| Invalid::new("speculative.fixups", error))?;
        if let Some(lora) = self.lora.iter().find(|lora| !lora.scale.is_finite()) {
            return Err(Invalid::new(
                "lora.scale",
                format!("`lora.scale` of {} must be a finite number", lora.path.display()),
            ));
        }
        let names = adapter_names(&self.lora);
        let model_names: Vec<String> = std::iter::once(self.model.name()).chain(self.model.aliases()).collect();
        for (index, name) in names.iter().enumerate() {
            let taken = if model_names.contains(name) {
                "the model's name"
            } else if names[..index].contains(name) {
                "an earlier adapter's name"
            } else {
                continue;
            };
            return Err(Invalid::new(
                "lora.name",
                format!("`lora.name` {name:?} of {} is {taken}; name them apart", self.lora[index].path.display()),
            ));
        }
        if let Err(error) = self.log.level.parse::<tracing_subscriber::EnvFilter>() {
            return Err(Invalid::new(
                "log.level",
                format!("`log.level` = {:?} is not a log filter: {error}", self.log.level),
            ));
        }
        Ok(())
    }
}

impl SpeculativeConfig {
    /// The fixups to run on the draft, in order.
    pub fn fixup_sources(&self) -> Result<Vec<PluginSource>, String> {
        let default = [DEFAULT_FIXUP.to_owned()];
        let names = self.fixups.as_deref().unwrap_or(&default);
        names
            .iter()
            .map(|name| {
                if looks_like_path(name) {
                    return Ok(PluginSource::Path(PathBuf::from(name)));
                }
                builtin_fixup(name).map(|(name, _)| PluginSource::Builtin(name)).ok_or_else(|| {
                    let names: Vec<&str> = BUILTIN_FIXUPS.iter().map(|(name, _)| *name).collect();
                    format!(
                        "`speculative.fixups` entry \"{name}\" is neither a built-in fixup ({}) nor a path to a .wasm file",
                        names.join(", ")
                    )
                })
            })
            .collect()
    }
}

/// `n`, or one per core when 0.
pub fn threads_or_cores(n: usize) -> usize {
    if n == 0 { std::thread::available_parallelism().map_or(1, usize::from) } else { n }
}

impl PolicyConfig {
    /// The per-call sandbox limits.
    pub fn limits(&self) -> PluginLimits {
        PluginLimits { fuel: self.fuel, deadline_ms: self.deadline_ms, memory_mb: self.memory_mb }
    }

    /// Where the policy comes from: a built-in name or a file path.
    pub fn source(&self) -> Result<PluginSource, String> {
        policy_source(&self.plugin, "policy.plugin")
    }

    /// The configuration of the shadow `shadow`: its plugin and settings
    /// under this policy's limits and fault rules.
    pub fn for_shadow(&self, shadow: &PolicySpec) -> PolicyConfig {
        PolicyConfig {
            plugin: shadow.plugin.clone(),
            settings: shadow.settings.clone(),
            shadow: Vec::new(),
            ..self.clone()
        }
    }
}

/// A policy plugin named by `key` (in errors): a built-in name or a file
/// path.
pub fn policy_source(plugin: &str, key: &str) -> Result<PluginSource, String> {
    if looks_like_path(plugin) {
        return Ok(PluginSource::Path(PathBuf::from(plugin)));
    }
    match builtin_policy(plugin) {
        Some((name, _)) => Ok(PluginSource::Builtin(name)),
        None => {
            let names: Vec<&str> = BUILTIN_POLICIES.iter().map(|(name, _)| *name).collect();
            Err(format!(
                "`{key}` = \"{plugin}\" is neither a built-in policy ({}) nor a path to a .wasm file",
                names.join(", ")
            ))
        }
    }
}

pub(super) fn looks_like_path(plugin: &str) -> bool {
    plugin.contains('/') || plugin.ends_with(".wasm")
}

/// The line (1-based) where the dotted `key` is set in TOML `text`: a
/// `name = …` line under the key's table header. A best effort for
/// pointing at values that parsed but failed validation.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let (table, name) = key.rsplit_once('.').unwrap_or(("", key));
    let mut current = String::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            current = header.trim_start_matches('[').split(']').next().unwrap_or("").trim().to_owned();
            continue;
        }
        let Some((left, _)) = line.split_once('=') else { continue };
        if current == table && left.trim().trim_matches('"') == name {
            return Some(index + 1);
        }
    }
    None
}
