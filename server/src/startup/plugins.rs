//! Plugin sources read once for everyone: the configured policy (at start,
//! on reloads, in the lab and the benchmarks), its fallback, and the draft
//! fixups.

use std::borrow::Cow;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::config::{PolicyConfig, SpeculativeConfig};
use sluice_engine::policy::SchedulingPolicy;
use sluice_engine::shadow::MAX_SHADOWS;
use sluice_engine::{FallbackPolicy, FaultRules};
use sluice_plugin_host::{
    LoadError, PluginHost, PluginLimits, PluginSource, WasmFixup, WasmPolicy, builtin_fixup, builtin_policy,
    settings_from_toml,
};

/// Why a plugin could not be loaded; the message names the plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{0}")]
    Config(String),
    #[error("no built-in plugin `{0}`")]
    NoBuiltin(String),
    #[error("{}: cannot read plugin: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// Which table a built-in name is looked up in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    Scheduler,
    DraftFixup,
}

/// A plugin's component: embedded for a built-in, read from disk for a path.
pub fn read_plugin(source: &PluginSource, world: World) -> Result<Cow<'static, [u8]>, PluginError> {
    match source {
        PluginSource::Builtin(name) => {
            let builtin = match world {
                World::Scheduler => builtin_policy(name),
                World::DraftFixup => builtin_fixup(name),
            };
            builtin.map(|(_, bytes)| Cow::Borrowed(bytes)).ok_or_else(|| PluginError::NoBuiltin((*name).to_owned()))
        }
        PluginSource::Path(path) => {
            read_component(path).map(Cow::Owned).map_err(|error| PluginError::Read { path: path.clone(), error })
        }
    }
}

/// Largest component file read. sluice's own are a few hundred KiB; the
/// bound keeps a path such as `/dev/zero`, or a huge file, from filling
/// the server's memory.
pub const MAX_COMPONENT_BYTES: u64 = 64 << 20;

