//! `cargo xtask bench constrained [--llama-server BIN]`: what structured
//! outputs cost (see `sluice bench constrained`), on `sluice serve` and,
//! when given, on llama-server with the same settings.

use std::process::Command;

use crate::bench_serve::{on_each_server, split_llama_server};
use crate::models;
use crate::workspace::{cargo, repo_root, run};

/// `cargo xtask bench constrained [--llama-server BIN]`: mask times over the
/// default model's vocabulary, then decode speed with and without JSON
/// schemas on `sluice serve` (1 slot, 2 threads) and, when given, on
/// llama-server with the same settings.
pub fn bench_constrained(args: &[String]) -> anyhow::Result<()> {
    let (llama_server, rest) = split_llama_server(args)?;
    let model = models::fetch_model()?;
    run(cargo().args(["build", "--quiet", "--release", "--package", "sluice", "--features", "lab"]))?;
    let sluice = repo_root().join("target/release/sluice");
    let bench = |port: u16, label: &str, mask: bool| {
        let mut command = Command::new(&sluice);
        command.args(["bench", "constrained", "--url", &format!("http://127.0.0.1:{port}"), "--label", label]);
        if mask {
            command.arg("-m").arg(&model);
        }
        run(command.args(&rest))
    };
    on_each_server(&sluice, llama_server, &model, 2048, &mut |port, label| bench(port, label, label == "sluice"))
}
