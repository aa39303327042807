//! Writes a synthetic Gemma model whose llama.cpp outputs are fixtures
//! (`sluice_tests::models::tiny_gemma`): `write-gemma gemma2|gemma3 FILE`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(arch @ ("gemma2" | "gemma3")), Some(path)) = (args.first().map(String::as_str), args.get(1)) else {
        eprintln!("usage: write-gemma gemma2|gemma3 FILE");
        return ExitCode::from(2);
    };
    let arch = if arch == "gemma2" { "gemma2" } else { "gemma3" };
    match std::fs::write(path, sluice_tests::models::tiny_gemma(arch).build()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("write-gemma: {path}: {error}");
            ExitCode::FAILURE
        }
    }
}
