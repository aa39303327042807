//! Server-sent events as llama-server frames them: `data: <json>\n\n` per
//! event, `data: [DONE]` at the end of OpenAI streams only, a `:` comment
//! after a silence. An error before the first token is a plain HTTP error;
//! after it, an `{"error": …}` event that ends the stream. Dropping the
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
use crate::engine::request::{Completion, Event, TokenEvent};

/// Turns engine events into the JSON payloads of one endpoint's stream.
pub trait Render: Send + 'static {
    /// Completion `index` got slot `id_slot`.
    fn started(&mut self, index: usize, id_slot: u32);
    fn token(&mut self, index: usize, token: &TokenEvent) -> Vec<Value>;
    fn done(&mut self, index: usize, completion: &Completion) -> Vec<Value>;
    /// After every completion is done.
    fn finish(&mut self) -> Vec<Value>;
    /// Whether the stream ends with `data: [DONE]` (OpenAI endpoints).
    fn done_marker(&self) -> bool;
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

/// Stream the completions. Waits for the first token (or the end) so that
/// a failure before it is answered as a plain HTTP error.
pub async fn respond<R: Render>(jobs: Vec<Submitted>, mut render: R, ping: Duration) -> Result<Response, ApiError> {
    let open = jobs.len();
    let mut events: Events = stream::select_all(jobs.into_iter().map(|job| job.into_stream().boxed()));
    let first = loop {
        match events.next().await {
            Some((index, Event::Started { id_slot })) => render.started(index, id_slot),
            Some((_, Event::Failed(error))) => return Err(error.into()),
            Some(first) => break first,
            None => return Err(engine_gone()),
        }
    };
    let state = State { events, render, first: Some(first), open, over: false };
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
    let frames = payloads.flat_map(|payloads| stream::iter(payloads.into_iter().map(Ok::<_, Infallible>)));
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
    let data = |payloads: Vec<Value>| payloads.into_iter().map(|payload| SseEvent::default().data(payload.to_string()));
    match item {
        Some((index, Event::Started { id_slot })) => {
            state.render.started(index, id_slot);
            Vec::new()
        }
        Some((index, Event::Token(token))) => data(state.render.token(index, &token)).collect(),
        Some((index, Event::Done(completion))) => {
            let mut frames: Vec<SseEvent> = data(state.render.done(index, &completion)).collect();
            state.open = state.open.saturating_sub(1);
            if state.open == 0 {
                frames.extend(data(state.render.finish()));
                if state.render.done_marker() {
                    frames.push(SseEvent::default().data("[DONE]"));
                }
                state.over = true;
            }
            frames
        }
        Some((_, Event::Failed(error))) => {
            state.over = true;
            vec![SseEvent::default().data(ApiError::from(error).body().to_string())]
        }
        None => {
            state.over = true;
            vec![SseEvent::default().data(engine_gone().body().to_string())]
        }
    }
}
