//! Per-token probabilities in llama-server's format, `{id, token, bytes,
//! logprob, top_logprobs}` (`prob`/`top_probs` after sampling), written
//! straight to JSON: a `Value` tree costs about ten times the text it
//! serializes to (a map, its keys and a `Value` per byte, for each of up to
//! `n_probs` alternatives per token), which a non-streamed answer with
//! probabilities would hold for every token at once.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use sluice_engine::request::TokenProbs;
use sluice_engine::sampling::TokenProb;
use sluice_model::tokenizer::Tokenizer;

/// One generated token's probabilities, listing at most `top_n`
/// alternatives.
pub struct Entry<'a> {
    pub tokenizer: &'a Tokenizer,
    pub probs: &'a TokenProbs,
    pub top_n: usize,
}

/// One token's probabilities as a JSON value (a stream's chunk is built as
/// one), listing at most `top_n` alternatives.
pub fn probs_json(tokenizer: &Tokenizer, probs: &TokenProbs, top_n: usize) -> Value {
    Entry { tokenizer, probs, top_n }.to_value()
}

impl Entry<'_> {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// As JSON text, what a non-streamed answer keeps of it.
    pub fn to_raw(&self) -> Box<RawValue> {
        // Serializing numbers, strings and byte lists cannot fail; the
        // fallback keeps the answer valid JSON all the same.
        serde_json::value::to_raw_value(self).unwrap_or_else(|_| RawValue::NULL.to_owned())
    }
}

impl Serialize for Entry<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let post = self.probs.post_sampling;
        let mut map = serializer.serialize_map(Some(5))?;
        Alternative { tokenizer: self.tokenizer, prob: &self.probs.chosen, post }.fields(&mut map)?;
        let top = Top { tokenizer: self.tokenizer, probs: &self.probs.top, top_n: self.top_n, post };
        map.serialize_entry(if post { "top_probs" } else { "top_logprobs" }, &top)?;
        map.end()
    }
}

struct Top<'a> {
    tokenizer: &'a Tokenizer,
    probs: &'a [TokenProb],
    top_n: usize,
    post: bool,
}

impl Serialize for Top<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.probs.iter().take(self.top_n).map(|prob| Alternative {
            tokenizer: self.tokenizer,
            prob,
            post: self.post,
        }))
    }
}

/// A token and its probability: `{id, token, bytes, logprob}` or, after
/// sampling, `prob` in place of `logprob`.
struct Alternative<'a> {
    tokenizer: &'a Tokenizer,
    prob: &'a TokenProb,
    post: bool,
}

impl Alternative<'_> {
    fn fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        let bytes = self.tokenizer.token_bytes(self.prob.token);
        map.serialize_entry("id", &self.prob.token)?;
        map.serialize_entry("token", token_text(bytes))?;
        map.serialize_entry("bytes", bytes)?;
        // As f64: the value llama-server prints for the f32 it has.
        if self.post {
            map.serialize_entry("prob", &f64::from(self.prob.prob))
        } else {
            map.serialize_entry("logprob", &logprob(self.prob.prob))
        }
    }
}

impl Serialize for Alternative<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        self.fields(&mut map)?;
        map.end()
    }
}

/// A token's text for probability entries: its bytes up to the last whole
/// UTF-8 character (llama-server trims partial characters the same way).
fn token_text(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => std::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or_default(),
    }
}

/// ln(p), with ln(0) written as -FLT_MAX as llama-server does (JSON has no
/// infinity).
fn logprob(prob: f32) -> f64 {
    if prob > 0.0 { f64::from(prob.ln()) } else { -f64::from(f32::MAX) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::constraint::testing::test_spm;

    #[test]
    fn zero_probability_is_minus_flt_max() {
        assert_eq!(logprob(0.0), -f64::from(f32::MAX));
        assert_eq!(logprob(1.0), 0.0);
    }

    #[test]
    fn partial_characters_are_trimmed_from_the_text_but_not_the_bytes() {
        assert_eq!(token_text("é".as_bytes()), "é");
        assert_eq!(token_text(&"aé".as_bytes()[..2]), "a");
        assert_eq!(token_text(&[0xff]), "");
    }

    #[test]
    fn the_text_is_the_value_written_out() {
        let tokenizer = test_spm(&[]);
        let prob = |token, prob| TokenProb { token, prob };
        for post_sampling in [false, true] {
            let probs = TokenProbs { chosen: prob(3, 0.5), top: vec![prob(3, 0.5), prob(4, 0.1)], post_sampling };
            let entry = Entry { tokenizer: &tokenizer, probs: &probs, top_n: 1 };
            let value = entry.to_value();
            assert_eq!(entry.to_raw().get(), value.to_string());
            let (key, top) = if post_sampling { ("prob", "top_probs") } else { ("logprob", "top_logprobs") };
            assert_eq!(value[top].as_array().map(Vec::len), Some(1), "{value}");
            assert_eq!(value[top][0]["id"], 3, "{value}");
            assert!(value[key].is_number() && value[top][0][key].is_number(), "{value}");
            assert_eq!(value["bytes"], serde_json::json!(tokenizer.token_bytes(3)), "{value}");
        }
    }
}
