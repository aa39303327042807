//! The configuration's schema: every section and key with its default
//! (`config/sluice.toml` documents the same values).

use std::path::PathBuf;

use serde::{Deserialize, Deserializer};
use sluice_kernels::backend::KvType;

use sluice_engine::OnFault;
use sluice_engine::sampling::SamplingParams;
use sluice_plugin_host::PluginLimits;

/// The model `sluice serve` loads when neither the file nor `-m` names one
/// (relative to the working directory; `cargo xtask` fetches it there).
pub const DEFAULT_MODEL: &str = "target/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// What `model.image_min_tokens` and `model.image_max_tokens` may be: the
/// rows of one image go into one prompt, and the Qwen2-VL family's own
/// bound is 4096.
pub const IMAGE_TOKENS: std::ops::RangeInclusive<u32> = 1..=65536;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    /// `[engine]`: slots, context and batching (the engine's settings are
    /// these plus the policy's fault rules, joined at start).
    pub engine: EngineSection,
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
    /// Threads serving HTTP (reading bodies, JSON, SSE; tokenizing and
    /// templating run on tokio's blocking pool); 0 = one per core.
    pub threads_http: usize,
    /// Serve `/metrics` (501 otherwise; off by default, as in llama-server).
    pub metrics: bool,
    /// Serve `/slots` (501 otherwise).
    pub slots: bool,
    /// Seconds of silence before an SSE stream gets a `:` comment; 0 = never.
    pub sse_ping_interval: u64,
    /// Milliseconds a stream waits for its first event before sending its
    /// headers and a `: waiting` comment anyway (a request held in the
    /// queue or by the policy); 0 = at once. A failure before then is a
    /// plain HTTP error, after it an error event.
    pub hold_notice_ms: u64,
    /// `Access-Control-Allow-Origin`: "*" echoes the request's origin (with
    /// credentials), "localhost" echoes only local origins, anything else is
    /// sent as it is.
    pub cors_origins: String,
    /// The folder `POST /slots/{id}?action=save|restore` writes and reads
    /// slot files in; without it the action answers 501.
    pub slot_save_path: Option<PathBuf>,
    /// Write every step's view and the policy's decision here (JSON lines, for
    /// `sluice lab replay`); an existing file is kept as `FILE.1`.
    pub record_trace: Option<PathBuf>,
    /// Size at which the trace moves to `FILE.1` and a new one starts.
    pub record_trace_mb: u64,
    pub limits: ServerLimits,
    pub timeouts: ServerTimeouts,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            threads_http: 0,
            metrics: false,
            slots: true,
            sse_ping_interval: 30,
            hold_notice_ms: 500,
            cors_origins: "*".into(),
            slot_save_path: None,
            record_trace: None,
            record_trace_mb: 256,
            limits: ServerLimits::default(),
            timeouts: ServerTimeouts::default(),
        }
    }
}

/// `[server.limits]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerLimits {
    /// Largest request body accepted; larger ones get 413.
    pub body_bytes: usize,
    /// Most KiB of a stream's events its client may leave unread; past
    /// that the request is ended (a client that stopped reading must not
    /// hold the server's memory); 0 = no bound.
    pub stream_window_kib: usize,
    /// Most probabilities a request may ask for per token (`n_probs`,
    /// `logprobs` on `/v1/completions`, `top_logprobs` on chat); more gets
    /// 400. Each is computed on the engine thread and written out for every
    /// token, so the vocabulary (49,152 for SmolLM2) per token would cost
    /// every other request time and the server gigabytes.
    pub n_probs: usize,
    /// Most MiB a response that is not streamed may hold for its client
    /// while it is generated (its text and probabilities as the JSON it
    /// will send); past that the request is ended with 400; 0 = no bound.
    pub response_mib: usize,
    /// Most MiB of text tokenized at once across requests (tokenizing
    /// holds several times its text); a larger text waits for its turn, up
    /// to 30 s, then gets 503; texts up to 64 KiB never wait; 0 = no bound.
    pub tokenizing_mib: usize,
    /// Most MiB of request bodies over 64 KiB held at once, as bytes and
    /// then as parsed JSON (which holds up to tens of times its text); a
    /// larger body waits for its turn, up to 30 s, then gets 503; 0 = no
    /// bound.
    pub bodies_mib: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            body_bytes: 16 << 20,
            stream_window_kib: 16 << 10,
            n_probs: 100,
            response_mib: 64,
            tokenizing_mib: 16,
            bodies_mib: 32,
        }
    }
}

