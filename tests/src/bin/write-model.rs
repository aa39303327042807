//! Writes a random-weight F16 model in a real model's shape:
//! `write-model SHAPE FILE [SEED]`, SHAPE one of `shapes::NAMED`.

use std::path::PathBuf;
use std::process::ExitCode;

use sluice_tests::shapes::{NAMED, Shape};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names = || NAMED.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
    let (Some(name), Some(path)) = (args.first(), args.get(1)) else {
        eprintln!("usage: write-model SHAPE FILE [SEED]; shapes: {}", names());
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
    let path = PathBuf::from(path);
    match shape.write(&path, seed) {
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
