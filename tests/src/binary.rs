//! The real `sluice` binary, built in the profile the tests run in.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Path to the `sluice` binary, building it first if this test process has
/// not yet (cargo only builds another package's binary for its own tests).
pub fn sluice_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            // target/<profile>/deps/<test binary>
            let exe = std::env::current_exe().expect("test executable path");
            let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps layout");
            let release = profile_dir.file_name().is_some_and(|name| name == "release");
            let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
            let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            cargo.args(["build", "--quiet", "--package", "sluice", "--bin", "sluice", "--manifest-path", manifest]);
            if release {
                cargo.arg("--release");
            }
            let status = cargo.status().expect("cargo runs");
            assert!(status.success(), "building the sluice binary failed");
            profile_dir.join("sluice")
        })
        .clone()
}
