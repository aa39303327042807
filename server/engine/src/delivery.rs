//! How a request's events reach its owner, and what bounds them.
//!
//! The engine never waits on a client, so its channel to each request
//! cannot block; but an unbounded channel lets a client that stops reading
//! grow the server's memory without limit (every token, with its
//! probabilities, kept until it is read). Each channel therefore counts
//! the bytes sent and not yet read; a request whose unread events pass its
//! window is ended with an error, which frees its slot at the same step.
//! A client that reads nothing at all is disconnected by the connection's
//! send timeout (`http::listen`) before it gets that far, normally.
//!
//! The queue's bookkeeping lives here too: a [`QueueTicket`] is the only
//! way into the waiting count and leaves it when dropped, so the count is
//! exactly the tickets alive, whatever path a request takes out of the
//! queue (admitted, cancelled, refused, failed closed, or never read
//! because the engine stopped).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use super::request::{EngineError, Event, TokenEvent};

/// The requests waiting for a slot, counted by their tickets.
#[derive(Debug, Default)]
pub struct Queue {
    waiting: Arc<AtomicUsize>,
}

impl Queue {
    /// A place in the queue if fewer than `limit` are waiting, else how
    /// many are. Checking and counting are one atomic step, so concurrent
    /// submissions cannot overshoot the limit.
    pub fn enter(&self, limit: usize) -> Result<QueueTicket, usize> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |waiting| (waiting < limit).then_some(waiting + 1))
            .map(|_| QueueTicket { waiting: Arc::clone(&self.waiting) })
    }

    /// How many are waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

/// One request's place in the [`Queue`]; dropping it leaves the queue.
#[derive(Debug)]
pub struct QueueTicket {
    waiting: Arc<AtomicUsize>,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request's event channel: the engine's end and its owner's end.
pub fn channel(window_bytes: usize) -> (EventSender, EventReceiver) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let unread = Arc::new(AtomicUsize::new(0));
    (EventSender { sender, unread: Arc::clone(&unread), window_bytes }, EventReceiver { receiver, unread })
}

/// Why an event was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undelivered {
    /// The owner went away.
    Closed,
    /// The owner left more than the window unread; it was told so and the
    /// request must end.
    Behind,
}

/// The engine's end of a request's events.
#[derive(Debug)]
pub struct EventSender {
    sender: mpsc::UnboundedSender<Event>,
    unread: Arc<AtomicUsize>,
    window_bytes: usize,
}

impl EventSender {
    /// Send `event`, unless its owner is gone or too far behind. The event
    /// that would pass the window is replaced by the error that ends the
    /// request, so the owner learns why if it ever reads on.
    pub fn send(&self, event: Event) -> Result<(), Undelivered> {
        let size = weight(&event);
        let unread = self.unread.fetch_add(size, Ordering::AcqRel) + size;
        if unread > self.window_bytes && matches!(event, Event::Token(_) | Event::Progress(_)) {
            self.unread.fetch_sub(size, Ordering::AcqRel);
            let error = EngineError::ClientBehind(format!(
                "the client left more than {} KiB of its stream unread; the request was cancelled",
                self.window_bytes / 1024
            ));
            let told = Event::Failed(error);
            self.unread.fetch_add(weight(&told), Ordering::AcqRel);
            let _ = self.sender.send(told);
            return Err(Undelivered::Behind);
        }
        self.sender.send(event).map_err(|_| Undelivered::Closed)
    }

    /// Whether the owner went away.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// The owner's end of a request's events.
#[derive(Debug)]
pub struct EventReceiver {
    receiver: mpsc::UnboundedReceiver<Event>,
    unread: Arc<AtomicUsize>,
}

impl EventReceiver {
    /// The next event; `None` once the engine dropped the request.
    pub async fn recv(&mut self) -> Option<Event> {
        let event = self.receiver.recv().await?;
        self.unread.fetch_sub(weight(&event), Ordering::AcqRel);
        Some(event)
    }

