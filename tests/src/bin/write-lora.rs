//! Writes random rank-8 LoRA adapters for a real model's shape, changing
//! every layer's seven matrices: `write-lora SHAPE DIR N [RANK]` writes
//! `DIR/lora-0.gguf` … `lora-{N-1}.gguf`, SHAPE one of `shapes::NAMED`.

use std::path::PathBuf;
use std::process::ExitCode;

use sluice_tests::lora::{LoraSpec, layer_targets};
use sluice_tests::shapes::{NAMED, Shape};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names = || NAMED.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
    let usage = || {
        eprintln!("usage: write-lora SHAPE DIR N [RANK]; shapes: {}", names());
        ExitCode::from(2)
    };
    let (Some(name), Some(dir), Some(count)) = (args.first(), args.get(1), args.get(2)) else { return usage() };
    let Some(shape) = Shape::named(name) else {
        eprintln!("write-lora: unknown shape `{name}`; known: {}", names());
        return ExitCode::from(2);
    };
    let (Ok(count), Ok(rank)) = (count.parse::<u64>(), args.get(3).map_or(Ok(8), |rank| rank.parse::<usize>())) else {
        return usage();
    };
    let kv_dim = (shape.n_embd / shape.n_head * shape.n_head_kv) as u64;
    let targets = layer_targets(shape.n_layer, shape.n_embd as u64, kv_dim, shape.n_ff as u64);
    let dir = PathBuf::from(dir);
    if let Err(error) = std::fs::create_dir_all(&dir) {
        eprintln!("write-lora: {}: {error}", dir.display());
        return ExitCode::FAILURE;
    }
    for index in 0..count {
        let spec = LoraSpec { rank, ..LoraSpec::new(shape.arch, 1000 + index, 0.02) };
        let path = dir.join(format!("lora-{index}.gguf"));
        if let Err(error) = std::fs::write(&path, spec.build(&targets).build()) {
            eprintln!("write-lora: {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
        println!("{}", path.display());
    }
    ExitCode::SUCCESS
}
