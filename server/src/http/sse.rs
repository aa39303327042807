//! Server-sent events as llama-server frames them: `data: <json>\n\n` per
//! event, `data: [DONE]` at the end of OpenAI streams only, a `:` comment
//! after a silence. An error before the first token is a plain HTTP error;
//! after it, an `{"error": …}` event that ends the stream. A request held
//! before its first token (queued, or kept by the policy) gets its headers
//! and a `: waiting` comment after the hold notice, so that clients with
//! short header timeouts keep waiting; a failure after that is an event. Dropping the
//! stream (the client went away) drops every receiver, which cancels the
//! requests.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream, SelectAll};
use serde_json::Value;

use super::error::ApiError;
use super::generate::{Submitted, engine_gone};
use sluice_engine::request::{Completion, Event, Progress, TokenEvent};

/// Turns engine events into the JSON payloads of one endpoint's stream.
pub trait Render: Send + 'static {
    /// Completion `index` got slot `id_slot`.
    fn started(&mut self, index: usize, id_slot: u32);
    fn token(&mut self, index: usize, token: &TokenEvent) -> Vec<Value>;
    fn done(&mut self, index: usize, completion: &Completion) -> Vec<Value>;
    /// Prompt progress of completion `index` (requests that asked for it).
    fn progress(&mut self, _index: usize, _progress: &Progress) -> Vec<Value> {
        Vec::new()
    }
    /// After every completion is done.
    fn finish(&mut self) -> Vec<Value> {
        Vec::new()
    }
    /// Whether the stream ends with `data: [DONE]` (OpenAI endpoints).
    fn done_marker(&self) -> bool {
        false
    }
    /// The `event:` name of a payload: none for native and OpenAI chat
    /// streams; the payload's `type` for the Messages and Responses APIs,
    /// which name every event so.
    fn event_name(&self, _payload: &Value) -> Option<String> {
        None
    }
    /// A failure after the first token: its event name and payload.
    fn failure(&self, error: &ApiError) -> (Option<String>, Value) {
        (None, error.body())
    }
}

type Events = SelectAll<BoxStream<'static, (usize, Event)>>;

struct State<R> {
    events: Events,
    render: R,
    /// The first result, read before the response started.
    first: Option<(usize, Event)>,
    open: usize,
    over: bool,
}

/// Stream the completions. Waits for the first token (or the end) up to
/// `hold_notice`, so that a failure before it is answered as a plain HTTP
/// error; past that the headers go out with a `: waiting` comment.
pub async fn respond<R: Render>(
    jobs: Vec<Submitted>,
    mut render: R,
    ping: Duration,
    hold_notice: Duration,
) -> Result<Response, ApiError> {
    let open = jobs.len();
    let mut events: Events = stream::select_all(jobs.into_iter().map(|job| job.into_stream().boxed()));
    let notice_at = tokio::time::Instant::now() + hold_notice;
    let first = loop {
        // The events are polled before the deadline is checked, so what is
        // already there is taken even with a notice of 0.
        let Ok(next) = tokio::time::timeout_at(notice_at, events.next()).await else { break None };
        match next {
            Some((index, Event::Started { id_slot })) => render.started(index, id_slot),
            Some((_, Event::Failed(error))) => return Err(error.into()),
            Some(first) => break Some(first),
            None => return Err(engine_gone()),
        }
    };
    let waiting = first.is_none().then(|| Ok::<_, Infallible>(SseEvent::default().comment("waiting")));
    let state = State { events, render, first, open, over: false };
    let payloads = stream::unfold(state, |mut state| async move {
        if state.over {
            return None;
        }
        let item = match state.first.take() {
            Some(item) => Some(item),
            None => state.events.next().await,
        };
        let payloads = step(&mut state, item);
        Some((payloads, state))
    });
    let frames = stream::iter(waiting)
        .chain(payloads.flat_map(|payloads| stream::iter(payloads.into_iter().map(Ok::<_, Infallible>))));
    let mut response = if ping.is_zero() {
        Sse::new(frames).into_response()
    } else {
        Sse::new(frames).keep_alive(KeepAlive::new().interval(ping)).into_response()
    };
    response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The frames one engine event produces.
fn step<R: Render>(state: &mut State<R>, item: Option<(usize, Event)>) -> Vec<SseEvent> {
    let data = |render: &R, payloads: Vec<Value>| {
        payloads.into_iter().map(|payload| frame(render.event_name(&payload), &payload)).collect::<Vec<_>>()
    };
    match item {
        Some((index, Event::Started { id_slot })) => {
            state.render.started(index, id_slot);
            Vec::new()
        }
        Some((index, Event::Token(token))) => {
            let payloads = state.render.token(index, &token);
            data(&state.render, payloads)
        }
        Some((index, Event::Progress(progress))) => {
            let payloads = state.render.progress(index, &progress);
            data(&state.render, payloads)
        }
        Some((index, Event::Done(completion))) => {
            let payloads = state.render.done(index, &completion);
            let mut frames = data(&state.render, payloads);
            state.open = state.open.saturating_sub(1);
            if state.open == 0 {
                let payloads = state.render.finish();
                frames.extend(data(&state.render, payloads));
                if state.render.done_marker() {
                    frames.push(SseEvent::default().data("[DONE]"));
                }
                state.over = true;
            }
            frames
        }
        Some((_, Event::Failed(error))) => {
            state.over = true;
            let (name, payload) = state.render.failure(&ApiError::from(error));
            vec![frame(name, &payload)]
        }
        None => {
            state.over = true;
            let (name, payload) = state.render.failure(&engine_gone());
            vec![frame(name, &payload)]
        }
    }
}

/// The [`Render::event_name`] of streams that name events by their `type`.
pub fn type_name(payload: &Value) -> Option<String> {
    payload.get("type").and_then(Value::as_str).map(str::to_owned)
}

/// `event:` comes before `data:`, as llama-server writes it.
fn frame(name: Option<String>, payload: &Value) -> SseEvent {
    let event = match name {
        Some(name) => SseEvent::default().event(name),
        None => SseEvent::default(),
    };
    event.data(payload.to_string())
}
