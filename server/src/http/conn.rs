//! Deadlines on each connection, so that no client can hold one open for
//! free: a request's headers must arrive within `header_s` of its first
//! byte, a connection with no request in flight is closed after `idle_s`,
//! and a write the client does not take for `send_s` (it stopped reading
//! its stream) closes the connection — which drops the response and so
//! cancels its request in the engine.
//!
//! hyper's own header timer runs from the moment it waits for a head, so
//! it cannot tell a slow head from an idle kept-alive connection; and it
//! has no write deadline. Both need to know whether a request is in
//! flight, which only the service sees: [`track`] counts requests from the
//! call until their response body is dropped, and [`Watched`] wraps the
//! socket and reads that count.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Request;
use axum::response::Response;
use futures_util::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use super::error::ApiError;

/// The deadlines; `None` turns one off.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timeouts {
    pub header: Option<Duration>,
    pub idle: Option<Duration>,
    pub send: Option<Duration>,
}

/// What a connection's socket and its service share.
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    /// Requests ended so far: a change restarts the idle clock.
    ended: AtomicU64,
    /// The socket's reader, woken when a request ends so that it arms the
    /// idle deadline (it may be waiting with none armed).
    reader: AtomicWaker,
}

/// A request from the service's call until its response body is gone.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.reader.wake();
    }
}

/// A response body that keeps its request counted in flight.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Wrap one connection's socket and service: the socket enforces the
/// deadlines, the service tells it when requests are in flight.
pub fn track<IO>(io: IO, app: Router, timeouts: Timeouts) -> (Watched<IO>, Counted) {
    let activity = Arc::new(Activity::default());
    (Watched::new(io, Arc::clone(&activity), timeouts), Counted { app, activity })
}

/// The application, counting its requests in flight on one connection.
#[derive(Clone)]
pub struct Counted {
    app: Router,
    activity: Arc<Activity>,
}

impl<B> tower::Service<Request<B>> for Counted
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let in_flight = InFlight::new(&self.activity);
        let app = self.app.clone();
        Box::pin(async move {
            let response = app.oneshot(request.map(Body::new)).await?;
            Ok(response.map(|body| Body::new(Tracked { body, _in_flight: in_flight })))
        })
    }
}

/// A socket with the connection's deadlines.
pub struct Watched<IO> {
    io: IO,
    activity: Arc<Activity>,
    timeouts: Timeouts,
    /// Since when no request has been in flight.
    idle_since: Instant,
    seen_ended: u64,
    /// When the first byte of a request's head came.
    head_started: Option<Instant>,
    /// Since when writes have been refused.
    write_stalled: Option<Instant>,
    read_timer: Pin<Box<Sleep>>,
    write_timer: Pin<Box<Sleep>>,
    /// What is left to write of the JSON answer to a bad head.
    json_error: Option<Vec<u8>>,
}

impl<IO> Watched<IO> {
    fn new(io: IO, activity: Arc<Activity>, timeouts: Timeouts) -> Self {
        let now = Instant::now();
        Watched {
            io,
            activity,
            timeouts,
            idle_since: now,
            seen_ended: 0,
            head_started: None,
            write_stalled: None,
            read_timer: Box::pin(tokio::time::sleep_until(now)),
            write_timer: Box::pin(tokio::time::sleep_until(now)),
            json_error: None,
        }
    }

    /// The read deadline while no request is in flight: the head's if one
    /// has begun, else the idle one.
    fn read_deadline(&self) -> Option<Instant> {
        match self.head_started {
            Some(started) => self.timeouts.header.map(|header| started + header),
            None => self.timeouts.idle.map(|idle| self.idle_since + idle),
        }
    }
}

/// Whether `deadline` has passed; if not, `timer` wakes the task then.
fn passed(timer: &mut Pin<Box<Sleep>>, deadline: Instant, cx: &mut Context<'_>) -> bool {
    if timer.deadline() != deadline {
        timer.as_mut().reset(deadline);
    }
    timer.as_mut().poll(cx).is_ready()
}

