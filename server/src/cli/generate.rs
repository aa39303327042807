//! `sluice generate`: one prompt, straight on the model; prints the text and
//! prefill/decode speeds.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use sluice::startup::load_model;
use sluice_engine::sampling::{Sampler, SamplingParams};
use sluice_kernels::backend::Device;
use sluice_model::session::Session;
use sluice_model::tokenizer::{StreamDecoder, Tokenizer};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The model (GGUF).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model: PathBuf,
    /// The prompt.
    #[arg(short = 'p', long = "prompt")]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Threads for the kernels.
    #[arg(short = 't', long = "threads", default_value_t = default_threads())]
    threads: usize,
    /// Where the model runs: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Prefill chunk size (tokens per forward pass).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    #[arg(long = "temp", default_value_t = SamplingParams::default().temperature)]
    temperature: f32,
    #[arg(long = "top-k", default_value_t = SamplingParams::default().top_k)]
    top_k: i32,
    #[arg(long = "top-p", default_value_t = SamplingParams::default().top_p)]
    top_p: f32,
    #[arg(long = "min-p", default_value_t = SamplingParams::default().min_p)]
    min_p: f32,
    #[arg(long = "typical", default_value_t = SamplingParams::default().typical_p)]
    typical_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = SamplingParams::default().repeat_penalty)]
    repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = SamplingParams::default().repeat_last_n)]
    repeat_last_n: usize,
    #[arg(long = "presence-penalty", default_value_t = SamplingParams::default().presence_penalty)]
    presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = SamplingParams::default().frequency_penalty)]
    frequency_penalty: f32,
    /// RNG seed (default: random).
    #[arg(long = "seed")]
    seed: Option<u32>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    ignore_eos: bool,
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

pub fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let model = load_model(&args.model, args.device, args.threads.max(1), &[])?;
    let tokenizer =
        Tokenizer::from_gguf(model.file()).with_context(|| format!("tokenizer of {}", args.model.display()))?;
    let prompt = tokenizer.encode(&args.prompt, true, true);
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty after tokenization");
    let mut session = Session::new(std::sync::Arc::clone(&model), prompt.len() + args.n_predict)?;
    let mut sampler = Sampler::new(SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        typical_p: args.typical_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    });
    prompt.iter().for_each(|&token| sampler.accept(token));

    let started = Instant::now();
    let mut logits = session.prefill(&prompt, args.batch_size)?;
    let prefill = started.elapsed();

    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{}", args.prompt)?;
    let mut decoder = StreamDecoder::new(false);
    let started = Instant::now();
    let mut generated = 0;
    let mut forwards = 0;
    while generated < args.n_predict {
        let token = sampler.sample(&logits, None).token;
        sampler.accept(token);
        generated += 1;
        if !args.ignore_eos && tokenizer.is_end_of_generation(token) {
            break;
        }
        write!(stdout, "{}", decoder.push(&tokenizer, token))?;
        stdout.flush()?;
        if generated == args.n_predict {
            break;
        }
        logits = session.decode(token)?;
        forwards += 1;
    }
    writeln!(stdout, "{}", decoder.finish())?;
    let decode = started.elapsed();
    eprintln!(
        "prefill: {} tokens in {:.1} ms ({:.1} tokens/s); decode: {} tokens in {:.1} ms ({:.1} tokens/s); {}",
        prompt.len(),
        prefill.as_secs_f64() * 1e3,
        prompt.len() as f64 / prefill.as_secs_f64(),
        forwards,
        decode.as_secs_f64() * 1e3,
        forwards as f64 / decode.as_secs_f64().max(1e-9),
        model.describe(),
    );
    Ok(())
}
