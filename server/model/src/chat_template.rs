//! Chat templates: the Jinja template a model ships in
//! `tokenizer.chat_template` (or one the operator gives), rendered with
//! minijinja set up the way Hugging Face transformers sets up Jinja2, so
//! that templates written for transformers render byte for byte the same:
//!
//! - `trim_blocks` and `lstrip_blocks`, `{% break %}` / `{% continue %}`;
//! - Python string/dict/list methods (`.strip()`, `.items()`, `.startswith()`…)
//!   through minijinja-contrib's pycompat;
//! - a `tojson` with Python's `json.dumps` output (minijinja's own escapes
//!   `<`, `>`, `&` and `'`, which would change tool descriptions);
//! - the `raise_exception` and `strftime_now` globals;
//! - `{% generation %}` blocks (transformers' assistant-mask extension),
//!   rendered as plain content;
//! - `bos_token` and `eos_token` in the context;
//! - as llama-server, a template that leaves a system message out of its
//!   output (GLM-4-0414's skips them) gets the system text folded into the
//!   next message instead.

use std::borrow::Cow;
use std::io;
use std::sync::LazyLock;

use minijinja::value::{Kwargs, Value as JinjaValue};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::gguf::{GgufError, GgufFile};
use crate::tokenizer::Tokenizer;

