//! The `sluice serve` flags (llama-server's names) and how they override
//! the file.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::TypedValueParser;

use super::schema::{Config, LoraConfig, SpecType};

impl Config {
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
        set(&mut self.model.device, &flags.device);
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
    /// Where the model runs: cpu, cuda or cuda:N (`model.device`).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
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
