//! The constraint on a byte-fallback vocabulary (any text can be written):
//! random logits, masked, then the best allowed token, as a model would
//! sample greedily.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::model::tokenizer::{Tokenizer, test_spm};

fn grammars() -> (Arc<Tokenizer>, Grammars) {
    let tokenizer = Arc::new(test_spm(&[("▁yes", -1.0), ("no", -1.0), ("{\"", -1.0)]));
    let grammars = Grammars::new(&tokenizer).expect("the vocabulary indexes");
    (tokenizer, grammars)
}

/// What the constrained greedy choice over seeded random logits writes, and
/// whether it ended with end-of-generation within `limit` tokens.
pub(crate) fn generate(tokenizer: &Tokenizer, grammar: &Grammar, seed: u64, limit: usize) -> (String, bool) {
    let mut constraint = grammar.start();
    let mut state = seed | 1;
    let mut text = Vec::new();
    // Logits a little longer than the vocabulary, as models pad them.
    let mut logits = vec![0.0f32; tokenizer.vocab_size() + 5];
    for _ in 0..limit {
        for logit in &mut logits {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *logit = (state % 1000) as f32;
        }
        constraint.apply(&mut logits).expect("a mask");
        assert!(logits[tokenizer.vocab_size()..].iter().all(|&logit| logit == f32::NEG_INFINITY));
        let token = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).expect("logits") as u32;
        assert!(logits[token as usize].is_finite(), "the mask left nothing");
        if tokenizer.is_end_of_generation(token) {
            return (String::from_utf8(text).expect("the grammar writes UTF-8"), true);
        }
        constraint.commit(token).expect("an allowed token commits");
        text.extend_from_slice(tokenizer.token_bytes(token));
    }
    (String::from_utf8_lossy(&text).into_owned(), false)
}

#[test]
fn json_schema_output_parses_and_matches() {
    let (tokenizer, grammars) = grammars();
    let schema = json!({
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["answer", "n"],
        "additionalProperties": false
    });
    let grammar = grammars.compile(&GrammarSource::JsonSchema(schema)).expect("the schema compiles");
    for seed in 1..=20 {
        let (text, ended) = generate(&tokenizer, &grammar, seed, 400);
        assert!(ended, "seed {seed}: no end within the limit: {text:?}");
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|error| panic!("{text:?}: {error}"));
        let object = value.as_object().expect("an object");
        assert_eq!(object.len(), 2, "{text}");
        assert!(matches!(object["answer"].as_str(), Some("yes" | "no")), "{text}");
        assert!(object["n"].as_i64().is_some_and(|n| (0..=9).contains(&n)), "{text}");
        // Whitespace between tokens is llama.cpp's: one space, or a newline
        // and at most 20 blanks.
        assert!(!text.contains("  \n") && !text.contains("\n\n"), "{text:?}");
    }
}

#[test]
fn lark_grammar_constrains_and_ends() {
    let (tokenizer, grammars) = grammars();
    let grammar = grammars
        .compile(&GrammarSource::Lark("start: (\"yes\" | \"no\") \"!\"{1,3}".into()))
        .expect("the grammar compiles");
    let mut seen = std::collections::BTreeSet::new();
    for seed in 1..=30 {
        let (text, ended) = generate(&tokenizer, &grammar, seed, 20);
        assert!(ended, "{text:?}");
        let word = text.trim_end_matches('!');
        assert!(matches!(word, "yes" | "no") && (1..=3).contains(&(text.len() - word.len())), "{text:?}");
        seen.insert(text);
    }
    assert!(seen.len() > 2, "random logits explore the language: {seen:?}");
}

#[test]
fn control_tokens_are_never_text() {
    let (tokenizer, grammars) = grammars();
    // `<s>` written out is text the grammar allows; the control token is not.
    let grammar = grammars.compile(&GrammarSource::Lark("start: /[<>a-z\\/]+/".into())).expect("compiles");
    let mut logits = vec![0.0f32; tokenizer.vocab_size()];
    grammar.start().apply(&mut logits).expect("a mask");
    let bos = tokenizer.bos().expect("the test vocabulary has <s>");
    assert_eq!(logits[bos as usize], f32::NEG_INFINITY);
    assert_eq!(logits[b'<' as usize + 3], 0.0, "the byte token of '<' stays");
}

#[test]
fn drafts_are_cut_where_the_grammar_forbids() {
    let (tokenizer, grammars) = grammars();
    let grammar = grammars.compile(&GrammarSource::Lark("start: \"yes\" | \"yet\"".into())).expect("compiles");
    let bytes = |text: &str| text.bytes().map(|byte| u32::from(byte) + 3).collect::<Vec<_>>();
    let mut constraint = grammar.start();
    assert_eq!(constraint.allowed_prefix(&bytes("yex")), 2);
    assert_eq!(constraint.allowed_prefix(&bytes("yet")), 3);
    // Checking drafts does not move the matcher.
    constraint.commit(bytes("y")[0]).expect("y");
    assert_eq!(constraint.allowed_prefix(&bytes("es")), 2);
    assert_eq!(tokenizer.token_bytes(bytes("y")[0]), b"y");
}

#[test]
fn a_forbidden_token_fails_the_matcher() {
    let (_, grammars) = grammars();
    let grammar = grammars.compile(&GrammarSource::Lark("start: \"yes\"".into())).expect("compiles");
    let mut constraint = grammar.start();
    assert!(matches!(constraint.commit(u32::from(b'n') + 3), Err(ConstraintEnd::Failed(_))));
    let mut logits = vec![0.0; 300];
    assert!(matches!(constraint.apply(&mut logits), Err(ConstraintEnd::Failed(_))), "it stays failed");
}

#[test]
fn bad_grammars_are_errors_naming_the_problem() {
    let (_, grammars) = grammars();
    let error = |source: GrammarSource| grammars.compile(&source).expect_err("refused").to_string();
    let message = error(GrammarSource::Lark("start: missing_rule".into()));
    assert!(message.contains("missing_rule"), "{message}");
    let message = error(GrammarSource::JsonSchema(json!({"type": "object", "properties": {"a": {"type": 7}}})));
    assert!(message.contains("type"), "{message}");
    let message = error(GrammarSource::Gbnf("root ::= \"a".into()));
    assert!(message.contains("line 1"), "{message}");
}
