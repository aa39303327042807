//! Loading a model on the configured device, its tokenizer and chat
//! template, and starting the engine on it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_kernels::backend::{Backend, CpuBackend, Device, KvTypes};

use super::draft::load_speculation;
use super::plugins::{fallback, fault_rules};
use crate::config::{Config, threads_or_cores};
use sluice_engine::policy::SchedulingPolicy;
use sluice_engine::trace::{TRACE_VERSION, TraceHeader, TraceRecorder};
use sluice_engine::{EngineConfig, EngineHandle, EngineStartError};
use sluice_model::chat_template::{ChatTemplate, TemplateError};
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_model::vision::Encoder;
use sluice_model::{LoadError, Model, Transformer};
use sluice_plugin_host::{PluginHost, WasmPolicy};

use super::templates::{self, CHATML};

/// Why the model or the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{}: cannot load the model: {error}", path.display())]
    Model { path: PathBuf, error: String },
    #[error("{error}")]
    Adapter { error: String },
    #[error("device {device}: {reason}")]
    Device { device: Device, reason: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("{}: cannot use the draft model: {error}", path.display())]
    Draft { path: PathBuf, error: String },
    #[error("{}: cannot use the projector (--mmproj): {error}", path.display())]
    Projector { path: PathBuf, error: String },
    #[error(transparent)]
    Engine(#[from] EngineStartError),
    #[error("shadow policies: {0}")]
    Shadows(String),
    #[error("{}: cannot record the step trace: {error}", path.display())]
    Trace { path: PathBuf, error: std::io::Error },
}

/// Longest wait for the engine to take the shadows at start.
const ENGINE_ANSWER: Duration = Duration::from_secs(5);

/// A model file loaded onto `device`, computing on `threads` threads (0 =
/// one per core; the CPU's), with these LoRA adapters (ids in this order),
/// for sequences of its trained context.
pub fn load_model(
    path: &Path,
    device: Device,
    threads: usize,
    adapters: &[PathBuf],
) -> Result<Arc<dyn Model>, StartError> {
    load_for_context(path, device, threads, adapters, None)
}

/// [`load_model`] for sequences of up to `n_ctx_seq` positions (`None`:
/// the trained context), which picks a LongRoPE model's factors.
fn load_for_context(
    path: &Path,
    device: Device,
    threads: usize,
    adapters: &[PathBuf],
    n_ctx_seq: Option<usize>,
) -> Result<Arc<dyn Model>, StartError> {
    usable(device)?;
    match device {
        Device::Cpu => on_backend(path, Arc::new(CpuBackend::new(threads_or_cores(threads))), adapters, n_ctx_seq),
        #[cfg(feature = "cuda")]
        Device::Cuda(index) => on_backend(path, Arc::new(cuda::backend(index)?), adapters, n_ctx_seq),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(without_cuda(device)),
    }
}

fn on_backend<B: Backend>(
    path: &Path,
    backend: Arc<B>,
    adapters: &[PathBuf],
    n_ctx_seq: Option<usize>,
) -> Result<Arc<dyn Model>, StartError> {
    tracing::info!(backend = %backend.describe(), "computing on");
    let model = Transformer::load(path, backend)
        .and_then(|model| match n_ctx_seq {
            Some(n_ctx_seq) => model.for_context(n_ctx_seq),
            None => Ok(model),
        })
        .map_err(|error: LoadError| StartError::Model { path: path.to_owned(), error: error.to_string() })?;
    let model = model.with_adapters(adapters).map_err(|error| StartError::Adapter { error: error.to_string() })?;
    for adapter in model.adapters() {
        tracing::info!(path = %adapter.path.display(), alpha = adapter.alpha, "LoRA adapter loaded");
    }
    Ok(Arc::new(model))
}

/// Whether this build can run on the device `config` names: checked before
/// the server listens, so a device it cannot use never answers "loading".
pub fn check_device(config: &Config) -> Result<(), StartError> {
    let device = config.model.device.parse().map_err(|reason: String| StartError::Model {
        path: config.model.path(),
        error: format!("`model.device`: {reason}"),
    })?;
    usable(device)
}

