//! Loading a plugin component and checking that it is what the host expects:
//! a component (not a core module), exporting the expected interface of
//! `sluice:plugin` at the host's version, importing nothing.

use std::fmt;
use std::path::PathBuf;

use wasmtime::component::{Component, types::ComponentItem};

use super::fault::PluginFault;
use super::host::PluginHost;

/// The WIT package version this host implements.
pub const PACKAGE_VERSION: &str = "0.3.0";

/// Where a plugin's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// A built-in plugin embedded in the binary.
    Builtin(&'static str),
    /// A `.wasm` file.
    Path(PathBuf),
}

impl fmt::Display for PluginSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginSource::Builtin(name) => write!(f, "built-in plugin `{name}`"),
            PluginSource::Path(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Why a plugin was refused at load time. The message names the plugin.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{plugin}: cannot read plugin: {error}")]
    Read { plugin: PluginSource, error: std::io::Error },
    #[error("{plugin}: not a WebAssembly file (no `\\0asm` header)")]
    NotWasm { plugin: PluginSource },
    #[error(
        "{plugin}: a core wasm module, not a component; turn it into a component (`cargo xtask plugins` does this)"
    )]
    CoreModule { plugin: PluginSource },
    #[error("{plugin}: cannot compile component: {error}")]
    Compile { plugin: PluginSource, error: String },
    #[error("{plugin}: imports {imports}; plugins may import nothing (no WASI, no host functions)")]
    Imports { plugin: PluginSource, imports: String },
    #[error("{plugin}: is a `{found}` plugin, expected a `{expected}` plugin")]
    WrongWorld { plugin: PluginSource, found: String, expected: &'static str },
    #[error("{plugin}: built for {found}, but this host implements sluice:plugin@{PACKAGE_VERSION}")]
    WrongVersion { plugin: PluginSource, found: String },
    #[error("{plugin}: exports {exports}, expected `{expected}`")]
    MissingExport { plugin: PluginSource, exports: String, expected: String },
    #[error("{plugin}: `{export}` does not match the host's interface: {error}")]
    Mismatch { plugin: PluginSource, export: String, error: String },
    #[error("{plugin}: cannot instantiate: {fault}")]
    Instantiate { plugin: PluginSource, fault: PluginFault },
    #[error("{plugin}: settings refused: {message}")]
    Configure { plugin: PluginSource, message: String },
    #[error("{plugin}: {message}")]
    Settings { plugin: PluginSource, message: String },
}

/// The worlds of `sluice:plugin`, by the interface each exports.
const WORLDS: &[(&str, &str)] = &[("policy", "scheduler"), ("fixup", "draft-fixup")];

/// Read and compile a component, refusing anything that is not a plugin of
/// `world` (exporting `interface`) at the host's version.
pub(super) fn load(
    host: &PluginHost,
    source: &PluginSource,
    bytes: &[u8],
    interface: &str,
) -> Result<Component, LoadError> {
    let source_of = || source.clone();
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(LoadError::NotWasm { plugin: source_of() });
    }
    // Bytes 6..8 are the layer: 0 for core modules, 1 for components.
    if bytes[6..8] == [0, 0] {
        return Err(LoadError::CoreModule { plugin: source_of() });
    }
    let component = Component::new(host.engine(), bytes)
        .map_err(|error| LoadError::Compile { plugin: source_of(), error: format!("{error:#}") })?;

    let engine = host.engine();
    let ty = component.component_type();
    let imports: Vec<String> =
        ty.imports(engine).map(|(name, item)| format!("`{name}` ({})", kind(&item.ty))).collect();
    if !imports.is_empty() {
        return Err(LoadError::Imports { plugin: source_of(), imports: imports.join(", ") });
    }

    let expected = format!("sluice:plugin/{interface}@{PACKAGE_VERSION}");
    let exports: Vec<String> = ty.exports(engine).map(|(name, _)| name.to_owned()).collect();
    if exports.contains(&expected) {
        return Ok(component);
    }
    let expected_world = world_of(interface);
    for name in &exports {
        let Some((found_interface, version)) =
            name.strip_prefix("sluice:plugin/").and_then(|rest| rest.split_once('@'))
        else {
            continue;
        };
        if found_interface != interface {
            let found = WORLDS
                .iter()
                .find(|(exported, _)| *exported == found_interface)
                .map_or_else(|| format!("sluice:plugin/{found_interface}"), |(_, world)| (*world).to_owned());
            return Err(LoadError::WrongWorld { plugin: source_of(), found, expected: expected_world });
        }
        return Err(LoadError::WrongVersion { plugin: source_of(), found: format!("sluice:plugin@{version}") });
    }
    let exports = if exports.is_empty() { "nothing".to_owned() } else { exports.join(", ") };
    Err(LoadError::MissingExport { plugin: source_of(), exports, expected })
}

fn world_of(interface: &str) -> &'static str {
    WORLDS.iter().find(|(exported, _)| *exported == interface).map_or("unknown", |(_, world)| world)
}

fn kind(item: &ComponentItem) -> &'static str {
    match item {
        ComponentItem::ComponentFunc(_) => "function",
        ComponentItem::CoreFunc(_) => "core function",
        ComponentItem::Module(_) => "module",
        ComponentItem::Component(_) => "component",
        ComponentItem::ComponentInstance(_) => "instance",
        ComponentItem::Type(_) => "type",
        ComponentItem::Resource(_) => "resource",
    }
}
