//! `sluice lab`: compare scheduling policies on one workload, in the
//! simulator (always) and live against the real engine (`--live`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;
use sluice::config::PolicyConfig;
use sluice::lab::live::{Client, Target, replay};
use sluice::lab::report::{cdf_svg, timeline_svg};
use sluice::lab::sim::{CostModel, EngineShape, simulate};
use sluice::lab::stats::{Percentiles, RequestRecord, Slo, Summary};
use sluice::lab::workload::{Arrivals, Generator, Length, TraceRequest, read_workload, to_jsonl};
use sluice::startup::{fallback, fault_rules, load_policy};
use sluice_engine::OnFault;
use sluice_engine::supervisor::Supervisor;
use sluice_plugin_host::PluginHost;

mod bench;
mod bench_cache;
mod bench_constrained;
mod policy;
mod replay;

pub use bench::{BenchCalibrateArgs, BenchServeArgs, bench_calibrate, bench_serve};
pub use bench_cache::{BenchCacheArgs, bench_cache};
pub use bench_constrained::{BenchConstrainedArgs, bench_constrained};
use policy::{on_fault_parser, policy_config};
use replay::{ReplayArgs, lab_replay};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LabArgs {
    #[command(subcommand)]
    command: Option<LabCommand>,
    /// A policy to compare: a built-in name or a .wasm path, optionally with
    /// settings for its `configure`: `cohort,max_wait_ms=500`. Repeatable.
    #[arg(long = "policy", value_name = "NAME|PATH[,KEY=VALUE...]", default_value = "continuous")]
    policies: Vec<String>,
    /// A JSONL trace (arrival_ms, prompt_tokens, max_tokens, adapter, priority,
    /// prompt), or a server's step trace (`--record-trace`).
    #[arg(long, value_name = "FILE", conflicts_with = "arrivals")]
    trace: Option<PathBuf>,
    /// Generate the workload instead: poisson:RATE, gamma:RATE:CV or burst.
    #[arg(long, default_value = "poisson:2")]
    arrivals: String,
    /// Generated requests.
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// Generated prompt lengths: N or A..B.
    #[arg(long, default_value = "16..256")]
    prompt_tokens: String,
    /// Generated output lengths: N or A..B.
    #[arg(long, default_value = "16..128")]
    max_tokens: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Slots (as `sluice serve -np`).
    #[arg(long = "slots", short = 'n', default_value_t = 4)]
    slots: usize,
    /// Token budget per step (as `sluice serve -b`).
    #[arg(long, default_value_t = 512)]
    batch_tokens: u32,
    /// Steps without a grant before a policy counts as stalled (as
    /// `[policy] stall_steps`).
    #[arg(long, default_value_t = PolicyConfig::default().stall_steps)]
    stall_steps: u32,
    /// After two faults in a row: fail-closed, or fallback to continuous
    /// (as `[policy] on_fault`).
    #[arg(long, default_value = "fail-closed", value_parser = on_fault_parser())]
    on_fault: OnFault,
    /// The step-cost model from `sluice bench calibrate`.
    #[arg(long, value_name = "FILE", default_value = "target/lab/cost-model.json")]
    cost_model: PathBuf,
    /// Also replay the workload in real time against `sluice serve` on this model.
    #[arg(long)]
    live: bool,
    /// The model for --live.
    #[arg(short = 'm', long, value_name = "FILE", default_value = "target/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Kernel threads for --live.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: usize,
    /// Goodput SLO: time to first token.
    #[arg(long, default_value_t = 2000.0)]
    slo_ttft_ms: f64,
    /// Goodput SLO: every gap between tokens.
    #[arg(long, default_value_t = 250.0)]
    slo_itl_ms: f64,
    /// Where report.json, trace.jsonl and the SVG pictures go.
    #[arg(long, value_name = "DIR", default_value = "target/lab/report")]
    out: PathBuf,
    /// Print report.json to stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum LabCommand {
    /// Run a policy against the steps a server recorded (`--record-trace`)
    /// and report where it would have decided differently.
    Replay(ReplayArgs),
}

struct PolicyRun {
    label: String,
    engine: &'static str,
    summary: Summary,
    records: Vec<RequestRecord>,
    decision_hash: Option<String>,
    fault: Option<String>,
    /// (ms, requests waiting for a slot) after each simulated step.
    queue: Vec<(f64, usize)>,
}