/// The answer to a head hyper refused, from its bare answer's status line:
/// the same status with llama-server's JSON error body, and the connection
/// closed.
fn json_error(bare: &[u8]) -> Vec<u8> {
    let status = bare
        .get(9..12)
        .and_then(|code| std::str::from_utf8(code).ok())
        .and_then(|code| axum::http::StatusCode::from_bytes(code.as_bytes()).ok())
        .unwrap_or(axum::http::StatusCode::BAD_REQUEST);
    let message = match status.as_u16() {
        414 => "the request target (URI) is too long",
        431 => "the request's header fields are too large",
        505 => "the HTTP version is not supported",
        _ => "the request is not valid HTTP/1.1",
    };
    // The body every other error answer has, from the one place that builds it.
    let body = ApiError { status: Some(status), ..ApiError::invalid(message) }.body().to_string();
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("the connection's {what} timeout passed"))
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let ended = this.activity.ended.load(Ordering::Acquire);
        if ended != this.seen_ended {
            this.seen_ended = ended;
            this.idle_since = Instant::now();
            this.head_started = None;
        }
        let in_flight = this.activity.in_flight.load(Ordering::Acquire) > 0;
        if in_flight {
            this.head_started = None;
        }
        let before = buf.filled().len();
        this.activity.reader.register(cx.waker());
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if !in_flight && buf.filled().len() > before {
                    this.head_started.get_or_insert_with(Instant::now);
                }
                Poll::Ready(Ok(()))
            }
            // The waker is registered above for both: hyper may poll once
            // more before it calls the service for the head just read, and
            // the request's end must wake it to arm the idle deadline.
            Poll::Pending if in_flight => Poll::Pending,
            Poll::Pending => match this.read_deadline() {
                Some(deadline) if passed(&mut this.read_timer, deadline, cx) => {
                    let what = if this.head_started.is_some() { "header" } else { "idle" };
                    Poll::Ready(Err(timed_out(what)))
                }
                _ => Poll::Pending,
            },
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }
}

impl<IO: AsyncWrite + Unpin> Watched<IO> {
    /// Whether hyper is answering a head it could not parse: it writes
    /// while a head has begun and the service was never called for it.
    /// Those answers (400, 414, 431) carry no body; API clients expect the
    /// JSON error every other answer has.
    fn answering_a_bad_head(&self) -> bool {
        self.head_started.is_some()
            && self.activity.in_flight.load(Ordering::Acquire) == 0
            && self.activity.ended.load(Ordering::Acquire) == self.seen_ended
    }

    /// Write `bytes` (hyper's bare error answer) as the JSON answer of the
    /// same status, then report `bytes` written.
    fn write_json_error(&mut self, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        let answer = self.json_error.get_or_insert_with(|| json_error(bytes));
        while !answer.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, answer) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(written)) => {
                    answer.drain(..written);
                }
                other => return self.watch_write(cx, other),
            }
        }
        Poll::Ready(Ok(bytes.len()))
    }

    /// A write's result, or the send timeout's error once writes have been
    /// refused for that long.
    fn watch_write(&mut self, cx: &mut Context<'_>, written: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if written.is_ready() {
            self.write_stalled = None;
            return written;
        }
        let Some(send) = self.timeouts.send else { return Poll::Pending };
        let stalled = *self.write_stalled.get_or_insert_with(Instant::now);
        if passed(&mut self.write_timer, stalled + send, cx) {
            return Poll::Ready(Err(timed_out("send")));
        }
        Poll::Pending
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.answering_a_bad_head() {
            return self.write_json_error(cx, buf);
        }
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch_write(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.answering_a_bad_head() {
            let bytes: Vec<u8> = bufs.iter().flat_map(|buf| buf.iter().copied()).collect();
            return self.write_json_error(cx, &bytes);
        }
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch_write(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