#[cfg(not(feature = "cuda"))]
fn usable(device: Device) -> Result<(), StartError> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(_) => Err(without_cuda(device)),
    }
}

#[cfg(not(feature = "cuda"))]
fn without_cuda(device: Device) -> StartError {
    let reason = "this sluice was built without CUDA support (cargo feature `cuda`); use --device cpu".into();
    StartError::Device { device, reason }
}

#[cfg(feature = "cuda")]
fn usable(device: Device) -> Result<(), StartError> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(index) => cuda::usable(index).map_err(|reason| StartError::Device { device, reason }),
    }
}

/// The CUDA backend at start: the device must answer, NVRTC must load, and
/// the kernels compile (or come from the cache) before the model loads.
#[cfg(feature = "cuda")]
mod cuda {
    use std::path::PathBuf;

    use sluice_kernels::backend::Device;
    use sluice_kernels::backend::cuda::{CudaBackend, KernelCache, Nvrtc, library_from_env, probe};

    use super::StartError;

    pub(super) fn usable(index: u32) -> Result<(), String> {
        let name = probe(index).map_err(|reason| format!("{reason}; use --device cpu"))?;
        Nvrtc::load(library_from_env().as_deref()).map_err(|error| {
            format!("{name} found, but {error}: set SLUICE_NVRTC to that file or its folder, or use --device cpu")
        })?;
        Ok(())
    }

    pub(super) fn backend(index: u32) -> Result<CudaBackend, StartError> {
        let failed = |reason: String| StartError::Device { device: Device::Cuda(index), reason };
        let nvrtc = Nvrtc::load(library_from_env().as_deref()).map_err(|error| failed(error.to_string()))?;
        let cache = KernelCache::new(cache_dir());
        CudaBackend::new(index, &nvrtc, &cache, |line| tracing::info!("{line}"))
            .map_err(|error| failed(error.to_string()))
    }

    /// `SLUICE_CACHE_DIR`, else the user's cache folder, then `cuda-kernels`.
    fn cache_dir() -> PathBuf {
        let base = std::env::var_os("SLUICE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
                .unwrap_or_else(std::env::temp_dir)
                .join("sluice")
        });
        base.join("cuda-kernels")
    }
}

/// The engine's settings: `[engine]`, the policy's fault rules, and the
/// context clamped to what the model was trained for (0 = all of it).
pub fn engine_config(config: &Config, n_ctx_train: usize) -> EngineConfig {
    let engine = &config.engine;
    let mut ctx = if engine.ctx == 0 { n_ctx_train } else { engine.ctx };
    if ctx > n_ctx_train {
        tracing::warn!(
            ctx,
            n_ctx_train,
            "the context is larger than the model was trained for; using the training context"
        );
        ctx = n_ctx_train;
    }
    EngineConfig {
        slots: engine.slots,
        ctx,
        batch_tokens: engine.batch_tokens,
        ubatch_tokens: engine.ubatch_tokens,
        kv_block_tokens: engine.kv_block_tokens,
        kv_types: KvTypes { k: engine.cache_type_k, v: engine.cache_type_v },
        prefix_cache: engine.prefix_cache,
        swa_full: engine.swa_full,
        cache_mib: u64::try_from(engine.cache_ram_mib).ok(),
        state_snapshot_tokens: engine.state_snapshot_tokens,
        context_shift: engine.context_shift,
        queue_limit: engine.queue_limit,
        // 0 = no bound.
        stream_window_bytes: match config.server.limits.stream_window_kib {
            0 => usize::MAX,
            kib => kib.saturating_mul(1024),
        },
        faults: fault_rules(&config.policy),
        shadow_budget: Duration::from_micros(config.policy.shadow_budget_us),
    }
}

/// A model being served: its engine, tokenizer and chat template.
pub struct Serving {
    pub model: Arc<dyn Model>,
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// The vision tower, when `model.mmproj` names one.
    pub vision: Option<Arc<dyn Encoder>>,
}

