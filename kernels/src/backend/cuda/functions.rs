//! The kernels of every program, loaded into a device context and found by
//! name, and the launch shapes their comments in `kernels/cuda/` prescribe.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, DriverError, LaunchConfig};
use cudarc::nvrtc::Ptx;

use super::super::BackendError;
use super::programs::{Program, programs};

pub(super) enum LoadError {
    Backend(BackendError),
    Driver(String, DriverError),
}

/// Every kernel the backend launches, found once when the programs load:
/// launches then skip the lookup, and no module is touched while a CUDA
/// graph is being recorded.
pub(super) struct Functions {
    found: HashMap<String, CudaFunction>,
}

impl Functions {
    /// Load every program, its cubin from `cubin`, and find the kernels
    /// `names` in them.
    pub(super) fn load(
        context: &Arc<CudaContext>,
        names: &[String],
        mut cubin: impl FnMut(&Program) -> Result<Vec<u8>, BackendError>,
    ) -> Result<Self, LoadError> {
        let mut modules = Vec::new();
        for program in programs() {
            let binary = cubin(&program).map_err(LoadError::Backend)?;
            let module = context
                .load_module(Ptx::from_binary(binary))
                .map_err(|error| LoadError::Driver(format!("loading the {} kernels", program.name()), error))?;
            modules.push(module);
        }
        let mut found = HashMap::with_capacity(names.len());
        for name in names {
            let function = modules.iter().find_map(|module| module.load_function(name).ok()).ok_or_else(|| {
                LoadError::Backend(BackendError::Unavailable(format!("no kernel {name} in the compiled programs")))
            })?;
            found.insert(name.clone(), function);
        }
        Ok(Functions { found })
    }

    /// The kernel `name` (one of those loaded).
    pub(super) fn get(&self, name: &str) -> Result<CudaFunction, String> {
        self.found.get(name).cloned().ok_or_else(|| format!("no kernel {name} among those loaded"))
    }
}

/// `blocks` blocks of `threads` threads, no dynamic shared memory.
pub(super) fn grid(blocks: (usize, usize, usize), threads: u32) -> LaunchConfig {
    let dim = |n: usize| u32::try_from(n.max(1)).unwrap_or(u32::MAX);
    LaunchConfig {
        grid_dim: (dim(blocks.0), dim(blocks.1), dim(blocks.2)),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The tiled product's grid (gemm.cu): a block per 128 output features ×
/// 64 activation rows, 256 threads.
pub(super) fn gemm_grid(n_out: usize, m: usize) -> LaunchConfig {
    grid((n_out.div_ceil(128), m.div_ceil(64), 1), 256)
}

/// The head-size variant of an attention kernel: the smallest of 64, 128
/// and 256 that holds `head_dim`, if any.
pub(super) fn head_variant(head_dim: usize) -> Option<usize> {
    [64, 128, 256].into_iter().find(|&d| head_dim <= d)
}

/// Query heads a decode attention block holds (P) for `group` query heads
/// per KV head: the smallest power of two at least `min(group, 8)`; its
/// lanes per head are 32 / P.
pub(super) fn decode_heads_per_block(group: usize) -> usize {
    group.clamp(1, 8).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_variants_follow_the_kernels_instantiations() {
        assert_eq!(head_variant(64), Some(64));
        assert_eq!(head_variant(80), Some(128));
        assert_eq!(head_variant(256), Some(256));
        assert_eq!(head_variant(512), None);
        // G = 1 → P 1, L 32; G = 3 → P 4, L 8; G ≥ 5 → P 8, L 4.
        assert_eq!([1, 2, 3, 4, 5, 8, 16].map(decode_heads_per_block), [1, 2, 4, 4, 8, 8, 8]);
    }
}
