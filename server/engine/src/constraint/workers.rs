//! The threads all grammar work runs on: compiling (with the first mask)
//! on a few, each token's step (taking the token, computing the next
//! mask, checking drafts) on as many as there are cores. None of it runs
//! on an HTTP worker, a blocking-pool thread or the engine's thread, whose
//! stacks are 2 MiB: llguidance recurses as deep as a grammar nests, and
//! its depth is bounded (`limits`) for these threads' stacks.
//!
//! The stacks are reserved, not used: a thread touches only the pages its
//! deepest call reaches, so a large reservation costs address space, not
//! memory.

use rayon::{ThreadPool, ThreadPoolBuilder};

use super::limits::NEEDED_STACK;

/// The stack of every grammar thread: eight times what the limits need,
/// so that a grammar at the limits, on a build whose frames are larger
/// than the measured release build's (a debug build's are up to 5x), still
/// has room.
pub const STACK: usize = 8 * NEEDED_STACK;
/// Compiles at once: each takes a core for up to a second or so, and
/// requests past these wait for one to finish.
const COMPILE_THREADS: usize = 2;

pub(super) struct Workers {
    pub compile: ThreadPool,
    pub steps: ThreadPool,
}

impl Workers {
    pub fn new(stack: usize) -> Result<Self, String> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let pool = |name: &'static str, threads: usize| {
            ThreadPoolBuilder::new()
                .num_threads(threads)
                .stack_size(stack)
                .thread_name(move |i| format!("{name}-{i}"))
                .build()
                .map_err(|error| format!("cannot start the {name} threads: {error}"))
        };
        Ok(Workers { compile: pool("grammar-compile", COMPILE_THREADS)?, steps: pool("grammar", cores)? })
    }
}
