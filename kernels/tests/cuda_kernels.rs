//! Every CUDA kernel compiled by NVRTC, through the path the server uses, for
//! Hopper and Ampere: no errors, no warnings, no spills. Needs NVRTC, and no
//! GPU: `cargo xtask test` fetches NVIDIA's NVRTC wheel and names it in
//! `SLUICE_NVRTC`, with `SLUICE_REQUIRE_NVRTC=1` so that a missing library
//! fails instead of skipping.
#![cfg(feature = "cuda")]

use std::collections::BTreeSet;

use sluice_kernels::backend::cuda::{
    Arch, CacheError, Cached, KernelCache, Nvrtc, NvrtcError, Program, kernel_names, library_from_env, programs,
};

/// NVRTC, or `None` after saying why the test is skipped.
fn nvrtc(test: &str) -> Option<Nvrtc> {
    match Nvrtc::load(library_from_env().as_deref()) {
        Ok(nvrtc) => Some(nvrtc),
        Err(error) if std::env::var_os("SLUICE_REQUIRE_NVRTC").is_some() => panic!("{error}"),
        Err(error) => {
            eprintln!("skipped {test}: {error} (set SLUICE_NVRTC to the library's folder)");
            None
        }
    }
}

#[test]
fn every_kernel_compiles_for_sm_90_and_sm_80_without_warnings_or_spills() {
    let Some(nvrtc) = nvrtc("every_kernel_compiles…") else { return };
    let mut failures = Vec::new();
    let mut entries = BTreeSet::new();
    println!("NVRTC {:?}", nvrtc.version());
    println!("{:<34} {:>5} {:>4} {:>6} {:>5} {:>6}", "kernel", "arch", "regs", "smem", "stack", "spills");
    // One thread per architecture: NVRTC compiles separate programs
    // concurrently, and CI machines have two cores.
    let compiled: Vec<_> = std::thread::scope(|scope| {
        let jobs: Vec<_> = [Arch::SM_90, Arch::SM_80]
            .map(|arch| {
                scope.spawn(move || {
                    programs().iter().map(|program| (arch, nvrtc.compile(program, arch))).collect::<Vec<_>>()
                })
            })
            .into();
        jobs.into_iter().flat_map(|job| job.join().expect("a compile thread panicked")).collect()
    });
    for (arch, result) in compiled {
        let compiled = match result {
            Ok(compiled) => compiled,
            Err(error) => {
                failures.push(error.to_string());
                continue;
            }
        };
        assert!(!compiled.cubin.is_empty(), "an empty cubin for {arch}");
        assert!(!compiled.kernels.is_empty(), "no kernels in ptxas's report for {arch}");
        for kernel in &compiled.kernels {
            let spills = kernel.spill_store_bytes + kernel.spill_load_bytes;
            println!(
                "{:<34} {:>5} {:>4} {:>6} {:>5} {:>6}",
                kernel.name,
                arch.to_string(),
                kernel.registers,
                kernel.shared_bytes,
                kernel.stack_bytes,
                spills
            );
            entries.insert(kernel.name.clone());
            if !kernel.name.starts_with("sl_") {
                failures.push(format!("entry {} is not named sl_…", kernel.name));
            }
            if spills > 0 {
                failures.push(format!("{arch}: {kernel:?} spills"));
            }
        }
    }
    let launched: BTreeSet<String> = kernel_names().into_iter().collect();
    for missing in launched.difference(&entries) {
        failures.push(format!("the backend launches {missing}, which no program defines"));
    }
    for unused in entries.difference(&launched) {
        failures.push(format!("{unused} is compiled but the backend never launches it"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_warning_fails_the_compile_and_an_error_names_its_line() {
    let Some(nvrtc) = nvrtc("a_warning_fails…") else { return };
    let warns = Program::new("warns", "extern \"C\" __global__ void sl_w(float* x) { int unused = 1; x[0] = 0; }");
    match nvrtc.compile(&warns, Arch::SM_90) {
        Err(NvrtcError::Warnings { warnings, .. }) => assert!(warnings.contains("unused"), "{warnings}"),
        other => panic!("a warning must fail the compile: {other:?}"),
    }
    let broken = Program::new("broken", "extern \"C\" __global__ void sl_b(float* x) {\n x[0] = y;\n}");
    match nvrtc.compile(&broken, Arch::SM_90) {
        Err(NvrtcError::Failed { log, .. }) => assert!(log.contains("broken.cu(2)"), "{log}"),
        other => panic!("an error must fail the compile: {other:?}"),
    }
}

#[test]
fn the_cache_reuses_a_cubin_until_the_source_changes() -> Result<(), CacheError> {
    let Some(nvrtc) = nvrtc("the_cache_reuses…") else { return Ok(()) };
    let dir = std::env::temp_dir().join(format!("sluice-kernel-cache-{}", std::process::id()));
    let cache = KernelCache::new(&dir);
    let first = Program::new("tiny", "extern \"C\" __global__ void sl_t(float* x) { x[0] = 1.0f; }");
    let (cubin, how) = cache.cubin(&nvrtc, &first, Arch::SM_90)?;
    assert!(matches!(how, Cached::Compiled(_)), "{how:?}");
    assert_eq!(cache.cubin(&nvrtc, &first, Arch::SM_90)?, (cubin.clone(), Cached::Reused));
    let (_, other_arch) = cache.cubin(&nvrtc, &first, Arch::SM_80)?;
    assert!(matches!(other_arch, Cached::Compiled(_)), "another architecture is another cubin");
    let changed = Program::new("tiny", "extern \"C\" __global__ void sl_t(float* x) { x[0] = 2.0f; }");
    let (changed_cubin, how) = cache.cubin(&nvrtc, &changed, Arch::SM_90)?;
    assert!(matches!(how, Cached::Compiled(_)), "a changed source compiles again");
    assert_ne!(changed_cubin, cubin);
    let files = std::fs::read_dir(dir.join("sm_90")).map(|dir| dir.count()).unwrap_or(0);
    assert_eq!(files, 2, "one cubin per source, nothing half-written left");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
