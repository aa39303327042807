//! The `sluice` command line.

mod cli;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use sluice::config::{Config, LogConfig, LogFormat, Overrides, help_epilogue, llama_style_args, threads_or_cores};
use sluice::http::server::Launch;
use sluice::startup::{check_device, load_fixup, load_policy, load_shadows};
use sluice_engine::policy::SchedulingPolicy;
use sluice_plugin_host::{PACKAGE_VERSION, PluginHost, PluginSource, builtin_fixup};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    propagate_version = true,
    about = "LLM inference server with sandboxed, hot-swappable scheduling"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(Box<ServeArgs>),
    /// Generate from one prompt straight on the model; prints tokens/s.
    Generate(cli::generate::GenerateArgs),
    /// Compare scheduling policies on a workload: simulated, and live with --live.
    #[cfg(feature = "lab")]
    Lab(Box<cli::lab::LabArgs>),
    /// Compare scheduling policies (needs a build with the cargo feature `lab`).
    #[cfg(not(feature = "lab"))]
    Lab(cli::WithoutLab),
    /// Measure speed.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Inspect model files.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Work with plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Decode and prefill tokens/s of a model.
    Model(cli::bench::BenchModelArgs),
    /// Aggregate tokens/s and latency percentiles of a running server.
    #[cfg(feature = "lab")]
    Serve(cli::lab::BenchServeArgs),
    /// Fit the policy lab's step-cost model to real forward passes.
    #[cfg(feature = "lab")]
    Calibrate(cli::lab::BenchCalibrateArgs),
    /// Mask time of structured outputs, and decode speed with and without
    /// a JSON schema on a running server.
    #[cfg(feature = "lab")]
    Constrained(cli::lab::BenchConstrainedArgs),
    /// Prefill time of a long prompt uncached, and of it with more after
    /// it once cached, on a running server.
    #[cfg(feature = "lab")]
    Cache(cli::lab::BenchCacheArgs),
    /// Load a running server (needs a build with the cargo feature `lab`).
    #[cfg(not(feature = "lab"))]
    Serve(cli::WithoutLab),
    /// Structured outputs' cost (needs a build with the cargo feature `lab`).
    #[cfg(not(feature = "lab"))]
    Constrained(cli::WithoutLab),
    /// What the prefix cache saves (needs a build with the cargo feature `lab`).
    #[cfg(not(feature = "lab"))]
    Cache(cli::WithoutLab),
    /// Fit the lab's step-cost model (needs a build with the cargo feature `lab`).
    #[cfg(not(feature = "lab"))]
    Calibrate(cli::WithoutLab),
    /// Decode speed without and with a draft, and how much of it is kept.
    Spec(cli::bench_spec::BenchSpecArgs),
    /// Time to prepare and encode one image with a projector's vision tower.
    Vision(cli::bench_vision::BenchVisionArgs),
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Print what sluice makes of a GGUF file (its shards, family, layer
    /// kinds and weight types, or why it is refused), its metadata and its
    /// tensor table.
    Info {
        /// The GGUF file (of a split model, its first shard).
        file: PathBuf,
        /// Also load every tensor on the CPU as `serve` would, naming any
        /// missing or misshapen one (takes the model's size in memory).
        #[arg(long)]
        load: bool,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    flags: Overrides,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Load a plugin as the server would and report whether it is accepted.
    Check {
        /// A .wasm component, or a built-in plugin's name.
        plugin: String,
        /// The world the plugin must implement.
        #[arg(long, value_enum, default_value_t = World::Scheduler)]
        world: World,
        /// Read `[policy]` limits and settings from this config file.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum World {
    Scheduler,
    DraftFixup,
}

fn main() -> ExitCode {
    // llama-server spells some flags in ways clap cannot (`-np`, `--ctx_size`),
    // and sluice ignores or refuses some of its flags.
    let llama = match llama_style_args(std::env::args_os()) {
        Ok(llama) => llama,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    // As in llama-server, a flag given twice takes the later value.
    let command =
        Cli::command().mut_subcommand("serve", |serve| serve.after_long_help(help_epilogue()).args_override_self(true));
    let cli = match command.try_get_matches_from(llama.args).and_then(|matches| Cli::from_arg_matches(&matches)) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let result = match cli.command {
        Command::Serve(args) => serve(*args, &llama.ignored),
        Command::Generate(args) => cli::generate::generate(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Model(args)) => cli::bench::bench_model(args).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "lab")]
        Command::Bench(BenchCommand::Serve(args)) => cli::lab::bench_serve(args).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "lab")]
        Command::Bench(BenchCommand::Calibrate(args)) => cli::lab::bench_calibrate(args).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "lab")]
        Command::Bench(BenchCommand::Constrained(args)) => {
            cli::lab::bench_constrained(args).map(|()| ExitCode::SUCCESS)
        }
        #[cfg(feature = "lab")]
        Command::Bench(BenchCommand::Cache(args)) => cli::lab::bench_cache(args).map(|()| ExitCode::SUCCESS),
        #[cfg(not(feature = "lab"))]
        Command::Bench(
            BenchCommand::Serve(args)
            | BenchCommand::Calibrate(args)
            | BenchCommand::Constrained(args)
            | BenchCommand::Cache(args),
        )
        | Command::Lab(args) => args.refuse().map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Spec(args)) => cli::bench_spec::bench_spec(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Vision(args)) => cli::bench_vision::bench_vision(args).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "lab")]
        Command::Lab(args) => cli::lab::lab(*args).map(|()| ExitCode::SUCCESS),
        Command::Model(ModelCommand::Info { file, load }) => {
            cli::model_info::model_info(&file, load).map(|()| ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Check { plugin, world, config }) => {
            check_plugin(&plugin, world, config.as_deref())
        }
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    match path {
        Some(path) => Ok(Config::load(path)?),
        None => Ok(Config::default()),
    }
}

