//! `sluice bench model`: decode and prefill speed on one model, as
//! llama-bench measures them (tg128 after a short prompt, pp512).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use sluice::model::session::Session;
use sluice::startup::load_model;
use sluice_kernels::backend::Device;

#[derive(clap::Args)]
pub struct BenchModelArgs {
    /// The model (GGUF).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model: PathBuf,
    /// Threads for the kernels.
    #[arg(short = 't', long = "threads", default_value_t = 2)]
    threads: usize,
    /// Where the model runs: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Prompt tokens for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prefill: usize,
    /// Tokens for the decode measurement.
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// End with a JSON line {"decode_tps": …, "prefill_tps": …}.
    #[arg(long)]
    json: bool,
}

pub fn bench_model(args: BenchModelArgs) -> anyhow::Result<()> {
    let model = load_model(&args.model, args.device, args.threads.max(1))?;
    let n_vocab = model.hparams().n_vocab as u32;
    // Deterministic, varied token ids: speed does not depend on the text.
    let tokens: Vec<u32> = (0..args.prefill as u32).map(|i| (i * 7919 + 17) % n_vocab).collect();
    let reps = args.reps.max(1);

    let mut prefill_tps = Vec::new();
    for _ in 0..reps {
        let mut session = Session::new(Arc::clone(&model), tokens.len())?;
        let started = Instant::now();
        session.prefill(&tokens, tokens.len())?;
        prefill_tps.push(tokens.len() as f64 / started.elapsed().as_secs_f64());
    }
    let mut decode_tps = Vec::new();
    for _ in 0..reps {
        let mut session = Session::new(Arc::clone(&model), 16 + args.decode)?;
        let mut logits = session.prefill(&tokens[..16.min(tokens.len())], 16)?;
        let started = Instant::now();
        for _ in 0..args.decode {
            let next = argmax(&logits);
            logits = session.decode(next)?;
        }
        decode_tps.push(args.decode as f64 / started.elapsed().as_secs_f64());
    }
    let (prefill, decode) = (median(&mut prefill_tps), median(&mut decode_tps));
    println!("model: {}", args.model.display());
    println!("backend: {}", model.describe());
    println!("pp{}: {prefill:.1} tokens/s", args.prefill);
    println!("tg{}: {decode:.1} tokens/s", args.decode);
    if args.json {
        println!("{{\"decode_tps\": {decode:.2}, \"prefill_tps\": {prefill:.2}}}");
    }
    Ok(())
}

fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (token, &logit)| if logit > best.1 { (token, logit) } else { best })
        .0 as u32
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
