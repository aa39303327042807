//! Built-in plugins, embedded at build time from `plugins/dist/` (rebuilt by
//! `cargo xtask plugins`, checked by `cargo xtask plugins --check`).

/// A table entry `(name, component)` for `plugins/dist/<name>.wasm`.
macro_rules! builtin {
    ($name:literal) => {
        ($name, include_bytes!(concat!("../../../plugins/dist/", $name, ".wasm")) as &[u8])
    };
}

/// Built-in scheduling policies by name; `continuous` is the default and
/// the fallback (docs/scheduling.md, "Built-in policies").
pub const BUILTIN_POLICIES: &[(&str, &[u8])] =
    &[builtin!("continuous"), builtin!("chunked"), builtin!("cohort"), builtin!("prefill-first"), builtin!("priority")];

/// Built-in draft fixups by name; `mrope-temporal` runs on every draft
/// unless `speculative.fixups` says otherwise (docs/draft-fixups.md).
pub const BUILTIN_FIXUPS: &[(&str, &[u8])] = &[builtin!("mrope-temporal")];

/// The component of a built-in fixup.
pub fn builtin_fixup(name: &str) -> Option<(&'static str, &'static [u8])> {
    BUILTIN_FIXUPS.iter().find(|(builtin, _)| *builtin == name).copied()
}

/// The component of a built-in policy.
pub fn builtin_policy(name: &str) -> Option<(&'static str, &'static [u8])> {
    BUILTIN_POLICIES.iter().find(|(builtin, _)| *builtin == name).copied()
}

#[cfg(test)]
#[path = "builtin_tests.rs"]
mod tests;
