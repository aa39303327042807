//! A read-only memory stream: what a machine's memory gives threads that
//! only read, the ceiling of decoding a model larger than its caches (each
//! decoded token reads every weight once). `sluice bench model` prints it
//! beside the bytes its decoding reads per second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::pool::ThreadPool;

/// One pass's measure: bytes read per second, and the wrapping sum of the
/// buffer's 64-bit words (which keeps the reads from being optimized away,
/// and lets a test check that every word was read once).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamRead {
    pub bytes_per_s: f64,
    pub checksum: u64,
}

/// Words summed per step: eight independent lanes, 64 bytes, which the
/// compiler keeps in vector registers, so that the loop is bound by the
/// loads and not by one chain of adds.
const LANES: usize = 8;

/// The fastest of `passes` passes of `pool`'s threads over a buffer of
/// `bytes` (rounded up to whole 64-byte steps per thread), each thread
/// reading its own contiguous share, as the matmul's threads read their
/// rows. The buffer is written first by the threads that read it (pages
/// land near them), with word `i` holding `i`.
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, passes: usize) -> StreamRead {
    let n_threads = pool.n_threads();
    let words = (bytes / 8).div_ceil(LANES * n_threads).max(1) * LANES * n_threads;
    let mut buffer = vec![0u64; words];
    pool.split_mut(&mut buffer, LANES, |start, piece| {
        for (i, word) in piece.iter_mut().enumerate() {
            *word = (start + i) as u64;
        }
    });
    let mut best = StreamRead { bytes_per_s: 0.0, checksum: 0 };
    for _ in 0..passes.max(1) {
        let total = AtomicU64::new(0);
        let started = Instant::now();
        pool.run(|thread, n| {
            let share = words / n;
            let sum = sum_words(&buffer[thread * share..(thread + 1) * share]);
            total.fetch_add(sum, Ordering::Relaxed);
        });
        let seconds = started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        let rate = (words * 8) as f64 / seconds;
        if rate > best.bytes_per_s {
            best = StreamRead { bytes_per_s: rate, checksum: total.load(Ordering::Relaxed) };
        }
    }
    best
}

/// The wrapping sum of `words` (a whole number of [`LANES`]).
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; LANES];
    for step in words.chunks_exact(LANES) {
        for (lane, &word) in lanes.iter_mut().zip(step) {
            *lane = lane.wrapping_add(word);
        }
    }
    lanes.iter().fold(0, |sum, &lane| sum.wrapping_add(lane))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_read_once_whatever_the_threads() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for bytes in [0, 8, 1000, 1 << 20] {
                let read = read_bandwidth(&pool, bytes, 2);
                // The buffer's words are 0..n for n rounded up to whole
                // steps per thread: their sum is n(n − 1)/2.
                let n = ((bytes / 8).div_ceil(LANES * pool.n_threads()).max(1) * LANES * pool.n_threads()) as u64;
                assert_eq!(read.checksum, n * (n - 1) / 2, "{threads} threads, {bytes} bytes");
                assert!(read.bytes_per_s > 0.0);
            }
        }
    }
}
