//! `cargo xtask plugins [--pinned|--check]`: build every plugin in
//! `plugins/` into a component, written to `target/plugins/components/`.
//! `--pinned` builds with the pinned toolchain and writes `plugins/dist/`
//! (the built-ins the server embeds); `--check` rebuilds with the pinned
//! toolchain and fails if `plugins/dist/` differs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::toolchain::Toolchain;
use crate::workspace::{repo_root, run};

#[derive(clap::Args)]
pub struct PluginsArgs {
    /// Rebuild with the pinned toolchain and fail if plugins/dist/ differs.
    #[arg(long)]
    check: bool,
    /// Build with the pinned toolchain even when rustup's wasm target exists
    /// (this is what updates plugins/dist/).
    #[arg(long)]
    pinned: bool,
}

impl PluginsArgs {
    /// The arguments of `plugins --check`.
    pub fn check() -> Self {
        PluginsArgs { check: true, pinned: false }
    }
}

pub fn plugins(args: PluginsArgs) -> anyhow::Result<()> {
    let toolchain = if args.check || args.pinned { Toolchain::pinned()? } else { Toolchain::auto()? };
    eprintln!("xtask: building plugins with {}", toolchain.describe());
    let built = build_components(&toolchain)?;
    let dist = repo_root().join("plugins/dist");
    if args.check {
        return check_dist(&dist, &built);
    }
    // Only an explicit --pinned build updates the committed built-ins; an
    // author's everyday build (whichever toolchain it used) goes to target/.
    if args.pinned {
        write_dist(&dist, &built)?;
        eprintln!("xtask: wrote {} components to plugins/dist/", built.len());
    } else {
        let out = repo_root().join("target/plugins/components");
        write_dist(&out, &built)?;
        eprintln!(
            "xtask: wrote {} components to {} (plugins/dist/ is only written by --pinned)",
            built.len(),
            out.display()
        );
    }
    Ok(())
}

/// Build the plugins workspace and turn each core module into a component,
/// keyed by file name (`<package>.wasm`).
fn build_components(toolchain: &Toolchain) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let manifest = repo_root().join("plugins/Cargo.toml");
    let target_dir = repo_root().join(match toolchain {
        Toolchain::Rustup => "target/plugins/rustup",
        Toolchain::Pinned { .. } => "target/plugins/pinned",
    });
    run(&mut toolchain.cargo_build(&manifest, &target_dir)?)?;
    let out = target_dir.join("wasm32-unknown-unknown/release");
    let mut components = BTreeMap::new();
    for package in workspace_members(&manifest)? {
        let core = out.join(format!("{}.wasm", package.replace('-', "_")));
        let module = std::fs::read(&core).with_context(|| format!("reading {}", core.display()))?;
        let component = wit_component::ComponentEncoder::default()
            .module(&module)
            .and_then(|encoder| encoder.validate(true).encode())
            .with_context(|| format!("turning {} into a component", core.display()))?;
        components.insert(format!("{package}.wasm"), component);
    }
    Ok(components)
}

fn workspace_members(manifest: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(manifest)?;
    let parsed: toml::Table = toml::from_str(&text).with_context(|| format!("parsing {}", manifest.display()))?;
    let members = parsed
        .get("workspace")
        .and_then(|workspace| workspace.get("members"))
        .and_then(|members| members.as_array())
        .with_context(|| format!("{}: no [workspace] members", manifest.display()))?;
    members
        .iter()
        .map(|member| member.as_str().map(str::to_owned).context("workspace members must be strings"))
        .collect()
}

fn write_dist(dir: &Path, components: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in components {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

fn check_dist(dist: &Path, built: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for (name, bytes) in built {
        match std::fs::read(dist.join(name)) {
            Ok(committed) if committed == *bytes => {}
            Ok(committed) => problems.push(format!(
                "plugins/dist/{name} differs from a fresh build ({} bytes committed, {} built)",
                committed.len(),
                bytes.len()
            )),
            Err(_) => problems.push(format!("plugins/dist/{name} is missing")),
        }
    }
    for entry in std::fs::read_dir(dist)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".wasm") && !built.contains_key(&name) {
            problems.push(format!("plugins/dist/{name} has no plugin in plugins/"));
        }
    }
    if problems.is_empty() {
        eprintln!("xtask: plugins/dist/ matches a fresh pinned build ({} components)", built.len());
        return Ok(());
    }
    let rebuilt = repo_root().join("target/plugins/check");
    write_dist(&rebuilt, built)?;
    bail!(
        "{}\nrun `cargo xtask plugins --pinned` and commit plugins/dist/ (fresh build left in {})",
        problems.join("\n"),
        PathBuf::from(&rebuilt).display()
    )
}
