//! The load and fault test (`cargo xtask loadtest`, and its 60 s form in
//! `server/tests/loadtest.rs`): many clients on loopback — half of them
//! streaming, a fifth of the streams dropped part way, a fifth of the
//! requests asking for token probabilities (up to the server's cap), a few
//! clients opening streams they never read, prompts from a few words to a
//! few hundred tokens — against a server with a small queue, so that it
//! fills, while the `chaos` policy commits each of its faults in
//! turn with a reload after each. It runs once per `on_fault` mode, on a
//! server of its own each time: the mode is read at start, and a reload
//! does not change it.
//!
//! Afterwards every request must have been answered as the rules say
//! (`clients` classifies them), the server must be back to idle with no
//! slot, KV block or queue place left held, still serve a full queue's
//! worth of requests, and its resident memory — sampled through the load
//! and read at the end — must be within [`RSS_BOUND_MIB`] of what it was
//! after the warm-up (`idle`).

mod api;
mod clients;
mod faults;
mod idle;
mod report;
mod setup;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use report::{Class, Load, ModeReport, Report};
pub use setup::{BATCH_TOKENS, Mode, N_PROBS, QUEUE_LIMIT, RSS_BOUND_MIB, SEND_TIMEOUT_S, SLOT_CTX, SLOTS};

use crate::http::Server;
use api::Api;
use setup::{API_KEY, DEADLINE_MS, FUEL, STALL_STEPS};

/// Kept out of each mode's time for the start, the drain (the queue and
/// the slots hold 18 requests, about 1.5 of which finish a second on two
/// busy cores) and the idle checks.
const RESERVE: Duration = Duration::from_secs(12);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The whole run, both modes, start-up aside (about half each).
    pub seconds: u64,
    /// Concurrent clients.
    pub clients: usize,
    /// Seeds the clients' choices (prompts, lengths, endpoints).
    pub seed: u64,
    /// The `sluice` binary to load.
    pub binary: PathBuf,
}

impl Options {
    /// The CI form: 60 s, 128 clients, this build's binary.
    pub fn ci() -> Self {
        Options { seconds: 60, clients: 128, seed: 1, binary: crate::binary::sluice_binary() }
    }
}

/// Run both modes, fail-closed first.
pub fn run(options: &Options) -> Report {
    let budget = Duration::from_secs(options.seconds.max(2 * RESERVE.as_secs() + 10)) / 2;
    let modes = [Mode::FailClosed, Mode::Fallback].map(|mode| run_mode(options, mode, budget)).into();
    Report { clients: options.clients, seconds: options.seconds, modes }
}

fn run_mode(options: &Options, mode: Mode, budget: Duration) -> ModeReport {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("sluice-loadtest-{}-{}", mode.name(), std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("sluice.toml");
    // The file a SIGHUP reload reads: the plain policy under this mode.
    std::fs::write(
        &config,
        format!(
            "[engine]\nqueue_limit = {QUEUE_LIMIT}\n[policy]\nplugin = \"continuous\"\non_fault = \"{}\"\n\
             stall_steps = {STALL_STEPS}\nfuel = {FUEL}\ndeadline_ms = {DEADLINE_MS}\nplugin_dir = {:?}\n\
             [server.timeouts]\nsend_s = {SEND_TIMEOUT_S}\n",
            mode.name(),
            faults::plugin_dir()
        ),
    )
    .expect("config");
    let total_ctx = (SLOTS * SLOT_CTX).to_string();
    let slots = SLOTS.to_string();
    let batch = BATCH_TOKENS.to_string();
    let server = Server::start_binary(
        &options.binary,
        &[
            "--config",
            config.to_str().expect("utf-8 path"),
            "-np",
            &slots,
            "-c",
            &total_ctx,
            "-b",
            &batch,
            "-t",
            "2",
            "--api-key",
            API_KEY,
        ],
    );
    let api = Api::new(&server, API_KEY);
    let baseline = idle::warm_up(&api, &server);
    let load_end = started + budget.saturating_sub(RESERVE);
    let workload = clients::Workload { api: &api, mode, clients: options.clients, seed: options.seed, load_end };
    let load = std::thread::scope(|scope| {
        let faults = scope.spawn(|| faults::schedule(&api, &server, mode, load_end));
        let peak = scope.spawn(|| peak_rss(&api, load_end));
        let tally = workload.run(scope);
        let (faults, rss_peak_kib) = (faults.join().expect("the fault schedule ran"), peak.join().ok().flatten());
        Load { tally, faults, rss_peak_kib }
    });
    let idle = idle::check(&api, &baseline);
    let log = server.log();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    ModeReport::new(mode, load, idle, &log, started.elapsed())
}

/// The most resident memory read, every 50 ms, until `until`.
fn peak_rss(api: &Api, until: Instant) -> Option<u64> {
    let mut peak = None;
    while Instant::now() < until {
        peak = peak.max(api.rss_kib());
        std::thread::sleep(Duration::from_millis(50));
    }
    peak
}
