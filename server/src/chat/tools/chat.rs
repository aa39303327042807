//! Tools in a chat request and reply: what the template is given, the
//! grammar the reply is held to, and the reply's `tool_calls` (whole, or
//! as OpenAI's streaming deltas).

use serde_json::{Map, Value, json};

use super::{
    StreamEvent, StreamParser, Tool, ToolChoice, ToolFormat, detect, grammar, harmony_grammar, parse_output,
    parse_tool_choice, parse_tools, preamble,
};
use crate::chat::error::Error;
use crate::chat::fields::Fields;
use crate::chat::ids::random_id;
use sluice_engine::constraint::GrammarSource;

/// The tools of one chat request that may call them.
pub struct ChatTools {
    pub format: ToolFormat,
    tools: Vec<Tool>,
    choice: ToolChoice,
    parallel: bool,
    /// The template knows no tools: they are described in the system
    /// prompt and earlier calls are written into the messages' text.
    preamble: bool,
    /// `tools` as the request gave it, for templates that render it.
    given: Value,
    /// The template writes Harmony: so do the calls (read back as Hermes
    /// blocks, see `chat::reasoning`).
    harmony: bool,
}

impl ChatTools {
    /// The request's tools; `None` without tools or with `tool_choice`
    /// `none` (the reply is then plain text, and the template is not shown
    /// the tools).
    pub fn read(fields: Fields<'_>, template_source: &str) -> Result<Option<ChatTools>, Error> {
        let given = fields.get("tools").cloned().unwrap_or(Value::Null);
        let tools = parse_tools(&given).map_err(Error::invalid)?;
        let choice = parse_tool_choice(fields.get("tool_choice"), &tools).map_err(Error::invalid)?;
        if choice == ToolChoice::None {
            return Ok(None);
        }
        // llama-server's default: one call per reply unless asked for more.
        let parallel = fields.bool_or("parallel_tool_calls", false)?;
        let (format, preamble) = detect(template_source);
        let harmony = crate::chat::harmony::is_harmony(template_source);
        Ok(Some(ChatTools { format, tools, choice, parallel, preamble, given, harmony }))
    }

    /// What the reply is held to.
    pub fn grammar(&self) -> Option<GrammarSource> {
        match self.harmony {
            true => harmony_grammar(&self.tools, &self.choice),
            false => grammar(self.format, &self.tools, &self.choice, self.parallel),
        }
        .map(GrammarSource::Lark)
    }

    /// Give the template the tools (its `tools` variable), or, for a
    /// template without tool support, describe them in the system prompt
    /// and write earlier calls and results as the Hermes format's text.
    pub fn prepare(&self, messages: &mut Vec<Value>, extra: &mut Map<String, Value>) {
        if !self.preamble {
            extra.insert("tools".into(), self.given.clone());
            return;
        }
        for message in messages.iter_mut() {
            inline_calls(message);
        }
        let preamble = preamble(&self.tools);
        match messages.first_mut() {
            Some(first) if first["role"] == "system" => {
                let text = first["content"].as_str().unwrap_or_default();
                first["content"] = Value::String(format!("{text}\n\n{preamble}"));
            }
            _ => messages.insert(0, json!({"role": "system", "content": preamble})),
        }
    }
}

/// Tool calls of an assistant turn and tool results as plain text in the
/// Hermes format, for templates that would drop them.
fn inline_calls(message: &mut Value) {
    let text = message["content"].as_str().unwrap_or_default().to_owned();
    if message["role"] == "tool" {
        message["role"] = Value::String("user".into());
        message["content"] = Value::String(format!("<tool_response>\n{text}\n</tool_response>"));
        return;
    }
    let Some(calls) = message.get("tool_calls").and_then(Value::as_array) else { return };
    let blocks: Vec<String> = calls
        .iter()
        .map(|call| {
            let function = call.get("function").unwrap_or(call);
            let call = json!({"name": function["name"], "arguments": function["arguments"]});
            format!("<tool_call>\n{call}\n</tool_call>")
        })
        .collect();
    let joined = [text].into_iter().filter(|text| !text.is_empty()).chain(blocks).collect::<Vec<_>>().join("\n");
    message["content"] = Value::String(joined);
}

/// An assistant message's `tool_calls`: `function.arguments` arrives as a
/// JSON string, and templates (Qwen's, Llama's) write it with `tojson`, so
/// they are given the object it holds.
pub fn arguments_as_objects(message: &mut Map<String, Value>) {
    let Some(Value::Array(calls)) = message.get_mut("tool_calls") else { return };
    for call in calls {
        let Some(function) = call.get_mut("function").and_then(Value::as_object_mut) else { continue };
        if let Some(Value::String(text)) = function.get("arguments")
            && let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(text)
        {
            function.insert("arguments".into(), value);
        }
    }
}