/// `[server.timeouts]`, in seconds; 0 turns one off.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerTimeouts {
    /// From a request's first byte to the end of its headers.
    pub header_s: u64,
    /// A connection, new or kept alive, waiting for its next request.
    pub idle_s: u64,
    /// Reading a whole request body (llama-server `--timeout`).
    pub body_s: u64,
    /// A response write the client does not take, because it stopped
    /// reading (llama-server `--timeout`); the connection is closed and
    /// its requests cancelled.
    pub send_s: u64,
    /// After a stop signal, how long running and queued requests may go
    /// on before they are ended with an error.
    pub shutdown_s: u64,
}

impl Default for ServerTimeouts {
    fn default() -> Self {
        ServerTimeouts { header_s: 30, idle_s: 60, body_s: 60, send_s: 60, shutdown_s: 10 }
    }
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// The GGUF file; relative paths are relative to the config file.
    pub path: Option<PathBuf>,
    /// Names the API reports, comma-separated; the first in sorted order
    /// is the model's id (default: the file name), as llama-server picks it.
    pub alias: Option<String>,
    /// Informational tags, comma-separated (`/v1/models`).
    pub tags: Option<String>,
    /// A llama.cpp built-in template name (`chatml`, `llama3`, …) or Jinja source, used instead of the model's own.
    pub chat_template: Option<String>,
    /// Kernel threads; 0 = one per core.
    pub threads: usize,
    /// Where the model runs: `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// A vision projector (mmproj GGUF) for image input; relative paths
    /// are relative to the config file.
    pub mmproj: Option<PathBuf>,
    /// Images are resized to at least this many output rows (tokens);
    /// unset: the projector's own bound (8 for the Qwen2-VL family).
    pub image_min_tokens: Option<u32>,
    /// Images are resized to at most this many output rows; unset: the
    /// projector's own bound (4096 for the Qwen2-VL family).
    pub image_max_tokens: Option<u32>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            path: None,
            alias: None,
            tags: None,
            chat_template: None,
            threads: 0,
            device: "cpu".into(),
            mmproj: None,
            image_min_tokens: None,
            image_max_tokens: None,
        }
    }
}

impl ModelConfig {
    /// The model file to load.
    pub fn path(&self) -> PathBuf {
        self.path.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL))
    }

    /// The model's name in responses: the first alias, else the file name.
    pub fn name(&self) -> String {
        if let Some(alias) = self.aliases().into_iter().next() {
            return alias;
        }
        let path = self.path();
        path.file_name().map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned())
    }
}

impl ModelConfig {
    /// The aliases, trimmed, without empty ones or repeats, sorted.
    pub fn aliases(&self) -> Vec<String> {
        comma_set(self.alias.as_deref())
    }

    /// The tags, as the aliases.
    pub fn tags(&self) -> Vec<String> {
        comma_set(self.tags.as_deref())
    }
}

fn comma_set(list: Option<&str>) -> Vec<String> {
    let set: std::collections::BTreeSet<&str> =
        list.unwrap_or_default().split(',').map(str::trim).filter(|item| !item.is_empty()).collect();
    set.into_iter().map(str::to_owned).collect()
}

