//! Everything start-up and reloads share: reading a plugin source once
//! (policies, fallbacks, fixups), loading a model on its device, pairing a
//! draft with its target, and starting the engine. `main.rs`, the HTTP
//! server, its admin endpoints, the lab and the benchmarks all come here.

mod draft;
mod model;
mod plugins;
mod templates;

pub use draft::{AppliedEdit, DraftKind, PairedDraft, PairingError, load_speculation, model_info, pair};
pub use model::{Serving, StartError, check_device, engine_config, load_model, load_projector, serve_model};
pub use plugins::{
    PluginError, World, confine, fallback, fault_rules, load_fixup, load_fixups, load_policy, load_shadows, read_plugin,
};
pub use templates::builtins as builtin_templates;
