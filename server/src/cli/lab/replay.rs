//! `sluice lab replay`: a policy against a server's recorded steps.

use std::path::PathBuf;

use anyhow::{Context, bail};
use sluice::config::PolicyConfig;
use sluice::lab::replay::{ReplayReport, replay};
use sluice::startup::{fault_rules, load_policy};
use sluice_engine::trace::{read_header, trace_lines};
use sluice_plugin_host::PluginHost;

use super::policy::policy_config;

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Trace files written by `sluice serve --record-trace`, oldest first
    /// (`FILE.1 FILE` after a rotation).
    #[arg(required = true, value_name = "FILE")]
    traces: Vec<PathBuf>,
    /// The policy to replay: a built-in name or a .wasm path, optionally
    /// with settings: `cohort,max_wait_ms=500`.
    #[arg(long, value_name = "NAME|PATH[,KEY=VALUE...]")]
    policy: String,
    /// Steps without a grant before the policy counts as stalled; by
    /// default the server's (the trace's header, as are the sandbox limits).
    #[arg(long)]
    stall_steps: Option<u32>,
    /// Divergent steps to list.
    #[arg(long, default_value_t = 20)]
    divergences: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn lab_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let header = read_header(&args.traces[0])?;
    let rules = PolicyConfig {
        fuel: header.fuel,
        deadline_ms: header.deadline_ms,
        memory_mb: header.memory_mb,
        stall_steps: args.stall_steps.unwrap_or(header.stall_steps),
        ..PolicyConfig::default()
    };
    let config = policy_config(&args.policy, rules)?;
    let host = PluginHost::new()?;
    let policy = load_policy(&host, &config).with_context(|| format!("policy `{}`", args.policy))?;
    let files = args.traces.iter().map(|path| trace_lines(path)).collect::<Result<Vec<_>, _>>()?;
    let report = replay(files.into_iter().flatten(), Box::new(policy), fault_rules(&config), args.divergences)?;
    if report.steps == 0 && report.quarantined.is_none() {
        bail!("the trace holds no steps");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(report: &ReplayReport) {
    let percent = |agreed: u64| 100.0 * agreed as f64 / report.steps.max(1) as f64;
    let agreed = report.agreed;
    println!(
        "policy {} over {} steps of {} server run(s) ({} missing from the trace)",
        report.policy, report.steps, report.runs, report.missing_steps
    );
    println!(
        "agreement: admit {:.1} %, prefill {:.1} %, decode {:.1} %, whole decision {:.1} %",
        percent(agreed.admit),
        percent(agreed.prefill),
        percent(agreed.decode),
        percent(agreed.all)
    );
    println!("divergent steps: {}", report.divergent_steps);
    println!("decision hash {} (applied: {})", report.decision_hash, report.applied_hash);
    for (reason, count) in &report.faults {
        println!("faults ({reason}): {count}");
    }
    if let Some(fault) = &report.quarantined {
        println!("quarantined {fault}; the replay stopped there");
    }
    for divergence in &report.divergences {
        println!(
            "  step {}: {} differ; applied {:?}, replayed {:?}",
            divergence.step,
            divergence.parts.join(", "),
            divergence.applied,
            divergence.replayed
        );
    }
}
