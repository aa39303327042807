//! A persistent thread pool for the per-token hot path.
//!
//! A decode step runs a couple of hundred matmuls of some tens of
//! microseconds each, so handing out work has to cost about a microsecond:
//! threads start once, and between jobs they spin for a short while before
//! parking, so back-to-back jobs find them awake.
//!
//! Synchronization. `run` stores a pointer to the caller's closure in
//! `job`, then bumps `generation` with Release; a worker that sees the new
//! generation with Acquire therefore sees the job. Each worker decrements
//! `pending` with Release after its last use of the job, and `run` returns
//! (or unwinds) only after seeing `pending == 0` with Acquire. So the
//! closure, borrowed from the caller's stack, outlives every use, and `job`
//! is never written while a worker may read it. A mutex keeps `run` calls
//! from different threads apart. Parking cannot lose a wakeup: `run`
//! unparks every worker after bumping the generation, and an unpark that
//! comes before the matching park makes that park return at once.

use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

type Job = dyn Fn(usize, usize) + Sync;

/// How long an idle worker spins before parking. Longer than the serial
/// work between two matmuls of a decode step, far shorter than a pause
/// between requests.
const SPIN_TIME: Duration = Duration::from_micros(100);

thread_local! {
    /// Set on pool workers, and on a caller while it runs its own share: a
    /// `run` from inside a job runs inline instead of waiting on threads
    /// that may be the ones waiting for it.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

struct Shared {
    n_threads: AtomicUsize,
    generation: AtomicUsize,
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    job: UnsafeCell<Option<*const Job>>,
}

// SAFETY: `job` is written only by `run` (serialized by `ThreadPool::serial`)
// while no worker can read it, and read by workers only between seeing a
// new generation and decrementing `pending` (see the module docs); the job
// itself is `Sync`. Everything else is atomic.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only a borrowed `Sync` closure.
unsafe impl Send for Shared {}

/// Runs a closure on a fixed set of threads; the calling thread takes part
/// as thread 0.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    serial: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads counting the caller (at least 1; 1 runs
    /// everything inline). If the OS refuses a thread, the pool keeps the
    /// ones it got: results never depend on the thread count.
    pub fn new(n_threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            n_threads: AtomicUsize::new(1),
            generation: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            job: UnsafeCell::new(None),
        });
        let mut workers = Vec::with_capacity(n_threads.saturating_sub(1));
        for index in 1..n_threads {
            let worker_shared = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("sluice-pool-{index}"))
                .spawn(move || worker(&worker_shared, index));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(_) => break,
            }
        }
        // Workers read the count only after seeing a job's generation, which
        // is published after this store.
        shared.n_threads.store(workers.len() + 1, Ordering::Relaxed);
        ThreadPool { shared, workers, serial: Mutex::new(()) }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads.load(Ordering::Relaxed)
    }

    /// Calls `f(thread_index, n_threads)` once for every thread index, in
    /// parallel, and returns when all calls have. A panic in any call is
    /// re-raised here once every thread is done with `f`.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.n_threads();
        if n == 1 || IN_JOB.get() {
            (0..n).for_each(|index| f(index, n));
            return;
        }
        let _serial = self.serial.lock().unwrap_or_else(PoisonError::into_inner);
        let shared = &*self.shared;
        let job: *const (dyn Fn(usize, usize) + Sync + '_) = &f;
        // SAFETY: only the lifetime is erased. Workers dereference the
        // pointer only before decrementing `pending`, and this function
        // neither returns nor unwinds before `pending` is zero.
        let job = unsafe { std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), *const Job>(job) };
        // SAFETY: every worker finished the previous job (`pending` was seen
        // at zero with Acquire) and reads `job` again only after the
        // generation bump below.
        unsafe { *shared.job.get() = Some(job) };
        shared.pending.store(n - 1, Ordering::Relaxed);
        shared.panicked.store(false, Ordering::Relaxed);
        shared.generation.fetch_add(1, Ordering::Release);
        for worker in &self.workers {
            worker.thread().unpark();
        }

        IN_JOB.set(true);
        let mine = panic::catch_unwind(AssertUnwindSafe(|| f(0, n)));
        IN_JOB.set(false);

        let mut spins = 0u32;
        while shared.pending.load(Ordering::Acquire) != 0 {
            // A worker that is this late has probably lost its core; let it
            // have ours.
            if spins < 1 << 14 {
                spins += 1;
                spin();
            } else {
                thread::yield_now();
            }
        }
        // SAFETY: all workers are done with the job (see above).
        unsafe { *shared.job.get() = None };
        if let Err(payload) = mine {
            panic::resume_unwind(payload);
        }
        if shared.panicked.load(Ordering::Relaxed) {
            panic!("a thread-pool job panicked on a worker thread");
        }
    }
}

