//! The wasm toolchain that builds plugins: rustup's `wasm32-unknown-unknown`
//! target when it is installed, else Debian's `rustc-web` unpacked (never
//! installed) under `target/` with `-Zbuild-std`. The Debian one is pinned
//! to exact package versions: it is the toolchain that produces the
//! committed `plugins/dist/` and that `--check` rebuilds with.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::workspace::{repo_root, run};

/// Debian packages of the pinned toolchain, `name=version`.
const PINNED_PACKAGES: &[&str] = &[
    "rustc-web=1.96.0+dfsg1-1~deb12u2",
    "libstd-rust-web-1.96=1.96.0+dfsg1-1~deb12u2",
    "libstd-rust-web-dev=1.96.0+dfsg1-1~deb12u2",
    "rust-web-src=1.96.0+dfsg1-1~deb12u2",
    "libllvm22=1:22.1.8-1~deb12u1",
];
const PINNED_NAME: &str = "debian-rustc-web-1.96.0-dfsg1-1-deb12u2";

/// A toolchain able to build `wasm32-unknown-unknown`.
pub enum Toolchain {
    /// The machine's rustup toolchain with the wasm target installed.
    Rustup,
    /// The pinned Debian toolchain unpacked under `root`.
    Pinned { root: PathBuf },
}

impl Toolchain {
    /// The rustup target when installed, else the pinned toolchain.
    pub fn auto() -> anyhow::Result<Self> {
        if rustup_has_wasm_target() { Ok(Toolchain::Rustup) } else { Self::pinned() }
    }

    /// The pinned toolchain, set up on first use.
    pub fn pinned() -> anyhow::Result<Self> {
        let root = repo_root().join("target/wasm-toolchain").join(PINNED_NAME);
        let stamp = root.join(".complete");
        if !stamp.exists() {
            setup_pinned(&root)
                .with_context(|| format!("setting up the pinned wasm toolchain in {}", root.display()))?;
            std::fs::write(&stamp, PINNED_PACKAGES.join("\n"))?;
        }
        Ok(Toolchain::Pinned { root })
    }

    pub fn describe(&self) -> String {
        match self {
            Toolchain::Rustup => "rustup's wasm32-unknown-unknown target".into(),
            Toolchain::Pinned { .. } => format!("pinned toolchain {PINNED_NAME}"),
        }
    }

    /// A `cargo build` for `wasm32-unknown-unknown` with this toolchain and
    /// flags that make the output independent of where things live.
    pub fn cargo_build(&self, manifest: &Path, target_dir: &Path) -> anyhow::Result<Command> {
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cargo.arg("build").arg("--release").arg("--target").arg("wasm32-unknown-unknown");
        cargo.arg("--manifest-path").arg(manifest).arg("--target-dir").arg(target_dir);
        cargo.arg("--workspace").arg("--locked");
        let mut remaps = vec![(repo_root(), "/sluice".to_owned()), (cargo_home(), "/cargo".to_owned())];
        match self {
            Toolchain::Rustup => {
                remaps.push((host_sysroot()?, "/rustc".into()));
            }
            Toolchain::Pinned { root } => {
                cargo.arg("-Zbuild-std=std,panic_abort");
                cargo.env("RUSTC", root.join("usr/bin/rustc"));
                cargo.env("LD_LIBRARY_PATH", root.join("usr/lib/x86_64-linux-gnu"));
                cargo.env("RUSTC_BOOTSTRAP", "1");
                cargo.env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", rust_lld()?);
                remaps.push((root.clone(), "/rustc".into()));
            }
        }
        let flags: Vec<String> =
            remaps.iter().map(|(from, to)| format!("--remap-path-prefix={}={to}", from.display())).collect();
        cargo.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"));
        // The machine's rustup settings must not pick another toolchain.
        cargo.env_remove("RUSTFLAGS").env_remove("RUSTUP_TOOLCHAIN");
        Ok(cargo)
    }
}

fn rustup_has_wasm_target() -> bool {
    let output =
        Command::new("rustc").args(["--print", "target-libdir", "--target", "wasm32-unknown-unknown"]).output();
    match output {
        Ok(output) if output.status.success() => {
            let libdir = String::from_utf8_lossy(&output.stdout);
            std::fs::read_dir(libdir.trim())
                .map(|entries| {
                    entries.flatten().any(|entry| entry.file_name().to_string_lossy().starts_with("libstd-"))
                })
                .unwrap_or(false)
        }
        _ => false,
    }
}

fn host_sysroot() -> anyhow::Result<PathBuf> {
    let output =
        Command::new("rustc").args(["--print", "sysroot"]).output().context("running rustc --print sysroot")?;
    if !output.status.success() {
        bail!("rustc --print sysroot failed");
    }
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

/// rustup's `rust-lld` links wasm for the Debian rustc, which ships none.
fn rust_lld() -> anyhow::Result<PathBuf> {
    let lld = host_sysroot()?.join("lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld");
    if !lld.exists() {
        bail!("{} not found: the wasm linker comes with the machine's rustup toolchain", lld.display());
    }
    Ok(lld)
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"))
}

fn setup_pinned(root: &Path) -> anyhow::Result<()> {
    eprintln!("xtask: fetching the pinned wasm toolchain ({PINNED_NAME}) from Debian's packages");
    let debs = root.with_extension("debs");
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    std::fs::create_dir_all(&debs)?;
    std::fs::create_dir_all(root)?;
    let download = || {
        let mut apt = Command::new("apt-get");
        apt.arg("download").args(PINNED_PACKAGES).current_dir(&debs);
        run(&mut apt)
    };
    if download().is_err() {
        // A fresh machine may have no package lists yet.
        run(Command::new("apt-get").arg("update").arg("-qq"))?;
        download().context("apt-get download of the pinned toolchain packages")?;
    }
    for entry in std::fs::read_dir(&debs)? {
        let deb = entry?.path();
        if deb.extension().is_some_and(|extension| extension == "deb") {
            run(Command::new("dpkg").arg("-x").arg(&deb).arg(root))?;
        }
    }
    std::fs::remove_dir_all(&debs)?;
    let library = root.join("usr/lib/rustlib/src/rust/library");
    let unpacked_library = root.join("usr/src/rustc-1.96.0/library");
    if !library.exists() && unpacked_library.exists() {
        std::fs::create_dir_all(library.parent().unwrap_or(root))?;
        std::os::unix::fs::symlink(&unpacked_library, &library)?;
    }
    if !library.exists() {
        bail!("{} missing after unpacking: -Zbuild-std needs the library sources", library.display());
    }
    let mut version = Command::new(root.join("usr/bin/rustc"));
    version.arg("--version").env("LD_LIBRARY_PATH", root.join("usr/lib/x86_64-linux-gnu"));
    run(&mut version)
}