/// `[engine]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    /// Sequences decoded together (llama-server `-np`).
    pub slots: usize,
    /// Context of each slot in tokens (llama-server `-c`); 0 = the model's
    /// training context.
    pub ctx: usize,
    /// Most tokens one step may process (llama-server `-b`).
    pub batch_tokens: usize,
    /// Most rows one forward pass runs (llama-server `-ub`): a step of more
    /// runs as several passes, with the same results.
    pub ubatch_tokens: usize,
    /// Tokens per KV-cache block.
    pub kv_block_tokens: usize,
    /// How the KV cache holds keys (llama-server `-ctk`): `f16`, or
    /// `q8_0` in about half the memory, each value within about 1/254 of
    /// the largest in its block of 32.
    #[serde(deserialize_with = "kv_type")]
    pub cache_type_k: KvType,
    /// How it holds values (llama-server `-ctv`), as `cache_type_k`.
    #[serde(deserialize_with = "kv_type")]
    pub cache_type_v: KvType,
    /// Share prompt prefixes between requests.
    pub prefix_cache: bool,
    /// Sliding-window layers keep every cell, as the other layers do
    /// (llama-server `--swa-full`), instead of only their window: more KV
    /// memory, but prompts are served from the prefix cache and slot files
    /// can be saved on such models (Gemma 2 and 3).
    pub swa_full: bool,
    /// Most MiB of KV the prefix cache keeps for finished requests
    /// (llama-server `--cache-ram`; -1 = no bound but the KV pool's).
    pub cache_ram_mib: i64,
    /// Prompt tokens between the prefix cache's snapshots of a recurrent
    /// model's state (llama-server `--checkpoint-min-step`; rounded up to
    /// whole KV blocks; 0 = only near a prompt's end and where a request
    /// ends).
    pub state_snapshot_tokens: usize,
    /// When a slot's context is full, drop the older half of what follows
    /// a request's `n_keep` tokens and go on (llama-server
    /// `--context-shift`); otherwise the request stops there.
    pub context_shift: bool,
    /// Most requests waiting for a slot; more are refused with 503.
    pub queue_limit: usize,
}

impl Default for EngineSection {
    fn default() -> Self {
        EngineSection {
            slots: 4,
            ctx: 4096,
            batch_tokens: 512,
            ubatch_tokens: 512,
            kv_block_tokens: 16,
            cache_type_k: KvType::F16,
            cache_type_v: KvType::F16,
            prefix_cache: true,
            swa_full: false,
            cache_ram_mib: 8192,
            state_snapshot_tokens: 8192,
            context_shift: false,
            queue_limit: 256,
        }
    }
}

/// A KV cache type by llama.cpp's name (`f16`, `q8_0`).
fn kv_type<'de, D: Deserializer<'de>>(deserializer: D) -> Result<KvType, D::Error> {
    String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
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
    /// Context shift: prompt tokens kept; -1 = all (llama-server `--keep`);
    /// a request's `n_keep` wins.
    pub n_keep: i64,
    /// OpenAI responses carry `__verbose`, the native response (llama-server
    /// does so at `--verbose`); a request's `verbose` wins.
    pub verbose: bool,
    /// 0 = off.
    pub top_k: i32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off.
    pub typical_p: f32,
    /// 1 = off.
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over; -1 = the context, 0 = off.
    pub repeat_last_n: i64,
    /// 0 = off.
    pub presence_penalty: f32,
    /// 0 = off.
    pub frequency_penalty: f32,
    /// Where chat replies put a `<think>` block (llama-server
    /// `--reasoning-format`); a request's `reasoning_format` wins.
    pub reasoning_format: ReasoningFormat,
    /// The chat template's `enable_thinking` (llama-server `--reasoning`); a
    /// request's `chat_template_kwargs` win.
    pub reasoning: Thinking,
}

impl Default for RequestDefaults {
    /// llama-server's defaults; the sampling ones are the engine's.
    fn default() -> Self {
        let sampling = SamplingParams::default();
        RequestDefaults {
            n_predict: -1,
            temperature: sampling.temperature,
            seed: -1,
            cache_prompt: true,
            n_keep: 0,
            verbose: false,
            top_k: sampling.top_k,
            top_p: sampling.top_p,
            min_p: sampling.min_p,
            typical_p: sampling.typical_p,
            repeat_penalty: sampling.repeat_penalty,
            repeat_last_n: sampling.repeat_last_n as i64,
            presence_penalty: sampling.presence_penalty,
            frequency_penalty: sampling.frequency_penalty,
            reasoning_format: ReasoningFormat::Auto,
            reasoning: Thinking::Auto,
        }
    }
}

