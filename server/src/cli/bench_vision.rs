//! `sluice bench vision`: the time to prepare one image (decode, resize,
//! normalise) and to run the projector's vision tower on it, as a request
//! with that image pays before its prompt is queued.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use sluice::startup::{load_model, load_projector};
use sluice_kernels::backend::Device;

#[derive(clap::Args)]
pub struct BenchVisionArgs {
    /// The text model (GGUF, M-RoPE).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model: PathBuf,
    /// The projector (mmproj GGUF).
    #[arg(long = "mmproj", value_name = "FILE")]
    mmproj: PathBuf,
    /// The image (PNG, JPEG or WebP).
    #[arg(long = "image", value_name = "FILE")]
    image: PathBuf,
    /// Threads for the kernels.
    #[arg(short = 't', long = "threads", default_value_t = 2)]
    threads: usize,
    /// Encodes timed after the first (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// End with a JSON line.
    #[arg(long)]
    json: bool,
}

pub fn bench_vision(args: BenchVisionArgs) -> anyhow::Result<()> {
    let model = load_model(&args.model, Device::Cpu, args.threads.max(1), &[])?;
    let encoder = load_projector(&args.mmproj, &*model)?;
    let bytes =
        std::fs::read(&args.image).with_context(|| format!("{}: cannot read the image", args.image.display()))?;
    let started = Instant::now();
    let prepared = encoder.info().image.prepare(&bytes).with_context(|| format!("{}", args.image.display()))?;
    let prepare_ms = started.elapsed().as_secs_f64() * 1e3;
    let encode = || -> anyhow::Result<(f64, usize)> {
        let started = Instant::now();
        let encoded = encoder.encode(&prepared)?;
        Ok((started.elapsed().as_secs_f64() * 1e3, (encoded.nx * encoded.ny) as usize))
    };
    // The first encode also allocates the tower's buffers and KV store.
    let (first_ms, rows) = encode()?;
    let mut times = (0..args.reps).map(|_| encode().map(|(ms, _)| ms)).collect::<anyhow::Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    let median_ms = times.get(times.len() / 2).copied().unwrap_or(first_ms);
    let info = encoder.info();
    println!(
        "projector: {} ({}, {} blocks, width {})",
        args.mmproj.display(),
        info.kind.name(),
        info.n_layer,
        info.n_embd
    );
    println!(
        "image: {} → {} × {} pixels, {rows} rows; threads {}",
        args.image.display(),
        prepared.width,
        prepared.height,
        args.threads
    );
    println!(
        "prepare: {prepare_ms:.1} ms; first encode: {first_ms:.1} ms; median of {} more: {median_ms:.1} ms",
        args.reps
    );
    if args.json {
        println!(
            "{{\"prepare_ms\": {prepare_ms:.2}, \"first_encode_ms\": {first_ms:.2}, \"encode_ms\": {median_ms:.2}}}"
        );
    }
    Ok(())
}
