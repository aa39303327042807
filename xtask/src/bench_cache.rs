//! `cargo xtask bench cache -m FILE [--llama-server BIN] [sluice bench cache
//! args]`: what the prefix cache saves on FILE (see `sluice bench cache`),
//! on `sluice serve` and, when given, on llama-server with the same
//! settings (1 slot, 2 threads, room for the prompts).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::bench_serve::{on_each_server, split_llama_server};
use crate::workspace::{cargo, repo_root, run};

pub fn bench_cache(args: &[String]) -> anyhow::Result<()> {
    let (llama_server, rest) = split_llama_server(args)?;
    let at = rest.iter().position(|arg| arg == "-m" || arg == "--model").context("give the model: -m FILE")?;
    let model = PathBuf::from(rest.get(at + 1).context("-m needs a file")?);
    let rest: Vec<String> = rest[..at].iter().chain(&rest[at + 2..]).cloned().collect();
    run(cargo().args(["build", "--quiet", "--release", "--package", "sluice", "--features", "lab"]))?;
    let sluice = repo_root().join("target/release/sluice");
    on_each_server(&sluice, llama_server, &model, 16384, &mut |port, label| {
        run(Command::new(&sluice)
            .args(["bench", "cache", "--url", &format!("http://127.0.0.1:{port}"), "--label", label])
            .args(&rest))
    })
}