pub fn lab(args: LabArgs) -> anyhow::Result<()> {
    if let Some(LabCommand::Replay(replay)) = args.command {
        return lab_replay(replay);
    }
    let trace = workload(&args)?;
    let cost = read_cost_model(&args.cost_model)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("trace.jsonl"), to_jsonl(&trace))?;
    let slo = Slo { ttft_ms: args.slo_ttft_ms, itl_ms: args.slo_itl_ms };
    let shape = EngineShape { slots: args.slots, token_budget: args.batch_tokens };
    let host = PluginHost::new()?;
    let mut runs = Vec::new();
    for spec in &args.policies {
        let rules = PolicyConfig { on_fault: args.on_fault, stall_steps: args.stall_steps, ..PolicyConfig::default() };
        let config = policy_config(spec, rules)?;
        let policy = load_policy(&host, &config).with_context(|| format!("policy `{spec}`"))?;
        let mut supervisor = Supervisor::new(Box::new(policy), fallback(&host, &config), fault_rules(&config));
        let run = simulate(&mut supervisor, &trace, shape, cost);
        let picture = timeline_svg(&format!("{spec}: slot phases (simulated)"), args.slots, &run.timeline);
        std::fs::write(args.out.join(format!("timeline-{}.svg", file_stem(spec))), picture)?;
        runs.push(PolicyRun {
            label: spec.clone(),
            engine: "sim",
            summary: Summary::of(&run.records, slo),
            records: run.records,
            decision_hash: Some(run.decision_hash),
            fault: run.fault,
            queue: thin(&run.queue, 500),
        });
        if args.live {
            let records = live_run(&args, &config, &trace)?;
            runs.push(PolicyRun {
                label: spec.clone(),
                engine: "live",
                summary: Summary::of(&records, slo),
                records,
                decision_hash: None,
                fault: None,
                queue: Vec::new(),
            });
        }
    }
    write_pictures(&args.out, &runs)?;
    let report = report_json(&args, &runs, cost);
    std::fs::write(args.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&trace, &runs);
        println!("report, trace and pictures in {}", args.out.display());
    }
    Ok(())
}

fn workload(args: &LabArgs) -> anyhow::Result<Vec<TraceRequest>> {
    if let Some(path) = &args.trace {
        return Ok(read_workload(path)?);
    }
    let generator = Generator {
        arrivals: args.arrivals.parse::<Arrivals>().map_err(|error| anyhow::anyhow!("--arrivals: {error}"))?,
        requests: args.requests,
        prompt_tokens: args
            .prompt_tokens
            .parse::<Length>()
            .map_err(|error| anyhow::anyhow!("--prompt-tokens: {error}"))?,
        max_tokens: args.max_tokens.parse::<Length>().map_err(|error| anyhow::anyhow!("--max-tokens: {error}"))?,
        seed: args.seed,
    };
    if generator.requests == 0 {
        bail!("--requests must be at least 1");
    }
    Ok(generator.generate()?)
}

fn read_cost_model(path: &Path) -> anyhow::Result<CostModel> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!("{}: cannot read the cost model (write one with `sluice bench calibrate`)", path.display())
    })?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a cost model", path.display()))
}

/// At most `points` evenly spaced samples of a series (its maximum is what
/// matters most, so each kept point is the largest of the ones it stands for).
fn thin(series: &[(f64, usize)], points: usize) -> Vec<(f64, usize)> {
    let stride = series.len().div_ceil(points.max(1)).max(1);
    series.chunks(stride).filter_map(|chunk| chunk.iter().copied().max_by_key(|&(_, waiting)| waiting)).collect()
}

