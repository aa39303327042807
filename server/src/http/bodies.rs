//! How much large request body the server holds at once. A body is held as
//! its bytes and then as the JSON value parsed from them, which for arrays
//! of small numbers is tens of times the text: sixteen clients each
//! sending 16 MiB of `[0,0,…]` would otherwise hold gigabytes. Bodies over
//! [`SMALL_BYTES`] take turns by what they hold within
//! `server.limits.bodies_mib`: a turn for the declared length is taken
//! before the body is read, and once it is read the turn grows to what
//! parsing it will hold ([`held`]: its bytes and a value for every
//! element). The turn lasts while the parsed value lives. A body that
//! holds more than the budget goes alone. A body waits at most [`WAIT`]
//! for its turn, then gets 503 with `Retry-After`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::{ApiError, ErrorType};

/// Bodies up to this size never wait (their bytes are not counted: the
/// connections' own limits bound them).
pub const SMALL_BYTES: usize = 64 << 10;

/// The longest a body waits for its turn.
pub const WAIT: Duration = Duration::from_secs(30);

/// The budget, counted in KiB.
#[derive(Debug)]
pub struct Gate {
    kib: Arc<Semaphore>,
    budget_kib: u32,
    wait: Duration,
}

impl Gate {
    /// A gate for `budget` bytes of large bodies at once; 0 = no bound.
    pub fn new(budget: usize) -> Self {
        Self::waiting(budget, WAIT)
    }

    fn waiting(budget: usize, wait: Duration) -> Self {
        let budget_kib = if budget == 0 { 0 } else { (budget >> 10).clamp(1, Semaphore::MAX_PERMITS >> 1) as u32 };
        Gate { kib: Arc::new(Semaphore::new(budget_kib as usize)), budget_kib, wait }
    }

    /// Wait for the turn of a body of `bytes`: nothing to wait for when it
    /// is small or there is no bound.
    pub async fn enter(&self, bytes: usize) -> Result<Turn, ApiError> {
        if bytes <= SMALL_BYTES || self.budget_kib == 0 {
            return Ok(Turn { _permit: None });
        }
        let kib = self.kib_of(bytes);
        match tokio::time::timeout(self.wait, Arc::clone(&self.kib).acquire_many_owned(kib)).await {
            Ok(Ok(permit)) => Ok(Turn { _permit: Some(permit) }),
            // The semaphore is never closed; a wait that ran out is the
            // answer either way.
            Ok(Err(_)) | Err(_) => Err(ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    ErrorType::Unavailable,
                    format!(
                        "the server is reading other large request bodies (server.limits.bodies_mib); this one \
                         ({} KiB) waited {} s for its turn",
                        bytes >> 10,
                        self.wait.as_secs()
                    ),
                )
            }),
        }
    }
}

impl Gate {
    /// `turn`, grown to cover `bytes` if it is smaller. Growing gives the
    /// turn back and waits for the larger one: two bodies each holding
    /// part of the budget while waiting for more would otherwise wait on
    /// each other until both ran out.
    pub async fn widen(&self, turn: Turn, bytes: usize) -> Result<Turn, ApiError> {
        let held = turn._permit.as_ref().map_or(0, |permit| permit.num_permits());
        if bytes <= SMALL_BYTES || self.budget_kib == 0 || self.kib_of(bytes) as usize <= held {
            return Ok(turn);
        }
        drop(turn);
        self.enter(bytes).await
    }

    fn kib_of(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.div_ceil(1 << 10)).unwrap_or(u32::MAX).min(self.budget_kib)
    }
}

/// What parsing `body` as JSON holds, at most: its bytes, and for every
/// element a value with room for its container to have doubled (object
/// keys count as elements too). Elements are counted by the separators
/// and brackets outside strings, so it reads the body once and allocates
/// nothing.
pub fn held(body: &[u8]) -> usize {
    let mut elements = 1usize;
    let (mut in_string, mut escaped) = (false, false);
    for &byte in body {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b',' | b':' | b'[' | b'{' => elements += 1,
            _ => {}
        }
    }
    body.len().saturating_add(elements.saturating_mul(2 * std::mem::size_of::<serde_json::Value>()))
}

/// A body's turn; it ends when dropped.
#[derive(Debug)]
pub struct Turn {
    _permit: Option<OwnedSemaphorePermit>,
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn large_bodies_take_turns_and_small_ones_never_wait() {
        let gate = Gate::waiting(1 << 20, Duration::from_millis(20));
        let first = gate.enter(700 << 10).await.expect("the first goes at once");
        let small = gate.enter(SMALL_BYTES).await.expect("small bodies go at once");
        // The second large one waits for the first...
        let mut second = Box::pin(gate.enter(700 << 10));
        assert!(second.as_mut().now_or_never().is_none());
        drop(first);
        let second = second.await.expect("its turn once the first is done");
        // ...and one larger than the budget goes alone, once the rest is done.
        let mut alone = Box::pin(gate.enter(4 << 20));
        assert!(alone.as_mut().now_or_never().is_none());
        drop((second, small));
        drop(alone.await.expect("alone"));
        // A turn that never comes ends in a 503.
        let held = gate.enter(1 << 20).await.expect("the whole budget");
        let refused = gate.enter(100 << 10).await.expect_err("no turn within the wait");
        assert_eq!((refused.status().as_u16(), refused.retry_after), (503, Some(1)));
        assert!(refused.message.contains("server.limits.bodies_mib"), "{}", refused.message);
        drop(held);
        // A turn grows to what the parsed body holds.
        let small = gate.enter(100 << 10).await.expect("goes");
        let grown = gate.widen(small, 900 << 10).await.expect("grows");
        let mut other = Box::pin(gate.enter(200 << 10));
        assert!(other.as_mut().now_or_never().is_none(), "900 + 200 KiB is over the budget");
        drop(grown);
        drop(other.await.expect("its turn"));
        // No bound: nothing waits.
        let unbounded = Gate::new(0);
        let (_a, _b) = (unbounded.enter(64 << 20).await.expect("goes"), unbounded.enter(64 << 20).await.expect("goes"));
    }

    #[test]
    fn what_a_body_holds_counts_its_elements_outside_strings() {
        let value = 2 * std::mem::size_of::<serde_json::Value>();
        assert_eq!(held(b"1"), 1 + value);
        // Four elements and the array: five values.
        assert_eq!(held(b"[0,0,0,0]"), 9 + 5 * value);
        // Separators inside strings (escaped quotes too) are text.
        let text = br#"{"prompt": "a, b: [c] {d} \" e, f"}"#;
        assert_eq!(held(text), text.len() + 3 * value);
        // Sixteen MiB of zeros hold tens of times their size; as much
        // text, barely more than itself.
        let zeros = [b"[".as_slice(), &b"0,".repeat(8 << 20), b"0]"].concat();
        assert!(held(&zeros) > 40 * zeros.len(), "{}", held(&zeros));
        let prompt = format!("{{\"prompt\": \"{}\"}}", "tea, cup: ".repeat(1 << 20));
        assert!(held(prompt.as_bytes()) < prompt.len() + 1024);
    }
}
