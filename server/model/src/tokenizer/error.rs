//! The error every part of the tokenizer reports (a leaf: it imports none
//! of them).

use crate::gguf::GgufError;

/// Why a tokenizer could not be built. Messages name the metadata key.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tokenizer.ggml.model = {0:?} is not supported (gpt2 and llama are)")]
    UnsupportedModel(String),
    #[error("tokenizer.ggml.pre = {0:?} is not a known pre-tokenizer")]
    UnknownPreTokenizer(String),
    #[error("tokenizer.ggml.tokens is empty")]
    EmptyVocab,
    #[error("{key} has {len} entries; expected {expected}")]
    Length { key: &'static str, len: usize, expected: usize },
    #[error("tokenizer.ggml.merges[{index}] = {merge:?} is not two tokens separated by a space")]
    Merge { index: usize, merge: String },
    #[error("{key}: {message}")]
    Build { key: &'static str, message: String },
}
