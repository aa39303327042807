//! The TOML configuration (`config/sluice.toml`), the `sluice serve` flags
//! that override it, and their validation. Errors name the file, the line
//! and the key.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::builder::TypedValueParser;
use serde::Deserialize;

use crate::engine::EngineConfig;
use crate::plugins::{BUILTIN_FIXUPS, BUILTIN_POLICIES, PluginLimits, PluginSource, builtin_fixup, builtin_policy};

/// The model `sluice serve` loads when neither the file nor `-m` names one
/// (relative to the working directory; `cargo xtask` fetches it there).
pub const DEFAULT_MODEL: &str = "target/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    /// `[engine]`: slots, context and batching (the engine's own settings;
    /// the policy's fault rules and the thread count come from other sections).
    pub engine: EngineConfig,
    #[serde(default)]
    pub defaults: RequestDefaults,
    #[serde(default)]
    pub policy: PolicyConfig,
    #[serde(default)]
    pub speculative: SpeculativeConfig,
    #[serde(default)]
    pub lora: Vec<LoraConfig>,
    #[serde(default)]
    pub log: LogConfig,
}

/// `[server]`: the HTTP listener.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks any free port (the log says which).
    pub port: u16,
    /// When set, every endpoint but `/health` needs this key.
    pub api_key: Option<String>,
    /// Threads serving HTTP (tokenizing, templating, JSON); 0 = one per core.
    pub threads_http: usize,
    /// Serve `/metrics` (501 otherwise).
    pub metrics: bool,
    /// Serve `/slots` (501 otherwise).
    pub slots: bool,
    /// Seconds of silence before an SSE stream gets a `:` comment; 0 = never.
    pub sse_ping_interval: u64,
    /// `Access-Control-Allow-Origin`: "*" echoes the request's origin (with
    /// credentials), "localhost" echoes only local origins, anything else is
    /// sent as it is.
    pub cors_origins: String,
    pub limits: ServerLimits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            threads_http: 0,
            metrics: true,
            slots: true,
            sse_ping_interval: 30,
            cors_origins: "*".into(),
            limits: ServerLimits::default(),
        }
    }
}

/// `[server.limits]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerLimits {
    /// Largest request body accepted; larger ones get 413.
    pub body_bytes: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits { body_bytes: 16 << 20 }
    }
}

/// `[model]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// The GGUF file; relative paths are relative to the config file.
    pub path: Option<PathBuf>,
    /// The name the API reports (default: the file name).
    pub alias: Option<String>,
    /// A Jinja chat template, or `chatml`, used instead of the model's own.
    pub chat_template: Option<String>,
    /// Kernel threads; 0 = one per core.
    pub threads: usize,
}

impl ModelConfig {
    /// The model file to load.
    pub fn path(&self) -> PathBuf {
        self.path.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL))
    }

    /// The model's name in responses: the alias, else the file name.
    pub fn name(&self) -> String {
        if let Some(alias) = &self.alias {
            return alias.clone();
        }
        let path = self.path();
        path.file_name().map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned())
    }
}

/// `[defaults]`: what a request gets for fields it leaves out.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RequestDefaults {
    /// Tokens to generate; -1 = until a stop or the context is full.
    pub n_predict: i64,
    pub temperature: f32,
    /// -1 = a random seed per request.
    pub seed: i64,
    /// Reuse cached prompt prefixes.
    pub cache_prompt: bool,
}

impl Default for RequestDefaults {
    fn default() -> Self {
        RequestDefaults { n_predict: -1, temperature: 0.8, seed: -1, cache_prompt: true }
    }
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

impl OnFault {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFault::FailClosed => "fail-closed",
            OnFault::Fallback => "fallback",
        }
    }
}

/// `[speculative]`: draft decoding.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpeculativeConfig {
    #[serde(rename = "type")]
    pub kind: SpecType,
    /// The draft model (GGUF); relative to the config file.
    pub draft_model: Option<PathBuf>,
    /// Most tokens drafted per step.
    pub n_max: u32,
    /// Fewest drafted tokens worth verifying.
    pub n_min: u32,
    /// Drafting stops below this draft probability.
    pub p_min: f32,
    /// `draft-fixup` plugins run on the draft's metadata, in order: built-in
    /// names or `.wasm` paths (relative to the config file). Unset means
    /// `["mrope-temporal"]`; `[]` runs none.
    pub fixups: Option<Vec<String>>,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig {
            kind: SpecType::None,
            draft_model: None,
            // llama-server's defaults.
            n_max: 3,
            n_min: 0,
            p_min: 0.0,
            fixups: None,
        }
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

