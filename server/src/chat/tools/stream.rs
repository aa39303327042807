//! Reading calls back out of a reply, whole or piece by piece.

use super::ToolFormat;
use serde_json::Value;

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// Compact JSON text of the arguments object.
    pub arguments: String,
}

/// Splits a finished reply into its content (trimmed; `None` when empty)
/// and its calls. Text that opens a call but does not complete a
/// well-formed one stays content.
pub fn parse_output(format: ToolFormat, text: &str) -> (Option<String>, Vec<ToolCall>) {
    let mut parser = StreamParser::new(format);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    assemble(events)
}

/// Content and calls put back together from a parser's events.
fn assemble(events: impl IntoIterator<Item = StreamEvent>) -> (Option<String>, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for event in events {
        match event {
            StreamEvent::Content(text) => content.push_str(&text),
            StreamEvent::CallStart { name, .. } => calls.push(ToolCall { name, arguments: String::new() }),
            StreamEvent::CallArguments { index, fragment } => {
                if let Some(call) = calls.get_mut(index) {
                    call.arguments.push_str(&fragment);
                }
            }
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

/// What [`StreamParser`] learnt from the text so far, in OpenAI's streaming
/// terms: a call's first delta has its index and name (the caller adds the
/// id, `"type": "function"` and empty arguments), later ones add argument
/// text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// More content. All content deltas together are the trimmed content.
    Content(String),
    CallStart {
        index: usize,
        name: String,
    },
    CallArguments {
        index: usize,
        fragment: String,
    },
}

/// Reads a reply piece by piece. Text that may still turn out to be part
/// of a call (a suffix that may be the start of the opening marker, or an
/// opened call) is held back until more text or [`finish`](Self::finish)
/// decides it, as is whitespace that may turn out to end the content.
#[derive(Debug)]
pub struct StreamParser {
    format: ToolFormat,
    /// Text not yet reported.
    pending: String,
    /// Llama 3 may open a call with a bare `{` until the first content.
    bare_call_possible: bool,
    /// Progress through the JSON of the call being read.
    scan: Scan,
    calls: usize,
    /// Whether content has started, so that leading whitespace is dropped.
    content_started: bool,
    /// Whitespace after the content so far: reported only if content follows.
    held_space: String,
}

impl StreamParser {
    pub fn new(format: ToolFormat) -> Self {
        StreamParser {
            format,
            pending: String::new(),
            bare_call_possible: format == ToolFormat::Llama3Json,
            scan: Scan::default(),
            calls: 0,
            content_started: false,
            held_space: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> Vec<StreamEvent> {
        self.pending.push_str(piece);
        let mut events = Vec::new();
        self.advance(false, &mut events);
        events
    }

    /// Reports what the end of the reply decides.
    pub fn finish(mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        self.advance(true, &mut events);
        events
    }

    fn advance(&mut self, end: bool, events: &mut Vec<StreamEvent>) {
        let marker = self.format.open();
        loop {
            let marker_len = if self.bare_call_possible {
                let space = self.pending.len() - self.pending.trim_start().len();
                self.content(space, events);
                if self.pending.is_empty() {
                    return;
                }
                if !self.pending.starts_with('{') {
                    self.bare_call_possible = false;
                    continue;
                }
                0
            } else if let Some(at) = self.pending.find(marker) {
                self.content(at, events);
                marker.len()
            } else {
                let held = if end { 0 } else { marker_prefix_len(&self.pending, marker) };
                self.content(self.pending.len() - held, events);
                return;
            };
            let after = self.pending.get(marker_len..).unwrap_or_default();
            match read_call(self.format, after, end, &mut self.scan) {
                Attempt::Wait => return,
                Attempt::Invalid => {
                    self.scan = Scan::default();
                    if marker_len == 0 {
                        self.bare_call_possible = false;
                    } else {
                        self.content(marker_len, events);
                    }
                }
                Attempt::Call(call, len) => {
                    self.scan = Scan::default();
                    self.bare_call_possible = false;
                    split_front(&mut self.pending, marker_len + len);
                    let index = self.calls;
                    self.calls += 1;
                    events.push(StreamEvent::CallStart { index, name: call.name });
                    events.push(StreamEvent::CallArguments { index, fragment: call.arguments });
                }
            }
        }
    }

    /// Reports the first `len` bytes of the pending text as content.
    fn content(&mut self, len: usize, events: &mut Vec<StreamEvent>) {
        let text = split_front(&mut self.pending, len);
        let text = if self.content_started { text.as_str() } else { text.trim_start() };
        if text.is_empty() {
            return;
        }
        self.content_started = true;
        let body = text.trim_end();
        if !body.is_empty() {
            let mut delta = std::mem::take(&mut self.held_space);
            delta.push_str(body);
            match events.last_mut() {
                Some(StreamEvent::Content(previous)) => previous.push_str(&delta),
                _ => events.push(StreamEvent::Content(delta)),
            }
        }
        self.held_space.push_str(text.get(body.len()..).unwrap_or_default());
    }
}

/// Removes and returns the first `len` bytes of `text` (all of it should
/// `len` not fall on a character boundary, which the callers rule out).
fn split_front(text: &mut String, len: usize) -> String {
    match text.get(len..) {
        Some(rest) => {
            let rest = rest.to_owned();
            let mut front = std::mem::replace(text, rest);
            front.truncate(len);
            front
        }
        None => std::mem::take(text),
    }
}

/// Length of the longest end of `text` that is a proper start of `marker`.
fn marker_prefix_len(text: &str, marker: &str) -> usize {
    (1..marker.len()).rev().find(|&len| marker.get(..len).is_some_and(|start| text.ends_with(start))).unwrap_or(0)
}

/// Progress through a bracketed JSON value whose text arrives in pieces.
#[derive(Debug, Default)]
struct Scan {
    pos: usize,
    /// The answer, once found: later calls must not scan past it.
    extent: Option<usize>,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Scan {
    /// The byte length of the bracketed value `text` starts with, once its
    /// closing bracket is there. Resumes where the previous call stopped, as
    /// `text` only grows between calls; whether the value is valid JSON is
    /// for serde to say once it is closed. Finding the end ourselves rather
    /// than asking serde whether an error is "only" an early end keeps each
    /// decision independent of where the text was cut.
    fn extent(&mut self, text: &str) -> Option<usize> {
        if self.extent.is_some() {
            return self.extent;
        }
        while let Some(&byte) = text.as_bytes().get(self.pos) {
            self.pos += 1;
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if byte == b'\\' {
                    self.escaped = true;
                } else if byte == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        self.extent = Some(self.pos);
                        return self.extent;
                    }
                }
                _ => {}
            }
        }
        None
    }
}

enum Attempt {
    /// The text so far does not decide.
    Wait,
    /// No call here, whatever follows.
    Invalid,
    /// A call, and the length of its text.
    Call(ToolCall, usize),
}

/// Reads a call from `text`, which follows the opening marker (or is the
/// bare JSON of a Llama 3 call); `end` says no more text will come.
fn read_call(format: ToolFormat, text: &str, end: bool, scan: &mut Scan) -> Attempt {
    let lead = text.len() - text.trim_start().len();
    let body = text.get(lead..).unwrap_or_default();
    if !body.starts_with('{') {
        return if body.is_empty() && !end { Attempt::Wait } else { Attempt::Invalid };
    }
    let Some(json_len) = scan.extent(body) else {
        return if end { Attempt::Invalid } else { Attempt::Wait };
    };
    let Some(call) = body.get(..json_len).and_then(|json| to_call(format, json)) else {
        return Attempt::Invalid;
    };
    let json_end = lead + json_len;
    let Some(close) = format.close() else {
        return Attempt::Call(call, json_end);
    };
    let rest = text.get(json_end..).unwrap_or_default();
    let trimmed = rest.trim_start();
    let close_at = json_end + rest.len() - trimmed.len();
    if trimmed.starts_with(close) {
        Attempt::Call(call, close_at + close.len())
    } else if !close.starts_with(trimmed) {
        Attempt::Invalid
    } else if !end {
        Attempt::Wait
    } else if trimmed.is_empty() {
        // The reply ended right after the JSON: generation stopped before
        // the closing tag (a stop string, say), which loses nothing.
        Attempt::Call(call, text.len())
    } else {
        Attempt::Invalid
    }
}

/// The call a JSON object describes, if it is one: a non-empty `name` and
/// the arguments object under the format's key or, as models mix them up,
/// the other format's.
fn to_call(format: ToolFormat, json: &str) -> Option<ToolCall> {
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(json) else {
        return None;
    };
    let name = object.get("name").and_then(Value::as_str).filter(|name| !name.is_empty())?;
    let other_key = match format {
        ToolFormat::Hermes => "parameters",
        ToolFormat::Llama3Json => "arguments",
    };
    let arguments = object.get(format.arguments_key()).or_else(|| object.get(other_key))?;
    let arguments = match arguments {
        Value::String(text) => serde_json::from_str::<Value>(text).ok()?,
        value => value.clone(),
    };
    arguments.is_object().then(|| ToolCall { name: name.to_owned(), arguments: arguments.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: arguments.into() }
    }

    const HERMES: &[&str] = &[
        "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n\
         </tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n",
        "a <tool_call> not json </tool_call> b",
        "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call> <tool_call>{\"name\": \"f\", \"arguments\": {}} x",
        "<tool_call>\n{\"name\": \"f\", \"argu",
        "<tool_call>oops <tool_call>\n{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}\n</tool_call>  after  ",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, {\"y\": \"}]\\\"\"}]}}\n",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_",
        "  just text, with a <tool_ca",
        "",
    ];

    #[test]
    fn parses_hermes_replies() {
        let parse = |text: &str| parse_output(ToolFormat::Hermes, text);
        let weather = call("get_weather", r#"{"city":"Zürich","days":2}"#);
        assert_eq!(parse(HERMES[0]), (Some("Let me look.".into()), vec![weather, call("get_time", "{}")]));
        assert_eq!(parse(HERMES[1]), (Some(HERMES[1].into()), vec![]));
        assert_eq!(parse(HERMES[2]), (Some(HERMES[2].trim().into()), vec![]));
        assert_eq!(parse(HERMES[3]), (Some(HERMES[3].trim().into()), vec![]));
        assert_eq!(parse(HERMES[4]), (Some("<tool_call>oops   after".into()), vec![call("f", r#"{"a":1}"#)]));
        assert_eq!(parse(HERMES[5]), (None, vec![call("f", r#"{"x":[1,{"y":"}]\""}]}"#)]));
        assert_eq!(parse(HERMES[6]), (Some(HERMES[6].into()), vec![]));
        assert_eq!(parse(HERMES[7]), (Some(HERMES[7].trim().into()), vec![]));
        assert_eq!(parse(""), (None, vec![]));
    }

    const LLAMA: &[&str] = &[
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "\n <|python_tag|>{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"a\": [1]}}",
        "I would call {\"name\": \"f\", \"parameters\": {}} here.",
        "{\"name\": \"Bob\", \"age\": 3}",
        "{\"name\": \"f\", \"parameters\": {}} and then <|python_tag|>{\"name\": \"g\", \"arguments\": {}}",
        "{\"name\": \"f\", \"param",
        "Sure. <|python_ta",
    ];

    #[test]
    fn parses_llama3_replies() {
        let parse = |text: &str| parse_output(ToolFormat::Llama3Json, text);
        assert_eq!(parse(LLAMA[0]), (None, vec![call("get_weather", r#"{"city":"Paris"}"#)]));
        assert_eq!(parse(LLAMA[1]), (None, vec![call("f", r#"{"a":[1]}"#)]));
        assert_eq!(parse(LLAMA[2]), (Some(LLAMA[2].into()), vec![]));
        assert_eq!(parse(LLAMA[3]), (Some(LLAMA[3].into()), vec![]));
        assert_eq!(parse(LLAMA[4]), (Some("and then".into()), vec![call("f", "{}"), call("g", "{}")]));
        assert_eq!(parse(LLAMA[5]), (Some(LLAMA[5].into()), vec![]));
        assert_eq!(parse(LLAMA[6]), (Some(LLAMA[6].into()), vec![]));
    }

    #[test]
    fn streaming_matches_whole_parse_for_every_cut() {
        for (format, texts) in [(ToolFormat::Hermes, HERMES), (ToolFormat::Llama3Json, LLAMA)] {
            for text in texts {
                let chars: Vec<char> = text.chars().collect();
                for size in 1..=7 {
                    let mut parser = StreamParser::new(format);
                    let mut events = Vec::new();
                    for piece in chars.chunks(size) {
                        events.extend(parser.push(&piece.iter().collect::<String>()));
                    }
                    events.extend(parser.finish());
                    // Calls are numbered in the order they start.
                    let starts: Vec<usize> = events
                        .iter()
                        .filter_map(|event| match event {
                            StreamEvent::CallStart { index, .. } => Some(*index),
                            _ => None,
                        })
                        .collect();
                    assert_eq!(starts, (0..starts.len()).collect::<Vec<_>>());
                    let streamed = assemble(events);
                    assert_eq!(streamed, parse_output(format, text), "{format:?} {text:?} in pieces of {size}");
                }
            }
        }
    }

    #[test]
    fn streaming_holds_back_only_what_may_be_a_call() {
        let mut parser = StreamParser::new(ToolFormat::Hermes);
        assert_eq!(parser.push("  Hi <tool"), vec![StreamEvent::Content("Hi".into())]);
        assert_eq!(parser.push("box> yes "), vec![StreamEvent::Content(" <toolbox> yes".into())]);
        assert_eq!(parser.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}"), vec![]);
        let call = vec![
            StreamEvent::CallStart { index: 0, name: "f".into() },
            StreamEvent::CallArguments { index: 0, fragment: r#"{"a":1}"#.into() },
        ];
        assert_eq!(parser.push("\n</tool_call>"), call);
        assert_eq!(parser.finish(), vec![]);
    }
}
