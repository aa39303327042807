//! How much text the server tokenizes at once. Tokenizing holds memory in
//! proportion to the text (bytes of token ids per byte at best; tens of
//! bytes per byte for text the BPE crate must take whole, and for
//! SentencePiece), so requests with large texts take turns: a text waits
//! until its bytes fit the budget with those being tokenized, and one
//! larger than the budget until nothing else is; each waits at most
//! [`WAIT`], then gets 503. Texts of up to [`SMALL_BYTES`] never wait
//! (their bytes still count), so ordinary requests are not held behind a
//! large one.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::error::Error;

/// The longest a text waits for its turn.
pub const WAIT: Duration = Duration::from_secs(30);

/// Texts up to this size go at once.
pub const SMALL_BYTES: usize = 64 << 10;

/// The bytes of text being tokenized, against a budget.
#[derive(Debug)]
pub struct Gate {
    budget: usize,
    busy: Mutex<usize>,
    freed: Condvar,
}

impl Gate {
    /// A gate for `budget` bytes at once; 0 = no bound.
    pub fn new(budget: usize) -> Self {
        Gate { budget: if budget == 0 { usize::MAX } else { budget }, busy: Mutex::new(0), freed: Condvar::new() }
    }

    /// Wait for the turn of a text of `bytes` (blocking: tokenizing runs on
    /// the blocking pool); it lasts while the pass lives.
    pub fn enter(&self, bytes: usize) -> Result<Pass<'_>, Error> {
        let deadline = Instant::now() + WAIT;
        // The count stays right even if a holder panicked: it is only ever
        // changed in one step.
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while bytes > SMALL_BYTES && *busy > 0 && busy.saturating_add(bytes) > self.budget {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Busy { kib: bytes >> 10, waited_s: WAIT.as_secs() });
            }
            busy = self.freed.wait_timeout(busy, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        *busy = busy.saturating_add(bytes);
        Ok(Pass { gate: self, bytes })
    }
}

/// A text's turn at the tokenizer; dropping it ends the turn.
#[derive(Debug)]
pub struct Pass<'a> {
    gate: &'a Gate,
    bytes: usize,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut busy = self.gate.busy.lock().unwrap_or_else(PoisonError::into_inner);
        *busy = busy.saturating_sub(self.bytes);
        self.gate.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_texts_take_turns_and_small_ones_never_wait() {
        let gate = Gate::new(1 << 20);
        let large = gate.enter(700 << 10).expect("the first goes at once");
        // A second large text waits until the first is done.
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| drop(gate.enter(700 << 10).expect("its turn")));
            let small = gate.enter(SMALL_BYTES).expect("small texts go at once");
            std::thread::sleep(Duration::from_millis(50));
            assert!(!waiting.is_finished(), "the second large text must wait");
            drop(large);
            drop(small);
            waiting.join().expect("joined");
        });
        assert_eq!(*gate.busy.lock().expect("lock"), 0);
        // Larger than the budget: alone, but it goes.
        drop(gate.enter(4 << 20).expect("alone"));
    }
}
