//! gpt-oss's replies in OpenAI's Harmony format, read as llama-server's
//! gpt-oss parser reads them. A reply is a run of messages, each a header
//! and a body (`<|channel|>analysis<|message|>…<|end|>`), the next opened
//! by `<|start|>assistant`; the prompt has already opened the first. The
//! `analysis` channel is reasoning; `final`, and `commentary` addressed to
//! no one (a preamble), are the answer; a message addressed
//! `to=functions.NAME` (in its role or its channel header) is a call whose
//! body is the arguments. The reply's last message ends with generation
//! (`<|return|>` and `<|call|>` end it and are not part of the text).
//! Messages to other recipients (built-in tools sluice does not run) are
//! dropped, as llama-server drops them; text that is not Harmony at all is
//! the answer as it stands.
//!
//! The parser is fed the reply piece by piece and gives out reasoning and
//! answer text as soon as it cannot be the start of a marker; a call comes
//! out whole when its message ends.

const START: &str = "<|start|>assistant";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const RECIPIENT: &str = " to=";
const FUNCTIONS: &str = "functions.";
/// A header longer than this is not one: the text is the answer.
const MAX_HEADER: usize = 256;

/// Whether a chat template writes Harmony (llama-server's test).
pub fn is_harmony(template_source: &str) -> bool {
    template_source.contains(CHANNEL)
}

/// What a piece of the reply adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    /// The end of an `analysis` message.
    ReasoningEnd,
    Answer(String),
    Call {
        name: String,
        arguments: String,
    },
}

/// What a message's body is, from its header.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Analysis,
    Answer,
    Call(String),
    /// A message for a recipient other than a function: dropped.
    Dropped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Reading a message's header, up to `<|message|>`.
    Header,
    Body(Body),
    /// After `<|end|>`: the next message's `<|start|>assistant`.
    Between,
    /// Not Harmony: the answer, to the end.
    Text,
}

/// Reads one Harmony reply: [`push`](Self::push) each piece, then
/// [`finish`](Self::finish).
#[derive(Debug, Clone)]
pub struct HarmonyParser {
    state: State,
    held: String,
}

impl Default for HarmonyParser {
    fn default() -> Self {
        HarmonyParser { state: State::Header, held: String::new() }
    }
}