fn file_stem(spec: &str) -> String {
    spec.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// Kills the server when the replay ends, however it ends.
struct ChildServer(Child);

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sluice serve` with the policy, replays the trace in real time
/// and stops the server.
fn live_run(args: &LabArgs, policy: &PolicyConfig, trace: &[TraceRequest]) -> anyhow::Result<Vec<RequestRecord>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    // The config file's directory anchors relative plugin paths; hand the
    // server an absolute one.
    let plugin = match std::fs::canonicalize(&policy.plugin) {
        Ok(absolute) => absolute.display().to_string(),
        Err(_) => policy.plugin.clone(),
    };
    let policy_table = toml::Table::from_iter([
        ("plugin".to_owned(), toml::Value::String(plugin)),
        ("stall_steps".to_owned(), toml::Value::Integer(i64::from(policy.stall_steps))),
        ("on_fault".to_owned(), toml::Value::String(policy.on_fault.as_str().to_owned())),
        ("settings".to_owned(), toml::Value::Table(policy.settings.clone())),
    ]);
    let config = toml::to_string(&toml::Table::from_iter([("policy".to_owned(), toml::Value::Table(policy_table))]))?;
    let stem = file_stem(&policy.plugin);
    let config_path = args.out.join(format!("live-{stem}.toml"));
    std::fs::write(&config_path, config)?;
    let log_path = args.out.join(format!("live-{stem}.log"));
    let mut server = ChildServer(
        Command::new(std::env::current_exe()?)
            .args(["serve", "--config"])
            .arg(&config_path)
            .arg("-m")
            .arg(&args.model)
            .args(["--port", &port.to_string(), "-np", &args.slots.to_string()])
            .args(["-b", &args.batch_tokens.to_string(), "-t", &args.threads.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path)?)
            .spawn()
            .context("starting sluice serve for --live")?,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let client = Client::new(Target {
        base_url: format!("http://127.0.0.1:{port}"),
        api_key: None,
        token_range: (1000, 20000),
        seed: args.seed,
    })?;
    // Up to two minutes for the model to load, unless the server exits.
    for _ in 0..120 {
        if let Some(status) = server.0.try_wait()? {
            bail!("sluice serve for --live exited ({status}); its log: {}", log_path.display());
        }
        if runtime.block_on(client.wait_healthy(Duration::from_secs(1))).is_ok() {
            return Ok(runtime.block_on(replay(&client, trace)));
        }
    }
    bail!("sluice serve for --live did not become healthy; its log: {}", log_path.display())
}

fn write_pictures(out: &Path, runs: &[PolicyRun]) -> anyhow::Result<()> {
    let series = |pick: fn(&RequestRecord) -> Option<f64>| -> Vec<(String, Vec<f64>)> {
        runs.iter()
            .map(|run| {
                let samples = run.records.iter().filter(|r| r.error.is_none()).filter_map(pick).collect();
                (format!("{} ({})", run.label, run.engine), samples)
            })
            .collect()
    };
    std::fs::write(out.join("ttft-cdf.svg"), cdf_svg("Time to first token, CDF", "ms", &series(|r| r.ttft_ms())))?;
    let e2e = series(|r| Some(r.end_ms - r.arrival_ms));
    std::fs::write(out.join("e2e-cdf.svg"), cdf_svg("End-to-end latency, CDF", "ms", &e2e))?;
    Ok(())
}

fn report_json(args: &LabArgs, runs: &[PolicyRun], cost: CostModel) -> serde_json::Value {
    let sim_error = |label: &str| {
        let find = |engine: &str| runs.iter().find(|run| run.label == label && run.engine == engine);
        let (sim, live) = (find("sim")?, find("live")?);
        let relative = |s: f64, l: f64| if l > 0.0 { (s - l) / l } else { f64::NAN };
        let p50 = |p: Option<Percentiles>| p.map_or(f64::NAN, |p| p.p50);
        Some(json!({
            "throughput": relative(sim.summary.throughput_tps, live.summary.throughput_tps),
            "ttft_p50": relative(p50(sim.summary.ttft_ms), p50(live.summary.ttft_ms)),
            "e2e_p50": relative(p50(sim.summary.e2e_ms), p50(live.summary.e2e_ms)),
        }))
    };
    json!({
        "slots": args.slots,
        "batch_tokens": args.batch_tokens,
        "slo": { "ttft_ms": args.slo_ttft_ms, "itl_ms": args.slo_itl_ms },
        "cost_model": cost,
        "runs": runs.iter().map(|run| json!({
            "policy": run.label,
            "engine": run.engine,
            "summary": run.summary,
            "decision_hash": run.decision_hash,
            "fault": run.fault,
            "queue": run.queue,
            "queue_max": run.queue.iter().map(|&(_, waiting)| waiting).max(),
            "sim_vs_live_relative_error": if run.engine == "live" { sim_error(&run.label) } else { None },
        })).collect::<Vec<_>>(),
    })
}

fn print_table(trace: &[TraceRequest], runs: &[PolicyRun]) {
    println!("{} requests", trace.len());
    println!(
        "| policy | engine | failed | tok/s | goodput req/s | TTFT p50 / p90 / p99 ms | ITL p50 / p99 ms | E2E p50 / p99 ms | queue max | decision hash |"
    );
    println!("|---|---|---:|---:|---:|---|---|---|---:|---|");
    let triple =
        |p: Option<Percentiles>| p.map_or("-".into(), |p| format!("{:.0} / {:.0} / {:.0}", p.p50, p.p90, p.p99));
    let pair = |p: Option<Percentiles>| p.map_or("-".into(), |p| format!("{:.1} / {:.1}", p.p50, p.p99));
    for run in runs {
        let s = &run.summary;
        println!(
            "| {} | {} | {} | {:.1} | {:.2} | {} | {} | {} | {} | {} |",
            run.label,
            run.engine,
            s.failed,
            s.throughput_tps,
            s.goodput_rps,
            triple(s.ttft_ms),
            pair(s.itl_ms),
            pair(s.e2e_ms),
            run.queue.iter().map(|&(_, waiting)| waiting).max().map_or("-".into(), |max| max.to_string()),
            run.decision_hash.as_deref().unwrap_or("-")
        );
        if let Some(fault) = &run.fault {
            println!("  {}: quarantined: {fault}", run.label);
        }
    }
}