/// The fixup run on every draft unless `speculative.fixups` says otherwise.
pub const DEFAULT_FIXUP: &str = "mrope-temporal";

/// `speculative.type` (llama-server's `--spec-type` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecType {
    None,
    DraftSimple,
    /// `dflash` (or llama-server's `draft-dflash`).
    #[serde(alias = "dflash")]
    DraftDflash,
}

impl SpecType {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "none" => Some(SpecType::None),
            "draft-simple" => Some(SpecType::DraftSimple),
            "dflash" | "draft-dflash" => Some(SpecType::DraftDflash),
            _ => None,
        }
    }
}

/// `[[lora]]`: one adapter loaded at start.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapter (GGUF); relative to the config file.
    pub path: PathBuf,
    /// Global scale until `POST /lora-adapters` changes it.
    #[serde(default = "one")]
    pub scale: f32,
}

fn one() -> f32 {
    1.0
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter, e.g. `info` or `sluice=debug`.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into(), format: LogFormat::Text }
    }
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

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
    fn new(key: &str, message: impl Into<String>) -> Self {
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
        let engine = &self.engine;
        let at_least_one = [
            ("policy.fuel", policy.fuel),
            ("policy.deadline_ms", policy.deadline_ms),
            ("policy.memory_mb", policy.memory_mb),
            ("policy.stall_steps", u64::from(policy.stall_steps)),
            ("engine.slots", engine.slots as u64),
            ("engine.batch_tokens", engine.batch_tokens as u64),
            ("engine.kv_block_tokens", engine.kv_block_tokens as u64),
            ("engine.queue_limit", engine.queue_limit as u64),
            ("server.limits.body_bytes", self.server.limits.body_bytes as u64),
        ];
        if let Some((key, _)) = at_least_one.iter().find(|(_, value)| *value == 0) {
            return Err(Invalid::new(key, format!("`{key}` must be at least 1")));
        }
        if engine.slots > 1024 {
            return Err(Invalid::new("engine.slots", "`engine.slots` must be at most 1024"));
        }
        if self.server.host.is_empty() {
            return Err(Invalid::new("server.host", "`server.host` must not be empty"));
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
        if let Err(error) = self.log.level.parse::<tracing_subscriber::EnvFilter>() {
            return Err(Invalid::new(
                "log.level",
                format!("`log.level` = {:?} is not a log filter: {error}", self.log.level),
            ));
        }
        Ok(())
    }

    /// Features the file may configure that sluice cannot serve yet: a
    /// configured one refuses the start rather than being ignored.
    pub fn check_supported(&self) -> Result<(), String> {
        if let Some(lora) = self.lora.first() {
            return Err(format!(
                "LoRA adapters ([[lora]], --lora, --lora-scaled) are not supported yet: {}",
                lora.path.display()
            ));
        }
        Ok(())
    }

    /// The engine's settings, given the model's training context.
    pub fn engine_config(&self, n_ctx_train: usize) -> EngineConfig {
        EngineConfig {
            ctx: if self.engine.ctx == 0 { n_ctx_train } else { self.engine.ctx },
            threads: threads_or_cores(self.model.threads),
            stall_steps: self.policy.stall_steps,
            on_fault: self.policy.on_fault,
            ..self.engine.clone()
        }
    }

    /// Apply command-line flags (they win over the file), then validate.
    pub fn apply(&mut self, flags: &Overrides) -> Result<(), String> {
        let set = |target: &mut String, value: &Option<String>| {
            if let Some(value) = value {
                target.clone_from(value);
            }
        };
        set(&mut self.policy.plugin, &flags.policy);
        set(&mut self.server.host, &flags.host);
        if let Some(port) = flags.port {
            self.server.port = port;
        }
        if flags.api_key.is_some() {
            self.server.api_key.clone_from(&flags.api_key);
        }
        if let Some(threads) = flags.threads_http {
            self.server.threads_http = threads;
        }
        set(&mut self.server.cors_origins, &flags.cors_origins);
        if flags.metrics {
            self.server.metrics = true;
        }
        if let Some(slots) = flags.slots_endpoint() {
            self.server.slots = slots;
        }
        if flags.model.is_some() {
            self.model.path.clone_from(&flags.model);
        }
        if flags.alias.is_some() {
            self.model.alias.clone_from(&flags.alias);
        }
        if flags.chat_template.is_some() {
            self.model.chat_template.clone_from(&flags.chat_template);
        }
        if let Some(threads) = flags.threads {
            self.model.threads = threads;
        }
        if let Some(parallel) = flags.parallel {
            self.engine.slots = parallel;
        }
        if let Some(ctx) = flags.ctx_size {
            self.engine.ctx = ctx;
        }
        if let Some(batch) = flags.batch_size {
            self.engine.batch_tokens = batch;
        }
        if let Some(n_predict) = flags.n_predict {
            self.defaults.n_predict = n_predict;
        }
        if let Some(temperature) = flags.temp {
            self.defaults.temperature = temperature;
        }
        if let Some(seed) = flags.seed {
            self.defaults.seed = seed;
        }
        if let Some(cache_prompt) = flags.cache_prompt_default() {
            self.defaults.cache_prompt = cache_prompt;
        }
        if flags.model_draft.is_some() {
            self.speculative.draft_model.clone_from(&flags.model_draft);
        }
        if let Some(kind) = &flags.spec_type {
            self.speculative.kind = SpecType::parse(kind)
                .ok_or_else(|| format!("--spec-type {kind}: expected none, draft-simple or dflash"))?;
        }
        if let Some(n_max) = flags.spec_draft_n_max {
            self.speculative.n_max = n_max;
        }
        if let Some(n_min) = flags.spec_draft_n_min {
            self.speculative.n_min = n_min;
        }
        if let Some(p_min) = flags.spec_draft_p_min {
            self.speculative.p_min = p_min;
        }
        for path in &flags.lora {
            self.lora.push(LoraConfig { path: path.clone(), scale: 1.0 });
        }
        for scaled in &flags.lora_scaled {
            for item in scaled.split(',') {
                let (path, scale) = item
                    .rsplit_once(':')
                    .and_then(|(path, scale)| Some((path, scale.parse::<f32>().ok()?)))
                    .ok_or_else(|| format!("--lora-scaled {item}: expected FILE:SCALE"))?;
                self.lora.push(LoraConfig { path: PathBuf::from(path), scale });
            }
        }
        self.validate().map_err(|invalid| invalid.to_string())
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

/// `sluice serve` flags. Names follow llama-server where the feature
/// exists; every flag overrides the matching config key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// Scheduling policy: a built-in name or a path to a .wasm component
    /// (`policy.plugin`).
    #[arg(long, value_name = "NAME|PATH")]
    pub policy: Option<String>,
    /// Model file, GGUF (`model.path`).
    #[arg(short = 'm', long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Address to listen on (`server.host`).
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on; 0 = any free port (`server.port`).
    #[arg(long)]
    pub port: Option<u16>,
    /// Slots: requests decoded together (`engine.slots`; also `-np`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024).map(|n| n as usize))]
    pub parallel: Option<usize>,
    /// Context of each slot in tokens; 0 = the model's (`engine.ctx`).
    #[arg(short = 'c', long, value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Most tokens per step (`engine.batch_tokens`).
    #[arg(short = 'b', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub batch_size: Option<usize>,
    /// Default tokens to generate per request; -1 = no limit
    /// (`defaults.n_predict`).
    #[arg(short = 'n', long, value_name = "N", allow_negative_numbers = true)]
    pub n_predict: Option<i64>,
    /// Kernel threads; 0 = one per core (`model.threads`).
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,
    /// HTTP threads; 0 = one per core (`server.threads_http`).
    #[arg(long, value_name = "N")]
    pub threads_http: Option<usize>,
    /// Default temperature (`defaults.temperature`).
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temp: Option<f32>,
    /// Default seed; -1 = random (`defaults.seed`).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Model name reported by the API (`model.alias`).
    #[arg(long, value_name = "NAME")]
    pub alias: Option<String>,
    /// Allowed CORS origins: "*", "localhost" or an origin (`server.cors_origins`).
    #[arg(long, value_name = "ORIGINS")]
    pub cors_origins: Option<String>,
    /// API key required on every endpoint but /health (`server.api_key`).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Serve /metrics (`server.metrics`; on by default).
    #[arg(long)]
    pub metrics: bool,
    /// Serve /slots (`server.slots`; on by default).
    #[arg(long, overrides_with = "no_slots")]
    pub slots: bool,
    /// Answer /slots with 501.
    #[arg(long, overrides_with = "slots")]
    pub no_slots: bool,
    /// Chat template: Jinja source or `chatml` (`model.chat_template`).
    #[arg(long, value_name = "TEMPLATE")]
    pub chat_template: Option<String>,
    /// Reuse cached prompt prefixes by default (`defaults.cache_prompt`).
    #[arg(long, overrides_with = "no_cache_prompt")]
    pub cache_prompt: bool,
    /// Do not reuse cached prompt prefixes unless a request asks.
    #[arg(long, overrides_with = "cache_prompt")]
    pub no_cache_prompt: bool,
    /// Draft model for speculative decoding (`speculative.draft_model`;
    /// also `-md`).
    #[arg(long, value_name = "FILE")]
    pub model_draft: Option<PathBuf>,
    /// Speculative decoding type: draft-simple or dflash (`speculative.type`;
    /// by default the draft's architecture decides).
    #[arg(long, value_name = "TYPE")]
    pub spec_type: Option<String>,
    /// Most drafted tokens per step (`speculative.n_max`).
    #[arg(long, value_name = "N")]
    pub spec_draft_n_max: Option<u32>,
    /// Fewest drafted tokens per step (`speculative.n_min`).
    #[arg(long, value_name = "N")]
    pub spec_draft_n_min: Option<u32>,
    /// Drafting stops below this draft probability (`speculative.p_min`).
    #[arg(long, value_name = "P")]
    pub spec_draft_p_min: Option<f32>,
    /// LoRA adapter, scale 1 (`[[lora]]`; repeatable). Not supported yet.
    #[arg(long, value_name = "FILE")]
    pub lora: Vec<PathBuf>,
    /// LoRA adapters with scales, `FILE:SCALE[,…]`. Not supported yet.
    #[arg(long, value_name = "FILE:SCALE")]
    pub lora_scaled: Vec<String>,
}

impl Overrides {
    fn slots_endpoint(&self) -> Option<bool> {
        match (self.slots, self.no_slots) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    fn cache_prompt_default(&self) -> Option<bool> {
        match (self.cache_prompt, self.no_cache_prompt) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// Rewrite llama-server's spellings that clap cannot express, in the
/// arguments after `serve`: the two-letter short flags `-np` and `-md`, and
/// underscores in long flag names (`--ctx_size`).
pub fn llama_style_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut serving = false;
    args.into_iter()
        .map(|arg| {
            if !serving {
                serving = arg == "serve";
                return arg;
            }
            let Some(text) = arg.to_str() else { return arg };
            match text {
                "-np" => "--parallel".into(),
                "-md" => "--model-draft".into(),
                _ if text.starts_with("--") => {
                    let (name, value) = text.split_once('=').map_or((text, None), |(name, value)| (name, Some(value)));
                    let name = name.replace('_', "-");
                    match value {
                        Some(value) => format!("{name}={value}").into(),
                        None => name.into(),
                    }
                }
                _ => arg,
            }
        })
        .collect()
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

    #[test]
    fn every_section_parses_with_its_defaults() {
        let config = Config::parse("").expect("valid");
        assert_eq!(config.server, ServerConfig::default());
        assert_eq!((config.server.host.as_str(), config.server.port), ("127.0.0.1", 8080));
        assert_eq!(config.model.path(), PathBuf::from(DEFAULT_MODEL));
        assert_eq!(config.engine, EngineConfig::default());
        assert_eq!(config.defaults, RequestDefaults::default());
        assert_eq!(config.speculative, SpeculativeConfig::default());
        assert!(config.lora.is_empty());
        assert_eq!(config.log.format, LogFormat::Text);
        assert_eq!(config.check_supported(), Ok(()));
        let engine = config.engine_config(8192);
        assert_eq!((engine.slots, engine.ctx, engine.on_fault), (4, 4096, OnFault::FailClosed));
    }

    #[test]
    fn the_shipped_config_is_valid_and_points_at_the_default_model() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/sluice.toml");
        let config = Config::load(&file).expect("config/sluice.toml is valid");
        let model = config.model.path();
        assert!(model.ends_with("../target/models/SmolLM2-135M-Instruct.Q4_1.gguf"), "{}", model.display());
        assert_eq!(config.engine, EngineConfig::default());
        assert_eq!(config.server, ServerConfig::default());
        assert_eq!(config.defaults, RequestDefaults::default());
        assert_eq!(config.check_supported(), Ok(()));
    }

    #[test]
    fn all_sections_are_read() {
        let text = r#"
[server]
host = "0.0.0.0"
port = 0
api_key = "secret"
threads_http = 3
metrics = false
slots = false
sse_ping_interval = 5
[server.limits]
body_bytes = 1024
[model]
path = "m.gguf"
alias = "tiny"
chat_template = "chatml"
threads = 2
[engine]
slots = 2
ctx = 0
batch_tokens = 64
kv_block_tokens = 32
prefix_cache = false
queue_limit = 9
[defaults]
n_predict = 16
temperature = 0.0
seed = 42
cache_prompt = false
[speculative]
type = "draft-simple"
draft_model = "draft.gguf"
n_max = 8
n_min = 2
p_min = 0.5
fixups = ["mrope-temporal", "plugins/extra.wasm"]
[[lora]]
path = "a.gguf"
[[lora]]
path = "b.gguf"
scale = 0.5
[log]
level = "sluice=debug"
format = "json"
"#;
        let config = Config::parse(text).expect("valid");
        assert_eq!(config.server.limits.body_bytes, 1024);
        assert_eq!(config.server.api_key.as_deref(), Some("secret"));
        assert_eq!(config.model.name(), "tiny");
        assert_eq!(config.engine_config(2048).ctx, 2048);
        assert_eq!(config.defaults.seed, 42);
        assert_eq!(config.speculative.kind, SpecType::DraftSimple);
        assert_eq!(config.lora[1], LoraConfig { path: "b.gguf".into(), scale: 0.5 });
        assert_eq!(config.log.format, LogFormat::Json);
        assert_eq!(
            config.speculative.fixup_sources(),
            Ok(vec![PluginSource::Builtin("mrope-temporal"), PluginSource::Path("plugins/extra.wasm".into())])
        );
        assert_eq!(SpeculativeConfig::default().fixup_sources(), Ok(vec![PluginSource::Builtin("mrope-temporal")]));
        assert!(config.check_supported().unwrap_err().contains("a.gguf"));
    }

    #[test]
    fn validation_errors_name_file_line_and_key() {
        let dir = std::env::temp_dir().join(format!("sluice-config-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("bad.toml");
        std::fs::write(&file, "[server]\nport = 1\n\n[engine]\nctx = 10\nslots = 0\n").expect("write config");
        let error = Config::load(&file).unwrap_err().to_string();
        assert_eq!(error, format!("{}: line 6: `engine.slots` must be at least 1", file.display()));
        std::fs::write(&file, "[speculative]\nn_max = 1\nn_min = 2\n").expect("write config");
        let error = Config::load(&file).unwrap_err().to_string();
        assert!(error.contains("line 3: `speculative.n_min` (2) must not exceed"), "{error}");
        std::fs::write(&file, "[[lora]]\nscale = 2.0\n").expect("write config");
        let error = Config::load(&file).unwrap_err().to_string();
        assert!(error.contains("missing field `path`"), "{error}");
        std::fs::remove_dir_all(&dir).expect("clean up");
        for (text, key) in [
            ("[engine]\nbatch_tokens = 0\n", "`engine.batch_tokens` must be at least 1"),
            ("[server]\napi_key = \"\"\n", "`server.api_key` must not be empty"),
            ("[defaults]\nn_predict = -2\n", "`defaults.n_predict` must be -1"),
            ("[defaults]\nseed = 4294967296\n", "`defaults.seed` must be -1"),
            ("[speculative]\ntype = \"draft-simple\"\n", "needs `speculative.draft_model`"),
            ("[speculative]\nfixups = [\"mrope\"]\n", "`speculative.fixups` entry \"mrope\" is neither"),
            ("[log]\nlevel = \"sluice=loud\"\n", "`log.level`"),
        ] {
            let error = Config::parse(text).unwrap_err();
            assert!(error.contains(key), "{text}: {error}");
        }
        let wrong = Config::parse("[speculative]\ntype = \"ngram-simple\"\n").unwrap_err();
        assert!(wrong.contains("line 2") && wrong.contains("draft-simple"), "{wrong}");
    }

    #[test]
    fn relative_model_paths_resolve_against_the_config_file() {
        let dir = std::env::temp_dir().join(format!("sluice-config-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("sluice.toml");
        std::fs::write(&file, "[model]\npath = \"models/m.gguf\"\n[[lora]]\npath = \"/abs/a.gguf\"\n").expect("write");
        let config = Config::load(&file).expect("valid");
        assert_eq!(config.model.path(), dir.join("models/m.gguf"));
        assert_eq!(config.lora[0].path, PathBuf::from("/abs/a.gguf"));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn flags_override_the_file() {
        let mut config = Config::parse("[engine]\nslots = 2\n[server]\nslots = true\n").expect("valid");
        let flags = Overrides {
            parallel: Some(1),
            port: Some(0),
            n_predict: Some(8),
            seed: Some(7),
            no_slots: true,
            no_cache_prompt: true,
            model: Some("x.gguf".into()),
            ..Overrides::default()
        };
        config.apply(&flags).expect("valid flags");
        assert_eq!((config.engine.slots, config.server.port, config.server.slots), (1, 0, false));
        assert_eq!((config.defaults.n_predict, config.defaults.seed, config.defaults.cache_prompt), (8, 7, false));
        assert_eq!(config.model.path(), PathBuf::from("x.gguf"));
        let bad = Overrides { n_predict: Some(-3), ..Overrides::default() };
        assert!(config.apply(&bad).unwrap_err().contains("defaults.n_predict"));
        let scaled = Overrides { lora_scaled: vec!["a.gguf:0.5,b.gguf:1".into()], ..Overrides::default() };
        let mut config = Config::default();
        config.apply(&scaled).expect("valid");
        assert_eq!(config.lora.len(), 2);
        assert_eq!(config.lora[0].scale, 0.5);
        let broken = Overrides { lora_scaled: vec!["a.gguf".into()], ..Overrides::default() };
        assert!(config.apply(&broken).unwrap_err().contains("FILE:SCALE"));
    }

    #[test]
    fn flags_parse_with_llama_server_names() {
        use clap::{Args, FromArgMatches};
        let command = Overrides::augment_args(clap::Command::new("serve"));
        command.clone().debug_assert();
        let args =
            ["serve", "-m", "m.gguf", "-n", "-1", "--temp", "0.5", "--seed", "-1", "--no-slots", "--lora", "a.gguf"];
        let args = llama_style_args(["sluice"].into_iter().chain(args).map(OsString::from)).split_off(1);
        let matches = command.clone().try_get_matches_from(args).expect("flags parse");
        let flags = Overrides::from_arg_matches(&matches).expect("flags convert");
        assert_eq!((flags.model, flags.n_predict, flags.seed), (Some("m.gguf".into()), Some(-1), Some(-1)));
        assert_eq!((flags.temp, flags.no_slots, flags.lora.len()), (Some(0.5), true, 1));
        let args = ["serve", "-np", "0"].map(OsString::from);
        assert!(command.try_get_matches_from(llama_style_args(args)).is_err(), "at least one slot");
    }

    #[test]
    fn llama_server_spellings_are_rewritten_after_serve() {
        let args = ["sluice", "serve", "-np", "4", "-md", "d.gguf", "--ctx_size=128", "--n_predict", "-n", "5"];
        let rewritten = llama_style_args(args.iter().map(OsString::from));
        let rewritten: Vec<&str> = rewritten.iter().map(|arg| arg.to_str().expect("utf-8")).collect();
        assert_eq!(
            rewritten,
            [
                "sluice",
                "serve",
                "--parallel",
                "4",
                "--model-draft",
                "d.gguf",
                "--ctx-size=128",
                "--n-predict",
                "-n",
                "5"
            ]
        );
        let other = llama_style_args(["sluice", "generate", "-np"].iter().map(OsString::from));
        assert_eq!(other, ["sluice", "generate", "-np"].map(OsString::from));
    }
}
