//! `cargo xtask loadtest [--seconds N] [--clients N] [--seed N] [--sluice BIN]`:
//! the load and fault test (`sluice_tests::loadtest`) at any length; prints
//! the counts and exits 1 when a rule was broken.

use std::path::PathBuf;
use std::process::ExitCode;

use sluice_tests::binary::sluice_binary;
use sluice_tests::loadtest::{self, Options};

const USAGE: &str = "usage: loadtest [--seconds N] [--clients N] [--seed N] [--sluice BIN]";

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("loadtest: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let report = loadtest::run(&options);
    print!("{report}");
    if report.problems().is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// The defaults are the long form: 300 s, 128 clients.
fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut seconds, mut clients, mut seed, mut binary) = (300, 128, 1, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|_| format!("{flag}: not a number: {value}"));
        match flag.as_str() {
            "--seconds" => seconds = number()?,
            "--clients" => clients = number()?.max(1) as usize,
            "--seed" => seed = number()?,
            "--sluice" => binary = Some(PathBuf::from(&value)),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(Options { seconds, clients, seed, binary: binary.unwrap_or_else(sluice_binary) })
}
