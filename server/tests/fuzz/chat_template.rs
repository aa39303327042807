//! `chat_template`: hostile conversations for every template sluice can
//! serve with, the default model's own and the built-in ones
//! (`--chat-template NAME`). Messages come straight to the renderer, without
//! the HTTP layer's checks: missing, null and non-string contents, content
//! arrays of odd parts, unknown roles, deep nesting, `tool_calls` of every
//! type, lists of hundreds of messages, and extra context variables
//! (`tools`, `enable_thinking`, …) of the wrong types. A render gives a
//! prompt or an error, never panics, ends (the watchdog), and the prompt
//! stays in proportion to the conversation.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde_json::{Map, Value, json};
use sluice::startup::builtin_templates;
use sluice_model::chat_template::ChatTemplate;
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_tests::fuzz::{Fuzzer, json};
use sluice_tests::models::default_model;

/// Field names worth adding to messages, besides those the templates read.
const NAMES: &[&str] = &[
    "role",
    "content",
    "type",
    "text",
    "image_url",
    "url",
    "tool_calls",
    "tool_call_id",
    "function",
    "name",
    "arguments",
    "id",
    "reasoning_content",
    "thinking",
    "tools",
    "parameters",
    "enable_thinking",
    "reasoning_effort",
    "messages",
    "add_generation_prompt",
    "extra",
];

/// What a prompt may take: its conversation's size several times over
/// (role markers, a default system prompt), never more.
fn prompt_bound(input_len: usize) -> usize {
    8 * input_len + (64 << 10)
}

struct Template {
    name: String,
    template: ChatTemplate,
    source: String,
}

fn templates() -> &'static [Template] {
    static TEMPLATES: OnceLock<Vec<Template>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        let file = GgufFile::open(&default_model()).expect("the default model opens");
        let tokenizer = Tokenizer::from_gguf(&file).expect("its tokenizer builds");
        let own = ChatTemplate::from_gguf(&file, &tokenizer, None).expect("its template compiles");
        let mut templates = vec![Template { name: "default model".into(), source: own.source().into(), template: own }];
        for (name, source) in builtin_templates() {
            let template = ChatTemplate::new(source, "<s>", "</s>").expect("built-in templates compile");
            templates.push(Template { name: (*name).into(), template, source: (*source).into() });
        }
        templates
    })
}

/// [`NAMES`] and every attribute and key the templates read
/// (`message.content`, `message['role']`).
fn names(templates: &[Template]) -> Vec<String> {
    let attribute = regex::Regex::new(r#"\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*['"]([A-Za-z_][A-Za-z0-9_]*)['"]\s*\]"#)
        .expect("constant regex");
    let mut names: BTreeSet<String> = NAMES.iter().map(|name| (*name).to_owned()).collect();
    for template in templates {
        for found in attribute.captures_iter(&template.source) {
            names.extend(found.get(1).or(found.get(2)).map(|name| name.as_str().to_owned()));
        }
    }
    names.into_iter().collect()
}

pub fn run() {
    let templates = templates();
    let names = names(templates);
    let long: Vec<Value> = (0..400)
        .map(|turn| {
            let role = if turn % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": format!("turn {turn}")})
        })
        .collect();
    let generated = vec![json!({"messages": long}), json!({"messages": []})];
    Fuzzer::new("chat_template", generated)
        .run(|rng, input, corpus| json::mutate(rng, input, corpus, &names), |input| check(templates, input));
}

/// A corpus entry is `{"messages": [...], "add_generation_prompt": bool,
/// "extra": {...}}`; whatever a mutation left of that shape is read as
/// kindly as it can be, so every input renders something.
fn conversation(input: &Value) -> (Vec<Value>, bool, Map<String, Value>) {
    let messages = match input.get("messages").unwrap_or(input) {
        Value::Array(messages) => messages.clone(),
        other => vec![other.clone()],
    };
    let add_generation_prompt = input.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(true);
    let extra = input.get("extra").and_then(Value::as_object).cloned().unwrap_or_default();
    (messages, add_generation_prompt, extra)
}

fn check(templates: &[Template], input: &Value) -> Result<(), String> {
    let (messages, add_generation_prompt, extra) = conversation(input);
    let input_len = input.to_string().len();
    for Template { name, template, .. } in templates {
        if let Ok(prompt) = template.render_with(&messages, add_generation_prompt, &extra)
            && prompt.len() > prompt_bound(input_len)
        {
            return Err(format!(
                "{name}: the prompt grows out of proportion\n{} bytes from {input_len} bytes of conversation",
                prompt.len()
            ));
        }
    }
    Ok(())
}
