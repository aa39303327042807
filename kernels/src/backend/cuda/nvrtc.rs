//! NVRTC, NVIDIA's run-time CUDA compiler, through cudarc: a kernel program
//! becomes machine code (a cubin) for one architecture, with ptxas's report
//! of each kernel's registers, shared memory and spills.
//!
//! Warnings are errors: a kernel that compiles with a warning is a kernel
//! whose author missed something, and CI compiles every program this way.

use std::ffi::c_char;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use super::programs::Program;

/// The file name NVRTC's CUDA 12 runtime library has (its soname).
const LIBRARY: &str = "libnvrtc.so.12";

/// A GPU architecture, compiled for as `sm_<major><minor>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    /// Ampere (A100).
    pub const SM_80: Arch = Arch { major: 8, minor: 0 };
    /// Hopper (H100, H200).
    pub const SM_90: Arch = Arch { major: 9, minor: 0 };
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    #[error("NVRTC ({LIBRARY}) cannot be loaded: {0}")]
    NotFound(String),
    #[error("{program} for {arch}: NVRTC's {call} failed: {code:?}")]
    Call { program: String, arch: Arch, call: &'static str, code: sys::nvrtcResult },
    #[error("{program} for {arch} does not compile:\n{log}")]
    Failed { program: String, arch: Arch, log: String },
    #[error("{program} for {arch} compiles with warnings, which are errors here:\n{warnings}")]
    Warnings { program: String, arch: Arch, warnings: String },
}

/// NVRTC, loaded. Holding one is the proof that its functions can be
/// called (cudarc panics on a call into a library it cannot find).
#[derive(Clone, Copy, Debug)]
pub struct Nvrtc {
    version: (i32, i32),
}

/// A program compiled for one architecture.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    /// Every kernel (entry function) of the program, as ptxas reported it.
    pub kernels: Vec<KernelResources>,
}

/// What one kernel takes of a multiprocessor, per ptxas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    /// Static shared memory per block.
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

impl Nvrtc {
    /// Load NVRTC: from `library` (the `libnvrtc.so.12` file, or a folder
    /// holding it) when given, else wherever the system's loader finds it.
    pub fn load(library: Option<&Path>) -> Result<Self, NvrtcError> {
        static PRELOADED: OnceLock<libloading::Library> = OnceLock::new();
        if let Some(path) = library {
            let file = if path.is_dir() { path.join(LIBRARY) } else { path.to_path_buf() };
            if PRELOADED.get().is_none() {
                // SAFETY: opening a shared library runs its initializers;
                // this is NVIDIA's NVRTC, whose initializers only set up
                // the library. Kept loaded for the life of the process, so
                // cudarc's later dlopen by soname finds this copy.
                let opened = unsafe { libloading::Library::new(&file) }
                    .map_err(|error| NvrtcError::NotFound(format!("{}: {error}", file.display())))?;
                let _ = PRELOADED.set(opened);
            }
        }
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(NvrtcError::NotFound(format!(
                "not on the library search path (name the file, or the folder holding {LIBRARY})"
            )));
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above); the pointers are
        // to two live integers.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|error| NvrtcError::NotFound(format!("nvrtcVersion: {error:?}")))?;
        Ok(Nvrtc { version: (major, minor) })
    }

    /// NVRTC's CUDA version, (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Compile `program` into machine code for `arch`.
    pub fn compile(&self, program: &Program, arch: Arch) -> Result<Compiled, NvrtcError> {
        let call = |call: &'static str| {
            move |code: result::NvrtcError| NvrtcError::Call {
                program: program.name().into(),
                arch,
                call,
                code: code.0,
            }
        };
        let (source, name) = program.c_strings();
        let handle = OwnedProgram(result::create_program(&source, Some(&name)).map_err(call("nvrtcCreateProgram"))?);
        let options = [format!("--gpu-architecture={arch}"), "-std=c++17".into(), "--ptxas-options=-v".into()];
        // SAFETY: `handle` was created above and is destroyed only on drop;
        // `source` and `name` outlive it.
        let compiled = unsafe { result::compile_program(handle.0, &options) };
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(handle.0) }.map_err(call("nvrtcGetProgramLog"))?;
        let log = log_text(&log);
        if compiled.is_err() {
            return Err(NvrtcError::Failed { program: program.name().into(), arch, log });
        }
        let (report, warnings): (Vec<&str>, Vec<&str>) =
            log.lines().filter(|line| !line.trim().is_empty()).partition(|line| is_report(line));
        if !warnings.is_empty() {
            return Err(NvrtcError::Warnings { program: program.name().into(), arch, warnings: warnings.join("\n") });
        }
        let mut size = 0;
        // SAFETY: as above; `size` is a live integer.
        unsafe { sys::nvrtcGetCUBINSize(handle.0, &mut size) }.result().map_err(call("nvrtcGetCUBINSize"))?;
        let mut cubin = vec![0u8; size];
        // SAFETY: as above; `cubin` holds the `size` bytes NVRTC writes.
        unsafe { sys::nvrtcGetCUBIN(handle.0, cubin.as_mut_ptr().cast::<c_char>()) }
            .result()
            .map_err(call("nvrtcGetCUBIN"))?;
        Ok(Compiled { cubin, kernels: parse_report(&report) })
    }
}

