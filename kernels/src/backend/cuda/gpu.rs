//! What every operation of the CUDA backend works through: [`Gpu`], one
//! device's stream, kernels and kept failure, and the buffers the backend
//! hands out. The seam's operations (backend.rs), the pass-reading ones
//! (pass.rs) and cuBLAS (blas.rs) all sit on top of this file.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DriverError};

use super::super::{BackendError, KvShape};
use super::functions::Functions;
use super::graphs::Graphs;
use crate::quant::DType;

/// Products of up to this many rows take the decode kernel.
pub const MATVEC_ROWS: usize = 8;

/// One device's stream and kernels, and the first failure of an operation
/// that could not return it.
pub(super) struct Gpu {
    stream: Arc<CudaStream>,
    /// Declared before the kernels: its graphs are destroyed before the
    /// modules their launches name are unloaded (fields drop in order).
    pub(super) graphs: Graphs,
    pub(super) functions: Functions,
    pub(super) name: String,
    multiprocessors: usize,
    /// Decode attention's partial results (sums, then maxima and totals),
    /// kept between layers and passes and grown when a pass needs more.
    scratch: Mutex<[Option<CudaSlice<f32>>; 2]>,
    /// The first failure of an operation that could not return it.
    fault: Mutex<Option<String>>,
}

impl Gpu {
    pub(super) fn new(stream: Arc<CudaStream>, functions: Functions, name: String, multiprocessors: usize) -> Gpu {
        Gpu {
            stream,
            graphs: Graphs::new(),
            functions,
            name,
            multiprocessors,
            scratch: Mutex::default(),
            fault: Mutex::default(),
        }
    }

    /// The stream, for kernel launches (which a recording may hold).
    pub(super) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream, for allocations and copies: a recording cannot hold
    /// those, so one in progress is submitted first (graphs.rs).
    pub(super) fn transfers(&self) -> &Arc<CudaStream> {
        let finished = self.graphs.finish(&self.stream);
        self.record("submitting a CUDA graph (graphs now off)", finished);
        &self.stream
    }

    pub(super) fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// The two scratch buffers, each at least as long as asked.
    pub(super) fn scratch(
        &self,
        lens: [usize; 2],
    ) -> Result<MutexGuard<'_, [Option<CudaSlice<f32>>; 2]>, BackendError> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (buffer, len) in scratch.iter_mut().zip(lens) {
            if buffer.as_ref().is_none_or(|buffer| buffer.len() < len.max(1)) {
                *buffer =
                    Some(self.transfers().alloc_zeros::<f32>(len.max(1)).map_err(self.driver("allocating scratch"))?);
            }
        }
        Ok(scratch)
    }

    /// Keep the first failure for the next download.
    pub(super) fn fail(&self, what: String) {
        let mut fault = self.fault.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        fault.get_or_insert(what);
    }

    /// `result`'s value, or `None` after keeping its failure.
    pub(super) fn record<T>(&self, what: &str, result: Result<T, DriverError>) -> Option<T> {
        result.map_err(|error| self.fail(format!("{what}: {error}"))).ok()
    }

    /// The kept failure, if any, as an error.
    pub(super) fn check(&self) -> Result<(), BackendError> {
        let fault = self.fault.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        fault.map_or(Ok(()), |fault| Err(BackendError::Unavailable(format!("{}: {fault}", self.name))))
    }

    pub(super) fn driver<'a>(&'a self, what: &'a str) -> impl Fn(DriverError) -> BackendError + 'a {
        move |error| BackendError::Unavailable(format!("{}: {what}: {error}", self.name))
    }

    /// The kernel `name`, or `None` after keeping why there is none.
    pub(super) fn function(&self, name: &str) -> Option<CudaFunction> {
        self.functions.get(name).map_err(|why| self.fail(why)).ok()
    }

    /// Make `rows` hold `len` values (contents unspecified), keeping its
    /// buffer when that is large enough. False (and a kept failure) when
    /// the device cannot allocate.
    pub(super) fn size(&self, rows: &mut CudaRows, len: usize) -> bool {
        rows.len = len;
        if rows.buffer.as_ref().is_some_and(|buffer| buffer.len() >= len.max(1)) {
            return true;
        }
        rows.buffer = self.record("allocating activations", self.transfers().alloc_zeros::<f32>(len.max(1)));
        rows.buffer.is_some()
    }

    pub(super) fn upload_u32(&self, values: &[u32]) -> Result<CudaSlice<u32>, BackendError> {
        // An empty upload would be a zero-length allocation, which the
        // driver refuses; one unused element is harmless.
        let values = if values.is_empty() { &[0][..] } else { values };
        self.transfers().clone_htod(values).map_err(self.driver("uploading a pass"))
    }
}

