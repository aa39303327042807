//! The `sluice serve` flags (llama-server's names) and how they override
//! the file.

use std::path::{Path, PathBuf};

use clap::builder::TypedValueParser;
use sluice_kernels::backend::KvType;

use super::schema::{Config, IMAGE_TOKENS, LogFormat, LoraConfig, PolicySpec, ReasoningFormat, SpecType, Thinking};

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
        if flags.slot_save_path.is_some() {
            self.server.slot_save_path.clone_from(&flags.slot_save_path);
        }
        if flags.metrics {
            self.server.metrics = true;
        }
        if let Some(slots) = flags.slots_endpoint() {
            self.server.slots = slots;
        }
        if flags.model.is_some() {
            self.model.path.clone_from(&flags.model);
        }
        if flags.mmproj.is_some() {
            self.model.mmproj.clone_from(&flags.mmproj);
        }
        if flags.image_min_tokens.is_some() {
            self.model.image_min_tokens = flags.image_min_tokens;
        }
        if flags.image_max_tokens.is_some() {
            self.model.image_max_tokens = flags.image_max_tokens;
        }
        if flags.alias.is_some() {
            self.model.alias.clone_from(&flags.alias);
        }
        if flags.tags.is_some() {
            self.model.tags.clone_from(&flags.tags);
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
            // llama-server's -c is the whole KV cache: with -np given and no
            // unified cache, each slot gets its share (llama-server also
            // rounds the share up to a multiple of 256; sluice does not).
            let share = flags.parallel.is_some() && !flags.kv_unified;
            self.engine.ctx = if share { ctx / self.engine.slots.max(1) } else { ctx };
        }
        if let Some(per_slot) = flags.kv_unified_per_slot {
            self.engine.ctx = per_slot;
        }
        if let Some(batch) = flags.batch_size {
            self.engine.batch_tokens = batch;
        }
        if let Some(ubatch) = flags.ubatch_size {
            self.engine.ubatch_tokens = ubatch;
        }
        if let Some(keep) = flags.keep {
            self.defaults.n_keep = keep;
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
        // llama-server's `verbose` default is verbosity above 9.
        if flags.verbose || flags.verbosity.is_some_and(|verbosity| verbosity > 9) {
            self.defaults.verbose = true;
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
        if let Some(format) = &flags.reasoning_format {
            self.defaults.reasoning_format = ReasoningFormat::parse(format).ok_or_else(|| {
                format!("--reasoning-format {format}: expected none, deepseek, deepseek-legacy or auto")
            })?;
        }
        if let Some(mode) = &flags.reasoning {
            self.defaults.reasoning =
                Thinking::parse(mode).ok_or_else(|| format!("--reasoning {mode}: expected on, off or auto"))?;
        }
        let defaults = &mut self.defaults;
        let sampling = [
            (&mut defaults.top_p, flags.top_p),
            (&mut defaults.min_p, flags.min_p),
            (&mut defaults.typical_p, flags.typical_p),
            (&mut defaults.repeat_penalty, flags.repeat_penalty),
            (&mut defaults.presence_penalty, flags.presence_penalty),
            (&mut defaults.frequency_penalty, flags.frequency_penalty),
        ];
        for (target, value) in sampling {
            if let Some(value) = value {
                *target = value;
            }
        }
        if let Some(top_k) = flags.top_k {
            defaults.top_k = top_k;
        }
        if let Some(last_n) = flags.repeat_last_n {
            defaults.repeat_last_n = last_n;
        }
        if let Some(mib) = flags.cache_ram {
            self.engine.cache_ram_mib = mib;
        }
        if flags.cache_ram == Some(0) {
            // llama-server's "no prompt cache"; other sizes are moot: the
            // prefix cache lives in the KV pool.
            self.engine.prefix_cache = false;
        }
        if let Some(kv_type) = flags.cache_type_k {
            self.engine.cache_type_k = kv_type;
        }
        if let Some(kv_type) = flags.cache_type_v {
            self.engine.cache_type_v = kv_type;
        }
        if flags.swa_full {
            self.engine.swa_full = true;
        }
        if let Some(tokens) = flags.checkpoint_min_step {
            self.engine.state_snapshot_tokens = tokens;
        }
        match (flags.context_shift, flags.no_context_shift) {
            (true, _) => self.engine.context_shift = true,
            (_, true) => self.engine.context_shift = false,
            _ => {}
        }
        if let Some(seconds) = flags.sse_ping_interval {
            self.server.sse_ping_interval = seconds;
        }
        if let Some(seconds) = flags.timeout {
            self.server.timeouts.body_s = seconds;
            self.server.timeouts.send_s = seconds;
        }
        if let Some(path) = &flags.api_key_file {
            self.server.api_key = Some(read_api_key(path)?);
        }
        if let Some(path) = &flags.chat_template_file {
            let source = std::fs::read_to_string(path)
                .map_err(|error| format!("--chat-template-file {}: {error}", path.display()))?;
            self.model.chat_template = Some(source);
        }
        if let Some(level) = flags.log_level() {
            self.log.level = level.to_owned();
        }
        match (flags.log_jsonl, flags.no_log_jsonl) {
            (true, _) => self.log.format = LogFormat::Json,
            (_, true) => self.log.format = LogFormat::Text,
            _ => {}
        }
        for path in &flags.lora {
            self.lora.push(LoraConfig { path: path.clone(), scale: 1.0, name: None });
        }
        for scaled in &flags.lora_scaled {
            for item in scaled.split(',') {
                let (path, scale) = item
                    .rsplit_once(':')
                    .and_then(|(path, scale)| Some((path, scale.parse::<f32>().ok()?)))
                    .ok_or_else(|| format!("--lora-scaled {item}: expected FILE:SCALE"))?;
                self.lora.push(LoraConfig { path: PathBuf::from(path), scale, name: None });
            }
        }
        if flags.lora_init_without_apply {
            self.lora.iter_mut().for_each(|lora| lora.scale = 0.0);
        }
        if !flags.policy_shadow.is_empty() {
            self.policy.shadow = flags
                .policy_shadow
                .iter()
                .map(|spec| policy_spec(spec, "--policy-shadow"))
                .collect::<Result<_, _>>()?;
        }
        if flags.plugin_dir.is_some() {
            self.policy.plugin_dir.clone_from(&flags.plugin_dir);
        }
        if flags.record_trace.is_some() {
            self.server.record_trace.clone_from(&flags.record_trace);
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
    /// A shadow policy (repeatable, at most 4): a built-in name or a .wasm
    /// path, then its settings, e.g. `cohort,max_members=4`
    /// (`[[policy.shadow]]`; given, it replaces the file's).
    #[arg(long, value_name = "NAME|PATH[,K=V...]")]
    pub policy_shadow: Vec<String>,
    /// The folder `.wasm` paths sent to the admin API must lie in
    /// (`policy.plugin_dir`); without it the admin API loads built-in
    /// policies only.
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Record every step's view and decision to FILE (`server.record_trace`).
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<PathBuf>,
    /// Model file, GGUF (`model.path`).
    #[arg(short = 'm', long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Vision projector, GGUF (`model.mmproj`): image input.
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// Resize images to at least N output rows (`model.image_min_tokens`).
    #[arg(long, value_name = "N", value_parser = image_tokens())]
    pub image_min_tokens: Option<u32>,
    /// Resize images to at most N output rows (`model.image_max_tokens`).
    #[arg(long, value_name = "N", value_parser = image_tokens())]
    pub image_max_tokens: Option<u32>,
    /// Address to listen on, or a comma-separated list (`server.host`).
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on; 0 = any free port (`server.port`).
    #[arg(long)]
    pub port: Option<u16>,
    /// Slots: requests decoded together (`engine.slots`; also `-np`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024).map(|n| n as usize))]
    pub parallel: Option<usize>,
    /// Context in tokens, as llama-server counts it: with -np given (and no
    /// --kv-unified), shared out among the slots; else each slot's; 0 = the
    /// model's, for each slot (`engine.ctx`, which is always per slot).
    #[arg(short = 'c', long, value_name = "N")]
    pub ctx_size: Option<usize>,
    /// With -c: every slot may use all of it, as llama-server's unified KV
    /// cache (also `-kvu`).
    #[arg(long, overrides_with = "no_kv_unified")]
    pub kv_unified: bool,
    /// Each slot's context, whatever -c says (`engine.ctx`).
    #[arg(long, value_name = "N")]
    pub kv_unified_per_slot: Option<usize>,
    /// With -c and -np: each slot gets its share (also `-no-kvu`).
    #[arg(long, overrides_with = "kv_unified")]
    pub no_kv_unified: bool,
    /// Most tokens per step (`engine.batch_tokens`).
    #[arg(short = 'b', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub batch_size: Option<usize>,
    /// Most rows one forward pass runs: a step of more runs as several
    /// passes, which bounds activation memory (`engine.ubatch_tokens`; also
    /// `-ub`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pub ubatch_size: Option<usize>,
    /// Default prompt tokens a context shift keeps; -1 = the whole prompt
    /// (`defaults.n_keep`).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    pub keep: Option<i64>,
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
    /// Model names reported by the API, comma-separated; the first in
    /// sorted order is the model's id (`model.alias`; also `-a`).
    #[arg(long, value_name = "NAMES")]
    pub alias: Option<String>,
    /// Informational model tags, comma-separated (`model.tags`).
    #[arg(long, value_name = "TAGS")]
    pub tags: Option<String>,
    /// Allowed CORS origins: "*", "localhost" or an origin (`server.cors_origins`).
    #[arg(long, value_name = "ORIGINS")]
    pub cors_origins: Option<String>,
    /// API key required on every endpoint but /health (`server.api_key`).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Serve /metrics (`server.metrics`; off by default, as in llama-server).
    #[arg(long)]
    pub metrics: bool,
    /// Serve /slots (`server.slots`; on by default).
    #[arg(long, overrides_with = "no_slots")]
    pub slots: bool,
    /// Answer /slots with 501.
    #[arg(long, overrides_with = "slots")]
    pub no_slots: bool,
    /// Folder of slot files for `POST /slots/{id}?action=save|restore`
    /// (`server.slot_save_path`).
    #[arg(long, value_name = "DIR")]
    pub slot_save_path: Option<PathBuf>,
    /// Chat template: a llama.cpp built-in name (chatml, llama3, …) or
    /// Jinja source (`model.chat_template`).
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
    /// Where chat replies put a `<think>` block: none (left in the
    /// content), deepseek (in `reasoning_content`), deepseek-legacy (also
    /// left in streamed content) or auto, as deepseek
    /// (`defaults.reasoning_format`).
    #[arg(long, value_name = "FORMAT")]
    pub reasoning_format: Option<String>,
    /// The chat template's `enable_thinking`: off (false), on or auto
    /// (true) (`defaults.reasoning`; also `-rea`).
    #[arg(long, value_name = "on|off|auto")]
    pub reasoning: Option<String>,
    /// Most drafted tokens per step (`speculative.n_max`).
    #[arg(long, value_name = "N")]
    pub spec_draft_n_max: Option<u32>,
    /// Fewest drafted tokens per step (`speculative.n_min`).
    #[arg(long, value_name = "N")]
    pub spec_draft_n_min: Option<u32>,
    /// Drafting stops below this draft probability (`speculative.p_min`).
    #[arg(long, value_name = "P")]
    pub spec_draft_p_min: Option<f32>,
    /// Default top-k; 0 = off (`defaults.top_k`).
    #[arg(long, value_name = "N")]
    pub top_k: Option<i32>,
    /// Default top-p; 1 = off (`defaults.top_p`).
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Default min-p; 0 = off (`defaults.min_p`).
    #[arg(long, value_name = "P")]
    pub min_p: Option<f32>,
    /// Default locally typical p; 1 = off (`defaults.typical_p`; also `--typical`).
    #[arg(long, value_name = "P")]
    pub typical_p: Option<f32>,
    /// Default repeat penalty; 1 = off (`defaults.repeat_penalty`).
    #[arg(long, value_name = "X")]
    pub repeat_penalty: Option<f32>,
    /// Default look-back of the penalties; -1 = the context
    /// (`defaults.repeat_last_n`).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub repeat_last_n: Option<i64>,
    /// Default presence penalty (`defaults.presence_penalty`).
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Default frequency penalty (`defaults.frequency_penalty`).
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Most MiB of KV the prefix cache keeps for finished requests (also
    /// `-cram`; `engine.cache_ram_mib`): -1 = no bound, 0 turns the prefix
    /// cache off (`engine.prefix_cache`).
    #[arg(long, value_name = "MIB", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    pub cache_ram: Option<i64>,
    /// How the KV cache holds keys: f16, or q8_0 in about half the memory
    /// (`engine.cache_type_k`; also `-ctk`).
    #[arg(long, value_name = "TYPE")]
    pub cache_type_k: Option<KvType>,
    /// How the KV cache holds values: f16 or q8_0 (`engine.cache_type_v`;
    /// also `-ctv`).
    #[arg(long, value_name = "TYPE")]
    pub cache_type_v: Option<KvType>,
    /// When a slot's context is full, drop the older half of what follows
    /// `n_keep` and go on generating (`engine.context_shift`).
    #[arg(long, overrides_with = "no_context_shift")]
    pub context_shift: bool,
    /// Stop a request whose slot's context is full (the default).
    #[arg(long, overrides_with = "context_shift")]
    pub no_context_shift: bool,
    /// Sliding-window layers keep every cell instead of only their window
    /// (`engine.swa_full`): more KV memory, prefix cache and slot files on
    /// such models.
    #[arg(long)]
    pub swa_full: bool,
    /// Prompt tokens between the prefix cache's snapshots of a recurrent
    /// model's state (also `-cms`; `engine.state_snapshot_tokens`; 0 = only
    /// near a prompt's end and where a request ends).
    #[arg(long, value_name = "N")]
    pub checkpoint_min_step: Option<usize>,
    /// Seconds of silence before an SSE stream gets a comment; 0 = never
    /// (`server.sse_ping_interval`).
    #[arg(long, value_name = "SECONDS")]
    pub sse_ping_interval: Option<u64>,
    /// Seconds a request body may take to arrive, and a response write may
    /// wait for a client that stopped reading (`server.timeouts.body_s` and
    /// `send_s`; llama-server's read/write timeout, also `-to`).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// Read the API key from this file: its first non-empty line.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Read the chat template (Jinja) from this file (`model.chat_template`).
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// Log everything (`log.level = "debug"`; also `--log-verbose`).
    #[arg(short = 'v', long, visible_alias = "log-verbose")]
    pub verbose: bool,
    /// llama-server's verbosity threshold (also `-lv`): 0–1 errors, 2
    /// warnings, 3 information, 4 and up everything (`log.level`).
    #[arg(long, value_name = "N", visible_alias = "log-verbosity")]
    pub verbosity: Option<u8>,
    /// No logs (`log.level = "off"`).
    #[arg(long)]
    pub log_disable: bool,
    /// Logs as JSON lines (`log.format = "json"`).
    #[arg(long, overrides_with = "no_log_jsonl")]
    pub log_jsonl: bool,
    /// Logs as text lines (`log.format = "text"`).
    #[arg(long, overrides_with = "log_jsonl")]
    pub no_log_jsonl: bool,
    /// LoRA adapter, scale 1 (`[[lora]]`; repeatable, comma-separated).
    #[arg(long, value_name = "FILE[,FILE…]", value_delimiter = ',')]
    pub lora: Vec<PathBuf>,
    /// LoRA adapters with scales, `FILE:SCALE[,…]`.
    #[arg(long, value_name = "FILE:SCALE")]
    pub lora_scaled: Vec<String>,
    /// Load the adapters at scale 0 (`POST /lora-adapters` or a request's
    /// `lora` applies them).
    #[arg(long)]
    pub lora_init_without_apply: bool,
}

impl Overrides {
    fn slots_endpoint(&self) -> Option<bool> {
        match (self.slots, self.no_slots) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    /// The `log.level` the logging flags ask for, the most specific first.
    fn log_level(&self) -> Option<&'static str> {
        if self.log_disable {
            return Some("off");
        }
        if let Some(verbosity) = self.verbosity {
            return Some(match verbosity {
                0 | 1 => "error",
                2 => "warn",
                3 => "info",
                _ => "debug",
            });
        }
        self.verbose.then_some("debug")
    }

    fn cache_prompt_default(&self) -> Option<bool> {
        match (self.cache_prompt, self.no_cache_prompt) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// llama-server's key file holds one key per line; sluice takes one key.
fn read_api_key(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("--api-key-file {}: {error}", path.display()))?;
    let mut keys = text.lines().map(str::trim).filter(|line| !line.is_empty());
    match (keys.next(), keys.next()) {
        (Some(key), None) => Ok(key.to_owned()),
        (None, _) => Err(format!("--api-key-file {}: the file holds no key", path.display())),
        (Some(_), Some(_)) => {
            Err(format!("--api-key-file {}: sluice takes one API key, the file holds several", path.display()))
        }
    }
}

/// A policy named on the command line, `NAME|PATH[,KEY=VALUE...]`
/// (`--policy-shadow`, the lab's `--policy`): values are TOML (`500`,
/// `true`, `"text"`) or else bare text.
pub fn policy_spec(spec: &str, flag: &str) -> Result<PolicySpec, String> {
    let mut parts = spec.split(',');
    let plugin = parts.next().unwrap_or_default().trim();
    if plugin.is_empty() {
        return Err(format!("{flag} {spec}: expected NAME|PATH[,KEY=VALUE...]"));
    }
    let mut settings = toml::Table::new();
    for pair in parts {
        let (key, value) = pair.split_once('=').ok_or_else(|| format!("{flag} {spec}: `{pair}` is not KEY=VALUE"))?;
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut table| table.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_owned()));
        settings.insert(key.trim().to_owned(), value);
    }
    Ok(PolicySpec { plugin: plugin.to_owned(), settings })
}

/// An image-token bound's range (`model.image_*_tokens`).
fn image_tokens() -> impl clap::builder::TypedValueParser<Value = u32> {
    clap::value_parser!(u32).range(i64::from(*IMAGE_TOKENS.start())..=i64::from(*IMAGE_TOKENS.end()))
}