/// Destroys its program when dropped, on every path out of `compile`.
struct OwnedProgram(sys::nvrtcProgram);

impl Drop for OwnedProgram {
    fn drop(&mut self) {
        // SAFETY: created by `create_program` and destroyed only here. A
        // failure leaks the program, which is all that can be done then.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn log_text(log: &[c_char]) -> String {
    let bytes: Vec<u8> = log.iter().take_while(|&&byte| byte != 0).map(|&byte| byte as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// ptxas's `-v` lines ("ptxas info …" and its indented continuation
/// "ptxas         . …"); anything else NVRTC logs, ptxas's own warnings
/// included, is a warning.
fn is_report(line: &str) -> bool {
    line.starts_with("ptxas info") || line.trim_start_matches("ptxas").trim_start().starts_with('.')
}

/// Each entry function's resources from ptxas's report. ptxas describes a
/// kernel in three lines: "Compiling entry function 'NAME'", the stack and
/// spills under "Function properties for NAME", then "Used N registers…";
/// properties of other (non-inlined) functions are skipped.
fn parse_report(lines: &[&str]) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    let mut properties_of_entry = false;
    for line in lines {
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            kernels.push(KernelResources { name: name.into(), ..KernelResources::default() });
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            properties_of_entry = kernels.last().is_some_and(|kernel| kernel.name == rest.trim());
        } else if let Some(kernel) = kernels.last_mut() {
            if properties_of_entry && line.contains("stack frame") {
                kernel.stack_bytes = number_before(line, "bytes stack frame");
                kernel.spill_store_bytes = number_before(line, "bytes spill stores");
                kernel.spill_load_bytes = number_before(line, "bytes spill loads");
            } else if line.contains("Used ") && line.contains(" registers") {
                kernel.registers = number_before(line, "registers");
                kernel.shared_bytes = number_before(line, "bytes smem");
            }
        }
    }
    kernels
}

fn quoted_after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &line[line.find(prefix)? + prefix.len()..];
    Some(&rest[..rest.find('\'')?])
}

/// The integer just before `label` in `line`, 0 when there is none.
fn number_before(line: &str, label: &str) -> u32 {
    line.find(label)
        .and_then(|end| line[..end].split_whitespace().last())
        .and_then(|word| word.parse().ok())
        .unwrap_or(0)
}

/// Where NVRTC is when the `SLUICE_NVRTC` environment variable names it.
pub fn library_from_env() -> Option<PathBuf> {
    std::env::var_os("SLUICE_NVRTC").map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'sl_add' for 'sm_90'
ptxas info    : Function properties for sl_add
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
ptxas info    : Compile time = 3.014 ms
ptxas info    : Function properties for helper
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'sl_tile' for 'sm_90'
ptxas info    : Function properties for sl_tile
ptxas         .     40 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16384 bytes smem, 400 bytes cmem[0]";

    #[test]
    fn the_report_gives_each_entry_its_registers_shared_memory_and_spills() {
        let lines: Vec<&str> = REPORT.lines().collect();
        assert!(lines.iter().all(|line| is_report(line)), "every line of a clean report is report");
        let kernels = parse_report(&lines);
        assert_eq!(
            kernels,
            [
                KernelResources { name: "sl_add".into(), registers: 10, ..KernelResources::default() },
                KernelResources {
                    name: "sl_tile".into(),
                    registers: 255,
                    shared_bytes: 16384,
                    stack_bytes: 40,
                    spill_store_bytes: 8,
                    spill_load_bytes: 12,
                },
            ]
        );
    }

    #[test]
    fn compiler_warnings_and_ptxas_warnings_are_not_report() {
        assert!(!is_report("k.cu(1): warning #177-D: variable \"unused\" was declared but never referenced"));
        assert!(!is_report("ptxas warning : Registers are spilled to local memory in function 'sl_tile'"));
        assert!(!is_report("Remark: The warnings can be suppressed with \"-diag-suppress <warning-number>\""));
    }

    #[test]
    fn architectures_are_named_as_nvrtc_takes_them() {
        assert_eq!(Arch::SM_90.to_string(), "sm_90");
        assert_eq!(Arch { major: 8, minor: 6 }.to_string(), "sm_86");
    }
}
