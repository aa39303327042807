//! OpenAI function calling (`tools`, `tool_choice`, `tool_calls`) for
//! `/v1/chat/completions`, as far as it is about formats: checking the
//! request's fields, telling which output format a chat template taught its
//! model, the llguidance grammar that holds the model to that format, and
//! turning the model's text back into calls, whole or while streaming.
//!
//! Two output formats are understood:
//! - [`ToolFormat::Hermes`] (Hermes 2 Pro, Qwen 2.5/3 and the templates
//!   modelled on them): each call is a block
//!   `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, after any
//!   plain content, one block per call when calls run in parallel;
//! - [`ToolFormat::Llama3Json`] (Llama 3.1–3.3 JSON tool calling): the reply
//!   opens with `{"name": "f", "parameters": {…}}`, or carries it after
//!   `<|python_tag|>`.
//!
//! One state machine, [`StreamParser`], reads replies both ways:
//! [`parse_output`] is that machine fed the whole reply at once. A call is
//! reported only once it is complete and well-formed (so malformed call text
//! can still become content), which is why its arguments arrive in a single
//! delta. A call's `arguments` is the compact JSON text (`serde_json`'s, key
//! order kept) of the arguments object the model wrote; a model that wrote
//! the arguments as a JSON string holding an object gets that object.

mod chat;
mod stream;

pub use chat::{ChatTools, ToolStream, arguments_as_objects, finish_reason, reply};

pub use stream::{StreamEvent, StreamParser, parse_output};

use serde_json::{Map, Value, json};

/// How a model writes its calls; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
}

impl ToolFormat {
    fn open(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Llama3Json => "<|python_tag|>",
        }
    }

    fn close(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some("</tool_call>"),
            ToolFormat::Llama3Json => None,
        }
    }

    /// The key the format's training data used for the arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "arguments",
            ToolFormat::Llama3Json => "parameters",
        }
    }
}

/// Tells the format from a chat template's source. The second value says
/// the template does not teach the format itself, so the tools must be
/// described by [`preamble`] in the system prompt (and not also handed to
/// the template): this is the case for templates without tool support and
/// for templates whose tool syntax is none of ours.
pub fn detect(template_source: &str) -> (ToolFormat, bool) {
    // Harmony's calls reach the tool parser as Hermes blocks (see
    // `chat::reasoning`); its template renders the tools itself.
    if template_source.contains("<tool_call>") || super::harmony::is_harmony(template_source) {
        (ToolFormat::Hermes, false)
    } else if template_source.contains("<|python_tag|>") || template_source.contains("\"parameters\": dictionary") {
        // The second marker is Llama 3's "Respond in the format {"name":
        // function name, "parameters": dictionary of …}" instruction, which
        // the 3.2 templates carry without `<|python_tag|>`.
        (ToolFormat::Llama3Json, false)
    } else {
        (ToolFormat::Hermes, true)
    }
}

/// The format's name, as `/props` reports it.
pub fn format_name(template_source: &str) -> &'static str {
    match detect(template_source) {
        (ToolFormat::Hermes, false) => "hermes",
        (ToolFormat::Hermes, true) => "hermes (system-prompt preamble)",
        (ToolFormat::Llama3Json, _) => "llama3-json",
    }
}

/// llama-server's `chat_template_caps`, as far as tools go: every template
/// can be given tools (a preamble stands in where it has no support), and
/// calls run in parallel only in the Hermes format.
pub fn template_caps(template_source: &str) -> Value {
    let (format, preamble) = detect(template_source);
    json!({
        "supports_tools": !preamble,
        "supports_tool_calls": true,
        "supports_parallel_tool_calls": format == ToolFormat::Hermes,
    })
}

/// One function the client offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of the arguments object.
    pub parameters: Value,
}

