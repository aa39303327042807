//! Unit tests on synthetic vocabularies (real models are tested end to end in
//! the `sluice-tests` crate against llama.cpp's ids).

use sluice_tests::gguf_writer::{GgufBuilder, Value};
use sluice_tests::vocab::spm_vocabulary;

use super::testing::bpe_entries;
use super::*;

fn gguf(builder: GgufBuilder) -> GgufFile {
    GgufFile::from_bytes(builder.build()).expect("a valid GGUF file")
}

const HELLO_WORLD: &[(&str, f32)] = &[
    ("▁", -2.0),
    ("H", -3.0),
    ("e", -3.0),
    ("l", -3.0),
    ("o", -3.0),
    ("w", -3.0),
    ("r", -3.0),
    ("d", -3.0),
    ("i", -3.0),
    ("▁H", -1.2),
    ("ll", -1.0),
    ("el", -1.5),
    ("ell", -0.8),
    ("ello", -0.3),
    ("▁Hello", -0.1),
    ("▁w", -1.1),
    ("or", -1.0),
    ("▁wor", -0.6),
    ("ld", -1.3),
    ("▁world", -0.2),
];

/// A SentencePiece tokenizer over `pieces` (with byte fallback, so it can
/// write any text).
pub(crate) fn spm(pieces: &[(&str, f32)]) -> Tokenizer {
    Tokenizer::from_gguf(&gguf(spm_vocabulary(pieces))).expect("valid SPM vocabulary")
}

fn ids(tokenizer: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts
        .iter()
        .map(|text| (0..tokenizer.vocab_size() as u32).find(|&id| tokenizer.piece(id) == *text).expect(text))
        .collect()
}

#[test]
fn spm_merges_best_score_first() {
    let tokenizer = spm(HELLO_WORLD);
    // ▁ H e l l o: "ll" (-1.0) beats "▁H" (-1.2) and "el" (-1.5); then "ell",
    // "ello", "▁H", and finally "▁Hello". "el" never merges: its "l" is gone.
    assert_eq!(tokenizer.encode("Hello world", false, false), ids(&tokenizer, &["▁Hello", "▁world"]));
    assert_eq!(
        tokenizer.encode("Hello world", true, false),
        [vec![1], ids(&tokenizer, &["▁Hello", "▁world"])].concat()
    );
    assert_eq!(tokenizer.bos(), Some(1));
    assert_eq!(tokenizer.eos(), Some(2));
    assert!(tokenizer.adds_bos());
    assert_eq!(tokenizer.encode("", true, false), vec![1]);
    assert_eq!(tokenizer.encode("", false, false), Vec::<u32>::new());
}

#[test]
fn spm_ties_go_to_the_leftmost_pair() {
    let base = [("a", -5.0), ("b", -5.0), ("c", -5.0), ("▁", -5.0)];
    let tie = spm(&[&base[..], &[("ab", -1.0), ("bc", -1.0)]].concat());
    assert_eq!(tie.encode("abc", false, false), ids(&tie, &["▁", "ab", "c"]));
    let right_wins = spm(&[&base[..], &[("ab", -1.0), ("bc", -0.5)]].concat());
    assert_eq!(right_wins.encode("abc", false, false), ids(&right_wins, &["▁", "a", "bc"]));
}

#[test]
fn spm_byte_fallback_and_decoding() {
    let tokenizer = spm(HELLO_WORLD);
    // é is no token: its UTF-8 bytes C3 A9 become <0xC3> <0xA9>.
    let encoded = tokenizer.encode("é", false, false);
    assert_eq!(encoded, ids(&tokenizer, &["▁", "<0xC3>", "<0xA9>"]));
    assert_eq!(tokenizer.token_bytes(encoded[1]), &[0xc3]);
    assert_eq!(tokenizer.decode(&encoded), " é");

    let sentence = tokenizer.encode("Hello world", true, false);
    assert_eq!(tokenizer.decode(&sentence), "<s> Hello world");
    assert_eq!(tokenizer.piece(sentence[1]), "▁Hello");
    assert_eq!(tokenizer.token_bytes(sentence[1]), b" Hello");
}

