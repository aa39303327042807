//! `tokenizer`: arbitrary bytes, read as text (lossy UTF-8) and as token
//! ids. For the default model's byte-level BPE under every pre-tokenizer
//! it may be paired with, and for a SentencePiece vocabulary with byte
//! fallback:
//!
//! - encoding never panics, with or without special tokens parsed and
//!   added, and `add_special` only puts BOS in front of the same tokens;
//! - decoding the tokens gives the text back, special tokens as their
//!   text, except the bytes the vocabulary has no token for: byte-level BPE
//!   spells a text byte by byte, but a vocabulary may lack some bytes'
//!   characters (SmolLM2's has none for 0x04, 0x06 and others never seen in
//!   training), and such bytes are dropped, as llama.cpp drops them;
//!   SentencePiece falls back to byte tokens, so it has every byte, and
//!   gives every `▁` back as a space (it is its space);
//! - streaming the same tokens gives what decoding them all at once gives;
//! - any ids, out of the vocabulary included, decode, stream and render
//!   without a panic, and the stream still equals the decode.

use std::sync::OnceLock;

use sluice_model::gguf::{GgufFile, MetaValue};
use sluice_model::tokenizer::{StreamDecoder, Tokenizer};
use sluice_tests::fuzz::{Fuzzer, bytes};
use sluice_tests::gguf_writer::{GgufBuilder, Value};
use sluice_tests::models::default_model;

/// Longest input: long enough for every pre-tokenizer rule, short enough
/// that one input takes well under a millisecond.
const MAX_LEN: usize = 2048;

/// A tokenizer under test and what decoding promises for it.
struct Case {
    name: String,
    tokenizer: Tokenizer,
    /// SentencePiece: `▁` in a text comes back as a space.
    spaces_are_pieces: bool,
    /// The bytes some token stands for alone: those a text keeps.
    representable: [bool; 256],
}

impl Case {
    fn new(name: String, tokenizer: Tokenizer, spaces_are_pieces: bool) -> Case {
        let mut representable = [false; 256];
        for id in 0..tokenizer.vocab_size() as u32 {
            if let [byte] = tokenizer.token_bytes(id) {
                representable[usize::from(*byte)] = true;
            }
        }
        Case { name, tokenizer, spaces_are_pieces, representable }
    }

    /// What decoding the tokens of `text` gives back.
    fn round_trip(&self, text: &str) -> String {
        let text = if self.spaces_are_pieces { text.replace('\u{2581}', " ") } else { text.to_owned() };
        let kept: Vec<u8> = text.bytes().filter(|&byte| self.representable[usize::from(byte)]).collect();
        String::from_utf8_lossy(&kept).into_owned()
    }
}

fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let mut file = GgufFile::open(&default_model()).expect("the default model opens");
        let mut cases = Vec::new();
        for pre in
            [None, Some("smollm"), Some("llama-bpe"), Some("qwen2"), Some("gpt-2"), Some("falcon"), Some("bloom")]
        {
            match pre {
                Some(name) => file.set_metadata("tokenizer.ggml.pre", MetaValue::Str(name.into())),
                None => file.remove_metadata("tokenizer.ggml.pre"),
            }
            let tokenizer = Tokenizer::from_gguf(&file).expect("the default vocabulary builds");
            cases.push(Case::new(format!("bpe/{}", pre.unwrap_or("default")), tokenizer, false));
        }
        cases.push(Case::new("spm".into(), sentencepiece(), true));
        cases
    })
}

