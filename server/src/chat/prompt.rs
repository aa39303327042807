//! `prompt` as llama-server reads it: a string, a token array, a mixed array
//! of tokens and strings, a `{"prompt_string": …}` object, or an array of
//! these (several prompts). BOS is added only when a prompt is a string or
//! starts with one, and the vocabulary asks for it. The object form may
//! carry images (`multimodal_data`, see `media`).

use serde_json::Value;

use super::error::Error;
use super::media::{self, Prompt, Vision};
use super::tokenizing::{Gate, Pass};
use sluice_model::tokenizer::Tokenizer;

/// What tokenizing a prompt needs.
#[derive(Clone, Copy)]
pub struct Reader<'a> {
    pub tokenizer: &'a Tokenizer,
    pub n_vocab: usize,
    pub vision: Option<&'a Vision>,
    /// Where a text waits for its turn at the tokenizer.
    pub gate: &'a Gate,
    /// The context a prompt must fit (a generation's); `None` when its
    /// tokens are only counted or shown.
    pub n_ctx: Option<usize>,
}

impl<'a> Reader<'a> {
    /// The go-ahead to tokenize `text`, which follows `before` tokens of its
    /// prompt: refused at once (as the engine would refuse the prompt)
    /// when the fewest tokens it can make cannot fit the context, so that
    /// a text far too long costs no tokenizing; else its turn at the gate.
    pub fn admit(&self, text: &str, before: usize) -> Result<Pass<'a>, Error> {
        if let Some(n_ctx) = self.n_ctx {
            let least = before.saturating_add(self.tokenizer.least_tokens(text));
            if least >= n_ctx {
                return Err(Error::ExceedsContext { least, n_ctx });
            }
        }
        self.gate.enter(text.len())
    }

    /// `text` tokenized, once [`Self::admit`]ted.
    pub fn encode(&self, text: &str, before: usize, add_special: bool) -> Result<Vec<u32>, Error> {
        let _turn = self.admit(text, before)?;
        Ok(self.tokenizer.encode(text, add_special, true))
    }
}

/// The 400 for images sent to a model without a projector.
pub fn no_vision(field: &str) -> Error {
    Error::invalid(format!(
        "`{field}` holds images, but this server has no vision projector (start it with --mmproj FILE)"
    ))
}

const SHAPE: &str = "`prompt` must be a string, an array of token ids and strings, or an array of such prompts";

/// The prompts of a request, tokenized. `n_vocab` bounds token ids given
/// as numbers.
pub fn prompts(value: &Value, reader: Reader<'_>) -> Result<Vec<Prompt>, Error> {
    match value {
        Value::Array(items) if items.iter().any(Value::is_number) => Ok(vec![mixed(items, reader)?.into()]),
        // An empty array is an empty token list, as in llama-server.
        Value::Array(items) if items.is_empty() => Ok(vec![Prompt::default()]),
        Value::Array(items) => items.iter().map(|item| one(item, reader)).collect(),
        single => Ok(vec![one(single, reader)?]),
    }
}

/// One prompt (an element of a multi-prompt array, or the whole field).
fn one(value: &Value, reader: Reader<'_>) -> Result<Prompt, Error> {
    match value {
        Value::String(text) => Ok(reader.encode(text, 0, true)?.into()),
        Value::Array(items) => Ok(mixed(items, reader)?.into()),
        Value::Object(object) => {
            let Some(Value::String(text)) = object.get("prompt_string") else {
                return Err(Error::invalid("`prompt.prompt_string` must be a string"));
            };
            let field = "prompt.multimodal_data";
            let files = match object.get("multimodal_data") {
                None | Some(Value::Null) => return Ok(reader.encode(text, 0, true)?.into()),
                Some(Value::Array(files)) => files,
                Some(_) => return Err(Error::invalid(format!("`{field}` must be an array of base64 strings"))),
            };
            let vision = reader.vision.ok_or_else(|| no_vision(field))?;
            let files = files
                .iter()
                .enumerate()
                .map(|(index, file)| match file {
                    Value::String(data) => media::decode_base64(data, &format!("{field}[{index}]")),
                    _ => Err(Error::invalid(format!("`{field}[{index}]` must be a base64 string"))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let _turn = reader.admit(text, 0)?;
            vision.prompt(text, &files, reader.tokenizer, true, field)
        }
        _ => Err(Error::invalid(SHAPE)),
    }
}

/// Token ids and strings in one prompt; only a leading string gets BOS.
fn mixed(items: &[Value], reader: Reader<'_>) -> Result<Vec<u32>, Error> {
    let n_vocab = reader.n_vocab;
    let mut tokens = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match item {
            Value::Number(number) => {
                let id = number.as_u64().filter(|&id| id < n_vocab as u64).ok_or_else(|| {
                    Error::invalid(format!("`prompt`: token id {number} is outside the vocabulary of {n_vocab}"))
                })?;
                tokens.push(id as u32);
            }
            Value::String(text) => {
                let encoded = reader.encode(text, tokens.len(), index == 0)?;
                tokens.extend(encoded);
            }
            _ => return Err(Error::invalid(SHAPE)),
        }
    }
    Ok(tokens)
}
