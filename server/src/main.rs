//! The `sluice` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use sluice::config::Config;
use sluice::plugins::{PluginHost, PluginSource, WasmFixup, WasmPolicy, builtin_policy, settings_from_toml};

#[derive(Parser)]
#[command(name = "sluice", version, about = "LLM inference server with sandboxed, hot-swappable scheduling")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(ServeArgs),
    /// Work with plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Scheduling policy: a built-in name or a path to a .wasm component.
    #[arg(long, value_name = "NAME|PATH")]
    policy: Option<String>,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Load a plugin as the server would and report whether it is accepted.
    Check {
        /// A .wasm component, or a built-in policy name.
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Plugin(PluginCommand::Check { plugin, world, config }) => check_plugin(&plugin, world, config.as_deref()),
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

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = load_config(args.config.as_deref())?;
    if let Some(policy) = args.policy {
        config.policy.plugin = policy;
    }
    let host = PluginHost::new()?;
    let policy = load_policy(&host, &config)?;
    eprintln!("policy `{}` loaded", sluice::engine::policy::SchedulingPolicy::name(&policy));
    eprintln!("sluice cannot serve yet: the model core and engine are not built (issues B and C)");
    Ok(ExitCode::from(2))
}

fn load_policy(host: &PluginHost, config: &Config) -> anyhow::Result<WasmPolicy> {
    let source = config.policy.source().map_err(anyhow::Error::msg)?;
    let bytes = read_plugin(&source)?;
    let settings = settings_from_toml(&config.policy.settings).map_err(anyhow::Error::msg)?;
    Ok(WasmPolicy::load(host, source, &bytes, settings, config.policy.limits())?)
}

fn read_plugin(source: &PluginSource) -> anyhow::Result<Vec<u8>> {
    match source {
        PluginSource::Builtin(name) => {
            builtin_policy(name).map(|(_, bytes)| bytes.to_vec()).with_context(|| format!("no built-in plugin `{name}`"))
        }
        PluginSource::Path(path) => {
            std::fs::read(path).with_context(|| format!("{}: cannot read plugin", path.display()))
        }
    }
}

fn check_plugin(plugin: &str, world: World, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = load_config(config)?;
    config.policy.plugin = plugin.to_owned();
    let host = PluginHost::new()?;
    match world {
        World::Scheduler => {
            load_policy(&host, &config)?;
            println!("{plugin}: accepted as a scheduler policy (sluice:plugin@0.1.0)");
        }
        World::DraftFixup => {
            let source = PluginSource::Path(PathBuf::from(plugin));
            let bytes = read_plugin(&source)?;
            WasmFixup::load(&host, source, &bytes, config.policy.limits())?;
            println!("{plugin}: accepted as a draft fixup (sluice:plugin@0.1.0)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
