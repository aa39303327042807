//! The default model's tokenizer against llama-server's outputs
//! (tests/fixtures/smollm2-llamacpp.json: `/tokenize`, `/completion` prompts).

use std::sync::OnceLock;

use serde_json::Value;
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::{StreamDecoder, Tokenizer};
use sluice_tests::models::default_model;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let file = GgufFile::open(&default_model()).expect("default model opens");
        Tokenizer::from_gguf(&file).expect("default model's tokenizer builds")
    })
}

fn fixture() -> &'static Value {
    static FIXTURE: OnceLock<Value> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let path = sluice_tests::fixture("smollm2-llamacpp.json");
        let text = std::fs::read_to_string(path).expect("fixture readable");
        serde_json::from_str(&text).expect("fixture is JSON")
    })
}

fn entries(section: &str) -> &'static [Value] {
    fixture()[section].as_array().unwrap_or_else(|| panic!("fixture has no {section}[]"))
}

fn text<'v>(entry: &'v Value, key: &str) -> &'v str {
    entry[key].as_str().unwrap_or_else(|| panic!("{key} is not a string in {entry}"))
}

fn ids(entry: &Value, key: &str) -> Vec<u32> {
    serde_json::from_value(entry[key].clone()).unwrap_or_else(|error| panic!("{key} in {entry}: {error}"))
}

/// Every text of the fixture, tokenize and completion entries alike.
fn all_texts() -> Vec<&'static str> {
    let tokenize = entries("tokenize").iter().map(|entry| text(entry, "text"));
    tokenize.chain(entries("completions").iter().map(|entry| text(entry, "prompt"))).collect()
}

/// Compares every entry, then fails once listing all mismatches.
fn check_all(section: &str, text_key: &str, ids_key: &str, add_special: bool, parse_special: bool) {
    let tokenizer = tokenizer();
    let mut mismatches = Vec::new();
    for entry in entries(section) {
        let text = text(entry, text_key);
        let expected = ids(entry, ids_key);
        let actual = tokenizer.encode(text, add_special, parse_special);
        if actual != expected {
            mismatches.push(format!("{text:?}\n  llama.cpp {expected:?}\n  sluice    {actual:?}"));
        }
    }
    assert!(entries(section).len() > 10, "fixture section {section} is unexpectedly small");
    assert!(
        mismatches.is_empty(),
        "{} of {} differ:\n{}",
        mismatches.len(),
        entries(section).len(),
        mismatches.join("\n")
    );
}

#[test]
fn tokenize_with_special_parsing_matches_llama_server() {
    check_all("tokenize", "text", "tokens_parse_special", false, true);
}

#[test]
fn tokenize_without_special_parsing_matches_llama_server() {
    check_all("tokenize", "text", "tokens_no_special", false, false);
}

#[test]
fn completion_prompts_match_llama_server() {
    // /completion tokenizes a string prompt with add_special and special parsing.
    check_all("completions", "prompt", "prompt_tokens", true, true);
}

#[test]
fn detokenize_round_trips() {
    let tokenizer = tokenizer();
    for text in all_texts() {
        for parse_special in [true, false] {
            let ids = tokenizer.encode(text, false, parse_special);
            assert_eq!(tokenizer.decode(&ids), text, "parse_special {parse_special}, ids {ids:?}");
        }
    }
}

#[test]
fn stream_decoder_yields_whole_characters_and_equals_decode() {
    let tokenizer = tokenizer();
    let extra = ["🙂🚀👍🏽 über naïve 日本語 한국어 👨‍👩‍👧‍👦", "é", "𝄞 music", "a\u{0301}", "<|im_start|>🙂<|im_end|>"];
    let mut held_back = 0;
    for text in all_texts().into_iter().chain(extra) {
        let ids = tokenizer.encode(text, false, true);
        let mut stream = StreamDecoder::new(true);
        let mut streamed = String::new();
        for &id in &ids {
            let piece = stream.push(tokenizer, id);
            assert!(!piece.contains('\u{FFFD}'), "{text:?}: broken character streamed at token {id}");
            if piece.is_empty() && !tokenizer.token_bytes(id).is_empty() {
                held_back += 1;
            }
            streamed.push_str(&piece);
        }
        assert!(!stream.has_pending(), "{text:?}: bytes left after the last token");
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, tokenizer.decode(&ids), "{text:?}");
        assert_eq!(streamed, text);
    }
    // Emoji and CJK are split across byte-level tokens: some pushes must
    // have held bytes back, or this test exercised nothing.
    assert!(held_back > 10, "only {held_back} tokens were held back");
}

#[test]
fn stream_decoder_hides_control_tokens_unless_asked() {
    let tokenizer = tokenizer();
    let ids = tokenizer.encode("<|im_start|>assistant\nHi<|im_end|>", false, true);
    let mut plain = StreamDecoder::new(false);
    let text: String = ids.iter().map(|&id| plain.push(tokenizer, id)).collect();
    assert_eq!(text, "assistant\nHi");
}

#[test]
fn special_tokens_of_the_default_model() {
    let tokenizer = tokenizer();
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert_eq!(tokenizer.bos(), Some(1));
    assert_eq!(tokenizer.eos(), Some(2));
    assert!(!tokenizer.adds_bos());
    assert_eq!(tokenizer.piece(1), "<|im_start|>");
    assert_eq!(tokenizer.piece(2), "<|im_end|>");
    assert_eq!(tokenizer.piece(905), "Ġworld");
    assert_eq!(tokenizer.token_bytes(905), b" world");
    // <|endoftext|> and <|im_end|> end generation; <|im_start|> does not.
    assert!(tokenizer.is_end_of_generation(0));
    assert!(tokenizer.is_end_of_generation(2));
    assert!(!tokenizer.is_end_of_generation(1));
    assert!(!tokenizer.is_end_of_generation(905));
}
