//! Vocabularies the tokenizer's tests (its own and its parts') build on.

use sluice_tests::gguf_writer::{GgufBuilder, Value};
use sluice_tests::vocab::{CONTROL, NORMAL, USER_DEFINED};

use super::byte_level;

/// A byte-level BPE vocabulary: the 256 byte characters, a few merges, and
/// special tokens of each type.
pub(super) fn bpe_entries(pre: Option<&'static str>) -> GgufBuilder {
    let mut tokens: Vec<String> = (0..=255u8).map(|byte| byte_level::byte_to_char(byte).to_string()).collect();
    let mut types = vec![NORMAL; 256];
    for (text, kind) in [
        ("hi", NORMAL),
        ("Ġhi", NORMAL),
        ("<|im_start|>", CONTROL),
        // Typed normal, but llama.cpp knows it ends a turn: forced CONTROL.
        ("<|im_end|>", NORMAL),
        ("<tool>", USER_DEFINED),
        ("<|endoftext|>", CONTROL),
    ] {
        tokens.push(text.to_owned());
        types.push(kind);
    }
    let merges = vec!["h i".to_owned(), "Ġ hi".to_owned()];
    let entries = GgufBuilder::new()
        .meta("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .meta("tokenizer.ggml.tokens", Value::Strs(tokens))
        .meta("tokenizer.ggml.token_type", Value::I32s(types))
        .meta("tokenizer.ggml.merges", Value::Strs(merges))
        .meta("tokenizer.ggml.eos_token_id", Value::U32(261));
    match pre {
        Some(pre) => entries.meta("tokenizer.ggml.pre", Value::Str(pre.into())),
        None => entries,
    }
}