/// A call's id, as OpenAI shapes them.
fn call_id() -> String {
    format!("call_{}", &random_id()[..24])
}

/// The finish reason of a reply that called: `tool_calls`, unless the
/// token limit cut it (llama-server reports those as `length`).
pub fn finish_reason(reason: &'static str) -> &'static str {
    if reason == "length" { reason } else { "tool_calls" }
}

/// A finished reply's `content` (trimmed, `null` when empty, as a stream of
/// the same reply sends it) and `tool_calls` (`None` when it made no call).
pub fn reply(format: ToolFormat, text: &str) -> (Value, Option<Value>) {
    let (content, calls) = parse_output(format, text);
    if calls.is_empty() {
        return (content.map_or(Value::Null, Value::String), None);
    }
    let calls = calls
        .into_iter()
        .map(|call| {
            json!({"id": call_id(), "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments}})
        })
        .collect();
    (content.map_or(Value::Null, Value::String), Some(Value::Array(calls)))
}

/// A streamed reply's parser, turning its text into content and
/// `tool_calls` deltas.
pub struct ToolStream {
    parser: Option<StreamParser>,
    called: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        ToolStream { parser: Some(StreamParser::new(format)), called: false }
    }

    /// Deltas for a piece of content (`end`: the reply is complete).
    pub fn push(&mut self, text: &str, end: bool) -> Vec<Value> {
        let Some(parser) = self.parser.as_mut() else { return Vec::new() };
        let mut events = parser.push(text);
        if end && let Some(parser) = self.parser.take() {
            events.extend(parser.finish());
        }
        events
            .into_iter()
            .map(|event| match event {
                StreamEvent::Content(text) => json!({"content": text}),
                StreamEvent::CallStart { index, name } => {
                    self.called = true;
                    json!({"tool_calls": [{"index": index, "id": call_id(), "type": "function",
                                           "function": {"name": name, "arguments": ""}}]})
                }
                StreamEvent::CallArguments { index, fragment } => {
                    json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
                }
            })
            .collect()
    }

    /// Whether any call was streamed (the finish reason is then
    /// `tool_calls`).
    pub fn called(&self) -> bool {
        self.called
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_split_into_content_and_calls() {
        let text =
            "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = reply(ToolFormat::Hermes, text);
        assert_eq!(content, "Let me look.");
        let calls = calls.expect("a call");
        assert_eq!(calls[0]["function"], json!({"name": "weather", "arguments": "{\"city\":\"Paris\"}"}));
        assert_eq!(calls[0]["type"], "function");
        assert!(calls[0]["id"].as_str().is_some_and(|id| id.starts_with("call_") && id.len() == 29));
        assert_eq!(reply(ToolFormat::Hermes, " plain "), (json!("plain"), None));
        assert_eq!(finish_reason("length"), "length");
        assert_eq!(finish_reason("stop"), "tool_calls");
    }

    #[test]
    fn streamed_deltas_reassemble_to_the_reply() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n</tool_call>";
        let mut stream = ToolStream::new(ToolFormat::Hermes);
        let mut deltas = Vec::new();
        for piece in text.as_bytes().chunks(5) {
            deltas.extend(stream.push(std::str::from_utf8(piece).expect("ascii"), false));
        }
        deltas.extend(stream.push("", true));
        assert!(stream.called());
        let name: String = deltas.iter().filter_map(|d| d["tool_calls"][0]["function"]["name"].as_str()).collect();
        let arguments: String =
            deltas.iter().filter_map(|d| d["tool_calls"][0]["function"]["arguments"].as_str()).collect();
        let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!((name.as_str(), arguments.as_str(), content.as_str()), ("f", "{\"a\":[1,2]}", ""));
    }

    #[test]
    fn templates_without_tools_get_a_preamble_and_text_calls() {
        let body =
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]});
        let tools = ChatTools::read(Fields(body.as_object().expect("object")), "{{ messages }}").expect("valid");
        let tools = tools.expect("tools");
        let mut messages = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": {"x": 1}}}]}),
            json!({"role": "tool", "content": "42"}),
        ];
        let mut extra = Map::new();
        tools.prepare(&mut messages, &mut extra);
        assert!(extra.is_empty());
        assert_eq!(messages[0]["role"], "system");
        assert!(messages[0]["content"].as_str().is_some_and(|text| text.contains("<tools>")));
        assert_eq!(messages[2]["content"], "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}\n</tool_call>");
        assert_eq!(messages[3], json!({"role": "user", "content": "<tool_response>\n42\n</tool_response>"}));
        let hermes = ChatTools::read(Fields(body.as_object().expect("object")), "{{ '<tool_call>' }}").expect("valid");
        let mut extra = Map::new();
        hermes.expect("tools").prepare(&mut Vec::new(), &mut extra);
        assert_eq!(extra["tools"], body["tools"]);
    }

    #[test]
    fn history_arguments_become_objects() {
        let mut message = json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\":1}"}},
                                 {"function": {"name": "g", "arguments": "not json"}}]});
        arguments_as_objects(message.as_object_mut().expect("object"));
        assert_eq!(message["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
        assert_eq!(message["tool_calls"][1]["function"]["arguments"], "not json");
    }
}

