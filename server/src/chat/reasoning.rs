//! A chat reply's reasoning split from its answer, as llama-server's
//! `--reasoning-format` splits a `<think>…</think>` block: one state
//! machine, fed the reply piece by piece, serves every chat API (OpenAI
//! chat, Anthropic Messages, Responses), streamed or not.
//!
//! As llama-server's parser, a think block counts only at the start of the
//! reply (after whitespace, which is dropped), or from the first token when
//! the prompt already opened it (DeepSeek-R1's and Qwen3's generation
//! prompts end with `<think>`); a `<think>` later in the reply is content.
//! Reasoning that is only whitespace is dropped; so is the whitespace right
//! after `</think>`. A block the reply never closes is reasoning to the end.
//! Tags are found across piece boundaries: a piece ending in what may be
//! the start of a tag is held back until the next piece decides it.

use super::error::Error;
use super::fields::Fields;
use super::harmony::{HarmonyParser, Piece, partial_tag};
use crate::config::ReasoningFormat;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a rendered prompt leaves the model inside a think block.
pub fn opens_thinking(prompt: &str) -> bool {
    prompt.trim_end_matches(is_space).ends_with(OPEN)
}

/// llama-server's parser skips C's `isspace` characters.
fn is_space(c: char) -> bool {
    c.is_ascii_whitespace() || c == '\u{b}'
}

/// Where a reply's reasoning goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Left in the content as generated (`none`).
    Inline,
    /// Into `reasoning_content`, out of the content.
    Apart,
    /// Left in the content between `<think>` and `</think>`: llama-server's
    /// `deepseek-legacy` when streaming.
    Tagged,
}

/// How one request's replies are split: its `reasoning_format` (else the
/// server's) and whether its prompt opened the think block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reasoning {
    route: Route,
    opened: bool,
    harmony: Option<Harmony>,
}

/// A Harmony reply (gpt-oss), read by [`HarmonyParser`] instead of think
/// blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Harmony {
    /// The request has tools: its calls are the answer's, written as
    /// Hermes `<tool_call>` blocks for the tool parser that reads it.
    calls: bool,
}

impl Reasoning {
    /// `deepseek-legacy` splits only what is not streamed, as in
    /// llama-server; `auto` is `deepseek`, as it is there for templates that
    /// think in `<think>` blocks (the only kind sluice recognises).
    pub fn new(fields: Fields<'_>, default: ReasoningFormat, stream: bool, opened: bool) -> Result<Self, Error> {
        let format = match fields.str("reasoning_format")? {
            None => default,
            Some(name) => ReasoningFormat::parse(name).ok_or_else(|| {
                Error::invalid(format!(
                    "`reasoning_format` must be \"none\", \"auto\", \"deepseek\" or \"deepseek-legacy\", not {name:?}"
                ))
            })?,
        };
        let route = match format {
            ReasoningFormat::None => Route::Inline,
            ReasoningFormat::DeepseekLegacy if stream => Route::Tagged,
            ReasoningFormat::Auto | ReasoningFormat::Deepseek | ReasoningFormat::DeepseekLegacy => Route::Apart,
        };
        Ok(Reasoning { route, opened, harmony: None })
    }

    /// The reply is Harmony (the template is, see
    /// [`super::harmony::is_harmony`]); `calls`: the request has tools.
    pub fn harmony(self, calls: bool) -> Self {
        Reasoning { harmony: Some(Harmony { calls }), ..self }
    }

    /// A splitter for one reply.
    pub fn splitter(self) -> Splitter {
        let state = match (self.route, self.opened) {
            (Route::Inline, _) => State::Answer,
            (_, true) => State::Thinking { said: false },
            (_, false) => State::Start,
        };
        let harmony = self.harmony.map(|Harmony { calls }| HarmonySplit {
            calls,
            inline: self.route == Route::Inline,
            parser: HarmonyParser::default(),
            analysis_open: false,
            answered: false,
            held: String::new(),
        });
        Splitter { route: self.route, state, held: String::new(), harmony }
    }

    /// A whole reply, split.
    pub fn split(self, text: &str) -> Parts {
        let mut splitter = self.splitter();
        let mut parts = splitter.push(text);
        parts.append(splitter.finish());
        parts
    }
}

/// What a piece of the reply adds: reasoning, then content (a reply's
/// reasoning always comes before its answer).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

