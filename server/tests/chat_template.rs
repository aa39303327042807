//! The default model's chat template against llama-server's `/apply-template`
//! (tests/fixtures/smollm2-llamacpp.json, `templates[]`), plus loading rules.

use serde_json::Value;
use sluice_model::chat_template::{ChatTemplate, TemplateError};
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_tests::gguf_writer::{GgufBuilder, Value as Meta};
use sluice_tests::models::default_model;

fn default_model_files() -> (GgufFile, Tokenizer) {
    let file = GgufFile::open(&default_model()).expect("default model opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer builds");
    (file, tokenizer)
}

#[test]
fn fixture_conversations_render_byte_identically() {
    let path = sluice_tests::fixture("smollm2-llamacpp.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture readable")).expect("JSON");
    let cases = fixture["templates"].as_array().expect("templates[]");
    assert!(cases.len() >= 2, "fixture has {} templates", cases.len());

    let (file, tokenizer) = default_model_files();
    let template = ChatTemplate::from_gguf(&file, &tokenizer, None).expect("model's template compiles");
    for case in cases {
        let messages = case["messages"].as_array().expect("messages[]");
        let expected = case["prompt"].as_str().expect("prompt");
        // /apply-template renders with add_generation_prompt on.
        assert_eq!(template.render(messages, true).expect("renders"), expected);
    }
}

#[test]
fn override_replaces_the_model_template() {
    let (file, tokenizer) = default_model_files();
    let source = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}";
    let template = ChatTemplate::from_gguf(&file, &tokenizer, Some(source)).expect("override compiles");
    let messages = [serde_json::json!({"role": "user", "content": "Hi"})];
    assert_eq!(template.render(&messages, false).expect("renders"), "<|im_start|>Hi<|im_end|>");
    assert_eq!(template.source(), source);
}

#[test]
fn a_model_without_a_template_says_so() {
    let tokens: Vec<String> = ["a", "b", "ab"].map(String::from).to_vec();
    let bytes = GgufBuilder::new()
        .meta("tokenizer.ggml.model", Meta::Str("gpt2".into()))
        .meta("tokenizer.ggml.tokens", Meta::Strs(tokens))
        .meta("tokenizer.ggml.merges", Meta::Strs(vec!["a b".into()]))
        .build();
    let file = GgufFile::from_bytes(bytes).expect("valid GGUF");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer builds");
    let error = ChatTemplate::from_gguf(&file, &tokenizer, None).expect_err("no template");
    assert!(matches!(error, TemplateError::Missing));
    assert!(error.to_string().contains("tokenizer.chat_template"), "{error}");
    assert!(ChatTemplate::from_gguf(&file, &tokenizer, Some("{{ messages | length }}")).is_ok());
}