    /// [`Self::recv`] for callers outside an async runtime.
    pub fn blocking_recv(&mut self) -> Option<Event> {
        let event = self.receiver.blocking_recv()?;
        self.unread.fetch_sub(weight(&event), Ordering::AcqRel);
        Some(event)
    }
}

/// What an event holds in memory: its text and probabilities (a large
/// `n_probs` is what makes events big), by the buffers allocated for them,
/// not by what they list: a buffer larger than its contents is held all the
/// same.
fn weight(event: &Event) -> usize {
    const BASE: usize = std::mem::size_of::<Event>();
    match event {
        Event::Token(TokenEvent { text, probs, .. }) => {
            let probs = probs.as_ref().map_or(0, |probs| probs.top.capacity() * std::mem::size_of_val(&probs.chosen));
            BASE + text.capacity() + probs
        }
        Event::Done(completion) => BASE + completion.text.capacity() + completion.stopping_word.capacity(),
        Event::Failed(error) => BASE + error.to_string().len(),
        Event::Started { .. } | Event::Progress(_) => BASE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::TokenProbs;
    use crate::sampling::TokenProb;

    fn token(n_probs: usize) -> Event {
        let prob = TokenProb { token: 1, prob: 0.5 };
        let probs = TokenProbs { chosen: prob, top: vec![prob; n_probs], post_sampling: false };
        Event::Token(TokenEvent { token: 1, text: "x".into(), probs: Some(probs) })
    }

    #[test]
    fn the_queue_counts_live_tickets_and_never_passes_its_limit() {
        let queue = Queue::default();
        let first = queue.enter(2).expect("room");
        let second = queue.enter(2).expect("room");
        assert_eq!(queue.enter(2).err(), Some(2));
        drop(first);
        assert_eq!(queue.waiting(), 1);
        let third = queue.enter(2).expect("room again");
        drop((second, third));
        assert_eq!(queue.waiting(), 0);
    }

    #[test]
    fn a_reader_that_falls_a_window_behind_ends_its_request_and_is_told_why() {
        let (sender, mut receiver) = channel(60 * 1024);
        // 1000 probabilities are 8 KB: seven fit in the window, the eighth does not.
        for _ in 0..7 {
            assert_eq!(sender.send(token(1000)), Ok(()));
        }
        assert_eq!(sender.send(token(1000)), Err(Undelivered::Behind));
        for _ in 0..7 {
            assert!(matches!(receiver.blocking_recv(), Some(Event::Token(_))));
        }
        let told = receiver.blocking_recv();
        assert!(
            matches!(&told, Some(Event::Failed(EngineError::ClientBehind(why))) if why.contains("60 KiB")),
            "{told:?}"
        );
        assert_eq!(receiver.unread.load(Ordering::Acquire), 0);
    }

    #[test]
    fn an_event_weighs_the_buffers_it_holds_not_only_what_they_list() {
        let Event::Token(mut event) = token(5) else { unreachable!("a token event") };
        let listed = weight(&Event::Token(event.clone()));
        if let Some(probs) = event.probs.as_mut() {
            probs.top.reserve_exact(49_152);
        }
        let held = weight(&Event::Token(event));
        assert!(held >= listed + 49_152 * std::mem::size_of::<TokenProb>(), "{held} bytes for a 393 KB buffer");
    }

    #[test]
    fn a_reader_that_keeps_up_is_never_cut_off() {
        let (sender, mut receiver) = channel(60 * 1024);
        for _ in 0..1000 {
            assert_eq!(sender.send(token(1000)), Ok(()));
            assert!(receiver.blocking_recv().is_some());
        }
        // Terminal events pass even a full window: they end the request anyway.
        for _ in 0..7 {
            sender.send(token(1000)).expect("fits");
        }
        let done = Event::Failed(EngineError::Unavailable("stopping".into()));
        assert_eq!(sender.send(done), Ok(()));
        drop(receiver);
        assert_eq!(sender.send(token(1)), Err(Undelivered::Closed));
    }
}
