//! The CUDA backend (cargo feature `cuda`, docs/cuda.md): device probing,
//! the kernels of `kernels/cuda/` compiled at run time by NVRTC into machine
//! code for the device's architecture and cached on disk, and
//! [`CudaBackend`], the `Backend` seam on one device.
//!
//! Everything here loads its NVIDIA library at run time (cudarc's dynamic
//! loading), so a build with the feature runs, and says why it cannot use
//! CUDA, on machines without a driver or without NVRTC.

mod backend;
mod blas;
mod cache;
mod functions;
mod gpu;
mod graphs;
mod nvrtc;
#[cfg(test)]
mod parity;
mod pass;
mod probe;
mod programs;

pub use backend::{CudaBackend, kernel_names};
pub use cache::{CacheError, Cached, KernelCache};
pub use gpu::{CudaKv, CudaLowRank, CudaMatrix, CudaRows, MATVEC_ROWS};
pub use nvrtc::{Arch, Compiled, KernelResources, Nvrtc, NvrtcError, library_from_env};
pub use pass::CudaPass;
pub use probe::probe;
pub use programs::{Program, programs};
