//! CUDA graphs for decode: a small model's decode step is hundreds of short
//! kernels, and launching them one by one leaves the GPU idle between
//! them. The layers of a pass of at most [`MATVEC_ROWS`] rows are recorded
//! (stream capture) and submitted as one graph; each pass's record updates
//! the executable graph kept for its pass and row count (its bucket) in
//! place, which costs far less than instantiating one.
//!
//! Recording is correct by construction: the captured launches are the
//! pass's own, in order. Anything a capture cannot hold (an allocation, a
//! copy to or from the host) ends it first: what was recorded is submitted
//! and the rest of the pass runs launch by launch. A bucket is recorded
//! from its second pass on, once its buffers have their size. Any failure
//! of a graph call turns graphs off for the process (and is reported as the
//! pass's fault); `SLUICE_CUDA_GRAPHS=0` turns them off from the start.
//!
//! A capture is the calling thread's (thread-local mode): the backend must
//! be driven by one thread from `begin_layers` to `end_layers`, as the
//! engine drives it. Another thread's call could not end the record.
//!
//! [`MATVEC_ROWS`]: super::MATVEC_ROWS

use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaStream, DriverError, result, sys};

/// A pass (its [`super::CudaPass`]'s id) at a row count.
pub(super) type Key = (u64, usize);

/// Executable graphs kept at most; past it they are all dropped and
/// recorded again (a server has a handful of passes × 8 row counts).
const MAX_GRAPHS: usize = 64;

pub(super) struct Graphs {
    enabled: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The bucket being recorded, if any.
    recording: Option<Key>,
    /// Buckets that have run once without a record.
    seen: HashSet<Key>,
    execs: HashMap<Key, Exec>,
    /// Graphs submitted so far.
    launched: u64,
}

/// An instantiated graph, destroyed with its owner.
struct Exec(sys::CUgraphExec);

// SAFETY: a graph exec is a driver handle without thread affinity; it is
// only touched under `Graphs::state`'s mutex, which serializes every call
// on it as the driver requires.
unsafe impl Send for Exec {}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful instantiation and is
        // destroyed once, here. A failure leaves nothing to recover.
        let _ = unsafe { result::graph::exec_destroy(self.0) };
    }
}

impl Graphs {
    pub(super) fn new() -> Self {
        let enabled = std::env::var("SLUICE_CUDA_GRAPHS").map_or(true, |value| value != "0");
        Graphs { enabled: AtomicBool::new(enabled), state: Mutex::default() }
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Start recording `key`'s layers when the bucket has run before. When
    /// that fails nothing is recorded (the pass runs launch by launch),
    /// graphs are turned off and the failure returned.
    pub(super) fn begin(&self, stream: &CudaStream, key: Key) -> Result<(), DriverError> {
        if !self.enabled() {
            return Ok(());
        }
        let mut state = self.state();
        if state.seen.len() > 4 * MAX_GRAPHS {
            state.seen.clear();
        }
        if state.recording.is_some() || state.seen.insert(key) {
            return Ok(());
        }
        // Thread-local: only this thread's calls are checked against the
        // capture (the engine runs passes on one thread).
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        let begun = stream.context().bind_to_thread().and_then(|()| {
            // SAFETY: the stream is alive (borrowed) and not the legacy
            // default stream, which cannot be captured.
            unsafe { result::stream::begin_capture(stream.cu_stream(), mode) }
        });
        match begun {
            Ok(()) => state.recording = Some(key),
            Err(_) => self.disable(),
        }
        begun
    }

    /// End a recording, if one is running: update (or make) its bucket's
    /// graph and submit it.
    pub(super) fn finish(&self, stream: &CudaStream) -> Result<(), DriverError> {
        let mut state = self.state();
        let Some(key) = state.recording.take() else { return Ok(()) };
        let submitted = submit(&mut state, stream, key);
        if submitted.is_err() {
            state.execs.clear();
            self.disable();
        }
        submitted
    }

    #[cfg(test)]
    pub(super) fn launched(&self) -> u64 {
        self.state().launched
    }

    fn disable(&self) {
        self.enabled.store(false, Ordering::Relaxed);
    }
}

fn submit(state: &mut State, stream: &CudaStream, key: Key) -> Result<(), DriverError> {
    // The capture is ended before anything can return: binding reports an
    // error an earlier drop left behind, and a stream left capturing would
    // swallow every later launch. The context is this thread's already (it
    // began the capture).
    let bound = stream.context().bind_to_thread();
    // SAFETY: this stream is capturing (`recording` was set by `begin`, on
    // this thread); ending it hands back the recorded graph, owned here.
    let graph = unsafe { result::stream::end_capture(stream.cu_stream()) }?;
    bound?;
    if graph.is_null() {
        return Ok(());
    }
    let updated = state.execs.get(&key).is_some_and(|exec| {
        let mut info = MaybeUninit::<sys::CUgraphExecUpdateResultInfo>::zeroed();
        // SAFETY: `exec` and `graph` are live handles of this context; the
        // update writes `info` and changes nothing when it fails.
        let status = unsafe { sys::cuGraphExecUpdate_v2(exec.0, graph, info.as_mut_ptr()) };
        status == sys::CUresult::CUDA_SUCCESS
    });
    let launched = (|| {
        if !updated {
            if state.execs.len() >= MAX_GRAPHS {
                state.execs.clear();
            }
            state.execs.remove(&key);
            // SAFETY: `graph` is the live graph just recorded.
            let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }?;
            state.execs.insert(key, Exec(exec));
        }
        let exec = state.execs.get(&key).map_or(std::ptr::null_mut(), |exec| exec.0);
        // SAFETY: `exec` was instantiated or updated from this stream's
        // record just above and is alive in `execs`.
        unsafe { result::graph::launch(exec, stream.cu_stream()) }
    })();
    if launched.is_ok() {
        state.launched += 1;
    }
    // SAFETY: the graph is ours and no longer needed: an executable graph
    // does not refer to the graph it was made or updated from. Failing to
    // free it leaks a host-side record and harms nothing launched.
    let _ = unsafe { result::graph::destroy(graph) };
    launched
}
