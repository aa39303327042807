//! `cargo xtask bench constrained [--llama-server BIN]`: what structured
//! outputs cost (see `sluice bench constrained`), on `sluice serve` and,
//! when given, on llama-server with the same settings.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::Context;

use crate::bench_serve::{Server, THREADS, free_port, log_file, split_llama_server};
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
    let mut servers: Vec<(&str, PathBuf)> = vec![("sluice", sluice.clone())];
    servers.extend(llama_server.map(|binary| ("llama-server", binary)));
    for (label, binary) in servers {
        let port = free_port()?;
        let mut command = Command::new(&binary);
        if label == "sluice" {
            command.arg("serve");
        }
        let _server = Server(
            command
                .arg("-m")
                .arg(&model)
                .args(["--port", &port.to_string(), "-np", "1", "-t", THREADS, "-c", "2048"])
                .stdout(Stdio::null())
                .stderr(log_file(label)?)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?,
        );
        bench(port, label, label == "sluice")?;
    }
    Ok(())
}
