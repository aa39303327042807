//! Helpers for tests of grammars, here and in the crates above (cargo
//! feature `testing`, which only test builds turn on): a tokenizer that can
//! write any text, and a constrained greedy generation.

use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_tests::vocab::spm_vocabulary;

use super::Grammar;

/// A SentencePiece tokenizer over `pieces`, with byte fallback.
pub fn test_spm(pieces: &[(&str, f32)]) -> Tokenizer {
    let file = GgufFile::from_bytes(spm_vocabulary(pieces).build()).expect("a valid GGUF file");
    Tokenizer::from_gguf(&file).expect("valid SPM vocabulary")
}

/// What the constrained greedy choice over seeded random logits writes, and
/// whether it ended with end-of-generation within `limit` tokens.
pub fn generate(tokenizer: &Tokenizer, grammar: &Grammar, seed: u64, limit: usize) -> (String, bool) {
    generate_after(tokenizer, grammar, "", seed, limit)
}

/// [`generate`] after `prefix`, written a byte token at a time (it must be
/// allowed), which the text returned starts with.
pub fn generate_after(
    tokenizer: &Tokenizer,
    grammar: &Grammar,
    prefix: &str,
    seed: u64,
    limit: usize,
) -> (String, bool) {
    let mut constraint = grammar.start();
    let mut state = seed | 1;
    for byte in prefix.bytes() {
        let token = (0..tokenizer.vocab_size() as u32)
            .find(|&id| tokenizer.token_bytes(id) == [byte] && !tokenizer.is_control(id))
            .expect("a byte token");
        constraint.commit(token).expect("the prefix is allowed");
    }
    let mut text = prefix.as_bytes().to_vec();
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
