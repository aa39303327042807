//! gpt-oss's replies in OpenAI's Harmony format, read as llama-server's
//! gpt-oss parser reads them. A reply is a run of messages, each a header
//! and a body (`<|channel|>analysis<|message|>…<|end|>`), the next opened
//! by `<|start|>assistant`; the prompt has already opened the first. The
//! `analysis` channel is reasoning; `final` is the answer, and so is
//! `commentary` addressed to no one (a preamble said before acting); a
//! message addressed `to=functions.NAME` (in its role or its channel
//! header) is a call whose body is the arguments. The reply's last message
//! ends with generation (`<|return|>` and `<|call|>` end it and are not
//! part of the text). Messages to other recipients (built-in tools sluice
//! does not run) are dropped, as llama-server drops them; text that is not
//! Harmony at all is the answer as it stands.
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
    /// Text of the `final` message, or text that is not Harmony.
    Answer(String),
    /// Text of a `commentary` message to no one.
    Preamble(String),
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
    Preamble,
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
    /// A message was read: a header the reply ends in was cut off by the
    /// token limit, and is not text.
    read_one: bool,
}

impl Default for HarmonyParser {
    fn default() -> Self {
        HarmonyParser { state: State::Header, held: String::new(), read_one: false }
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
                        self.read_one = true;
                    }
                    Some(_) => self.state = State::Text,
                    None if could_open_header(&self.held) => return out,
                    None => self.state = State::Text,
                },
                State::Body(body) => {
                    let end = self.held.find(END);
                    let ready = end.unwrap_or(self.held.len() - partial_tag(&self.held, END));
                    out.extend(text_of(body, &self.held[..ready]));
                    let Some(end) = end else {
                        // A call's body waits whole for its end.
                        if !matches!(body, Body::Call(_)) {
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
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => text_of(&Body::Answer, &held).into_iter().collect(),
            // Text that only looked like a header.
            State::Header if !self.read_one => text_of(&Body::Answer, &held).into_iter().collect(),
            State::Body(body) => text_of(&body, &held).into_iter().chain(close(&body, &held)).collect(),
            State::Header | State::Between => Vec::new(),
        }
    }
}

/// The text a message of this kind gives out as it comes (none when
/// `text` is empty, or for a call or a dropped message).
fn text_of(body: &Body, text: &str) -> Option<Piece> {
    match body {
        _ if text.is_empty() => None,
        Body::Analysis => Some(Piece::Reasoning(text.to_owned())),
        Body::Answer => Some(Piece::Answer(text.to_owned())),
        Body::Preamble => Some(Piece::Preamble(text.to_owned())),
        Body::Call(_) | Body::Dropped => None,
    }
}

/// What ends with a message: its whole `text` (for a call).
fn close(body: &Body, text: &str) -> Option<Piece> {
    match body {
        Body::Analysis => Some(Piece::ReasoningEnd),
        Body::Call(name) => Some(Piece::Call { name: name.clone(), arguments: text.trim().to_owned() }),
        Body::Answer | Body::Preamble | Body::Dropped => None,
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
    let recipient = header.find(RECIPIENT).map(|at| word_at(&header[at + RECIPIENT.len()..]));
    match recipient {
        Some(recipient) if recipient.starts_with(FUNCTIONS) => Body::Call(recipient[FUNCTIONS.len()..].to_owned()),
        // gpt-oss-20b sometimes addresses a message to itself.
        Some(recipient) if recipient != "assistant" => Body::Dropped,
        // The last channel counts: gpt-oss-20b sometimes writes a stray
        // `<|channel|>commentary` before the real one.
        _ => match header.rfind(CHANNEL).map(|at| word_at(&header[at + CHANNEL.len()..])) {
            Some("analysis") => Body::Analysis,
            Some("commentary") => Body::Preamble,
            _ => Body::Answer,
        },
    }
}

/// The word `text` starts with, up to a blank or a marker.
fn word_at(text: &str) -> &str {
    &text[..text.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(text.len())]
}

/// The length of the longest end of `text` that begins `tag` (a tag cut
/// off by the end of a piece). Tags are ASCII, so the cut is a character
/// boundary.
pub(super) fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len()).rev().find(|&len| text.ends_with(&tag[..len])).unwrap_or(0)
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
                | (Some(Piece::Answer(text)), Piece::Answer(more))
                | (Some(Piece::Preamble(text)), Piece::Preamble(more)) => text.push_str(&more),
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
        let preamble = |text: &str| Piece::Preamble(text.into());
        assert_eq!(every_split(reply), [preamble("Checking the weather.Done."), answer("Sunny.")]);
        // A stray commentary channel before the real one.
        let stray = "<|channel|>commentary to=assistant<|channel|>analysis<|message|>think<|end|>\
                     <|start|>assistant<|channel|>commentary<|channel|>final<|message|>hi";
        assert_eq!(every_split(stray), [reasoning("think"), Piece::ReasoningEnd, answer("hi")]);
    }

    #[test]
    fn text_that_is_not_harmony_is_the_answer() {
        assert_eq!(every_split("Hello <|end|> there"), [answer("Hello <|end|> there")]);
        assert_eq!(every_split("<|chan"), [answer("<|chan")]);
        assert_eq!(every_split("{\"a\": 1}"), [answer("{\"a\": 1}")]);
        assert_eq!(every_split(""), []);
        // A reply cut short inside a header (text, as no message was read)
        // or between messages or in a later header (dropped).
        assert_eq!(every_split("<|channel|>final"), [answer("<|channel|>final")]);
        let thought = [reasoning("hm"), Piece::ReasoningEnd];
        assert_eq!(every_split("<|channel|>analysis<|message|>hm<|end|><|start|>assi"), thought);
        assert_eq!(every_split("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>fin"), thought);
        assert_eq!(every_split("<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.f"), thought);
        // An unfinished end marker is the body's.
        assert_eq!(every_split("<|channel|>final<|message|>a <|en"), [answer("a <|en")]);
    }

    #[test]
    fn templates_are_told_by_their_channel_marker() {
        assert!(is_harmony("{{- '<|start|>assistant<|channel|>final<|message|>' }}"));
        assert!(!is_harmony("{{ '<|im_start|>assistant' }}"));
    }
}