#[test]
fn spm_space_prefix_follows_special_tokens_and_metadata() {
    let tokenizer = spm(HELLO_WORLD);
    // After a special token the text gets the space prefix again.
    assert_eq!(tokenizer.encode("<s>Hello", false, true), [vec![1], ids(&tokenizer, &["▁Hello"])].concat());
    // Without special parsing `<s>` is text, spelled out in bytes.
    let plain = tokenizer.encode("<s>Hello", false, false);
    assert_eq!(&plain[..4], &ids(&tokenizer, &["▁", "<0x3C>", "<0x73>", "<0x3E>"])[..]);

    let entries = spm_vocabulary(HELLO_WORLD)
        .meta("tokenizer.ggml.add_space_prefix", Value::Bool(false))
        .meta("tokenizer.ggml.add_bos_token", Value::Bool(false));
    let no_prefix = Tokenizer::from_gguf(&gguf(entries)).expect("valid");
    assert_eq!(no_prefix.encode("Hello", true, false), ids(&no_prefix, &["H", "ello"]));
}

fn bpe(pre: Option<&'static str>) -> Tokenizer {
    Tokenizer::from_gguf(&gguf(bpe_entries(pre))).expect("valid BPE vocabulary")
}

#[test]
fn bpe_special_tokens_by_type() {
    let tokenizer = bpe(Some("smollm"));
    let [hi, space_hi, start, end, tool] = [256, 257, 258, 259, 260];
    assert_eq!(tokenizer.encode("hi hi", false, false), vec![hi, space_hi]);
    assert_eq!(tokenizer.encode("<|im_start|>hi<|im_end|>", false, true), vec![start, hi, end]);
    // Without special parsing control tokens are text, but user-defined
    // tokens are still split out.
    let plain = tokenizer.encode("<|im_start|><tool>", false, false);
    assert_eq!(plain.len(), 13);
    assert_eq!(plain[12], tool);
    assert_eq!(tokenizer.decode(&plain), "<|im_start|><tool>");
    // smollm's pre-tokenizer adds no BOS.
    assert_eq!(tokenizer.encode("hi", true, true), vec![hi]);
    assert!(!tokenizer.adds_bos());
}

#[test]
fn bpe_end_of_generation() {
    let tokenizer = bpe(None);
    let [end, endoftext] = [259, 261];
    assert_eq!(tokenizer.eos(), Some(endoftext));
    assert!(tokenizer.is_end_of_generation(end));
    assert!(tokenizer.is_end_of_generation(endoftext));
    assert!(!tokenizer.is_end_of_generation(258));
    assert!(!tokenizer.is_end_of_generation(u32::MAX));
    assert_eq!(tokenizer.end_of_generation_ids(), &[end, endoftext]);
    // `<|im_end|>` was forced to CONTROL: hidden when specials are not rendered.
    let mut stream = StreamDecoder::new(false);
    assert_eq!(stream.push(&tokenizer, 256), "hi");
    assert_eq!(stream.push(&tokenizer, end), "");
    let mut stream = StreamDecoder::new(true);
    assert_eq!(stream.push(&tokenizer, end), "<|im_end|>");
}

#[test]
fn bpe_llama3_adds_bos_by_default() {
    let entries = bpe_entries(Some("llama-bpe")).meta("tokenizer.ggml.bos_token_id", Value::U32(258));
    let tokenizer = Tokenizer::from_gguf(&gguf(entries)).expect("valid");
    assert_eq!(tokenizer.encode("hi", true, false), vec![258, 256]);
    assert_eq!(tokenizer.encode("hi", false, false), vec![256]);
}