const KEY_TEMPLATE: &str = "tokenizer.chat_template";
const NAME: &str = "chat_template";
/// `tojson(indent=…)` larger than this is refused rather than allocated.
const MAX_INDENT: usize = 256;

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("the model has no chat template ({KEY_TEMPLATE}) and none was given")]
    Missing,
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`: usually it refuses
    /// the conversation (say, roles that do not alternate).
    #[error("{0}")]
    Raised(String),
    #[error("chat template failed: {0}")]
    Render(String),
}

/// A compiled chat template with the special-token texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// The tokenizer adds BOS (EOS) itself, so a rendered prompt starting
    /// (ending) with its text has it taken off, as llama-server does:
    /// templates such as Gemma's begin with `{{ bos_token }}`.
    strip_bos: bool,
    strip_eos: bool,
    /// Whether the template renders a system message's text (see
    /// [`fold_system`]).
    system_role: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("len", &self.source.len()).finish_non_exhaustive()
    }
}

/// The error `raise_exception` returns, found again in the render error's
/// source chain to tell a template's refusal from a template bug.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the
    /// template sees under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|error| TemplateError::Syntax(error.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |message: String| -> Result<JinjaValue, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, without_generation_tags(source))
            .map_err(|error| TemplateError::Syntax(describe(&error)))?;
        let mut template = ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            strip_bos: false,
            strip_eos: false,
            system_role: true,
        };
        template.system_role = template.renders_system_text();
        Ok(template)
    }

    /// Whether a system message's text reaches the output, probed as
    /// llama.cpp probes it: a system message then a user message. A
    /// template that refuses the probe keeps its system messages (llama.cpp
    /// too leaves the capability on when the probe raises). llama.cpp
    /// checks whether the template reads the text; this checks whether it
    /// writes it, which is the same for every template that does not read
    /// a system message only to drop it.
    fn renders_system_text(&self) -> bool {
        const PROBE: &str = "System message text for the probe";
        let messages = [
            serde_json::json!({ "role": "system", "content": PROBE }),
            serde_json::json!({ "role": "user", "content": "User message" }),
        ];
        match self.render_messages(&messages, false, &Map::new()) {
            Ok(text) => text.contains(PROBE),
            Err(_) => true,
        }
    }

    /// The template `override_source` names, else the model's own; BOS and
    /// EOS texts come from the tokenizer.
    pub fn from_gguf(
        file: &GgufFile,
        tokenizer: &Tokenizer,
        override_source: Option<&str>,
    ) -> Result<ChatTemplate, TemplateError> {
        let source = match override_source {
            Some(source) => source,
            None => file.opt_str(KEY_TEMPLATE)?.ok_or(TemplateError::Missing)?,
        };
        let text = |id: Option<u32>| id.map_or("", |id| tokenizer.piece(id));
        let template = ChatTemplate::new(source, text(tokenizer.bos()), text(tokenizer.eos()))?;
        Ok(ChatTemplate { strip_bos: tokenizer.adds_bos(), strip_eos: tokenizer.adds_eos(), ..template })
    }

    /// The template as given (for `/props`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (OpenAI-style objects: `role`, `content`, …).
    pub fn render(&self, messages: &[Value], add_generation_prompt: bool) -> Result<String, TemplateError> {
        self.render_with(messages, add_generation_prompt, &Map::new())
    }

    /// Renders with extra context variables (`tools`, `enable_thinking`,
    /// a request's `chat_template_kwargs`…). `messages`,
    /// `add_generation_prompt`, `bos_token` and `eos_token` take precedence
    /// over extras of the same name; extras take precedence over what
    /// llama.cpp gives templates that read it: today's date as
    /// `date_string` (Llama 3.x, "01 Dec 2026") and `datetime`
    /// (firefunction, "Dec 01 2026 21:04:09 GMT"), and firefunction's
    /// `functions`, empty without tools.
    pub fn render_with(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        extra: &Map<String, Value>,
    ) -> Result<String, TemplateError> {
        let messages = if self.system_role { Cow::Borrowed(messages) } else { fold_system(messages) };
        self.render_messages(&messages, add_generation_prompt, extra)
    }

    fn render_messages(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        extra: &Map<String, Value>,
    ) -> Result<String, TemplateError> {
        let now = chrono::Local::now();
        let mut context = Map::new();
        context.insert("date_string".into(), Value::String(now.format("%d %b %Y").to_string()));
        context.insert("datetime".into(), Value::String(now.format("%b %d %Y %H:%M:%S GMT").to_string()));
        context.insert("functions".into(), Value::String(String::new()));
        context.extend(extra.clone());
        context.insert("messages".into(), Value::Array(messages.to_vec()));
        context.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        context.insert("bos_token".into(), Value::String(self.bos_token.clone()));
        context.insert("eos_token".into(), Value::String(self.eos_token.clone()));
        let template = self.env.get_template(NAME).map_err(|error| TemplateError::Render(describe(&error)))?;
        let mut rendered = template.render(JinjaValue::from(minijinja::value::Serde(&context))).map_err(|error| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
            while let Some(cause) = source {
                if let Some(Raised(message)) = cause.downcast_ref::<Raised>() {
                    return TemplateError::Raised(message.clone());
                }
                source = cause.source();
            }
            TemplateError::Render(describe(&error))
        })?;
        if self.strip_bos && !self.bos_token.is_empty() && rendered.starts_with(&self.bos_token) {
            rendered.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && rendered.ends_with(&self.eos_token) {
            rendered.truncate(rendered.len() - self.eos_token.len());
        }
        Ok(rendered)
    }
}

/// `messages` for a template without a system role, as llama-server
/// gives them: a leading system message's text joined by a newline before
/// the next message's, or dropped when nothing follows. Contents that are
/// not plain text (parts) are left for the template.
fn fold_system(messages: &[Value]) -> Cow<'_, [Value]> {
    let Some((first, rest)) = messages.split_first() else { return Cow::Borrowed(messages) };
    if first["role"] != "system" {
        return Cow::Borrowed(messages);
    }
    let mut rest = rest.to_vec();
    if let Some(next) = rest.first_mut() {
        let (Some(system), Some(content)) = (first["content"].as_str(), next["content"].as_str()) else {
            return Cow::Borrowed(messages);
        };
        next["content"] = Value::String(format!("{system}\n{content}"));
    }
    Cow::Owned(rest)
}

/// An error with the template line it points at.
fn describe(error: &JinjaError) -> String {
    match error.line() {
        Some(line) => format!("{error} (line {line})"),
        None => error.to_string(),
    }
}

/// Rewrites `{% generation %}…{% endgeneration %}` as an always-true `if`,
/// keeping the tags' whitespace control, since minijinja has no such tag.
fn without_generation_tags(source: &str) -> String {
    static OPEN: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"\{%(-?)\s*generation\s*(-?)%\}").expect("constant regex"));
    static CLOSE: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"\{%(-?)\s*endgeneration\s*(-?)%\}").expect("constant regex"));
    let opened = OPEN.replace_all(source, "{%${1} if true ${2}%}");
    CLOSE.replace_all(&opened, "{%${1} endif ${2}%}").into_owned()
}

/// transformers' `strftime_now(format)`: the local time, strftime-formatted.
fn strftime_now(format: String) -> Result<String, JinjaError> {
    use std::fmt::Write;
    let invalid = |detail: String| JinjaError::new(ErrorKind::InvalidOperation, detail);
    let items = chrono::format::StrftimeItems::new(&format)
        .parse()
        .map_err(|error| invalid(format!("strftime_now({format:?}): {error}")))?;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format_with_items(items.iter()))
        .map_err(|_| invalid(format!("strftime_now({format:?}) cannot format the current time")))?;
    Ok(out)
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False, indent=…,
/// separators=…, sort_keys=…)`, byte for byte.
fn tojson(value: &JinjaValue, kwargs: Kwargs) -> Result<String, JinjaError> {
    let invalid = |detail: &str| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {detail}"));
    let indent: Option<JinjaValue> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    // Python: an int indents by that many spaces, a string by itself; none
    // (the default) writes everything on one line.
    let indent = match indent {
        None => None,
        Some(indent) if indent.is_none() => None,
        Some(indent) => Some(match indent.as_str() {
            Some(text) => text.to_owned(),
            None => {
                let width = i64::try_from(indent).map_err(|_| invalid("indent must be an integer or a string"))?;
                let width = usize::try_from(width.max(0)).unwrap_or(0);
                if width > MAX_INDENT {
                    return Err(invalid("indent is too large"));
                }
                " ".repeat(width)
            }
        }),
    };
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(invalid("separators must be two strings")),
        // Python's defaults drop the space after a comma when indenting.
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };

    let mut json = serde_json::to_value(value).map_err(|error| invalid(&error.to_string()))?;
    if sort_keys == Some(true) {
        sort_object_keys(&mut json);
    }
    let formatter = PyFormatter { item: &item, key: &key, indent: indent.as_deref(), depth: 0, has_value: false };
    let mut out = Vec::new();
    json.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))
        .map_err(|error| invalid(&error.to_string()))?;
    let text = String::from_utf8(out).map_err(|error| invalid(&error.to_string()))?;
    Ok(if ensure_ascii == Some(true) { escape_non_ascii(&text) } else { text })
}