/// A component file's bytes: a regular file of at most
/// [`MAX_COMPONENT_BYTES`]. It is opened without blocking, so that a FIFO
/// (whose open waits for a writer) is refused rather than waited on.
fn read_component(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let too_large = || {
        let message = format!("larger than {} MiB, the most a component may be", MAX_COMPONENT_BYTES >> 20);
        std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
    };
    if metadata.len() > MAX_COMPONENT_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    // The file may grow after it was measured: one byte more than the
    // bound shows it.
    file.take(MAX_COMPONENT_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// `path`, given to the admin API, as the file it names inside `folder`
/// (`policy.plugin_dir`): relative paths are taken in the folder, and the
/// file, its links followed, must lie within it.
pub fn confine(path: &Path, folder: Option<&Path>) -> Result<PathBuf, String> {
    let Some(folder) = folder else {
        return Err(format!(
            "{} is not loaded: the admin API loads .wasm files only from `policy.plugin_dir` (--plugin-dir), which is not set",
            path.display()
        ));
    };
    let root = folder
        .canonicalize()
        .map_err(|error| format!("`policy.plugin_dir` ({}) cannot be used: {error}", folder.display()))?;
    let resolved =
        root.join(path).canonicalize().map_err(|error| format!("{} cannot be read: {error}", path.display()))?;
    if !resolved.starts_with(&root) {
        return Err(format!("{} is outside `policy.plugin_dir` ({})", path.display(), folder.display()));
    }
    Ok(resolved)
}

/// Load, check and configure the policy `config` names, with its limits and
/// settings.
pub fn load_policy(host: &PluginHost, config: &PolicyConfig) -> Result<WasmPolicy, PluginError> {
    let source = config.source().map_err(PluginError::Config)?;
    let bytes = read_plugin(&source, World::Scheduler)?;
    let settings = settings_from_toml(&config.settings).map_err(PluginError::Config)?;
    Ok(WasmPolicy::load(host, source, &bytes, settings, config.limits())?)
}

/// Load the shadow policies `config` lists (`[[policy.shadow]]`), each
/// under the active policy's limits.
pub fn load_shadows(host: &PluginHost, config: &PolicyConfig) -> Result<Vec<WasmPolicy>, PluginError> {
    if config.shadow.len() > MAX_SHADOWS {
        return Err(PluginError::Config(format!(
            "`[[policy.shadow]]` lists {} policies; at most {MAX_SHADOWS} run as shadows",
            config.shadow.len()
        )));
    }
    config
        .shadow
        .iter()
        .map(|shadow| {
            load_policy(host, &config.for_shadow(shadow))
                .map_err(|error| PluginError::Config(format!("shadow policy `{}`: {error}", shadow.plugin)))
        })
        .collect()
}

/// Load a draft-fixup component from `source`.
pub fn load_fixup(host: &PluginHost, source: PluginSource, limits: PluginLimits) -> Result<WasmFixup, PluginError> {
    let bytes = read_plugin(&source, World::DraftFixup)?;
    Ok(WasmFixup::load(host, source, &bytes, limits)?)
}

/// The fixups `[speculative]` lists, in order.
pub fn load_fixups(
    host: &PluginHost,
    config: &SpeculativeConfig,
    limits: PluginLimits,
) -> Result<Vec<WasmFixup>, PluginError> {
    let sources = config.fixup_sources().map_err(PluginError::Config)?;
    sources.into_iter().map(|source| load_fixup(host, source, limits)).collect()
}

/// What the supervisor falls back to after a quarantine: the built-in
/// `continuous`, under `config`'s limits.
pub fn fallback(host: &PluginHost, config: &PolicyConfig) -> FallbackPolicy {
    let host = host.clone();
    let config = PolicyConfig { plugin: "continuous".into(), settings: toml::Table::new(), ..config.clone() };
    Box::new(move || match load_policy(&host, &config) {
        Ok(policy) => Some(Box::new(policy) as Box<dyn SchedulingPolicy>),
        Err(error) => {
            tracing::error!(%error, "cannot load the fallback policy");
            None
        }
    })
}

/// The supervisor's rules from `[policy]`.
pub fn fault_rules(config: &PolicyConfig) -> FaultRules {
    FaultRules { on_fault: config.on_fault, stall_steps: config.stall_steps }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::OnFault;

    #[test]
    fn builtins_come_from_their_world_and_paths_from_disk() {
        let policy = read_plugin(&PluginSource::Builtin("continuous"), World::Scheduler).expect("built in");
        assert!(policy.starts_with(b"\0asm"));
        let wrong = read_plugin(&PluginSource::Builtin("continuous"), World::DraftFixup).unwrap_err();
        assert_eq!(wrong.to_string(), "no built-in plugin `continuous`");
        let missing = read_plugin(&PluginSource::Path("/nonexistent/p.wasm".into()), World::Scheduler).unwrap_err();
        assert!(missing.to_string().starts_with("/nonexistent/p.wasm: cannot read plugin"), "{missing}");
    }

    #[test]
    fn the_fault_rules_follow_the_policy_section() {
        let config = PolicyConfig { on_fault: OnFault::Fallback, stall_steps: 9, ..PolicyConfig::default() };
        assert_eq!(fault_rules(&config), FaultRules { on_fault: OnFault::Fallback, stall_steps: 9 });
        assert_eq!(fault_rules(&PolicyConfig::default()), FaultRules::default());
    }

    /// A scratch folder of this test's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("sluice-plugins-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a scratch folder");
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn component_files_are_regular_and_bounded_and_a_fifo_is_not_waited_on() {
        let scratch = Scratch::new("read");
        let small = scratch.0.join("small.wasm");
        std::fs::write(&small, b"\0asm").expect("a file");
        assert_eq!(read_component(&small).expect("a regular file reads"), b"\0asm");
        let huge = scratch.0.join("huge.wasm");
        std::fs::File::create(&huge).and_then(|file| file.set_len(MAX_COMPONENT_BYTES + 1)).expect("a sparse file");
        let error = read_component(&huge).expect_err("too large");
        assert!(error.to_string().contains("64 MiB"), "{error}");
        let error = read_component(Path::new("/dev/zero")).expect_err("a device");
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let error = read_component(&scratch.0).expect_err("a folder");
        assert!(error.to_string().contains("not a regular file"), "{error}");
        // Opening a FIFO for reading blocks until a writer comes; this one
        // never gets one, so a blocking open would hang the test.
        let fifo = scratch.0.join("fifo.wasm");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
        assert!(made.success());
        let error = read_component(&fifo).expect_err("a FIFO");
        assert!(error.to_string().contains("not a regular file"), "{error}");
    }

    #[test]
    fn admin_paths_resolve_inside_the_plugin_folder_only() {
        let scratch = Scratch::new("confine");
        let folder = scratch.0.join("plugins");
        std::fs::create_dir_all(folder.join("nested")).expect("folders");
        std::fs::write(folder.join("nested/mine.wasm"), b"x").expect("a file");
        std::fs::write(scratch.0.join("outside.wasm"), b"x").expect("a file");
        std::os::unix::fs::symlink(scratch.0.join("outside.wasm"), folder.join("link.wasm")).expect("a link");
        let inside = folder.canonicalize().expect("exists").join("nested/mine.wasm");
        assert_eq!(confine(Path::new("nested/mine.wasm"), Some(&folder)), Ok(inside.clone()));
        assert_eq!(confine(&folder.join("nested/mine.wasm"), Some(&folder)), Ok(inside));
        for outside in [folder.join("../outside.wasm"), folder.join("link.wasm"), PathBuf::from("/etc/hostname")] {
            let error = confine(&outside, Some(&folder)).expect_err("outside");
            assert!(error.contains("outside `policy.plugin_dir`"), "{error}");
        }
        let error = confine(Path::new("missing.wasm"), Some(&folder)).expect_err("missing");
        assert!(error.contains("missing.wasm cannot be read"), "{error}");
        let error = confine(Path::new("nested/mine.wasm"), None).expect_err("no folder");
        assert!(error.contains("nested/mine.wasm is not loaded") && error.contains("which is not set"), "{error}");
    }
}