/// Checks the request's `tools` (`null` or absent: no tools). Errors name
/// the offending field.
pub fn parse_tools(tools: &Value) -> Result<Vec<Tool>, String> {
    let items = match tools {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        _ => return Err("`tools` must be an array".into()),
    };
    let mut parsed: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = |name: &str| format!("`tools[{i}]{name}`");
        let item = item.as_object().ok_or_else(|| format!("{} must be an object", field("")))?;
        // OpenAI requires `type`; some clients leave it out, which is harmless.
        if item.get("type").is_some_and(|t| t != "function") {
            return Err(format!("{} must be \"function\"", field(".type")));
        }
        let function = item
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("{} must be an object", field(".function")))?;
        let name = match function.get("name") {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            Some(Value::String(_)) => return Err(format!("{} must not be empty", field(".function.name"))),
            _ => return Err(format!("{} must be a string", field(".function.name"))),
        };
        if parsed.iter().any(|tool| tool.name == name) {
            return Err(format!("{} repeats the name {name:?}", field(".function.name")));
        }
        let description = match function.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.clone()),
            _ => return Err(format!("{} must be a string", field(".function.description"))),
        };
        let parameters = match function.get("parameters") {
            // No schema, or the empty one, still means an arguments *object*.
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(Value::Object(schema)) if schema.is_empty() => json!({"type": "object", "properties": {}}),
            Some(schema @ Value::Object(_)) => schema.clone(),
            _ => return Err(format!("{} must be a JSON Schema object", field(".function.parameters"))),
        };
        parsed.push(Tool { name, description, parameters });
    }
    Ok(parsed)
}

/// What the client lets or makes the model do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Answer, call, or both.
    Auto,
    /// Never call; also the choice whenever there are no tools.
    None,
    /// Call at least one function and write nothing else.
    Required,
    /// Call this function and write nothing else.
    Named(String),
}

/// Checks `tool_choice` against the parsed `tools`. Absent, it is `auto`
/// with tools and `none` without, as OpenAI has it.
pub fn parse_tool_choice(value: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, String> {
    let choice = match value {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(mode)) => match mode.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(format!(
                    "`tool_choice` must be \"auto\", \"none\", \"required\" or a function object, not {other:?}"
                ));
            }
        },
        Some(Value::Object(object)) => {
            if object.get("type").is_some_and(|t| t != "function") {
                return Err("`tool_choice.type` must be \"function\"".into());
            }
            let name = object
                .get("function")
                .and_then(|function| function.get("name"))
                .and_then(Value::as_str)
                .ok_or("`tool_choice.function.name` must be a string")?;
            if !tools.iter().any(|tool| tool.name == name) {
                return Err(format!("`tool_choice.function.name` is {name:?}, which is not a function in `tools`"));
            }
            ToolChoice::Named(name.to_owned())
        }
        Some(_) => return Err("`tool_choice` must be a string or an object".into()),
    };
    match choice {
        ToolChoice::Required if tools.is_empty() => Err("`tool_choice` \"required\" needs a non-empty `tools`".into()),
        ToolChoice::Auto if tools.is_empty() => Ok(ToolChoice::None),
        choice => Ok(choice),
    }
}

/// The tool as OpenAI's request shape, which is how models saw tools in
/// training, whatever the template.
fn tool_json(tool: &Tool) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), Value::String(tool.name.clone()));
    if let Some(description) = &tool.description {
        function.insert("description".into(), Value::String(description.clone()));
    }
    function.insert("parameters".into(), tool.parameters.clone());
    json!({"type": "function", "function": function})
}

