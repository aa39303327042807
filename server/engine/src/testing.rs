//! Helpers the tests of this crate and of the crates above share (cargo
//! feature `testing`, which only test builds turn on).

use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_tests::vocab::spm_vocabulary;

use crate::constraint::Grammar;
use crate::step_cost::{CostModel, StepWork};

/// A SentencePiece tokenizer over `pieces`, with byte fallback.
pub fn test_spm(pieces: &[(&str, f32)]) -> Tokenizer {
    let file = GgufFile::from_bytes(spm_vocabulary(pieces).build()).expect("a valid GGUF file");
    Tokenizer::from_gguf(&file).expect("valid SPM vocabulary")
}

/// What the constrained greedy choice over seeded random logits writes, and
/// whether it ended with end-of-generation within `limit` tokens.
pub fn generate(tokenizer: &Tokenizer, grammar: &Grammar, seed: u64, limit: usize) -> (String, bool) {
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

/// A prefill chunk and `decodes` decode rows, all at `context`.
pub fn step(prefill: u32, context: u64, decodes: u32) -> StepWork {
    let mut work = StepWork::default();
    work.add_rows(context, prefill, false);
    for _ in 0..decodes {
        work.add_rows(context, 1, true);
    }
    work
}

pub fn assert_close(got: CostModel, want: CostModel) {
    for (got, want) in [
        (got.base_ms, want.base_ms),
        (got.prefill_token_ms, want.prefill_token_ms),
        (got.decode_token_ms, want.decode_token_ms),
        (got.attention_kpair_ms, want.attention_kpair_ms),
    ] {
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }
}
