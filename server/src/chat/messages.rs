//! A conversation as the model's chat template takes it: the request's
//! `messages` normalised (content parts joined, images replaced by media
//! markers), its tools and thinking switches passed to the template, the
//! rendering, and the rendered prompt tokenized.

use serde_json::{Map, Value};

use super::error::Error;
use super::fields::{Fields, wrong};
use super::harmony;
use super::media::{self, Prompt};
use super::prompt::{self, Reader};
use super::reasoning;
use super::tools::{self, ChatTools};
use crate::config::Thinking;
use sluice_model::chat_template::{ChatTemplate, TemplateError};
use sluice_model::tokenizer::Tokenizer;

/// A rendered chat prompt, tokenized.
pub struct ChatPrompt {
    pub prompt: Prompt,
    /// The prompt ends inside a think block, so the reply starts in it.
    pub opens_thinking: bool,
    /// The request's tools, when the reply may call them.
    pub tools: Option<ChatTools>,
    /// The template writes Harmony (gpt-oss): so will the reply.
    pub harmony: bool,
}

/// The tokens of the rendered chat prompt (special tokens parsed, BOS
/// added where the vocabulary asks for it), read by `reader` (which says
/// whether it must fit the context).
pub fn chat_tokens(
    template: &ChatTemplate,
    reader: Reader<'_>,
    fields: Fields<'_>,
    thinking: Thinking,
) -> Result<ChatPrompt, Error> {
    let Rendered { text, files, tools } = render(template, reader, fields, thinking)?;
    let prompt = match reader.vision {
        Some(vision) if !files.is_empty() => {
            let _turn = reader.admit(&text, 0)?;
            vision.prompt(&text, &files, reader.tokenizer, true, "messages")?
        }
        _ => reader.encode(&text, 0, true)?.into(),
    };
    let harmony = harmony::is_harmony(template.source());
    Ok(ChatPrompt { prompt, opens_thinking: reasoning::opens_thinking(&text), tools, harmony })
}

/// Render `messages` with the model's chat template. `thinking` (the
/// server's `--reasoning`) sets `enable_thinking` unless the request's
/// `chat_template_kwargs` or `reasoning_effort` do.
pub fn chat_prompt(
    template: &ChatTemplate,
    reader: Reader<'_>,
    fields: Fields<'_>,
    thinking: Thinking,
) -> Result<String, Error> {
    render(template, reader, fields, thinking).map(|rendered| rendered.text)
}

/// A conversation rendered by the chat template.
struct Rendered {
    /// The prompt, with a media marker where each image goes.
    text: String,
    /// The image files, in the order of their markers.
    files: Vec<Vec<u8>>,
    /// The request's tools, when the reply may call them.
    tools: Option<ChatTools>,
}

/// A chat request's conversation, read from its fields and checked once:
/// everything the template is given.
struct Conversation {
    /// The messages as templates expect them (see [`normalize`]), the
    /// tools already shown to the template where it has no tool support.
    messages: Vec<Value>,
    /// The image files, in the order of their markers in `messages`.
    files: Vec<Vec<u8>>,
    add_generation_prompt: bool,
    /// The template's other variables: `enable_thinking`,
    /// `reasoning_effort`, the request's `chat_template_kwargs`, `tools`.
    extra: Map<String, Value>,
    tools: Option<ChatTools>,
}