pub struct CudaMatrix {
    pub(super) dtype: DType,
    pub(super) bytes: CudaSlice<u8>,
    pub(super) n_out: usize,
    pub(super) n_in: usize,
    /// The format's decode and prefill product kernels, found once here
    /// rather than by name at every product of every layer.
    pub(super) matvec: CudaFunction,
    pub(super) gemm: CudaFunction,
}

/// Activations: `len` values at the start of a buffer that keeps its
/// capacity from pass to pass.
#[derive(Default)]
pub struct CudaRows {
    pub(super) buffer: Option<CudaSlice<f32>>,
    pub(super) len: usize,
}

/// Every layer's keys in one allocation and every layer's values in
/// another, layer `l` at `l ×` the arena's bytes, so that one launch copies
/// a block in all layers.
pub struct CudaKv {
    pub(super) shape: KvShape,
    pub(super) keys: CudaSlice<u8>,
    pub(super) values: CudaSlice<u8>,
    /// Bytes of one layer's arena of keys, and of values.
    pub(super) arena_bytes: (usize, usize),
    /// Bytes of one block of a layer's keys, and of its values.
    pub(super) block_bytes: (usize, usize),
}

/// An adapter's factors: `a` as given (rank rows of n_in), `b` transposed
/// (rank rows of n_out) so that the up-projection's loads are coalesced.
pub struct CudaLowRank {
    pub(super) a: CudaSlice<f32>,
    pub(super) b_t: CudaSlice<f32>,
    pub(super) rank: usize,
    pub(super) n_in: usize,
    pub(super) n_out: usize,
}

impl CudaRows {
    pub(super) fn buffer(&self) -> Option<&CudaSlice<f32>> {
        self.buffer.as_ref()
    }

    pub(super) fn buffer_mut(&mut self) -> Option<&mut CudaSlice<f32>> {
        self.buffer.as_mut()
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }
}

impl CudaMatrix {
    pub(super) fn dtype(&self) -> DType {
        self.dtype
    }

    pub(super) fn bytes(&self) -> &CudaSlice<u8> {
        &self.bytes
    }

    pub(super) fn n_out(&self) -> usize {
        self.n_out
    }

    pub(super) fn n_in(&self) -> usize {
        self.n_in
    }
}

impl CudaKv {
    pub(super) fn shape(&self) -> KvShape {
        self.shape
    }

    /// Keys, values, and the bytes of one layer's arena of each.
    pub(super) fn arenas(&self) -> (&CudaSlice<u8>, &CudaSlice<u8>, (usize, usize)) {
        (&self.keys, &self.values, self.arena_bytes)
    }

    pub(super) fn arenas_mut(&mut self) -> (&mut CudaSlice<u8>, &mut CudaSlice<u8>, (usize, usize)) {
        (&mut self.keys, &mut self.values, self.arena_bytes)
    }
}

/// `n` as a kernel's `int`; `None` for shapes no kernel takes.
pub(super) fn int(n: usize) -> Option<i32> {
    i32::try_from(n).ok()
}
