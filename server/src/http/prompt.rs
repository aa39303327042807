//! `prompt` as llama-server reads it: a string, a token array, a mixed array
//! of tokens and strings, a `{"prompt_string": …}` object, or an array of
//! these (several prompts). BOS is added only when a prompt is a string or
//! starts with one, and the vocabulary asks for it.

use serde_json::Value;

use super::error::{ApiError, ErrorType};
use crate::model::tokenizer::Tokenizer;

const SHAPE: &str = "`prompt` must be a string, an array of token ids and strings, or an array of such prompts";

/// The prompts of a request, tokenized. `n_vocab` bounds token ids given
/// as numbers.
pub fn prompts(value: &Value, tokenizer: &Tokenizer, n_vocab: usize) -> Result<Vec<Vec<u32>>, ApiError> {
    match value {
        Value::Array(items) if items.iter().any(Value::is_number) => Ok(vec![mixed(items, tokenizer, n_vocab)?]),
        // An empty array is an empty token list, as in llama-server.
        Value::Array(items) if items.is_empty() => Ok(vec![Vec::new()]),
        Value::Array(items) => items.iter().map(|item| one(item, tokenizer, n_vocab)).collect(),
        single => Ok(vec![one(single, tokenizer, n_vocab)?]),
    }
}

/// One prompt (an element of a multi-prompt array, or the whole field).
fn one(value: &Value, tokenizer: &Tokenizer, n_vocab: usize) -> Result<Vec<u32>, ApiError> {
    match value {
        Value::String(text) => Ok(tokenizer.encode(text, true, true)),
        Value::Array(items) => mixed(items, tokenizer, n_vocab),
        Value::Object(object) => {
            if object.get("multimodal_data").is_some_and(|data| !data.is_null()) {
                return Err(ApiError::new(
                    ErrorType::NotSupported,
                    "multimodal prompts are not supported by sluice yet",
                ));
            }
            match object.get("prompt_string") {
                Some(Value::String(text)) => Ok(tokenizer.encode(text, true, true)),
                _ => Err(ApiError::invalid("`prompt.prompt_string` must be a string")),
            }
        }
        _ => Err(ApiError::invalid(SHAPE)),
    }
}

/// Token ids and strings in one prompt; only a leading string gets BOS.
fn mixed(items: &[Value], tokenizer: &Tokenizer, n_vocab: usize) -> Result<Vec<u32>, ApiError> {
    let mut tokens = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match item {
            Value::Number(number) => {
                let id = number.as_u64().filter(|&id| id < n_vocab as u64).ok_or_else(|| {
                    ApiError::invalid(format!("`prompt`: token id {number} is outside the vocabulary of {n_vocab}"))
                })?;
                tokens.push(id as u32);
            }
            Value::String(text) => tokens.extend(tokenizer.encode(text, index == 0, true)),
            _ => return Err(ApiError::invalid(SHAPE)),
        }
    }
    Ok(tokens)
}
