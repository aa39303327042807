//! The real `sluice` binary: cargo builds it before it runs the sluice
//! package's integration tests, next to their folder of test executables
//! (and `cargo xtask loadtest` builds it before it runs this crate's
//! `loadtest`, next to it).

use std::path::PathBuf;

/// Path to the `sluice` binary of the build the test runs in.
pub fn sluice_binary() -> PathBuf {
    // Newer cargo also sets this at run time; otherwise the layout says:
    // target/<profile>/deps/<test> → target/<profile>/sluice.
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_sluice") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let exe_dir = exe.parent().expect("an executable is in a folder");
    // A binary of this crate: target/<profile>/<bin> → target/<profile>/sluice.
    let sibling = exe_dir.join("sluice");
    if sibling.is_file() {
        return sibling;
    }
    let profile_dir = exe_dir.parent().expect("target/<profile>/deps layout");
    let binary = profile_dir.join("sluice");
    assert!(
        binary.is_file(),
        "{} is missing: run the tests of the `sluice` package (cargo test -p sluice), which build it",
        binary.display()
    );
    binary
}