/// `defaults.reasoning_format`, llama-server's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReasoningFormat {
    /// Left in the content as generated.
    None,
    /// llama-server's default: as `deepseek` for templates that think (it
    /// picks by template; sluice knows only `<think>` blocks).
    Auto,
    /// Out of the content, into `reasoning_content`.
    Deepseek,
    /// As `deepseek`, but left in the content between its tags when
    /// streamed.
    DeepseekLegacy,
}

impl ReasoningFormat {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "none" => Some(ReasoningFormat::None),
            "auto" => Some(ReasoningFormat::Auto),
            "deepseek" => Some(ReasoningFormat::Deepseek),
            "deepseek-legacy" => Some(ReasoningFormat::DeepseekLegacy),
            _ => None,
        }
    }
}

/// `defaults.reasoning`: whether chat templates are told to think.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Thinking {
    On,
    Off,
    /// As `on`: llama-server tells templates that react to
    /// `enable_thinking` to think, and for the others it makes no
    /// difference.
    Auto,
}

impl Thinking {
    /// llama-server's spellings, its synonyms included.
    pub(super) fn parse(name: &str) -> Option<Self> {
        match name {
            "on" | "enabled" | "true" | "1" => Some(Thinking::On),
            "off" | "disabled" | "false" | "0" => Some(Thinking::Off),
            "auto" => Some(Thinking::Auto),
            _ => None,
        }
    }

    /// The `enable_thinking` a template is rendered with (llama-server
    /// always sets it: templates that test `not enable_thinking` read an
    /// unset one as false).
    pub fn enable_thinking(self) -> bool {
        self != Thinking::Off
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
    /// `[[policy.shadow]]`: candidates that see every step and whose
    /// decisions are compared, never applied (at most 4; same limits).
    pub shadow: Vec<PolicySpec>,
    /// Most microseconds all shadows together may take per step; the rest
    /// skip that step.
    pub shadow_budget_us: u64,
    /// The folder `.wasm` paths sent to the admin API must lie in
    /// (relative paths there are relative to it); none: the admin API
    /// loads built-in policies only. The config file's own paths are the
    /// operator's and may be anywhere.
    pub plugin_dir: Option<PathBuf>,
}

/// One `[[policy.shadow]]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// A built-in policy name or a path to a `.wasm` component.
    pub plugin: String,
    #[serde(default)]
    pub settings: toml::Table,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            plugin: "chunked".into(),
            on_fault: OnFault::FailClosed,
            stall_steps: 64,
            fuel: PluginLimits::default().fuel,
            deadline_ms: PluginLimits::default().deadline_ms,
            memory_mb: PluginLimits::default().memory_mb,
            settings: toml::Table::new(),
            shadow: Vec::new(),
            shadow_budget_us: 200,
            plugin_dir: None,
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
    pub(super) fn parse(name: &str) -> Option<Self> {
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
    /// What `/v1/models`, `/metrics` and a request's `model` call it; the
    /// file's stem when unset.
    #[serde(default)]
    pub name: Option<String>,
}

/// The adapters' names, by id: `name` where set, else the file's stem, made
/// unique with the id (`adapter-2`) when an earlier adapter has it
/// (adapters downloaded as `adapter.gguf` into several folders).
pub fn adapter_names(lora: &[LoraConfig]) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(lora.len());
    for (id, adapter) in lora.iter().enumerate() {
        let name = match (&adapter.name, adapter.path.file_stem()) {
            (Some(name), _) => name.clone(),
            (None, stem) => {
                let stem =
                    stem.map_or_else(|| adapter.path.display().to_string(), |s| s.to_string_lossy().into_owned());
                if names.contains(&stem) { format!("{stem}-{id}") } else { stem }
            }
        };
        names.push(name);
    }
    names
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