impl ThreadPool {
    /// `f(start, piece)` on the threads over `data` cut into one piece per
    /// thread, each starting at a multiple of `unit` elements; `start` is
    /// the piece's first index in `data`.
    pub fn split_mut<T: Send>(&self, data: &mut [T], unit: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let unit = unit.max(1);
        let per = data.len().div_ceil(unit).div_ceil(self.n_threads()) * unit;
        if per == 0 {
            return f(0, data);
        }
        let pieces: Vec<Mutex<(usize, &mut [T])>> =
            data.chunks_mut(per).enumerate().map(|(i, piece)| Mutex::new((i * per, piece))).collect();
        self.run(|thread, _| {
            if let Some(Ok(mut piece)) = pieces.get(thread).map(Mutex::lock) {
                let (start, piece) = &mut *piece;
                f(*start, piece);
            }
        });
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.generation.fetch_add(1, Ordering::Release);
        for worker in self.workers.drain(..) {
            worker.thread().unpark();
            // A worker cannot panic (jobs are caught), so there is nothing
            // to report from a join.
            let _ = worker.join();
        }
    }
}

fn worker(shared: &Shared, index: usize) {
    IN_JOB.set(true);
    let mut seen = 0;
    loop {
        seen = wait_for_change(&shared.generation, seen);
        if shared.shutdown.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: the job was stored before the generation we saw
        // (Acquire) and stays alive until we decrement `pending`.
        if let Some(job) = unsafe { *shared.job.get() } {
            // SAFETY: as above.
            let job = unsafe { &*job };
            if panic::catch_unwind(AssertUnwindSafe(|| job(index, shared.n_threads.load(Ordering::Relaxed)))).is_err() {
                shared.panicked.store(true, Ordering::Relaxed);
            }
        }
        shared.pending.fetch_sub(1, Ordering::Release);
    }
}

/// One iteration of a busy wait. Deliberately not `hint::spin_loop()`:
/// under KVM, a guest executing PAUSE in a loop triggers pause-loop exits
/// and the vCPU is descheduled for tens to hundreds of microseconds, which
/// costs more than the whole job it is waiting for.
#[inline(always)]
fn spin() {
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}

fn wait_for_change(generation: &AtomicUsize, seen: usize) -> usize {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let current = generation.load(Ordering::Acquire);
        if current != seen {
            return current;
        }
        spins = spins.wrapping_add(1);
        // Reading the clock costs more than a spin; look at it now and then.
        if !spins.is_multiple_of(64) || start.elapsed() < SPIN_TIME {
            spin();
        } else {
            thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pool: &ThreadPool) -> Vec<usize> {
        let n = pool.n_threads();
        let calls: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        pool.run(|index, n_threads| {
            assert_eq!(n_threads, n);
            calls[index].fetch_add(1, Ordering::Relaxed);
        });
        calls.into_iter().map(AtomicUsize::into_inner).collect()
    }

    #[test]
    fn every_index_runs_once() {
        for n in [0, 1, 2, 3, 4] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n.max(1));
            for _ in 0..1000 {
                assert_eq!(counts(&pool), vec![1; n.max(1)]);
            }
        }
    }

    #[test]
    fn split_pieces_cover_the_data_once_from_unit_boundaries() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for (len, unit) in [(0, 4), (7, 4), (64, 4), (100, 7), (5, 0)] {
                let mut data = vec![0usize; len];
                let starts = Mutex::new(Vec::new());
                pool.split_mut(&mut data, unit, |start, piece| {
                    starts.lock().expect("not poisoned").push(start);
                    for (i, value) in piece.iter_mut().enumerate() {
                        *value += start + i + 1;
                    }
                });
                assert_eq!(data, (1..=len).collect::<Vec<_>>(), "{threads} threads, {len} by {unit}");
                let starts = starts.into_inner().expect("not poisoned");
                assert!(starts.iter().all(|start| start % unit.max(1) == 0), "{starts:?}");
                assert!(starts.len() <= threads, "{starts:?}");
            }
        }
    }

    #[test]
    fn results_written_by_workers_are_visible_after_run() {
        let pool = ThreadPool::new(3);
        let mut total = 0u64;
        for round in 0..2000u64 {
            let slots: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            let data: Vec<u64> = (0..300).map(|i| i * round).collect();
            pool.run(|index, n| {
                let part: u64 = data[index * 300 / n..(index + 1) * 300 / n].iter().sum();
                slots[index].store(part as usize, Ordering::Relaxed);
            });
            let sum: u64 = slots.iter().map(|s| s.load(Ordering::Relaxed) as u64).sum();
            assert_eq!(sum, data.iter().sum::<u64>());
            total += sum;
        }
        assert!(total > 0);
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(2);
        for _ in 0..3 {
            thread::sleep(SPIN_TIME * 20);
            assert_eq!(counts(&pool), [1, 1]);
        }
    }

    #[test]
    fn panics_propagate_and_the_pool_survives() {
        let pool = ThreadPool::new(3);
        for culprit in [0, 2] {
            let result = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run(|index, _| assert_ne!(index, culprit, "planned panic"));
            }));
            assert!(result.is_err(), "a panic on thread {culprit} must reach the caller");
            assert_eq!(counts(&pool), [1, 1, 1]);
        }
    }

    #[test]
    fn nested_runs_execute_inline() {
        let pool = ThreadPool::new(2);
        let inner = AtomicUsize::new(0);
        pool.run(|_, _| {
            pool.run(|_, _| {
                inner.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(inner.into_inner(), 4);
    }

    #[test]
    fn concurrent_callers_take_turns() {
        let pool = ThreadPool::new(2);
        thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..500 {
                        assert_eq!(counts(&pool), [1, 1]);
                    }
                });
            }
        });
    }
}