fn serve(args: ServeArgs, ignored: &[String]) -> anyhow::Result<ExitCode> {
    let mut config = load_config(args.config.as_deref())?;
    config.apply(&args.flags).map_err(anyhow::Error::msg)?;
    init_logging(&config.log)?;
    for note in ignored {
        tracing::warn!("{note}");
    }
    check_device(&config)?;
    let host = PluginHost::new()?;
    let policy = load_policy(&host, &config.policy)?;
    eprintln!("policy `{}` loaded", policy.name());
    let shadows = load_shadows(&host, &config.policy)?;
    for shadow in &shadows {
        eprintln!("shadow policy `{}` loaded", shadow.name());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads_or_cores(config.server.threads_http))
        .thread_name("http")
        .enable_all()
        .build()
        .context("cannot start the HTTP runtime")?;
    let launch = Launch { config, config_file: args.config, flags: args.flags, host, policy, shadows };
    let served = runtime.block_on(sluice::http::serve(launch));
    // A model load still running on a blocking thread must not hold up the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Logs go to stderr, filtered by `log.level`, as text or JSON lines.
fn init_logging(log: &LogConfig) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(&log.level).context("log.level")?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|error| anyhow::anyhow!("cannot install the logger: {error}"))
}

fn check_plugin(plugin: &str, world: World, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = load_config(config)?;
    config.policy.plugin = plugin.to_owned();
    let host = PluginHost::new()?;
    match world {
        World::Scheduler => {
            load_policy(&host, &config.policy)?;
            println!("{plugin}: accepted as a scheduler policy (sluice:plugin@{PACKAGE_VERSION})");
        }
        World::DraftFixup => {
            let source = match builtin_fixup(plugin) {
                Some((name, _)) => PluginSource::Builtin(name),
                None => PluginSource::Path(PathBuf::from(plugin)),
            };
            load_fixup(&host, source, config.policy.limits())?;
            println!("{plugin}: accepted as a draft fixup (sluice:plugin@{PACKAGE_VERSION})");
        }
    }
    Ok(ExitCode::SUCCESS)
}