/// Load the configured model (paging its weights in), its tokenizer,
/// template and draft, and start the engine with `policy` and `shadows`.
/// Blocking.
pub fn serve_model(
    config: &Config,
    host: &PluginHost,
    policy: Box<dyn SchedulingPolicy>,
    shadows: Vec<WasmPolicy>,
) -> Result<Serving, StartError> {
    let path = config.model.path();
    let device =
        config.model.device.parse().map_err(|reason| StartError::Model { path: path.clone(), error: reason })?;
    let adapters: Vec<PathBuf> = config.lora.iter().map(|lora| lora.path.clone()).collect();
    // A slot's context (`engine.ctx`, 0: the trained one) picks LongRoPE's
    // factors, as llama-server's per-sequence context does (which rounds a
    // slot's share of `-c` up to a multiple of 256; sluice does not).
    let n_ctx_seq = Some(config.engine.ctx).filter(|&ctx| ctx > 0);
    let model = load_for_context(&path, device, config.model.threads, &adapters, n_ctx_seq)?;
    tracing::info!(backend = model.describe(), "model on its device");
    read_weights(model.as_ref());
    let tokenizer = Tokenizer::from_gguf(model.file())
        .map_err(|error| StartError::Model { path: path.clone(), error: format!("tokenizer: {error}") })?;
    let tokenizer = Arc::new(tokenizer);
    let template = chat_template(config.model.chat_template.as_deref(), model.as_ref(), &tokenizer)?;
    let vision = config.model.mmproj.as_deref().map(|path| load_projector(path, model.as_ref())).transpose()?;
    let engine_config = engine_config(config, model.hparams().n_ctx_train);
    if engine_config.context_shift && model.recurrent_state_bytes().is_some() {
        let error = format!(
            "engine.context_shift (--context-shift) is on, but this model's ({}) recurrent layers cannot drop \
             their oldest positions: their state holds every position at once",
            model.hparams().arch.name()
        );
        return Err(StartError::Model { path, error });
    }
    let speculation = load_speculation(&config.speculative, host, config.policy.limits(), &model, &engine_config)
        .map_err(|(path, error)| StartError::Draft { path, error })?;
    let engine = EngineHandle::start(
        Arc::clone(&model),
        Arc::clone(&tokenizer),
        policy,
        fallback(host, &config.policy),
        engine_config,
        speculation,
    )?;
    watch_steps(&engine, config, shadows)?;
    Ok(Serving { model, engine, tokenizer, template, vision })
}

/// The projector at `path`, onto the model's backend: only a model with
/// M-RoPE positions can place an image's rows.
/// The vision tower of the projector file at `path`, on `model`'s backend.
pub fn load_projector(path: &Path, model: &dyn Model) -> Result<Arc<dyn Encoder>, StartError> {
    let error = |error: String| StartError::Projector { path: path.to_owned(), error };
    if !model.hparams().rope.is_multimodal() {
        return Err(error(format!(
            "the model ({}) has no M-RoPE positions for image rows; Qwen2-VL-family models do",
            model.hparams().arch.name()
        )));
    }
    let file = GgufFile::open_resident(path).map_err(|e| error(e.to_string()))?;
    let encoder = model.load_projector(&file).map_err(|e| error(e.to_string()))?;
    let info = encoder.info();
    tracing::info!(
        projector = info.kind.name(),
        blocks = info.n_layer,
        width = info.n_embd,
        patch = info.image.patch_size,
        "vision tower loaded"
    );
    Ok(encoder)
}