impl Parts {
    pub fn append(&mut self, more: Parts) {
        self.reasoning.push_str(&more.reasoning);
        self.content.push_str(&more.content);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a think block may open.
    Start,
    /// Inside the think block; `said` once reasoning other than whitespace
    /// was given out.
    Thinking { said: bool },
    /// Right after `</think>`, where whitespace is dropped.
    Closed,
    /// The answer, to the end.
    Answer,
}

/// Splits one reply as it streams: [`Splitter::push`] each piece of text,
/// then [`Splitter::finish`] for what was held back.
#[derive(Debug, Clone)]
pub struct Splitter {
    route: Route,
    state: State,
    /// Text not given out yet: what may still be a tag, or leading
    /// whitespace whose place is not decided.
    held: String,
    harmony: Option<HarmonySplit>,
}

impl Splitter {
    pub fn push(&mut self, text: &str) -> Parts {
        if let Some(harmony) = &mut self.harmony {
            let pieces = harmony.parser.push(text);
            return harmony.parts(pieces, false);
        }
        let mut out = Parts::default();
        self.held.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let rest = self.held.trim_start_matches(is_space);
                    if let Some(inner) = rest.strip_prefix(OPEN) {
                        self.held = inner.to_owned();
                        self.state = State::Thinking { said: false };
                    } else if OPEN.starts_with(rest) {
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking { said } => {
                    let close = self.held.find(CLOSE);
                    let ready = close.unwrap_or(self.held.len() - partial_tag(&self.held, CLOSE));
                    let thought = &self.held[..ready];
                    let says = said || !thought.chars().all(is_space);
                    if says {
                        self.reason(&mut out, said, thought);
                    }
                    match close {
                        Some(at) => {
                            if says && self.route == Route::Tagged {
                                out.content.push_str(CLOSE);
                            }
                            self.held.drain(..at + CLOSE.len());
                            self.state = State::Closed;
                        }
                        None => {
                            // Whitespace alone waits: it is dropped if the
                            // block turns out to hold nothing else.
                            if says {
                                self.held.drain(..ready);
                            }
                            self.state = State::Thinking { said: says };
                            return out;
                        }
                    }
                }
                State::Closed => {
                    let rest = self.held.trim_start_matches(is_space);
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_owned();
                    self.state = State::Answer;
                }
                State::Answer => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// The end of the reply: what was held back, where it belongs now that
    /// nothing follows (a partial tag is text; an unclosed block's tail is
    /// reasoning).
    pub fn finish(&mut self) -> Parts {
        if let Some(harmony) = &mut self.harmony {
            let pieces = harmony.parser.finish();
            return harmony.parts(pieces, true);
        }
        let mut out = Parts::default();
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Start => out.content = held,
            State::Thinking { said } => {
                if said || !held.chars().all(is_space) {
                    self.reason(&mut out, said, &held);
                }
            }
            State::Closed | State::Answer => {}
        }
        self.state = State::Answer;
        out
    }

    /// Give out reasoning; `said` is whether some was given out before.
    fn reason(&self, out: &mut Parts, said: bool, text: &str) {
        match self.route {
            Route::Tagged => {
                if !said {
                    out.content.push_str(OPEN);
                }
                out.content.push_str(text);
            }
            Route::Apart | Route::Inline => out.reasoning.push_str(text),
        }
    }
}

/// A Harmony reply's splitter: its parser, and where its pieces go.
#[derive(Debug, Clone)]
struct HarmonySplit {
    /// The request has tools: calls become Hermes blocks of the content.
    calls: bool,
    /// Reasoning stays in the content, written as llama-server writes it
    /// then, `<|channel|>analysis<|message|>…<|end|>` (`none`).
    inline: bool,
    parser: HarmonyParser,
    /// An analysis message's opening was written inline.
    analysis_open: bool,
    /// The answer began: later reasoning (a message after `final`, which
    /// ends the reply in practice) joins it, so that no API's stream sees
    /// reasoning follow content.
    answered: bool,
    /// Preambles and calls, which wait for the answer or the end of the
    /// reply, so that reasoning after a preamble still comes before any
    /// content.
    held: String,
}

impl HarmonySplit {
    fn parts(&mut self, pieces: Vec<Piece>, end: bool) -> Parts {
        const OPEN_ANALYSIS: &str = "<|channel|>analysis<|message|>";
        let mut out = Parts::default();
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) if self.inline => {
                    if !self.analysis_open {
                        out.content.push_str(OPEN_ANALYSIS);
                        self.analysis_open = true;
                    }
                    out.content.push_str(&text);
                }
                Piece::Reasoning(text) if self.answered => out.content.push_str(&text),
                Piece::Reasoning(text) => out.reasoning.push_str(&text),
                Piece::ReasoningEnd => {
                    if self.inline {
                        if !self.analysis_open {
                            out.content.push_str(OPEN_ANALYSIS);
                        }
                        out.content.push_str("<|end|>");
                    }
                    self.analysis_open = false;
                }
                Piece::Preamble(text) => self.held.push_str(&text),
                Piece::Answer(text) => {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    out.content.push_str(&text);
                    self.answered = true;
                }
                // A call whose arguments are not a JSON object (cut short by
                // the token limit) is dropped, as calls are without tools.
                Piece::Call { name, arguments } if self.calls => {
                    if let Ok(arguments @ serde_json::Value::Object(_)) = serde_json::from_str(&arguments) {
                        let call = serde_json::json!({ "name": name, "arguments": arguments });
                        self.held.push_str(&format!("\n<tool_call>\n{call}\n</tool_call>\n"));
                    }
                }
                Piece::Call { .. } => {}
            }
        }
        if end {
            out.content.push_str(&std::mem::take(&mut self.held));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;

    fn reasoning(format: ReasoningFormat, stream: bool, opened: bool) -> Reasoning {
        Reasoning::new(Fields(&Map::new()), format, stream, opened).expect("valid")
    }

    fn apart(opened: bool) -> Reasoning {
        reasoning(ReasoningFormat::Deepseek, false, opened)
    }

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts { reasoning: reasoning.into(), content: content.into() }
    }

