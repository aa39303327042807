//! Synthetic tokenizer vocabularies as GGUF metadata, for the tokenizer's
//! tests and for anything else that needs a small tokenizer.

use crate::gguf_writer::{GgufBuilder, Value};

/// llama.cpp's token types.
pub const NORMAL: i32 = 1;
pub const UNKNOWN: i32 = 2;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;
pub const BYTE: i32 = 6;

/// A SentencePiece vocabulary (`tokenizer.ggml.model = llama`): `<unk>`,
/// `<s>`, `</s>`, the 256 byte tokens `<0x00>`…`<0xFF>`, then `pieces` with
/// their scores. Byte fallback lets its tokenizer write any text.
pub fn spm_vocabulary(pieces: &[(&str, f32)]) -> GgufBuilder {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    let mut scores = vec![0.0, 0.0, 0.0];
    for byte in 0..=255u8 {
        tokens.push(format!("<0x{byte:02X}>"));
        types.push(BYTE);
        scores.push(0.0);
    }
    for (text, score) in pieces {
        tokens.push((*text).to_owned());
        types.push(NORMAL);
        scores.push(*score);
    }
    GgufBuilder::new()
        .meta("tokenizer.ggml.model", Value::Str("llama".into()))
        .meta("tokenizer.ggml.tokens", Value::Strs(tokens))
        .meta("tokenizer.ggml.token_type", Value::I32s(types))
        .meta("tokenizer.ggml.scores", Value::F32s(scores))
}
