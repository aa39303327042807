//! The CUDA kernels as NVRTC programs: each `kernels/cuda/*.cu` file is one
//! program, compiled with the shared headers in front of it (NVRTC is given
//! no include path, so nothing is looked up on the machine that compiles).

use std::ffi::CString;
use std::fmt::Write;

use crate::quant::iq1_grid::IQ1S_GRID;
use crate::quant::iq2_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use crate::quant::iq3_grids::{IQ3S_GRID, IQ3XXS_GRID};

/// Put in front of every program, in this order, then the grid tables
/// ([`grid_tables`]) and [`GRID_HEADERS`], which read them.
const HEADERS: [&str; 5] = [
    include_str!("../../../cuda/common.cuh"),
    include_str!("../../../cuda/quant.cuh"),
    include_str!("../../../cuda/quant_lut4.cuh"),
    include_str!("../../../cuda/quant_low_k.cuh"),
    include_str!("../../../cuda/quant_ternary.cuh"),
];

const GRID_HEADERS: [&str; 2] =
    [include_str!("../../../cuda/quant_grid.cuh"), include_str!("../../../cuda/quant_iq3.cuh")];

const FILES: [(&str, &str); 10] = [
    ("matvec", include_str!("../../../cuda/matvec.cu")),
    ("gemm", include_str!("../../../cuda/gemm.cu")),
    ("embed", include_str!("../../../cuda/embed.cu")),
    ("norm", include_str!("../../../cuda/norm.cu")),
    ("rope", include_str!("../../../cuda/rope.cu")),
    ("elementwise", include_str!("../../../cuda/elementwise.cu")),
    ("kv", include_str!("../../../cuda/kv.cu")),
    ("attention", include_str!("../../../cuda/attention.cu")),
    ("sample", include_str!("../../../cuda/sample.cu")),
    ("lora", include_str!("../../../cuda/lora.cu")),
];

/// One program's name and whole source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    name: String,
    source: String,
}

impl Program {
    /// A program of `source` alone, without the shared headers (a test's
    /// own kernel).
    pub fn new(name: &str, source: &str) -> Self {
        Program { name: name.into(), source: source.into() }
    }

    /// The file's name without `.cu`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The source and the file name NVRTC's messages give, as C strings.
    pub(super) fn c_strings(&self) -> (CString, CString) {
        // Sources are text files, which hold no NUL; one that did would
        // compile as the part before it and fail there.
        let c = |text: &str| CString::new(text.split('\0').next().unwrap_or_default()).unwrap_or_default();
        (c(&self.source), c(&format!("{}.cu", self.name)))
    }
}

/// The grid formats' tables (`quant::iq1_grid`, `iq2_grids`, `iq3_grids`)
/// as CUDA arrays of u32, a 64-bit entry i as words 2i (its low half) and
/// 2i + 1, so that the device reads the numbers the CPU reads.
fn grid_tables() -> String {
    let words =
        |table: &[u64]| -> Vec<u32> { table.iter().flat_map(|&entry| [entry as u32, (entry >> 32) as u32]).collect() };
    let tables: [(&str, Vec<u32>); 6] = [
        ("qx_iq2xxs_grid", words(&IQ2XXS_GRID)),
        ("qx_iq2xs_grid", words(&IQ2XS_GRID)),
        ("qx_iq2s_grid", words(&IQ2S_GRID)),
        ("qx_iq1s_grid", words(&IQ1S_GRID)),
        ("qx_iq3xxs_grid", IQ3XXS_GRID.to_vec()),
        ("qx_iq3s_grid", IQ3S_GRID.to_vec()),
    ];
    let mut out = String::new();
    for (name, table) in tables {
        let _ = write!(out, "__device__ const u32 {name}[{}] = {{", table.len());
        for word in table {
            let _ = write!(out, "{word:#x}u, ");
        }
        out.push_str("};\n");
    }
    out
}

/// Every kernel program, headers included.
pub fn programs() -> Vec<Program> {
    let headers = [HEADERS.join("\n"), grid_tables(), GRID_HEADERS.join("\n")].join("\n");
    FILES
        .iter()
        .map(|(name, file)| {
            let mut source = headers.clone();
            source.push('\n');
            source.push_str(file);
            Program { name: (*name).into(), source }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_starts_with_the_headers_and_names_its_file() {
        let programs = programs();
        assert_eq!(programs.len(), FILES.len());
        for (program, (name, file)) in programs.iter().zip(FILES) {
            assert_eq!(program.name(), name);
            assert!(program.source().starts_with(HEADERS[0]) && program.source().ends_with(file));
            assert_eq!(program.c_strings().1.to_str(), Ok(format!("{name}.cu").as_str()));
        }
    }
}
