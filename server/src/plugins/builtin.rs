//! Built-in plugins, embedded at build time from `plugins/dist/` (rebuilt by
//! `cargo xtask plugins`, checked by `cargo xtask plugins --check`).

/// Built-in scheduling policies by name.
pub const BUILTIN_POLICIES: &[(&str, &[u8])] =
    &[("continuous", include_bytes!("../../../plugins/dist/continuous.wasm"))];

/// The component of a built-in policy.
pub fn builtin_policy(name: &str) -> Option<(&'static str, &'static [u8])> {
    BUILTIN_POLICIES.iter().find(|(builtin, _)| *builtin == name).copied()
}