/// `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then pieces with scores
/// (merges happen by score), as llama-architecture files have them; no
/// space prefix, so that decoding gives exactly the text.
fn sentencepiece() -> Tokenizer {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![2, 3, 3];
    tokens.extend((0..=255u8).map(|byte| format!("<0x{byte:02X}>")));
    types.extend([6; 256]);
    let pieces =
        ["▁", "e", "l", "o", "▁H", "ll", "ell", "ello", "▁Hello", "▁w", "or", "▁wor", "ld", "▁world", "日", "🙂"];
    tokens.extend(pieces.iter().map(|piece| (*piece).to_owned()));
    types.extend(pieces.iter().map(|_| 1));
    let scores: Vec<f32> = (0..tokens.len()).map(|id| -(id as f32) / 100.0).collect();
    let bytes = GgufBuilder::new()
        .meta("tokenizer.ggml.model", Value::Str("llama".into()))
        .meta("tokenizer.ggml.tokens", Value::Strs(tokens))
        .meta("tokenizer.ggml.token_type", Value::I32s(types))
        .meta("tokenizer.ggml.scores", Value::F32s(scores))
        .meta("tokenizer.ggml.add_space_prefix", Value::Bool(false))
        .build();
    Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).expect("valid GGUF")).expect("valid vocabulary")
}

pub fn run() {
    let cases = cases();
    let generated = vec![b"Hello world".to_vec(), (0..=255u8).collect(), "<|im_start|>user\n🙂<|im_end|>".into()];
    Fuzzer::new("tokenizer", generated).run(
        |rng, input, corpus| bytes::mutate(rng, input, corpus, MAX_LEN),
        |input| cases.iter().try_for_each(|case| check(case, input).map_err(|error| format!("{}: {error}", case.name))),
    );
}

fn check(case: &Case, input: &[u8]) -> Result<(), String> {
    let tokenizer = &case.tokenizer;
    let text = String::from_utf8_lossy(input);
    let expected = case.round_trip(&text);
    for parse_special in [false, true] {
        let ids = tokenizer.encode(&text, false, parse_special);
        let decoded = tokenizer.decode(&ids);
        if decoded != expected {
            return Err(format!(
                "the text does not come back (parse_special {parse_special})\n{text:?}\ndecodes as {decoded:?}\n\
                 expected {expected:?}\nids {ids:?}"
            ));
        }
        let with_special = tokenizer.encode(&text, true, parse_special);
        let bos = usize::from(tokenizer.adds_bos());
        if bos == 1 && with_special.first().copied() != tokenizer.bos() {
            return Err(format!("add_special does not start with BOS\n{with_special:?}"));
        }
        if with_special.get(bos..bos + ids.len()) != Some(&ids[..]) {
            return Err(format!("add_special changes the text's tokens\n{with_special:?}\nagainst {ids:?}"));
        }
        let streamed = stream(tokenizer, &ids, true);
        if streamed != decoded {
            return Err(format!("streaming the text's tokens differs\n{ids:?}\n{streamed:?}\nagainst {decoded:?}"));
        }
    }
    // The same bytes as ids: every fourth one as far out as u32 goes, the
    // rest near the vocabulary's end.
    let vocab = tokenizer.vocab_size() as u32;
    let ids: Vec<u32> = input
        .chunks(4)
        .enumerate()
        .map(|(at, chunk)| {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            let raw = u32::from_le_bytes(word);
            if at % 4 == 3 { raw } else { raw % (vocab + 8) }
        })
        .collect();
    let decoded = tokenizer.decode(&ids);
    let streamed = stream(tokenizer, &ids, true);
    if streamed != decoded {
        return Err(format!("streaming arbitrary ids differs\n{ids:?}\n{streamed:?}\nagainst {decoded:?}"));
    }
    let _ = stream(tokenizer, &ids, false);
    for &id in &ids {
        let _ = (tokenizer.piece(id), tokenizer.token_bytes(id), tokenizer.render_bytes(id, false));
        let _ = tokenizer.is_end_of_generation(id);
    }
    Ok(())
}

fn stream(tokenizer: &Tokenizer, ids: &[u32], render_special: bool) -> String {
    let mut decoder = StreamDecoder::new(render_special);
    let mut text: String = ids.iter().map(|&id| decoder.push(tokenizer, id)).collect();
    text.push_str(&decoder.finish());
    text
}
