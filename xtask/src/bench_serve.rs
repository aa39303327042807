//! `cargo xtask bench serve [--llama-server BIN] [sluice bench serve args]`:
//! starts `sluice serve` on the default model with 16 slots and 2 kernel
//! threads, measures it with `sluice bench serve`, and when given a
//! llama-server binary does the same to it with matching settings. With
//! `--adapters N` both servers load N random rank-8 LoRA adapters for the
//! default model (written once under `target/bench/lora/`) and the requests
//! take them in turn.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use crate::models;
use crate::workspace::{cargo, repo_root, run};

const SLOTS: &str = "16";
pub(crate) const THREADS: &str = "2";
/// Per slot: a 100-token prompt and 128 new tokens fit.
const SLOT_CTX: usize = 512;

/// Kills the server when the benchmark ends, however it ends.
pub(crate) struct Server(pub(crate) Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn bench_serve(args: &[String]) -> anyhow::Result<()> {
    let (llama_server, rest) = split_llama_server(args)?;
    let model = models::fetch_model()?;
    run(cargo().args(["build", "--quiet", "--release", "--package", "sluice", "--features", "lab"]))?;
    let sluice = repo_root().join("target/release/sluice");
    let adapters = adapters(&rest)?;
    let list: Vec<String> = adapters.iter().map(|path| path.display().to_string()).collect();
    let lora: Vec<String> = if list.is_empty() { Vec::new() } else { vec!["--lora".into(), list.join(",")] };

    // -c is the total context, split between the slots, for both servers.
    let total_ctx = (SLOT_CTX * SLOTS.parse::<usize>()?).to_string();
    let port = free_port()?;
    let server = Server(
        Command::new(&sluice)
            .args(["serve", "-m"])
            .arg(&model)
            .args(["--port", &port.to_string(), "-np", SLOTS, "-t", THREADS, "-c", &total_ctx])
            .args(&lora)
            .stdout(Stdio::null())
            .stderr(log_file("sluice")?)
            .spawn()
            .context("starting sluice serve")?,
    );
    measure(&sluice, port, "sluice", &rest)?;
    drop(server);

    if let Some(binary) = llama_server {
        let port = free_port()?;
        let _server = Server(
            Command::new(&binary)
                .arg("-m")
                .arg(&model)
                .args(["--port", &port.to_string(), "-np", SLOTS, "-t", THREADS, "-c", &total_ctx])
                .args(&lora)
                .stdout(Stdio::null())
                .stderr(log_file("llama-server")?)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?,
        );
        measure(&sluice, port, "llama-server", &rest)?;
    }
    Ok(())
}

fn measure(sluice: &Path, port: u16, label: &str, args: &[String]) -> anyhow::Result<()> {
    run(Command::new(sluice)
        .args(["bench", "serve", "--url", &format!("http://127.0.0.1:{port}"), "--label", label])
        .args(args))
}

/// The server's log goes to target/bench-serve-NAME.log, out of the table's way.
pub(crate) fn log_file(name: &str) -> anyhow::Result<std::fs::File> {
    let path = repo_root().join(format!("target/bench-serve-{name}.log"));
    std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))
}

/// The adapters `--adapters N` (passed on to `sluice bench serve`) asks
/// for, written if they are not there yet.
fn adapters(args: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let count = match args.iter().position(|arg| arg == "--adapters") {
        Some(at) => args.get(at + 1).context("--adapters needs a count")?.parse::<usize>()?,
        None => 0,
    };
    let dir = repo_root().join("target/bench/lora");
    let paths: Vec<PathBuf> = (0..count).map(|index| dir.join(format!("lora-{index}.gguf"))).collect();
    if !paths.iter().all(|path| path.exists()) {
        run(cargo()
            .args(["run", "--quiet", "--release", "--package", "sluice-tests", "--bin", "write-lora", "--"])
            .args(["smollm2-135m", &dir.display().to_string(), &count.to_string()]))?;
    }
    Ok(paths)
}

/// Takes `--llama-server BIN` out of the arguments.
pub(crate) fn split_llama_server(args: &[String]) -> anyhow::Result<(Option<PathBuf>, Vec<String>)> {
    let mut binary = None;
    let mut rest = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--llama-server" {
            binary = Some(PathBuf::from(args.next().context("--llama-server needs a path")?));
        } else {
            rest.push(arg.clone());
        }
    }
    Ok((binary, rest))
}

/// A port that was free a moment ago (the servers bind it right after).
/// Start `model` on sluice (`sluice` binary) and then, when given,
/// llama-server with the same settings (1 slot, 2 threads, a context of
/// `ctx`), and run `measure` with each one's port and name while it serves.
pub(crate) fn on_each_server(
    sluice: &Path,
    llama_server: Option<PathBuf>,
    model: &Path,
    ctx: usize,
    measure: &mut dyn FnMut(u16, &str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut servers: Vec<(&str, PathBuf)> = vec![("sluice", sluice.to_path_buf())];
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
                .arg(model)
                .args(["--port", &port.to_string(), "-np", "1", "-t", THREADS, "-c", &ctx.to_string()])
                .stdout(Stdio::null())
                .stderr(log_file(label)?)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?,
        );
        measure(port, label)?;
    }
    Ok(())
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