    /// Feed the pieces one by one, checking that nothing is given out twice
    /// and that reasoning never follows content.
    fn feed(reasoning: Reasoning, pieces: &[&str]) -> Parts {
        let mut splitter = reasoning.splitter();
        let mut total = Parts::default();
        let mut given: Vec<Parts> = pieces.iter().map(|piece| splitter.push(piece)).collect();
        given.push(splitter.finish());
        for piece in given {
            assert!(piece.reasoning.is_empty() || total.content.is_empty(), "reasoning after content: {pieces:?}");
            total.append(piece);
        }
        total
    }

    /// Every way of cutting `text` in two, at char boundaries, splits as the
    /// whole does; and so does one piece per character.
    fn same_however_cut(reasoning: Reasoning, text: &str) -> Parts {
        let whole = reasoning.split(text);
        for (at, _) in text.char_indices().skip(1) {
            assert_eq!(feed(reasoning, &[&text[..at], &text[at..]]), whole, "{text:?} cut at {at}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(reasoning, &chars), whole, "{text:?} one character at a time");
        whole
    }

    #[test]
    fn a_think_block_at_the_start_is_taken_out() {
        let split = same_however_cut(apart(false), "<think>Let me see.\nOK.</think>\n\nThe answer is 4.");
        assert_eq!(split, parts("Let me see.\nOK.", "The answer is 4."));
        // Leading whitespace before the tag goes; inner whitespace stays.
        let split = same_however_cut(apart(false), "\n <think> a </think>b ");
        assert_eq!(split, parts(" a ", "b "));
    }

    #[test]
    fn a_prompt_that_opened_the_block_starts_inside_it() {
        let split = same_however_cut(apart(true), "\nHmm, 2+2.\n</think>\n\nFour.");
        assert_eq!(split, parts("\nHmm, 2+2.\n", "Four."));
        // An opening tag then is text of the reasoning.
        assert_eq!(apart(true).split("<think>x</think>y"), parts("<think>x", "y"));
    }

    #[test]
    fn an_unclosed_block_is_reasoning_to_the_end() {
        assert_eq!(same_however_cut(apart(false), "<think>still going </th"), parts("still going </th", ""));
        assert_eq!(same_however_cut(apart(true), "all of it"), parts("all of it", ""));
        assert_eq!(same_however_cut(apart(true), "ends </think"), parts("ends </think", ""));
    }

    #[test]
    fn replies_without_a_block_are_content() {
        for text in ["The answer is 4.", "", "  ", "<thin", "<", "a <think>b</think>c", "<thinking>x</thinking>"] {
            assert_eq!(same_however_cut(apart(false), text), parts("", text), "{text:?}");
        }
        // Text before the tag: no block, as llama-server parses it.
        assert_eq!(apart(false).split("Sure. <think>x</think>"), parts("", "Sure. <think>x</think>"));
    }

    #[test]
    fn whitespace_only_reasoning_and_the_gap_after_the_block_are_dropped() {
        assert_eq!(same_however_cut(apart(false), "<think>\n\n</think>\n\nHi"), parts("", "Hi"));
        assert_eq!(same_however_cut(apart(true), " \n "), parts("", ""));
        assert_eq!(same_however_cut(apart(true), "</think>  "), parts("", ""));
        // Whitespace held back while undecided comes out with what follows.
        let mut splitter = apart(true).splitter();
        assert_eq!(splitter.push("\n"), Parts::default());
        assert_eq!(splitter.push(" x"), parts("\n x", ""));
        assert_eq!(splitter.push("</think>\n"), Parts::default());
        assert_eq!(splitter.push("\ny"), parts("", "y"));
        assert_eq!(splitter.finish(), Parts::default());
    }

    #[test]
    fn partial_tags_wait_for_the_next_piece() {
        let mut splitter = apart(false).splitter();
        assert_eq!(splitter.push("<thi"), Parts::default());
        assert_eq!(splitter.push("nk>abc</"), parts("abc", ""));
        assert_eq!(splitter.push("thin"), Parts::default());
        assert_eq!(splitter.push("k"), Parts::default());
        assert_eq!(splitter.push(">ok"), parts("", "ok"));
        // A near-tag turns back into text as soon as it is not one.
        let mut splitter = apart(true).splitter();
        assert_eq!(splitter.push("a </t"), parts("a ", ""));
        assert_eq!(splitter.push("able>"), parts("</table>", ""));
    }

    #[test]
    fn multibyte_text_is_never_cut() {
        let text = "<think>日本語の思考 🤔</think>\n答え: 4 ✓";
        assert_eq!(same_however_cut(apart(false), text), parts("日本語の思考 🤔", "答え: 4 ✓"));
        assert_eq!(same_however_cut(apart(true), "é</think>ü"), parts("é", "ü"));
    }

    #[test]
    fn none_leaves_the_reply_as_generated() {
        let none = reasoning(ReasoningFormat::None, false, true);
        let text = "<think>x</think>\n\ny";
        assert_eq!(same_however_cut(none, text), parts("", text));
        assert_eq!(same_however_cut(reasoning(ReasoningFormat::None, true, false), text), parts("", text));
    }

    #[test]
    fn deepseek_legacy_splits_unstreamed_and_keeps_the_tags_streamed() {
        let text = "<think>x</think>\n\ny";
        assert_eq!(reasoning(ReasoningFormat::DeepseekLegacy, false, false).split(text), parts("x", "y"));
        let streamed = reasoning(ReasoningFormat::DeepseekLegacy, true, false);
        assert_eq!(same_however_cut(streamed, text), parts("", "<think>x</think>y"));
        let opened = reasoning(ReasoningFormat::DeepseekLegacy, true, true);
        assert_eq!(same_however_cut(opened, "x</think>\ny"), parts("", "<think>x</think>y"));
        assert_eq!(same_however_cut(opened, "unclosed"), parts("", "<think>unclosed"));
    }

    #[test]
    fn auto_is_deepseek_and_the_request_field_wins() {
        let text = "<think>x</think>y";
        assert_eq!(reasoning(ReasoningFormat::Auto, true, false).split(text), parts("x", "y"));
        let body = json!({"reasoning_format": "none"});
        let fields = Fields(body.as_object().expect("object"));
        let none = Reasoning::new(fields, ReasoningFormat::Deepseek, false, false).expect("valid");
        assert_eq!(none.split(text), parts("", text));
        let body = json!({"reasoning_format": "nothink"});
        let error = Reasoning::new(Fields(body.as_object().expect("object")), ReasoningFormat::Auto, false, false)
            .expect_err("unknown format");
        assert!(error.to_string().contains("reasoning_format"), "{error}");
    }

    #[test]
    fn prompts_that_open_the_block_are_recognised() {
        assert!(opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(opens_thinking("Assistant:<think>"));
        assert!(!opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!opens_thinking("<|im_start|>assistant\n"));
    }

    #[test]
    fn harmony_replies_split_by_channel_reasoning_first() {
        let reply = "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant\
                     <|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant\
                     <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
        let pieces: Vec<&str> = reply.as_bytes().chunks(7).map(|c| std::str::from_utf8(c).expect("ASCII")).collect();
        let with_tools = feed(apart(false).harmony(true), &pieces);
        assert_eq!(with_tools.reasoning, "Use the tool.");
        assert_eq!(
            with_tools.content,
            "Let me check.\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>\n"
        );
        // Without tools a call is dropped.
        assert_eq!(feed(apart(false).harmony(false), &pieces), parts("Use the tool.", "Let me check."));
        // `none` leaves the analysis in the content as llama-server writes it.
        let inline = reasoning(ReasoningFormat::None, false, false).harmony(false);
        let thought = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi.";
        assert_eq!(inline.split(thought), parts("", "<|channel|>analysis<|message|>Hm.<|end|>Hi."));
    }
}
