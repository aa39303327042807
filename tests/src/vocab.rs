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

/// A Gemma-style SentencePiece vocabulary: `<pad>`, `<eos>`, `<bos>`,
/// `<unk>`, `<start_of_turn>`, `<end_of_turn>` (ids 0–5, with Gemma's
/// special-token ids), the 128 ASCII byte tokens, then `pieces`. Only
/// ASCII bytes: a random model would write lone UTF-8 lead bytes, whose
/// tokens llama-server reports no log-probs for. Returns the
/// tokens and what writes the tokenizer's metadata into a file (replacing
/// any other vocabulary's).
pub fn gemma_vocabulary(pieces: &[&str]) -> (Vec<String>, impl Fn(GgufBuilder) -> GgufBuilder) {
    let special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"];
    let mut tokens: Vec<String> = special.iter().map(|token| (*token).to_owned()).collect();
    let mut types = vec![CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL];
    tokens.extend((0..128u8).map(|byte| format!("<0x{byte:02X}>")));
    types.extend([BYTE; 128]);
    tokens.extend(pieces.iter().map(|piece| (*piece).to_owned()));
    types.extend(pieces.iter().map(|_| NORMAL));
    // Longer pieces score higher, so that they win over their parts.
    let scores: Vec<f32> =
        tokens.iter().zip(&types).map(|(token, &kind)| if kind == NORMAL { token.len() as f32 } else { 0.0 }).collect();
    let metadata = {
        let tokens = tokens.clone();
        move |builder: GgufBuilder| {
            builder
                .without_meta("tokenizer.ggml.merges")
                .meta("tokenizer.ggml.model", Value::Str("llama".into()))
                .meta("tokenizer.ggml.tokens", Value::Strs(tokens.clone()))
                .meta("tokenizer.ggml.token_type", Value::I32s(types.clone()))
                .meta("tokenizer.ggml.scores", Value::F32s(scores.clone()))
                .meta("tokenizer.ggml.bos_token_id", Value::U32(2))
                .meta("tokenizer.ggml.eos_token_id", Value::U32(1))
                .meta("tokenizer.ggml.unknown_token_id", Value::U32(3))
                .meta("tokenizer.ggml.padding_token_id", Value::U32(0))
                .meta("tokenizer.ggml.add_bos_token", Value::Bool(true))
                .meta("tokenizer.ggml.add_eos_token", Value::Bool(false))
        }
    };
    (tokens, metadata)
}

/// A byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`) in the
/// layout llama.cpp's converter writes: the 256 byte characters, then
/// `words` (plain text, spaces included) with every prefix of each made a
/// token by one merge, then `specials` as control tokens. Returns the
/// tokens, their types and the merges, in rank order.
pub fn bpe_vocabulary(words: &[&str], specials: &[&str]) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|byte| byte_char(byte).to_string()).collect();
    let mut merges = Vec::new();
    for word in words {
        let chars: Vec<char> = word.bytes().map(byte_char).collect();
        for end in 2..=chars.len() {
            let (left, right): (String, String) = (chars[..end - 1].iter().collect(), chars[end - 1].to_string());
            let token = format!("{left}{right}");
            if !tokens.contains(&token) {
                merges.push(format!("{left} {right}"));
                tokens.push(token);
            }
        }
    }
    let mut types = vec![NORMAL; tokens.len()];
    tokens.extend(specials.iter().map(|special| (*special).to_owned()));
    types.extend(specials.iter().map(|_| CONTROL));
    (tokens, types, merges)
}

/// GPT-2's printable stand-in for a byte: printable Latin-1 bytes are
/// themselves, the others take the code points from U+0100 on, in order.
pub fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let shifted = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
}
