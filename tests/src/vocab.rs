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
/// special-token ids), the 128 ASCII byte tokens, then `pieces`. Returns
/// the tokens and what writes the tokenizer's metadata into a file
/// (replacing any other vocabulary's).
pub fn gemma_vocabulary(pieces: &[&str]) -> (Vec<String>, impl Fn(GgufBuilder) -> GgufBuilder) {
    let special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"];
    let kinds = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL];
    let (tokens, spm) = ascii_spm(&special.iter().copied().zip(kinds).collect::<Vec<_>>(), pieces, &[]);
    let ids = [("bos", 2), ("eos", 1), ("unknown", 3), ("padding", 0)];
    (tokens, move |builder: GgufBuilder| with_ids(spm(builder), &ids, true))
}

/// A Phi-3-style SentencePiece vocabulary: `<unk>`, `<s>`, `</s>` (ids
/// 0–2), the 128 ASCII byte tokens, `pieces`, then Phi-3's chat tokens
/// (`<|endoftext|>`, `<|assistant|>`, `<|end|>`, `<|system|>`,
/// `<|user|>`), with Phi-3.5's special ids and no BOS added.
pub fn phi3_vocabulary(pieces: &[&str]) -> (Vec<String>, impl Fn(GgufBuilder) -> GgufBuilder) {
    let special = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)];
    let chat = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"];
    let (tokens, spm) = ascii_spm(&special, pieces, &chat);
    let id = |text: &str| tokens.iter().position(|token| token == text).unwrap_or(0) as u32;
    let ids = [
        ("bos", 1),
        ("eos", id("<|endoftext|>")),
        ("eot", id("<|end|>")),
        ("unknown", 0),
        ("padding", id("<|endoftext|>")),
    ];
    (tokens, move |builder: GgufBuilder| with_ids(spm(builder), &ids, false))
}

/// `builder` with these special-token ids (`bos` for
/// `tokenizer.ggml.bos_token_id`, …), adding BOS or not, never EOS.
fn with_ids(builder: GgufBuilder, ids: &[(&str, u32)], add_bos: bool) -> GgufBuilder {
    ids.iter()
        .fold(builder, |builder, (name, id)| builder.meta(&format!("tokenizer.ggml.{name}_token_id"), Value::U32(*id)))
        .meta("tokenizer.ggml.add_bos_token", Value::Bool(add_bos))
        .meta("tokenizer.ggml.add_eos_token", Value::Bool(false))
}

/// A SentencePiece vocabulary of `special` tokens, the 128 ASCII byte
/// tokens, `pieces`, then `control` tokens. Only ASCII bytes: a random
/// model would write lone UTF-8 lead bytes, whose tokens llama-server
/// reports no log-probs for.
fn ascii_spm(
    special: &[(&str, i32)],
    pieces: &[&str],
    control: &[&str],
) -> (Vec<String>, impl Fn(GgufBuilder) -> GgufBuilder + use<>) {
    let mut tokens: Vec<String> = special.iter().map(|(token, _)| (*token).to_owned()).collect();
    let mut types: Vec<i32> = special.iter().map(|(_, kind)| *kind).collect();
    tokens.extend((0..128u8).map(|byte| format!("<0x{byte:02X}>")));
    types.extend([BYTE; 128]);
    tokens.extend(pieces.iter().map(|piece| (*piece).to_owned()));
    types.extend(pieces.iter().map(|_| NORMAL));
    tokens.extend(control.iter().map(|token| (*token).to_owned()));
    types.extend(control.iter().map(|_| CONTROL));
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
        }
    };
    (tokens, metadata)
}

/// GPT-2's byte-level alphabet: printable Latin-1 bytes stand for
/// themselves, the others for the characters from U+0100 on, in order.
pub fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    if printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&lower| !printable(lower)).count() as u32;
    char::from_u32(0x100 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// A byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`): `first`
/// (control tokens), the byte characters of `bytes`, `words` (in GPT-2's
/// spelling, `Ġ` for a space) with every prefix of each and the merges
/// that build them left to right, then `last` (control tokens). A random
/// model writes any token it has, so a vocabulary without the lone lead
/// bytes of multi-byte characters keeps its outputs printable
/// (llama-server reports no log-probs for a partial character). Returns
/// the tokens and what writes the tokenizer's metadata into a file.
pub fn bpe_vocabulary(
    first: &[&str],
    bytes: &[u8],
    words: &[&str],
    last: &[&str],
) -> (Vec<String>, impl Fn(GgufBuilder) -> GgufBuilder + use<>) {
    let mut tokens: Vec<String> = first.iter().map(|token| (*token).to_owned()).collect();
    let mut types = vec![CONTROL; tokens.len()];
    for &byte in bytes {
        tokens.push(byte_char(byte).to_string());
        types.push(NORMAL);
    }
    let mut merges = Vec::new();
    for word in words {
        let chars: Vec<char> = word.chars().collect();
        for end in 2..=chars.len() {
            let (left, right): (String, String) = (chars[..end - 1].iter().collect(), chars[end - 1].to_string());
            let whole = format!("{left}{right}");
            if !tokens.contains(&whole) {
                merges.push(format!("{left} {right}"));
                tokens.push(whole);
                types.push(NORMAL);
            }
        }
    }
    tokens.extend(last.iter().map(|token| (*token).to_owned()));
    types.extend(last.iter().map(|_| CONTROL));
    let all = tokens.clone();
    let metadata = move |builder: GgufBuilder| {
        builder
            .meta("tokenizer.ggml.model", Value::Str("gpt2".into()))
            .meta("tokenizer.ggml.tokens", Value::Strs(all.clone()))
            .meta("tokenizer.ggml.token_type", Value::I32s(types.clone()))
            .meta("tokenizer.ggml.merges", Value::Strs(merges.clone()))
    };
    (tokens, metadata)
}

/// [`bpe_vocabulary`] of the 128 ASCII bytes, `pieces`, then `control`,
/// with pre-tokenizer `pre`.
pub fn ascii_bpe_vocabulary(
    pre: &str,
    pieces: &[&str],
    control: &[&str],
) -> (Vec<String>, impl Fn(GgufBuilder) -> GgufBuilder + use<>) {
    let (tokens, vocabulary) = bpe_vocabulary(&[], &(0..128u8).collect::<Vec<u8>>(), pieces, control);
    let pre = pre.to_owned();
    (tokens, move |builder: GgufBuilder| vocabulary(builder).meta("tokenizer.ggml.pre", Value::Str(pre.clone())))
}