impl Conversation {
    /// `thinking` (the server's `--reasoning`) sets `enable_thinking`
    /// unless the request's `chat_template_kwargs` or `reasoning_effort`
    /// do; `marker` stands for each image (none without a projector).
    fn read(
        fields: Fields<'_>,
        template: &ChatTemplate,
        marker: Option<&str>,
        thinking: Thinking,
    ) -> Result<Self, Error> {
        let messages = fields.get("messages").ok_or_else(|| Error::invalid("'messages' is required"))?;
        let messages = messages.as_array().ok_or_else(|| wrong("messages", "an array of messages"))?;
        // An empty conversation renders as the template has it (llama-server
        // accepts one too): usually just the generation prompt.
        // A final assistant message is continued (below): llama-server joins
        // its text parts with a blank line, every other message's with a newline.
        let mut files = Vec::new();
        let mut media = Media { marker, files: &mut files };
        let mut normalized = messages
            .iter()
            .enumerate()
            .map(|(index, message)| {
                let continued = index + 1 == messages.len() && message["role"] == "assistant";
                normalize(index, message, if continued { "\n\n" } else { "\n" }, &mut media)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let add_generation_prompt = fields.bool_or("add_generation_prompt", true)?;
        // A trailing assistant message is always continued (below); asking for
        // that and for a new assistant turn at once is a contradiction.
        if fields.bool_or("continue_final_message", false)?
            && fields.get("add_generation_prompt") == Some(&Value::Bool(true))
        {
            return Err(Error::invalid("Cannot set both add_generation_prompt and continue_final_message to true."));
        }
        let is_assistant = |message: &Value| message["role"] == "assistant";
        if let Some((last, before)) = normalized.split_last()
            && is_assistant(last)
            && before.last().is_some_and(is_assistant)
        {
            return Err(Error::invalid("Cannot have 2 or more assistant messages at the end of the list."));
        }
        let mut extra = Map::new();
        extra.insert("enable_thinking".into(), Value::Bool(thinking.enable_thinking()));
        match fields.get("chat_template_kwargs") {
            Some(Value::Object(kwargs)) => extra.extend(kwargs.clone()),
            Some(_) => return Err(wrong("chat_template_kwargs", "an object")),
            None => {}
        }
        // OpenAI's effort levels reach templates that read them (gpt-oss's);
        // "none" turns thinking off instead, as llama-server has it.
        match fields.str("reasoning_effort")? {
            Some("none") => {
                extra.insert("enable_thinking".into(), Value::Bool(false));
                extra.remove("reasoning_effort");
            }
            Some(effort) if !effort.is_empty() => {
                extra.insert("reasoning_effort".into(), Value::String(effort.to_owned()));
            }
            _ => {}
        }
        if harmony::is_harmony(template.source()) {
            normalized.iter_mut().for_each(harmony_thinking);
        }
        let tools = ChatTools::read(fields, template.source())?;
        if let Some(tools) = &tools {
            tools.prepare(&mut normalized, &mut extra);
        }
        Ok(Conversation { messages: normalized, files, add_generation_prompt, extra, tools })
    }

    /// The conversation rendered by `template`; `tokenizer` says whether
    /// the prompt will get BOS.
    fn render(self, template: &ChatTemplate, tokenizer: &Tokenizer) -> Result<Rendered, Error> {
        let Conversation { messages, files, add_generation_prompt, extra, tools } = self;
        let render = |messages: &[Value], add_generation_prompt: bool| {
            template.render_with(messages, add_generation_prompt, &extra).map_err(|error| match error {
                TemplateError::Raised(message) => Error::invalid(message),
                // The template compiled at start; what it cannot render now is
                // what these messages hold.
                TemplateError::Render(message) => {
                    Error::invalid(format!("the chat template cannot render these messages: {message}"))
                }
                other => Error::Server(other.to_string()),
            })
        };
        let rendered = match messages.split_last() {
            // Assistant prefill, as llama-server does by default: the reply
            // continues the final assistant message, so the prompt is the
            // conversation before it with the generation prompt, then its text.
            Some((last, before)) if last["role"] == "assistant" => {
                render(before, true)? + last["content"].as_str().unwrap_or_default()
            }
            _ => render(&messages, add_generation_prompt)?,
        };
        // The prompt is tokenized with BOS added where the vocabulary asks for
        // it; a template that writes BOS itself would double it, so its text is
        // dropped here (as llama.cpp does).
        let bos = tokenizer.bos().map(|id| tokenizer.piece(id)).filter(|bos| !bos.is_empty());
        let text = match bos {
            Some(bos) if tokenizer.adds_bos() => rendered.strip_prefix(bos).map(str::to_owned).unwrap_or(rendered),
            _ => rendered,
        };
        Ok(Rendered { text, files, tools })
    }
}

fn render(
    template: &ChatTemplate,
    reader: Reader<'_>,
    fields: Fields<'_>,
    thinking: Thinking,
) -> Result<Rendered, Error> {
    let marker = reader.vision.map(|vision| vision.marker());
    Conversation::read(fields, template, marker, thinking)?.render(template, reader.tokenizer)
}

/// An assistant message's `reasoning_content` as the Harmony template
/// reads it, its `thinking` (which, with tool calls, stands for the
/// content), as llama-server passes it.
fn harmony_thinking(message: &mut Value) {
    let Some(object) = message.as_object_mut() else { return };
    let Some(reasoning @ Value::String(_)) = object.get("reasoning_content").cloned() else { return };
    object.insert("thinking".into(), reasoning);
    if object.get("tool_calls").and_then(Value::as_array).is_some_and(|calls| !calls.is_empty()) {
        object.remove("content");
    }
}

/// Where a conversation's images go: the files, in order, and the marker
/// that stands for each in the text (none without a projector).
struct Media<'a> {
    marker: Option<&'a str>,
    files: &'a mut Vec<Vec<u8>>,
}

/// A message as templates expect it: `content` as one string (text parts
/// joined by `separator`, each image replaced by the media marker).
fn normalize(index: usize, message: &Value, separator: &str, media: &mut Media<'_>) -> Result<Value, Error> {
    let object = message.as_object().ok_or_else(|| Error::invalid(format!("`messages[{index}]` must be an object")))?;
    if !object.get("role").is_some_and(Value::is_string) {
        return Err(Error::invalid(format!("`messages[{index}].role` must be a string")));
    }
    let mut object = object.clone();
    tools::arguments_as_objects(&mut object);
    match object.get("content") {
        Some(Value::String(_)) => {}
        // As in llama.cpp: `null` is no text (an assistant turn that only
        // called tools has none), and only such a turn may leave it out.
        // Templates concatenate `content`, so it is always a string here.
        Some(Value::Null) => {
            object.insert("content".into(), Value::String(String::new()));
        }
        None if object.get("tool_calls").is_some_and(|calls| !calls.is_null()) => {
            object.insert("content".into(), Value::String(String::new()));
        }
        None => return Err(Error::invalid(format!("`messages[{index}].content` is required"))),
        Some(Value::Array(parts)) => {
            // As llama-server joins them: text parts on their own lines,
            // but nothing around an image's marker.
            let mut content = String::new();
            let mut after_image = false;
            for (number, part) in parts.iter().enumerate() {
                let at = format!("messages[{index}].content[{number}]");
                let kind = match part {
                    Value::Object(part) => part.get("type").and_then(Value::as_str),
                    _ => return Err(wrong(&at, "a content part object")),
                };
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(text)) => {
                        if !after_image && !content.is_empty() {
                            content.push_str(separator);
                        }
                        content.push_str(text);
                        after_image = false;
                    }
                    (Some("text"), None) => return Err(wrong(&format!("{at}.text"), "a string")),
                    (Some("image_url"), _) => {
                        let field = format!("{at}.image_url.url");
                        let marker = media.marker.ok_or_else(|| prompt::no_vision(&field))?;
                        let url = part
                            .pointer("/image_url/url")
                            .and_then(Value::as_str)
                            .ok_or_else(|| Error::invalid(format!("`{field}` must be a string")))?;
                        media.files.push(media::image_url(url, &field)?);
                        content.push_str(marker);
                        after_image = true;
                    }
                    // Parts OpenAI defines that sluice cannot read yet.
                    (Some(kind @ ("input_audio" | "file" | "video_url" | "audio_url")), _) => {
                        return Err(Error::Unsupported(format!("`{at}` of type {kind:?}")));
                    }
                    (Some(kind), _) => {
                        return Err(Error::invalid(format!(
                            "`{at}.type` must be \"text\" or \"image_url\", not {kind:?}"
                        )));
                    }
                    (None, _) => return Err(wrong(&format!("{at}.type"), "a string")),
                }
            }
            object.insert("content".into(), Value::String(content));
        }
        Some(_) => return Err(wrong(&format!("messages[{index}].content"), "a string or an array of parts")),
    }
    Ok(Value::Object(object))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn text_parts_are_joined() {
        let message =
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        let mut files = Vec::new();
        let mut media = Media { marker: None, files: &mut files };
        assert_eq!(normalize(0, &message, "\n", &mut media).expect("valid")["content"], "a\nb");
        let image = json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]});
        let error = normalize(0, &image, "\n", &mut media).unwrap_err().to_string();
        assert!(error.contains("messages[0].content[0].image_url.url") && error.contains("--mmproj"), "{error}");
        let audio = json!({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]});
        assert!(matches!(normalize(0, &audio, "\n", &mut media), Err(Error::Unsupported(_))));
        // Malformed parts are the client's mistake, not a missing feature.
        for (content, field) in [
            (json!([[[[1]]]]), "messages[0].content[0]"),
            (json!(["a"]), "messages[0].content[0]"),
            (json!([{"text": "a"}]), "messages[0].content[0].type"),
            (json!([{"type": 1}]), "messages[0].content[0].type"),
            (json!([{"type": "text", "text": "a"}, {"type": "txet", "text": "b"}]), "messages[0].content[1].type"),
            (json!([{"type": "text", "text": 1}]), "messages[0].content[0].text"),
        ] {
            let message = json!({"role": "user", "content": content});
            let error = normalize(0, &message, "\n", &mut media).unwrap_err();
            assert!(matches!(&error, Error::Invalid(message) if message.contains(field)), "{content}: {error}");
        }
        assert!(
            normalize(1, &json!({"content": "x"}), "\n", &mut media)
                .unwrap_err()
                .to_string()
                .contains("messages[1].role")
        );
        let mut media = Media { marker: Some("<M>"), files: &mut files };
        let mixed = json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
            {"type": "text", "text": "b"}, {"type": "text", "text": "c"}]});
        assert_eq!(normalize(0, &mixed, "\n", &mut media).expect("valid")["content"], "a<M>b\nc");
        assert_eq!(files, [b"hi".to_vec()]);
    }
}