impl HarmonyParser {
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match &self.state {
                State::Header => match self.held.find(MESSAGE) {
                    Some(at) if is_header(&self.held[..at]) => {
                        self.state = State::Body(body(&self.held[..at]));
                        self.held.drain(..at + MESSAGE.len());
                    }
                    Some(_) => self.state = State::Text,
                    None if could_open_header(&self.held) => return out,
                    None => self.state = State::Text,
                },
                State::Body(body) => {
                    let end = self.held.find(END);
                    let ready = end.unwrap_or(self.held.len() - partial(&self.held, END));
                    match body {
                        Body::Analysis if ready > 0 => out.push(Piece::Reasoning(self.held[..ready].to_owned())),
                        Body::Answer if ready > 0 => out.push(Piece::Answer(self.held[..ready].to_owned())),
                        _ => {}
                    }
                    let Some(end) = end else {
                        if matches!(body, Body::Analysis | Body::Answer) {
                            self.held.drain(..ready);
                        }
                        return out;
                    };
                    out.extend(close(body, &self.held[..end]));
                    self.held.drain(..end + END.len());
                    self.state = State::Between;
                }
                State::Between => {
                    if let Some(rest) = self.held.strip_prefix(START) {
                        self.held = rest.to_owned();
                    } else if START.starts_with(self.held.as_str()) {
                        return out;
                    }
                    // Without `<|start|>assistant`, a header may still follow.
                    self.state = State::Header;
                }
                State::Text => {
                    if !self.held.is_empty() {
                        out.push(Piece::Answer(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the reply: the last message ends with it.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let state = std::mem::replace(&mut self.state, State::Text);
        match state {
            // An unfinished header, or text that only looked like one.
            State::Header | State::Text if !held.is_empty() => vec![Piece::Answer(held)],
            State::Body(body) => {
                let mut out = match body {
                    Body::Analysis if !held.is_empty() => vec![Piece::Reasoning(held.clone())],
                    Body::Answer if !held.is_empty() => vec![Piece::Answer(held.clone())],
                    _ => Vec::new(),
                };
                out.extend(close(&body, &held));
                out
            }
            _ => Vec::new(),
        }
    }
}

/// What ends with a message: its whole `text` (for a call) or the last of
/// it.
fn close(body: &Body, text: &str) -> Option<Piece> {
    match body {
        Body::Analysis => Some(Piece::ReasoningEnd),
        Body::Call(name) => Some(Piece::Call { name: name.clone(), arguments: text.trim().to_owned() }),
        Body::Answer | Body::Dropped => None,
    }
}

/// Whether `text` is a message header: a channel, a recipient or both,
/// and no marker that ends a message.
fn is_header(text: &str) -> bool {
    (text.starts_with(CHANNEL) || text.starts_with(RECIPIENT)) && !text.contains(END) && text.len() <= MAX_HEADER
}

/// Whether `text` may still grow into a header.
fn could_open_header(text: &str) -> bool {
    let opens = |marker: &str| text.starts_with(marker) || marker.starts_with(text);
    (opens(CHANNEL) || opens(RECIPIENT)) && !text.contains(END) && text.len() <= MAX_HEADER
}

/// What a message with this header holds.
fn body(header: &str) -> Body {
    let word = |after: &str| -> Option<&str> {
        let at = header.find(after)? + after.len();
        let rest = &header[at..];
        Some(&rest[..rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len())])
    };
    match word(RECIPIENT) {
        Some(recipient) if recipient.starts_with(FUNCTIONS) => Body::Call(recipient[FUNCTIONS.len()..].to_owned()),
        // gpt-oss-20b sometimes addresses a message to itself.
        Some(recipient) if recipient != "assistant" => Body::Dropped,
        _ => match word(CHANNEL) {
            Some("analysis") => Body::Analysis,
            _ => Body::Answer,
        },
    }
}

/// The length of the longest end of `text` that begins `marker`.
fn partial(text: &str, marker: &str) -> usize {
    (1..marker.len()).rev().find(|&len| text.ends_with(&marker[..len])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces of `text` fed `size` bytes at a time (ASCII), adjacent
    /// pieces of one kind joined.
    fn parse(text: &str, size: usize) -> Vec<Piece> {
        let mut parser = HarmonyParser::default();
        let mut pieces = Vec::new();
        for chunk in text.as_bytes().chunks(size.max(1)) {
            pieces.extend(parser.push(std::str::from_utf8(chunk).expect("ASCII")));
        }
        pieces.extend(parser.finish());
        let mut joined: Vec<Piece> = Vec::new();
        for piece in pieces {
            match (joined.last_mut(), piece) {
                (Some(Piece::Reasoning(text)), Piece::Reasoning(more))
                | (Some(Piece::Answer(text)), Piece::Answer(more)) => text.push_str(&more),
                (_, piece) => joined.push(piece),
            }
        }
        joined
    }

    fn every_split(text: &str) -> Vec<Piece> {
        let whole = parse(text, text.len());
        for size in 1..8 {
            assert_eq!(parse(text, size), whole, "{text:?} in pieces of {size}");
        }
        whole
    }

    fn reasoning(text: &str) -> Piece {
        Piece::Reasoning(text.into())
    }

    fn answer(text: &str) -> Piece {
        Piece::Answer(text.into())
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_the_answer() {
        // OpenAI's Harmony guide's example reply, after `<|start|>assistant`.
        let reply = "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.\
                     <|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
        assert_eq!(
            every_split(reply),
            [
                reasoning("User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer."),
                Piece::ReasoningEnd,
                answer("2 + 2 = 4.")
            ]
        );
    }

    #[test]
    fn calls_are_read_from_the_channel_or_the_role_header() {
        let in_channel = "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>\
                          <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
                          <|message|>{\"location\":\"San Francisco\"}";
        let call = Piece::Call { name: "get_weather".into(), arguments: "{\"location\":\"San Francisco\"}".into() };
        assert_eq!(
            every_split(in_channel),
            [reasoning("Need to use function get_weather."), Piece::ReasoningEnd, call]
        );
        let in_role = " to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Tokyo\"} ";
        let call = Piece::Call { name: "get_weather".into(), arguments: "{\"location\": \"Tokyo\"}".into() };
        assert_eq!(every_split(in_role), [call]);
    }

    #[test]
    fn preambles_are_answer_and_other_recipients_are_dropped() {
        let reply = "<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant\
                     <|channel|>analysis to=browser.search code<|message|>{\"query\":\"x\"}<|end|>\
                     <|start|>assistant<|channel|>commentary to=assistant<|message|>Done.<|end|>\
                     <|start|>assistant<|channel|>final<|message|>Sunny.";
        assert_eq!(every_split(reply), [answer("Checking the weather.Done.Sunny.")]);
    }

    #[test]
    fn text_that_is_not_harmony_is_the_answer() {
        assert_eq!(every_split("Hello <|end|> there"), [answer("Hello <|end|> there")]);
        assert_eq!(every_split("<|chan"), [answer("<|chan")]);
        assert_eq!(every_split("{\"a\": 1}"), [answer("{\"a\": 1}")]);
        assert_eq!(every_split(""), []);
        // A reply cut short inside a header or between messages.
        assert_eq!(every_split("<|channel|>final"), [answer("<|channel|>final")]);
        assert_eq!(
            every_split("<|channel|>analysis<|message|>hm<|end|><|start|>assi"),
            [reasoning("hm"), Piece::ReasoningEnd]
        );
        // An unfinished end marker is the body's.
        assert_eq!(every_split("<|channel|>final<|message|>a <|en"), [answer("a <|en")]);
    }

    #[test]
    fn templates_are_told_by_their_channel_marker() {
        assert!(is_harmony("{{- '<|start|>assistant<|channel|>final<|message|>' }}"));
        assert!(!is_harmony("{{ '<|im_start|>assistant' }}"));
    }
}
