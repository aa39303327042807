//! Compiled kernels kept on disk, so that a server compiles its kernels once
//! per device architecture and NVRTC version and reuses them at every later
//! start.
//!
//! A cubin is named by a digest of everything that decides its bytes: the
//! program's source, the architecture, the NVRTC version and this build's
//! compile options. A changed kernel gets a new name; stale files are never
//! read, only left behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::nvrtc::{Arch, Nvrtc, NvrtcError};
use super::programs::Program;

/// Bump when `Nvrtc::compile`'s options change.
const OPTIONS_EPOCH: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Compile(#[from] NvrtcError),
    #[error("kernel cache {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// How a program's cubin was had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached {
    /// Read from the cache.
    Reused,
    /// Compiled now, taking this long, and stored.
    Compiled(Duration),
}

/// A folder of compiled kernels, one subfolder per architecture.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: dir.into() }
    }

    /// `program`'s cubin for `arch`, from the cache or compiled and stored.
    pub fn cubin(&self, nvrtc: &Nvrtc, program: &Program, arch: Arch) -> Result<(Vec<u8>, Cached), CacheError> {
        let path = self.path(nvrtc, program, arch);
        let io = |source| CacheError::Io { path: path.clone(), source };
        match std::fs::read(&path) {
            Ok(cubin) => return Ok((cubin, Cached::Reused)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io(error)),
        }
        let started = Instant::now();
        let compiled = nvrtc.compile(program, arch)?;
        let took = started.elapsed();
        let folder = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(folder).map_err(io)?;
        // Written aside and renamed into place: a reader never sees half a
        // file, and two servers starting at once both end with a whole one.
        let partial = folder.join(format!(".{}.{}", file_name(&path), std::process::id()));
        std::fs::write(&partial, &compiled.cubin).map_err(io)?;
        std::fs::rename(&partial, &path).map_err(io)?;
        Ok((compiled.cubin, Cached::Compiled(took)))
    }

    fn path(&self, nvrtc: &Nvrtc, program: &Program, arch: Arch) -> PathBuf {
        let (major, minor) = nvrtc.version();
        let mut digest = Sha256::new();
        digest.update(format!("{arch} nvrtc {major}.{minor} options {OPTIONS_EPOCH}\n"));
        digest.update(program.source());
        let hex: String = digest.finalize()[..8].iter().map(|byte| format!("{byte:02x}")).collect();
        self.dir.join(arch.to_string()).join(format!("{}-{hex}.cubin", program.name()))
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
}
