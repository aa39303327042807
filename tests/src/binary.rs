//! The real `sluice` binary, built in the profile the tests run in.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Path to the `sluice` binary, built fresh (cargo builds a package's binary
/// only for that package's own tests, and this crate is another package).
pub fn sluice_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            // target/<profile>/deps/<test binary>
            let exe = std::env::current_exe().expect("test executable path");
            let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps layout");
            let release = profile_dir.file_name().is_some_and(|name| name == "release");
            let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
            // The same build as `cargo xtask test` (whole workspace, all
            // targets): a no-op when run under it, while building only the
            // binary would resolve features differently and rebuild every
            // dependency.
            let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            cargo.args(["test", "--quiet", "--no-run", "--workspace", "--all-targets", "--manifest-path", manifest]);
            if release {
                cargo.arg("--release");
            }
            let status = cargo.status().expect("cargo runs");
            assert!(status.success(), "building the sluice binary failed");
            profile_dir.join("sluice")
        })
        .clone()
}
