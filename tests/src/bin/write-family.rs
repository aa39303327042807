//! Writes a family's synthetic model, whose llama.cpp outputs are fixtures
//! (`sluice_tests::models::tiny_family`): `write-family ARCH FILE`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(arch), Some(path)) = (args.first(), args.get(1)) else {
        eprintln!("usage: write-family ARCH FILE");
        return ExitCode::from(2);
    };
    let Some(model) = sluice_tests::models::tiny_family(arch) else {
        eprintln!("write-family: no tiny model of architecture {arch:?}");
        return ExitCode::from(2);
    };
    match std::fs::write(path, model.build()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("write-family: {path}: {error}");
            ExitCode::FAILURE
        }
    }
}