/// Attach the configured shadow policies and start the step trace, before
/// the first request.
fn watch_steps(engine: &EngineHandle, config: &Config, shadows: Vec<WasmPolicy>) -> Result<(), StartError> {
    let shadows = shadows.into_iter().map(|policy| Box::new(policy) as Box<dyn SchedulingPolicy>).collect();
    engine.replace_shadows(shadows, ENGINE_ANSWER).map_err(StartError::Shadows)?;
    let Some(path) = &config.server.record_trace else { return Ok(()) };
    let header = TraceHeader {
        version: TRACE_VERSION,
        policy: engine.policy_name(),
        slots: engine.config().slots as u32,
        token_budget: engine.config().batch_tokens as u32,
        fuel: config.policy.fuel,
        deadline_ms: config.policy.deadline_ms,
        memory_mb: config.policy.memory_mb,
        stall_steps: config.policy.stall_steps,
    };
    let max_bytes = config.server.record_trace_mb.saturating_mul(1 << 20);
    let trace_error = |error| StartError::Trace { path: path.clone(), error };
    let recorder = TraceRecorder::start(path, max_bytes, header).map_err(trace_error)?;
    engine.record(recorder).map_err(|error| trace_error(std::io::Error::other(error)))?;
    tracing::info!(path = %path.display(), "recording every step");
    Ok(())
}

/// Pages the weights in before serving, with a progress bar on a terminal
/// (log lines at each quarter otherwise), so the first requests do not
/// stall on a cold page cache.
fn read_weights(model: &dyn Model) {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template("loading weights {bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        model.file().prefault(|done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        return;
    }
    let mut next_quarter = 1;
    model.file().prefault(|done, total| {
        while next_quarter <= 4 && done * 4 >= total * next_quarter {
            tracing::info!(percent = next_quarter * 25, bytes = done, "loading weights");
            next_quarter += 1;
        }
    });
}

/// The configured template (a llama.cpp built-in name or Jinja source; a
/// string that is neither renders as itself, as in llama-server), else the
/// model's, else ChatML (llama-server's fallback too).
fn chat_template(
    configured: Option<&str>,
    model: &dyn Model,
    tokenizer: &Tokenizer,
) -> Result<ChatTemplate, StartError> {
    let source = configured.map(|configured| templates::builtin(configured).unwrap_or(configured));
    match ChatTemplate::from_gguf(model.file(), tokenizer, source) {
        Err(TemplateError::Missing) => {
            tracing::warn!("the model has no chat template; using ChatML");
            ChatTemplate::from_gguf(model.file(), tokenizer, Some(CHATML))
                .map_err(|error| StartError::Template(error.to_string()))
        }
        loaded => loaded.map_err(|error| StartError::Template(error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::{FaultRules, OnFault};

    #[test]
    fn the_engine_gets_the_config_defaults_and_a_clamped_context() {
        let config = Config::parse("").expect("valid");
        let engine = engine_config(&config, 8192);
        assert_eq!((engine.slots, engine.ctx, engine.faults.on_fault), (4, 4096, OnFault::FailClosed));
        assert_eq!(engine, EngineConfig::default(), "the config's defaults are the engine's");
        assert_eq!(engine_config(&config, 2048).ctx, 2048, "clamped to the training context");
        let all =
            Config::parse("[engine]\nctx = 0\n[policy]\non_fault = \"fallback\"\nstall_steps = 5\n").expect("valid");
        let engine = engine_config(&all, 2048);
        assert_eq!(engine.ctx, 2048);
        assert_eq!(engine.faults, FaultRules { on_fault: OnFault::Fallback, stall_steps: 5 });
    }

    #[test]
    fn the_kv_cache_types_reach_the_engine() {
        use sluice_kernels::backend::KvType;
        assert_eq!(engine_config(&Config::default(), 8192).kv_types, KvTypes::default());
        let config = Config::parse("[engine]\ncache_type_k = \"q8_0\"\n").expect("valid");
        assert_eq!(engine_config(&config, 8192).kv_types, KvTypes { k: KvType::Q8_0, v: KvType::F16 });
    }

    #[test]
    fn a_device_this_build_cannot_use_is_a_start_error() {
        #[cfg(feature = "cuda")]
        if let Ok(name) = sluice_kernels::backend::cuda::probe(0) {
            return eprintln!("skipped: this machine has a usable CUDA device ({name})");
        }
        let error = load_model(Path::new("unused.gguf"), Device::Cuda(0), 1, &[]).err().expect("no CUDA backend");
        assert!(error.to_string().starts_with("device cuda:0: "), "{error}");
        assert!(error.to_string().ends_with("use --device cpu"), "{error}");
    }
}
