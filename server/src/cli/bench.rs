//! `sluice bench model`: decode and prefill speed on one model, as
//! llama-bench measures them (pp512 and tg128, optionally after `--depth`
//! cached positions, like its `-d`); on the CPU, also the bytes of weights
//! decoding reads per second beside what a read-only stream of the same
//! threads reads, which bounds it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use sluice::startup::load_model;
use sluice_kernels::backend::{Device, KvType, KvTypes};
use sluice_kernels::pool::ThreadPool;
use sluice_kernels::stream::read_bandwidth;
use sluice_model::gguf::GgufFile;
use sluice_model::session::Session;

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
    /// Positions already in the KV cache before each measurement (prefilled
    /// untimed), for speed at long contexts.
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Sequences decoding together (one token each per pass); decode
    /// speed is then their total.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// How the KV cache holds keys: f16 or q8_0 (llama-bench's `-ctk`).
    #[arg(long, value_name = "TYPE", default_value_t = KvType::F16)]
    cache_type_k: KvType,
    /// How the KV cache holds values: f16 or q8_0 (llama-bench's `-ctv`).
    #[arg(long, value_name = "TYPE", default_value_t = KvType::F16)]
    cache_type_v: KvType,
    /// End with a JSON line {"decode_tps": …, "prefill_tps": …} (decode
    /// the total over `--batch` sequences).
    #[arg(long)]
    json: bool,
}

pub fn bench_model(args: BenchModelArgs) -> anyhow::Result<()> {
    let model = load_model(&args.model, args.device, args.threads.max(1), &[])?;
    let kv_types = KvTypes { k: args.cache_type_k, v: args.cache_type_v };
    let n_vocab = model.hparams().n_vocab as u32;
    // Deterministic, varied token ids: speed does not depend on the text.
    let token = |i: usize| (i as u32).wrapping_mul(7919).wrapping_add(17) % n_vocab;
    let context: Vec<u32> = (0..args.depth.max(1)).map(token).collect();
    let prompt: Vec<u32> = (args.depth..args.depth + args.prefill).map(token).collect();
    let reps = args.reps.max(1);
    let batch = args.batch.max(1);
    // A session of `n_seq` sequences each holding `depth` cached positions
    // (at least one, so that decoding has logits to start from) with room
    // for `more`; the logits of each.
    let warm = |more: usize, n_seq: usize| -> anyhow::Result<(Session, Vec<f32>)> {
        let mut session = Session::with_sequences(Arc::clone(&model), context.len() + more, n_seq, kv_types)?;
        let mut logits = Vec::new();
        for seq in 0..n_seq {
            logits.extend(session.prefill_sequence(seq, &context, CHUNK)?);
        }
        Ok((session, logits))
    };

    let mut prefill_tps = Vec::new();
    for _ in 0..if prompt.is_empty() { 0 } else { reps } {
        let (mut session, _) = if args.depth == 0 {
            (Session::with_kv_types(Arc::clone(&model), prompt.len(), kv_types)?, Vec::new())
        } else {
            warm(prompt.len(), 1)?
        };
        let started = Instant::now();
        session.prefill(&prompt, prompt.len())?;
        prefill_tps.push(prompt.len() as f64 / started.elapsed().as_secs_f64());
    }
    let mut decode_tps = Vec::new();
    for _ in 0..if args.decode == 0 { 0 } else { reps } {
        let (mut session, mut logits) = warm(args.decode, batch)?;
        let n_vocab = n_vocab as usize;
        let started = Instant::now();
        for _ in 0..args.decode {
            let next: Vec<u32> = logits.chunks(n_vocab.max(1)).map(argmax).collect();
            logits = session.decode_each(&next)?;
        }
        decode_tps.push((batch * args.decode) as f64 / started.elapsed().as_secs_f64());
    }
    let (prefill, decode) = (median(&mut prefill_tps), median(&mut decode_tps));
    let at = if args.depth > 0 { format!(" @ d{}", args.depth) } else { String::new() };
    println!("model: {}", args.model.display());
    println!("backend: {}", model.describe());
    println!("KV cache: K {}, V {}", kv_types.k, kv_types.v);
    println!("pp{}{at}: {prefill:.1} tokens/s", args.prefill);
    let batched = if batch > 1 { format!(" × {batch} sequences") } else { String::new() };
    println!("tg{}{at}{batched}: {decode:.1} tokens/s", args.decode);
    let mut stream_gb_s = 0.0_f64;
    let weight_bytes = decoded_weight_bytes(&args.model)?;
    if args.device == Device::Cpu && args.decode > 0 {
        drop(model);
        let pool = ThreadPool::new(args.threads.max(1));
        stream_gb_s = read_bandwidth(&pool, STREAM_BYTES, 5).bytes_per_s / 1e9;
        let decode_gb_s = decode / batch as f64 * weight_bytes as f64 / 1e9;
        println!("memory stream (read-only, {} threads): {stream_gb_s:.1} GB/s", pool.n_threads());
        println!(
            "decode reads {:.0} MB of weights a step: {decode_gb_s:.1} GB/s, {:.2}× the stream",
            weight_bytes as f64 / 1e6,
            decode_gb_s / stream_gb_s.max(f64::MIN_POSITIVE)
        );
    }
    if args.json {
        println!(
            "{{\"decode_tps\": {decode:.2}, \"prefill_tps\": {prefill:.2}, \"depth\": {}, \"weight_bytes\": {weight_bytes}, \
             \"stream_gb_s\": {stream_gb_s:.2}}}",
            args.depth
        );
    }
    Ok(())
}

/// The stream's buffer: far past any last-level cache a machine running
/// this has, so that it measures memory.
const STREAM_BYTES: usize = 1 << 29;

/// Bytes of weights one decoding step reads: every tensor once, except the
/// token embeddings, of which it reads one row, unless the output matrix is
/// the embeddings themselves (no `output.weight`), and a mixture of experts'
/// expert tensors (`*_exps`), of which one token reads `expert_used_count`
/// of the `expert_count` experts.
fn decoded_weight_bytes(path: &std::path::Path) -> anyhow::Result<u64> {
    let error = |error: sluice_model::gguf::GgufError| anyhow::anyhow!("{error}");
    let file = GgufFile::open(path).map_err(error).with_context(|| path.display().to_string())?;
    let tied = file.tensor("output.weight").is_none();
    let arch = file.str("general.architecture").map_err(error)?;
    let count = |key: &str| file.opt_u32(&format!("{arch}.{key}")).map_err(error);
    let (used, experts) = match (count("expert_used_count")?, count("expert_count")?) {
        (Some(used), Some(experts)) if experts > 0 => (u64::from(used.min(experts)), u64::from(experts)),
        _ => (1, 1),
    };
    Ok(file
        .tensors()
        .iter()
        .filter(|tensor| tied || tensor.name != "token_embd.weight")
        .map(|tensor| match tensor.name.contains("_exps.") {
            true => tensor.len as u64 / experts * used,
            false => tensor.len as u64,
        })
        .sum())
}

/// Chunk size for filling the context before a measurement: llama-bench's
/// default micro-batch.
const CHUNK: usize = 512;

fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (token, &logit)| if logit > best.1 { (token, logit) } else { best })
        .0 as u32
}

/// 0 when nothing was measured (`--prefill 0` or `--decode 0`).
pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