fn sort_object_keys(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (key, mut value) in entries {
                sort_object_keys(&mut value);
                map.insert(key, value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(sort_object_keys),
        _ => {}
    }
}

/// `\uXXXX` for every non-ASCII character (UTF-16, lowercase, as Python).
/// Non-ASCII text only ever occurs inside JSON strings, so this is safe on
/// the serialized document.
fn escape_non_ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// serde_json output shaped like Python's `json.dumps`: configurable item and
/// key separators, and Python's indentation (newline before each item and
/// before the closing bracket of a non-empty container).
struct PyFormatter<'a> {
    item: &'a str,
    key: &'a str,
    indent: Option<&'a str>,
    depth: usize,
    has_value: bool,
}

impl PyFormatter<'_> {
    fn newline<W: ?Sized + io::Write>(&self, writer: &mut W) -> io::Result<()> {
        if let Some(indent) = self.indent {
            writer.write_all(b"\n")?;
            for _ in 0..self.depth {
                writer.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(bracket)
    }

    fn close<W: ?Sized + io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        if self.has_value {
            self.newline(writer)?;
        }
        writer.write_all(bracket)
    }

    fn item<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if !first {
            writer.write_all(self.item.as_bytes())?;
        }
        self.newline(writer)
    }
}

impl serde_json::ser::Formatter for PyFormatter<'_> {
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(self.key.as_bytes())
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_that_drops_system_messages_gets_them_folded_into_the_next() {
        // GLM-4-0414's way: system messages are skipped by the loop.
        let skipping = "{% for m in messages if m.role != 'system' %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
        let system = json!({ "role": "system", "content": "Be brief." });
        let user = json!({ "role": "user", "content": "Hi" });
        let assistant = json!({ "role": "assistant", "content": "Hello" });
        assert_eq!(
            render(skipping, json!([system, user, assistant])).expect("renders"),
            "<|user|>Be brief.\nHi<|assistant|>Hello"
        );
        // A system message alone is dropped; one not in the lead is left.
        assert_eq!(render(skipping, json!([system])).expect("renders"), "");
        assert_eq!(render(skipping, json!([user, system])).expect("renders"), "<|user|>Hi");
        // Content parts are not text to join: left for the template.
        let parts = json!({ "role": "user", "content": [{ "type": "text", "text": "Hi" }] });
        let rendered = render(skipping, json!([system, parts])).expect("renders");
        assert!(!rendered.contains("Be brief."), "{rendered}");
        // A template that writes system messages, or raises on them, is
        // given them as they are.
        let writing = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
        assert_eq!(render(writing, json!([system, user])).expect("renders"), "<|system|>Be brief.<|user|>Hi");
        let raising = "{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}{% endif %}\
                       {% for m in messages %}{{ m.content }}{% endfor %}";
        assert!(matches!(render(raising, json!([system, user])), Err(TemplateError::Raised(_))));
    }

    fn render(source: &str, messages: Value) -> Result<String, TemplateError> {
        let messages = messages.as_array().cloned().unwrap_or_default();
        ChatTemplate::new(source, "<s>", "</s>")?.render(&messages, true)
    }

    fn show(source: &str) -> String {
        render(source, json!([])).unwrap_or_else(|error| panic!("{source}: {error}"))
    }

    #[test]
    fn chatml_with_trimmed_blocks() {
        let source = "{% for message in messages %}\n  {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n{% endfor %}\n{% if add_generation_prompt %}\n  {{- '<|im_start|>assistant\\n' }}\n{% endif %}\n";
        let rendered = render(source, json!([{"role": "user", "content": "Hi"}])).expect("renders");
        // As in Jinja2: the newline after each `}}` is kept; those after block
        // tags go, as do the spaces before them.
        assert_eq!(rendered, "<|im_start|>user\nHi<|im_end|>\n\n<|im_start|>assistant\n\n");
    }

    #[test]
    fn context_has_special_tokens_and_extras() {
        let template = ChatTemplate::new(
            "{{ bos_token }}|{{ eos_token }}|{{ tools | length }}|{{ enable_thinking }}",
            "<s>",
            "</s>",
        )
        .expect("compiles");
        let extra = json!({"tools": [1, 2], "enable_thinking": false, "bos_token": "ignored"});
        let extra = extra.as_object().cloned().unwrap_or_default();
        assert_eq!(template.render_with(&[], false, &extra).expect("renders"), "<s>|</s>|2|False");
        assert_eq!(template.source(), "{{ bos_token }}|{{ eos_token }}|{{ tools | length }}|{{ enable_thinking }}");
    }

    #[test]
    fn tojson_writes_what_python_writes() {
        assert_eq!(
            show(r#"{{ {"a": "<x> & 'y' é", "b": [1, 2.5, true, none], "c": {}} | tojson }}"#),
            r#"{"a": "<x> & 'y' é", "b": [1, 2.5, true, null], "c": {}}"#
        );
        assert_eq!(
            show(r#"{{ {"z": [1, [], {"k": "v"}], "a": {}} | tojson(indent=2) }}"#),
            "{\n  \"z\": [\n    1,\n    [],\n    {\n      \"k\": \"v\"\n    }\n  ],\n  \"a\": {}\n}"
        );
        assert_eq!(
            show(r#"{{ {"b": 1, "a": [1, 2]} | tojson(separators=[",", ":"], sort_keys=true) }}"#),
            r#"{"a":[1,2],"b":1}"#
        );
        assert_eq!(show(r#"{{ "é😀\n" | tojson(ensure_ascii=true) }}"#), r#""\u00e9\ud83d\ude00\n""#);
        assert_eq!(show(r#"{{ [1] | tojson(indent="\t") }}"#), "[\n\t1\n]");
        assert!(matches!(render("{{ 1 | tojson(indent=100000) }}", json!([])), Err(TemplateError::Render(_))));
        assert!(matches!(render("{{ 1 | tojson(bogus=1) }}", json!([])), Err(TemplateError::Render(_))));
    }

    #[test]
    fn raise_exception_is_a_refusal() {
        let source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}ok";
        match render(source, json!([{"role": "assistant", "content": ""}])) {
            Err(TemplateError::Raised(message)) => assert_eq!(message, "Conversation roles must alternate"),
            other => panic!("expected a raised error, got {other:?}"),
        }
        assert_eq!(render(source, json!([{"role": "user", "content": ""}])).expect("renders"), "ok");
        assert!(matches!(render("{{ messages.bogus.deeper }}", json!([])), Err(TemplateError::Render(_))));
    }

    #[test]
    fn strftime_now_formats_the_local_time() {
        let year = show("{{ strftime_now('%Y') }}");
        assert!(year.len() == 4 && year.chars().all(|c| c.is_ascii_digit()), "{year}");
        assert_eq!(show("{{ strftime_now('%d %B %Y') }}").split(' ').count(), 3);
        assert!(matches!(render("{{ strftime_now('%') }}", json!([])), Err(TemplateError::Render(_))));
    }

    #[test]
    fn templates_see_today_unless_the_request_says_otherwise() {
        // Read around the render, so a render at midnight still matches one.
        let today = || chrono::Local::now().format("%d %b %Y").to_string();
        let before = today();
        let shown = show("{{ date_string }}|{{ datetime }}{{ functions }}");
        let after = today();
        let (date, datetime) = shown.split_once('|').expect("both");
        assert!(date == before || date == after, "{shown}");
        assert!(datetime.ends_with(" GMT") && datetime.split(' ').count() == 5, "{shown}");
        let template = ChatTemplate::new("{{ date_string }}", "", "").expect("compiles");
        let mut extra = Map::new();
        extra.insert("date_string".into(), json!("26 Jul 2024"));
        assert_eq!(template.render_with(&[], false, &extra).expect("renders"), "26 Jul 2024");
    }

    #[test]
    fn generation_blocks_render_their_content() {
        let source = "{% for m in messages %}[{% generation -%}\n {{ m.content }}\n{%- endgeneration %}]{% endfor %}";
        assert_eq!(render(source, json!([{"content": "a"}, {"content": "b"}])).expect("renders"), "[a][b]");
    }

    #[test]
    fn python_idioms() {
        assert_eq!(
            show(
                "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"
            ),
            "02"
        );
        assert_eq!(
            show(
                "{{ '  x  '.strip() }}|{{ 'abc'.startswith('ab') }}|{{ 'a,b'.split(',')[-1] }}|{{ 'x\\ny'.split('\\n')[-1].lstrip('\\n') }}"
            ),
            "x|True|b|y"
        );
        assert_eq!(show("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
        assert_eq!(
            show("{{ [1, 2, 3][::-1] }}|{% for i in range(3, -1, -1) %}{{ i }}{% endfor %}|{{ 7 // 2 }}|{{ -7 % 3 }}"),
            "[3, 2, 1]|3210|3|2"
        );
        assert_eq!(
            show("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "3"
        );
        assert_eq!(
            show("{{ {'a': 'b'} }}|{{ \"don't\" | title }}|{{ 'x' is string }}|{{ {} is mapping }}"),
            "{'a': 'b'}|Don't|True|True"
        );
        assert_eq!(
            show("{{ 1.0 }}|{{ [1.5, none, true] }}|{{ none }}|{{ 3 / 2 }}|{{ 'a' ~ 1 }}"),
            "1.0|[1.5, None, True]|None|1.5|a1"
        );
    }

    #[test]
    fn syntax_errors_are_reported() {
        match ChatTemplate::new("{% for x in %}", "", "") {
            Err(TemplateError::Syntax(message)) => assert!(message.contains("line 1"), "{message}"),
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }
}