/// Text for the system prompt of a model whose template has no tool support
/// (see [`detect`]): lists the tools as JSON and teaches the Hermes format.
pub fn preamble(tools: &[Tool]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou can call functions to help with the request. Each available function is described \
         below by a JSON object giving its name, its purpose and a JSON Schema for its arguments:\n<tools>\n",
    );
    for tool in tools {
        text.push_str(&tool_json(tool).to_string());
        text.push('\n');
    }
    text.push_str(
        "</tools>\n\nTo call a function, write a block like the following, with the function's name and \
         its arguments as a JSON object that matches its schema:\n<tool_call>\n\
         {\"name\": \"<function name>\", \"arguments\": {\"<argument>\": <value>}}\n</tool_call>\n\
         Write one block per call; several blocks, one after another, call several functions. Call only \
         the functions listed above. When no function is needed, reply normally, without any block.",
    );
    text
}

/// Whitespace the JSON of a call may hold between tokens: bounded, so that a
/// constrained model cannot loop on blank space forever.
const JSON_SPACE: &str = r"[\x20\x0A\x0D\x09]{1,32}";

/// The llguidance (Lark) grammar for the reply, or `None` when the reply is
/// unconstrained (`tool_choice` `none`, or no function to call).
///
/// With `required` or a named function, the whole reply is a call (one or
/// more with `parallel`, Hermes only: Llama 3 makes one call) whose name and
/// arguments match a chosen function's schema. With `auto`, text is free
/// until the model opens a call; from there on the call is held to the
/// schemas and nothing but further calls may follow. Llama 3's opening is a
/// `{` at the start of the reply, and its `auto` text may not start with
/// `{` nor spell out `<|python_tag|>`; the special token itself is not used,
/// as it is not in every tokenizer.
pub fn grammar(format: ToolFormat, tools: &[Tool], choice: &ToolChoice, parallel: bool) -> Option<String> {
    let chosen: Vec<&Tool> = match choice {
        ToolChoice::None => return None,
        ToolChoice::Named(name) => tools.iter().filter(|tool| &tool.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    if chosen.is_empty() {
        return None;
    }
    let key = format.arguments_key();
    let variants: Vec<Value> = chosen
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let mut parameters = tool.parameters.clone();
            // The function's schema is nested in ours: its local `$ref`s must
            // follow it there.
            rebase_refs(&mut parameters, &format!("#/anyOf/{i}/properties/{key}"));
            json!({
                "type": "object",
                "properties": {"name": {"const": tool.name}, key: parameters},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = json!({"x-guidance": {"whitespace_pattern": JSON_SPACE}, "anyOf": variants});
    let auto = *choice == ToolChoice::Auto;
    let start = match format {
        ToolFormat::Hermes => {
            // A lone "\n" may end the calls, so that a newline never forces
            // the model into another call.
            let more = if parallel { r#" ("\n" call)* "\n"?"# } else { "" };
            if auto {
                // Free text and the opening marker form one lexeme: text that
                // may not contain the marker, then the marker.
                format!(
                    "start: TEXT | TEXT_THEN_OPEN call_rest{more}\n\
                     TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/\n\
                     TEXT_THEN_OPEN: TEXT \"<tool_call>\"\n"
                )
            } else {
                format!("start: call{more}\n")
            }
        }
        ToolFormat::Llama3Json if auto => "start: TEXT | body\n\
             TEXT: /\\s*([^{\\s](?s:.*))?/ & ~/(?s:.*)<\\|python_tag\\|>(?s:.*)/\n"
            .to_owned(),
        ToolFormat::Llama3Json => "start: body\n".to_owned(),
    };
    let calls = match format {
        ToolFormat::Hermes => "call: \"<tool_call>\" call_rest\ncall_rest: \"\\n\" body \"\\n</tool_call>\"\n",
        ToolFormat::Llama3Json => "",
    };
    Some(format!("{start}{calls}body: %json {schema}\n"))
}

/// The grammar of a Harmony reply (gpt-oss) that must call: optional
/// reasoning (an `analysis` message), then one call on the `commentary`
/// channel to a chosen function, its arguments held to that function's
/// schema; `<|call|>` ends it. The reasoning and its closing markers are
/// one lexeme, as Hermes's text and opening marker are (see [`grammar`]).
/// With `auto` the reply is not held (`None`):
/// the model writes its own channels, and the calls are read back out.
pub fn harmony_grammar(tools: &[Tool], choice: &ToolChoice) -> Option<String> {
    let chosen: Vec<&Tool> = match choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Named(name) => tools.iter().filter(|tool| &tool.name == name).collect(),
        ToolChoice::Required => tools.iter().collect(),
    };
    if chosen.is_empty() {
        return None;
    }
    let calls: Vec<String> = chosen
        .iter()
        .map(|tool| {
            let schema = json!({"x-guidance": {"whitespace_pattern": JSON_SPACE}, "allOf": [tool.parameters]});
            let name = Value::String(format!("{} <|constrain|>json<|message|>", tool.name));
            format!("{name} %json {schema}")
        })
        .collect();
    Some(format!(
        "start: THOUGHT_DONE? \"<|channel|>commentary to=functions.\" call\n\
         THOUGHT_DONE: THOUGHT \"<|end|><|start|>assistant\"\n\
         THOUGHT: /<\\|channel\\|>analysis<\\|message\\|>(?s:.*)/ & ~/(?s:.*)<\\|end\\|>(?s:.*)/\n\
         call: {}\n",
        calls.join(" | ")
    ))
}

/// Prefixes the schema's document-local references (`#…`) with `base`.
fn rebase_refs(schema: &mut Value, base: &str) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(target) if key == "$ref" => {
                        if let Some(pointer) = target.strip_prefix('#') {
                            *target = format!("{base}{pointer}");
                        }
                    }
                    _ => rebase_refs(value, base),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rebase_refs(item, base)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Tool> {
        parse_tools(&json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time"}},
        ]))
        .expect("valid tools")
    }

    #[test]
    fn detects_formats_from_templates() {
        let qwen = "{%- if tools %}…<tools>{{ tool | tojson }}</tools>…<tool_call>\\n{\"name\": …}\\n</tool_call>";
        assert_eq!(detect(qwen), (ToolFormat::Hermes, false));
        let llama31 = "{%- if tools is not none %}{{- 'Respond in the format {\"name\": function name, \
                       \"parameters\": dictionary of argument name and its value}.' }}\
                       {{- '<|python_tag|>' + tool_call.name }}";
        assert_eq!(detect(llama31), (ToolFormat::Llama3Json, false));
        let llama32 = "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of …}' }}";
        assert_eq!(detect(llama32), (ToolFormat::Llama3Json, false));
        let plain = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}";
        assert_eq!(detect(plain), (ToolFormat::Hermes, true));
        let mistral = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]";
        assert_eq!(detect(mistral), (ToolFormat::Hermes, true));
    }

    #[test]
    fn checks_tools() {
        let parsed = tools();
        assert_eq!(parsed[0].description.as_deref(), Some("Weather in a city"));
        assert_eq!(parsed[1].parameters, json!({"type": "object", "properties": {}}));
        assert_eq!(parse_tools(&Value::Null), Ok(vec![]));
        let error = |value: Value| parse_tools(&value).expect_err("invalid tools");
        assert_eq!(error(json!({})), "`tools` must be an array");
        assert_eq!(
            error(json!([{"function": {"name": "a"}}, {"function": {"name": 7}}])),
            "`tools[1].function.name` must be a string"
        );
        assert_eq!(error(json!([{"type": "code", "function": {"name": "a"}}])), "`tools[0].type` must be \"function\"");
        assert_eq!(error(json!(["a"])), "`tools[0]` must be an object");
        assert_eq!(error(json!([{"type": "function"}])), "`tools[0].function` must be an object");
        assert_eq!(
            error(json!([{"function": {"name": "a"}}, {"function": {"name": "a"}}])),
            "`tools[1].function.name` repeats the name \"a\""
        );
        assert_eq!(
            error(json!([{"function": {"name": "a", "parameters": []}}])),
            "`tools[0].function.parameters` must be a JSON Schema object"
        );
        assert_eq!(
            error(json!([{"function": {"name": "a", "description": 1}}])),
            "`tools[0].function.description` must be a string"
        );
    }

    #[test]
    fn checks_tool_choice() {
        let tools = tools();
        let choice = |value: Value| parse_tool_choice(Some(&value), &tools);
        assert_eq!(parse_tool_choice(None, &tools), Ok(ToolChoice::Auto));
        assert_eq!(parse_tool_choice(None, &[]), Ok(ToolChoice::None));
        assert_eq!(choice(json!("none")), Ok(ToolChoice::None));
        assert_eq!(choice(json!("required")), Ok(ToolChoice::Required));
        assert_eq!(
            choice(json!({"type": "function", "function": {"name": "get_time"}})),
            Ok(ToolChoice::Named("get_time".into()))
        );
        let unknown = choice(json!({"type": "function", "function": {"name": "launch"}})).expect_err("unknown");
        assert!(unknown.contains("\"launch\""), "{unknown}");
        assert!(choice(json!("sometimes")).expect_err("bad mode").contains("\"sometimes\""));
        assert!(choice(json!({"function": {}})).expect_err("no name").contains("`tool_choice.function.name`"));
        assert!(parse_tool_choice(Some(&json!("required")), &[]).is_err());
    }

    #[test]
    fn grammars_hold_the_format() {
        let tools = tools();
        let text = grammar(ToolFormat::Hermes, &tools, &ToolChoice::Auto, true).expect("grammar");
        assert!(text.starts_with("start: TEXT | TEXT_THEN_OPEN call_rest (\"\\n\" call)* \"\\n\"?\n"), "{text}");
        assert!(text.contains("TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/\n"));
        assert!(text.contains("call_rest: \"\\n\" body \"\\n</tool_call>\"\n"));
        assert!(text.contains(r#""name":{"const":"get_weather"},"arguments":{"type":"object""#), "{text}");
        assert!(text.contains(r#""name":{"const":"get_time"}"#));
        let named = ToolChoice::Named("get_time".into());
        let text = grammar(ToolFormat::Hermes, &tools, &named, false).expect("grammar");
        assert!(text.starts_with("start: call\n") && !text.contains("get_weather"), "{text}");
        let text = grammar(ToolFormat::Llama3Json, &tools, &ToolChoice::Required, true).expect("grammar");
        assert!(text.starts_with("start: body\nbody: %json {") && text.contains(r#""required":["name","parameters"]"#));
        let text = grammar(ToolFormat::Llama3Json, &tools, &ToolChoice::Auto, false).expect("grammar");
        assert!(text.contains(r"TEXT: /\s*([^{\s](?s:.*))?/ & ~/(?s:.*)<\|python_tag\|>(?s:.*)/"), "{text}");
        assert_eq!(grammar(ToolFormat::Hermes, &tools, &ToolChoice::None, false), None);
        assert_eq!(grammar(ToolFormat::Hermes, &[], &ToolChoice::Auto, false), None);
    }

    #[test]
    fn nested_refs_follow_the_schema() {
        let mut tools = tools();
        tools[0].parameters = json!({"$defs": {"d": {"type": "integer"}}, "properties": {"n": {"$ref": "#/$defs/d"}}});
        let text = grammar(ToolFormat::Hermes, &tools, &ToolChoice::Required, false).expect("grammar");
        assert!(text.contains(r##""$ref":"#/anyOf/0/properties/arguments/$defs/d""##), "{text}");
    }

    #[test]
    fn preamble_lists_tools_and_format() {
        let text = preamble(&tools());
        assert!(text.contains(r#"{"type":"function","function":{"name":"get_weather","description":"Weather"#));
        assert!(text.contains("<tool_call>\n{\"name\": \"<function name>\", \"arguments\": "));
    }
}