#[test]
fn unknown_pre_tokenizer_is_named() {
    let error = Tokenizer::from_gguf(&gguf(bpe_entries(Some("bogus-pre")))).expect_err("unknown pre");
    let message = error.to_string();
    assert!(message.contains("tokenizer.ggml.pre") && message.contains("bogus-pre"), "{message}");
}

#[test]
fn missing_metadata_is_named() {
    let without = |key: &str| {
        Tokenizer::from_gguf(&gguf(bpe_entries(None).without_meta(key))).expect_err("missing key").to_string()
    };
    for key in ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"] {
        let message = without(key);
        assert!(message.contains(key), "{key}: {message}");
    }
}

#[test]
fn malformed_metadata_is_named() {
    let entries = spm_vocabulary(HELLO_WORLD).meta("tokenizer.ggml.scores", Value::F32s(vec![0.0; 3]));
    let message = Tokenizer::from_gguf(&gguf(entries)).expect_err("short scores").to_string();
    assert!(message.contains("tokenizer.ggml.scores"), "{message}");

    let entries = bpe_entries(None).meta("tokenizer.ggml.merges", Value::Strs(vec!["nospace".to_owned()]));
    let message = Tokenizer::from_gguf(&gguf(entries)).expect_err("bad merge").to_string();
    assert!(message.contains("tokenizer.ggml.merges[0]"), "{message}");

    let entries = bpe_entries(None).meta("tokenizer.ggml.model", Value::Str("t5".into()));
    let message = Tokenizer::from_gguf(&gguf(entries)).expect_err("unsupported").to_string();
    assert!(message.contains("tokenizer.ggml.model") && message.contains("t5"), "{message}");
}

#[test]
fn out_of_range_ids_are_harmless() {
    let tokenizer = spm(HELLO_WORLD);
    let beyond = tokenizer.vocab_size() as u32;
    assert_eq!(tokenizer.token_bytes(beyond), b"");
    assert_eq!(tokenizer.piece(beyond), "");
    assert_eq!(tokenizer.decode(&[beyond, u32::MAX]), "");
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let tokenizer = spm(HELLO_WORLD);
    let [c3, a9, f0, x9f] = [3 + 0xc3, 3 + 0xa9, 3 + 0xf0, 3 + 0x9f];
    let mut stream = StreamDecoder::new(true);
    assert_eq!(stream.push(&tokenizer, c3), "");
    assert!(stream.has_pending());
    assert_eq!(stream.push(&tokenizer, a9), "é");
    assert!(!stream.has_pending());
    // A byte that cannot continue the held-back sequence: both become U+FFFD
    // (the held prefix) and the rest comes through, as a lossy decode does.
    let sequence = [f0, x9f, 3 + b'A' as u32, a9, c3];
    let mut stream = StreamDecoder::new(true);
    let mut streamed: String = sequence.iter().map(|&id| stream.push(&tokenizer, id)).collect();
    assert!(stream.has_pending());
    streamed.push_str(&stream.finish());
    assert_eq!(streamed, tokenizer.decode(&sequence));
    assert_eq!(streamed, "\u{FFFD}A\u{FFFD}\u{FFFD}");
}

#[test]
fn least_tokens_is_a_lower_bound_found_without_encoding() {
    for tokenizer in [bpe(Some("smollm")), spm(&[("▁hi", 2.0), ("hi", 1.0)])] {
        let long = "hi hi, <|im_start|>日本 ".repeat(50);
        for text in ["", "hi", "hi hi hi", "<|im_start|>hi", "\u{4}\u{6}", "日本語 hi", long.as_str()] {
            let least = tokenizer.least_tokens(text);
            for (add_special, parse_special) in [(false, false), (true, true)] {
                let tokens = tokenizer.encode(text, add_special, parse_special).len();
                assert!(least <= tokens, "{text:?}: at least {least}, encoded to {tokens}");
            }
        }
        // Every byte is spelled here, so the bound is the text over the longest token.
        assert_eq!(tokenizer.least_tokens(&long), long.len().div_ceil(tokenizer.longest));
    }
}
