//! Writes a random-weight model in a real model's shape:
//! `write-model SHAPE FILE [SEED] [TYPE]`, SHAPE one of `shapes::NAMED`,
//! TYPE `f16` (the default) or `q4_k` (random Q4_K blocks, for measuring).

use std::path::PathBuf;
use std::process::ExitCode;

use sluice_tests::shapes::{Matrices, NAMED, Shape};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names = || NAMED.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
    let (Some(name), Some(path)) = (args.first(), args.get(1)) else {
        eprintln!("usage: write-model SHAPE FILE [SEED] [f16|q4_k]; shapes: {}", names());
        return ExitCode::from(2);
    };
    let Some(shape) = Shape::named(name) else {
        eprintln!("write-model: unknown shape `{name}`; known: {}", names());
        return ExitCode::from(2);
    };
    let seed = match args.get(2).map(|seed| seed.parse::<u64>()) {
        None => 1,
        Some(Ok(seed)) => seed,
        Some(Err(error)) => {
            eprintln!("write-model: SEED `{}`: {error}", args[2]);
            return ExitCode::from(2);
        }
    };
    let matrices = match args.get(3).map(String::as_str) {
        None | Some("f16") => Matrices::F16,
        Some("q4_k") => Matrices::Q4K,
        Some(other) => {
            eprintln!("write-model: TYPE `{other}`: expected f16 or q4_k");
            return ExitCode::from(2);
        }
    };
    let path = PathBuf::from(path);
    match shape.write(&path, seed, matrices) {
        Ok(()) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("write-model: {}: {error}", path.display());
            ExitCode::FAILURE
        }
    }
}
