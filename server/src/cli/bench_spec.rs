//! `sluice bench spec`: one greedy stream decoded by the engine without and
//! with a draft: tokens/s, and how many drafted tokens each verification
//! pass keeps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use sluice::config::{PolicyConfig, SpeculativeConfig};
use sluice::startup::{load_model, load_policy, load_speculation};
use sluice_engine::request::{Event, GenerationRequest};
use sluice_engine::sampling::SamplingParams;
use sluice_engine::speculative::Speculation;
use sluice_engine::{EngineConfig, EngineHandle};
use sluice_kernels::backend::Device;
use sluice_model::Model;
use sluice_model::tokenizer::Tokenizer;
use sluice_plugin_host::PluginHost;

#[derive(clap::Args)]
pub struct BenchSpecArgs {
    /// The target model (GGUF).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model: PathBuf,
    /// The draft model (GGUF): draft-simple, or DFlash by its architecture.
    #[arg(long = "model-draft", visible_alias = "md", value_name = "FILE")]
    draft: PathBuf,
    /// Threads for the kernels.
    #[arg(short = 't', long = "threads", default_value_t = 2)]
    threads: usize,
    /// Tokens to generate per run.
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Most tokens drafted per step (the server's default).
    #[arg(long, default_value_t = SpeculativeConfig::default().n_max)]
    n_max: u32,
    /// Drafting stops below this draft probability (the server's default).
    #[arg(long, default_value_t = SpeculativeConfig::default().p_min)]
    p_min: f32,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// End with a JSON line.
    #[arg(long)]
    json: bool,
}

/// What one run measured.
struct Run {
    tokens_per_s: f64,
    drafted: usize,
    accepted: usize,
    /// Target passes that verified drafts.
    verifications: u64,
}

pub fn bench_spec(args: BenchSpecArgs) -> anyhow::Result<()> {
    let target = load_model(&args.model, Device::Cpu, args.threads.max(1), &[])?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file()).context("tokenizer")?);
    let n_vocab = target.hparams().n_vocab as u32;
    let mut prompt = tokenizer.encode("Write a short story about a robot who learns to paint.", true, false);
    if prompt.is_empty() {
        // A synthetic vocabulary without bytes: deterministic ids.
        prompt = (0..16u32).map(|i| (i * 7919 + 17) % n_vocab).collect();
    }
    let config = EngineConfig { slots: 1, ctx: prompt.len() + args.decode + 32, ..EngineConfig::default() };
    let spec = SpeculativeConfig {
        draft_model: Some(args.draft.clone()),
        n_max: args.n_max,
        p_min: args.p_min,
        ..SpeculativeConfig::default()
    };
    let bench = Bench { target, tokenizer, config, host: PluginHost::new()?, prompt, decode: args.decode };
    let mut plain = Vec::new();
    let mut drafted = Vec::new();
    for _ in 0..args.reps.max(1) {
        plain.push(bench.run(None)?);
        let limits = PolicyConfig::default().limits();
        let speculation = load_speculation(&spec, &bench.host, limits, &bench.target, &bench.config)
            .map_err(|(path, error)| anyhow::anyhow!("{}: {error}", path.display()))?;
        drafted.push(bench.run(speculation)?);
    }
    let median = |runs: &mut Vec<Run>| {
        runs.sort_by(|a, b| a.tokens_per_s.total_cmp(&b.tokens_per_s));
        runs.swap_remove(runs.len() / 2)
    };
    let (plain, drafted) = (median(&mut plain), median(&mut drafted));
    let per_pass = drafted.accepted as f64 / drafted.verifications.max(1) as f64;
    let acceptance = drafted.accepted as f64 / drafted.drafted.max(1) as f64;
    println!("target: {}", args.model.display());
    println!("draft: {}", args.draft.display());
    println!("threads: {}, {} tokens greedy, n_max {}, p_min {}", args.threads, args.decode, args.n_max, args.p_min);
    println!("without draft: {:.1} tokens/s", plain.tokens_per_s);
    println!("with draft: {:.1} tokens/s ({:.2}x)", drafted.tokens_per_s, drafted.tokens_per_s / plain.tokens_per_s);
    println!(
        "drafted {} accepted {} ({:.1} %); mean accepted per verification {per_pass:.2} (+1 target token)",
        drafted.drafted,
        drafted.accepted,
        acceptance * 100.0
    );
    if args.json {
        println!(
            "{{\"plain_tps\": {:.2}, \"draft_tps\": {:.2}, \"acceptance\": {acceptance:.4}, \"mean_accepted\": {per_pass:.3}}}",
            plain.tokens_per_s, drafted.tokens_per_s
        );
    }
    Ok(())
}

/// One greedy stream on a fresh engine, with or without a draft.
struct Bench {
    target: Arc<dyn Model>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    host: PluginHost,
    prompt: Vec<u32>,
    decode: usize,
}

impl Bench {
    fn run(&self, speculation: Option<Speculation>) -> anyhow::Result<Run> {
        let policy = load_policy(&self.host, &PolicyConfig::default())?;
        let engine = EngineHandle::start(
            Arc::clone(&self.target),
            Arc::clone(&self.tokenizer),
            Box::new(policy),
            Box::new(|| None),
            self.config.clone(),
            speculation,
        )?;
        let mut request = GenerationRequest::new(self.prompt.clone());
        request.n_predict = Some(self.decode);
        request.ignore_eos = true;
        request.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
        let (_, mut events) = engine.submit(request)?;
        let mut first_token = None;
        loop {
            match events.blocking_recv().context("the engine stopped")? {
                Event::Started { .. } | Event::Progress(_) => {}
                // Decode speed from the first token on (the prompt is not timed).
                Event::Token(_) => {
                    first_token.get_or_insert_with(Instant::now);
                }
                Event::Done(completion) => {
                    let seconds = first_token.map_or(f64::NAN, |started| started.elapsed().as_secs_f64());
                    let verifications = engine.shared().metrics.drafts_total.load(std::sync::atomic::Ordering::Relaxed);
                    return Ok(Run {
                        tokens_per_s: (completion.tokens_predicted.saturating_sub(1)) as f64 / seconds,
                        drafted: completion.timings.draft_n,
                        accepted: completion.timings.draft_n_accepted,
                        verifications,
                    });
                }
                Event::Failed(error) => anyhow::bail!("the request failed: {error}"),
            }
        }
    }
}
