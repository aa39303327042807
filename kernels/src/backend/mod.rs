//! The compute seam between a model's forward pass and the device that runs
//! it (docs/architecture.md, "The Backend seam").
//!
//! A [`Backend`] owns everything device-specific: where weights live, the
//! activation buffers, the paged KV store (f16 or Q8_0), the threads. Model code is
//! written once against the operations below (embedding lookup, RMSNorm,
//! matmul over quantized weights, RoPE, KV writes, paged attention, SwiGLU,
//! residual adds) and reads results back to the host only where the host
//! needs them (logits for sampling, hidden-state taps for DFlash). Buffers
//! are opaque to the model, so a device backend keeps activations resident
//! between operations, and what the layers of a pass share (positions, KV
//! cells, block tables) is prepared once per pass.
//!
//! Guarantees are per backend: [`CpuBackend`] is batch-invariant (a row's
//! results never depend on the other rows, the chunking, the paging or the
//! thread count) and computes what llama.cpp's CPU backend computes.

mod api;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;

pub use crate::ops::KvType;
pub use api::{
    Backend, BackendError, Embed, KvBlockFormat, KvShape, KvTypes, LowRankSource, LowRankTerm, MatmulGroup,
    MatrixSource, PassLayout, PassRow, PassSequence, SharedBytes,
};
pub use cpu::{CpuBackend, CpuKv};
pub use device::Device;

#[cfg(test)]
mod tests {
    use crate::ops::Gelu;

    use super::api::{host_gelu, host_layer_norm};
    use super::{Backend, CpuBackend};

    #[test]
    fn host_layer_norm_and_gelu_equal_the_cpu_backends_own() {
        // What a backend without kernels of its own computes (CUDA's
        // LayerNorm and GELU) is the CPU backend's split version, bit for bit.
        let backend = CpuBackend::new(2);
        let width = 40;
        let x: Vec<f32> = (0..5 * width).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        let weight: Vec<f32> = (0..width).map(|i| 1.0 + i as f32 / 80.0).collect();
        let bias: Vec<f32> = (0..width).map(|i| i as f32 / 40.0 - 0.5).collect();
        let (mut own, mut host) = (Vec::new(), Vec::new());
        backend.layer_norm(&x, &weight, &bias, 1e-6, &mut own).expect("cpu layer norm");
        host_layer_norm(&backend, &x, &weight, &bias, 1e-6, &mut host).expect("host layer norm");
        assert_eq!(own, host);
        for kind in [Gelu::Tanh, Gelu::Quick] {
            let (mut own, mut host) = (x.clone(), x.clone());
            backend.gelu(&mut own, kind).expect("cpu gelu");
            host_gelu(&backend, &mut host, kind).expect("host gelu");
            assert_eq!(own, host, "{kind:?}");
        }
    }
}