/// Every format and choice compiles, and what a grammar lets a model write
/// (random logits, the best allowed token) parses back into valid calls.
#[cfg(test)]
mod grammar_tests {
    use serde_json::{Value, json};

    use super::super::{ToolChoice, ToolFormat, grammar, harmony_grammar, parse_output, parse_tools};
    use crate::chat::harmony::{HarmonyParser, Piece};
    use sluice_engine::constraint::testing::{generate, generate_after, test_spm};
    use sluice_engine::constraint::{GrammarSource, Grammars};

    #[test]
    fn harmony_calls_compile_and_parse_back() {
        let tokenizer = test_spm(&[]);
        let grammars = Grammars::new(&tokenizer).expect("the vocabulary indexes");
        let tools = tools();
        assert_eq!(harmony_grammar(&tools, &ToolChoice::Auto), None);
        for choice in [ToolChoice::Required, ToolChoice::Named("mode".into())] {
            let text = harmony_grammar(&tools, &choice).expect("a grammar");
            let compiled = grammars.compile(&GrammarSource::Lark(text)).unwrap_or_else(|error| panic!("{error}"));
            // A random model would reason forever: it is made to stop, or
            // never to start.
            let thought = "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant";
            for (seed, prefix) in (1..=4).zip([thought, "<|channel|>commentary", thought, "<|channel|>c"]) {
                let (reply, ended) = generate_after(&tokenizer, &compiled, prefix, seed, 400);
                let what = format!("{choice:?} seed {seed}: {reply:?}");
                assert!(ended, "{what}: no end");
                let mut parser = HarmonyParser::default();
                let mut pieces = parser.push(&reply);
                pieces.extend(parser.finish());
                let Some(Piece::Call { name, arguments }) = pieces.last() else { panic!("{what}: no call") };
                let arguments: Value = serde_json::from_str(arguments).expect("JSON arguments");
                match name.as_str() {
                    "add" => assert!(arguments["a"].is_u64() && arguments["b"].is_u64(), "{what}"),
                    "mode" => assert!(arguments["on"].is_boolean(), "{what}"),
                    other => panic!("{what}: unknown function {other}"),
                }
                if let ToolChoice::Named(named) = &choice {
                    assert_eq!(name, named, "{what}");
                }
            }
        }
    }

    fn tools() -> Vec<super::super::Tool> {
        parse_tools(&json!([
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a", "b"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "mode", "parameters": {"type": "object", "properties": {
                "on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": false}}}
        ]))
        .expect("valid tools")
    }

    #[test]
    fn every_format_and_choice_compiles_and_parses_back() {
        let tokenizer = test_spm(&[]);
        let grammars = Grammars::new(&tokenizer).expect("the vocabulary indexes");
        let tools = parse_tools(&json!([
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a", "b"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "mode", "parameters": {"type": "object", "properties": {
                "on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": false}}}
        ]))
        .expect("valid tools");
        for format in [ToolFormat::Hermes, ToolFormat::Llama3Json] {
            for choice in [ToolChoice::Auto, ToolChoice::Required, ToolChoice::Named("mode".into())] {
                for parallel in [false, true] {
                    let text = grammar(format, &tools, &choice, parallel).expect("a grammar");
                    let compiled = grammars
                        .compile(&GrammarSource::Lark(text))
                        .unwrap_or_else(|error| panic!("{format:?} {choice:?} {parallel}: {error}"));
                    if choice == ToolChoice::Auto {
                        continue;
                    }
                    for seed in 1..=4 {
                        let (reply, ended) = generate(&tokenizer, &compiled, seed, 400);
                        let what = format!("{format:?} {choice:?} {parallel} seed {seed}: {reply:?}");
                        assert!(ended, "{what}: no end");
                        let (content, calls) = parse_output(format, &reply);
                        assert!(content.is_none() && !calls.is_empty(), "{what}");
                        assert!(parallel || calls.len() == 1, "{what}");
                        for call in calls {
                            let arguments: Value = serde_json::from_str(&call.arguments).expect("JSON arguments");
                            match call.name.as_str() {
                                "add" => assert!(arguments["a"].is_u64() && arguments["b"].is_u64(), "{what}"),
                                "mode" => assert!(arguments["on"].is_boolean(), "{what}"),
                                other => panic!("{what}: unknown function {other}"),
                            }
                            if let ToolChoice::Named(name) = &choice {
                                assert_eq!(&call.name, name, "{what}");
                            }
                        }
                    }
                }
            }
        }
    }
}
