//! `sluice bench cache`: what the prefix cache saves a running server on a
//! long prompt sent again with more after it (the next turn of a
//! conversation): the prompt's prefill uncached, then the longer prompt's
//! once the first has run with `cache_prompt`. On a model with recurrent
//! layers this measures the state snapshots (`engine::state_cache`).

use crate::cli::bench::median;
use anyhow::Context;
use serde_json::{Value, json};

use super::bench_constrained::ready_client;

#[derive(clap::Args)]
pub struct BenchCacheArgs {
    /// The running server (`http://127.0.0.1:8080`).
    #[arg(long)]
    url: String,
    /// The server's name in the output.
    #[arg(long, default_value = "server")]
    label: String,
    /// Tokens of the cached prompt.
    #[arg(long, default_value_t = 4096)]
    prompt: usize,
    /// Tokens the second request adds after it.
    #[arg(long, default_value_t = 64)]
    new: usize,
    /// Repetitions, each with other tokens (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

pub fn bench_cache(args: BenchCacheArgs) -> anyhow::Result<()> {
    let client = ready_client(&args.url)?;
    let models: Value = client.get(format!("{}/v1/models", args.url)).send()?.error_for_status()?.json()?;
    let n_vocab = models["data"][0]["meta"]["n_vocab"].as_u64().with_context(|| format!("no n_vocab in {models}"))?;
    // Ids below 1000 are often special tokens: leave them out.
    let n_vocab = n_vocab.checked_sub(1000).context("a vocabulary of under 1000 tokens")? as u32;
    // (prompt ms, prompt tokens computed, cached tokens)
    let run = |prompt: &[u32], cache: bool| -> anyhow::Result<(f64, u64, u64)> {
        let body = json!({"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": cache});
        let answer: Value = client
            .post(format!("{}/completion", args.url))
            .json(&body)
            .send()
            .with_context(|| format!("POST {}/completion", args.url))?
            .error_for_status()?
            .json()?;
        let timings = &answer["timings"];
        let number = |field: &str| timings[field].as_f64().with_context(|| format!("no timings.{field} in {answer}"));
        Ok((number("prompt_ms")?, number("prompt_n")? as u64, timings["cache_n"].as_u64().unwrap_or(0)))
    };
    let mut uncached = Vec::new();
    let mut cached = Vec::new();
    let mut reused = 0;
    for rep in 0..args.reps.max(1) {
        // Varied ids, another run of them each repetition: nothing cached
        // from the last one.
        let token = |i: usize| 1000 + ((i + rep * 1_000_003) as u32).wrapping_mul(7919).wrapping_add(17) % n_vocab;
        let prompt: Vec<u32> = (0..args.prompt).map(token).collect();
        let longer: Vec<u32> = (0..args.prompt + args.new).map(token).collect();
        uncached.push(run(&prompt, false)?.0);
        run(&prompt, true)?;
        let (ms, _, cache_n) = run(&longer, true)?;
        cached.push(ms);
        reused = cache_n;
    }
    let (uncached, cached) = (median(&mut uncached), median(&mut cached));
    println!(
        "{}: prefill of {} tokens, then of those + {} more (median of {})",
        args.label,
        args.prompt,
        args.new,
        args.reps.max(1)
    );
    println!("| prompt | prefill ms | cached tokens | speed-up |");
    println!("|---|---:|---:|---:|");
    println!("| {} tokens, uncached | {uncached:.1} | 0 | 1.00× |", args.prompt);
    println!(
        "| {} + {} tokens, cached | {cached:.1} | {reused} | {:.1}× |",
        args.prompt,
        args.new,
        uncached / cached.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
