//! The vocabulary as GGUF metadata describes it: token texts, scores, types,
//! special ids and the BOS/EOS/space-prefix flags, with llama.cpp's defaults
//! wherever a key is absent.

use std::collections::HashMap;

use super::error::TokenizerError;
use crate::gguf::GgufFile;

pub(super) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(super) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(super) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(super) const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// The two tokenizer families `tokenizer.ggml.model` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Model {
    /// `gpt2`: byte-level BPE with a regex pre-tokenizer.
    Bpe,
    /// `llama`: SentencePiece-style score-driven merges with byte fallback.
    Spm,
}

/// A token's type, from `tokenizer.ggml.token_type` (llama.cpp's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenAttr {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenAttr {
    fn from_gguf(value: i64) -> TokenAttr {
        match value {
            1 => TokenAttr::Normal,
            2 => TokenAttr::Unknown,
            3 => TokenAttr::Control,
            4 => TokenAttr::UserDefined,
            5 => TokenAttr::Unused,
            6 => TokenAttr::Byte,
            // llama.cpp reads 0 and any value it does not know as "undefined".
            _ => TokenAttr::Undefined,
        }
    }
}

/// Texts llama.cpp recognises as an end-of-turn token when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
];

/// Texts that end generation whatever the metadata says (llama.cpp keeps this
/// list because converted files often name only one of a model's end tokens).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle padding, repository and file-separator tokens: llama.cpp
/// ends generation on them too. Each entry: metadata key, texts to detect.
const FIM_EOG: &[(&str, &[&str])] = &[
    ("tokenizer.ggml.fim_pad_token_id", &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"]),
    ("tokenizer.ggml.fim_rep_token_id", &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

/// Harmony's (gpt-oss's) tokens that llama.cpp always renders, so that
/// generated text keeps the structure its parser reads.
const HARMONY_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// llama.cpp's adjustments for Harmony vocabularies: its structural tokens
/// become user-defined (rendered, and matched in text), and where both
/// `<|return|>` and `<|call|>` end generation, `<|end|>` (which closes a
/// reasoning message before the answer) does not, and is rendered too.
fn harmony(texts: &[String], attrs: &mut [TokenAttr], eog: &mut Vec<u32>) {
    for (attr, text) in attrs.iter_mut().zip(texts) {
        if HARMONY_RENDERED.contains(&text.as_str()) {
            *attr = TokenAttr::UserDefined;
        }
    }
    let ending = |wanted: &str| eog.iter().copied().find(|&id| texts.get(id as usize).is_some_and(|t| t == wanted));
    if let (Some(_), Some(_), Some(end)) = (ending("<|return|>"), ending("<|call|>"), ending("<|end|>")) {
        eog.retain(|&id| id != end);
        attrs[end as usize] = TokenAttr::UserDefined;
    }
}

pub(super) struct Vocab {
    pub model: Model,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<TokenAttr>,
    /// Text to id; when a text repeats, the last id wins (as in llama.cpp).
    pub token_to_id: HashMap<String, u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub add_space_prefix: bool,
    /// Ids that end generation, sorted.
    pub eog: Vec<u32>,
}

/// Flags whose defaults depend on the pre-tokenizer (llama-bpe adds BOS).
pub(super) struct Flags {
    pub add_bos: bool,
    pub add_eos: bool,
}

impl Vocab {
    pub(super) fn from_gguf(file: &GgufFile) -> Result<Vocab, TokenizerError> {
        let model = match file.str(KEY_MODEL)? {
            "gpt2" => Model::Bpe,
            "llama" => Model::Spm,
            other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
        };
        let raw = file.strs(KEY_TOKENS)?;
        if raw.is_empty() {
            return Err(TokenizerError::EmptyVocab);
        }
        let n_tokens = raw.len();
        if u32::try_from(n_tokens).is_err() {
            return Err(TokenizerError::Length { key: KEY_TOKENS, len: n_tokens, expected: u32::MAX as usize });
        }
        // An empty text would match everywhere when special tokens are split
        // out of a prompt; llama.cpp renames such tokens the same way.
        let texts: Vec<String> = raw
            .iter()
            .enumerate()
            .map(|(id, text)| if text.is_empty() { format!("[EMPTY_{id}]") } else { text.clone() })
            .collect();

        let scores = match file.get(KEY_SCORES) {
            None => vec![0.0; n_tokens],
            Some(_) => {
                let scores = file.floats(KEY_SCORES)?;
                check_len(KEY_SCORES, scores.len(), n_tokens)?;
                scores
            }
        };
        let mut attrs = match file.get(KEY_TOKEN_TYPE) {
            None => vec![TokenAttr::Normal; n_tokens],
            Some(_) => {
                let types = file.ints(KEY_TOKEN_TYPE)?;
                check_len(KEY_TOKEN_TYPE, types.len(), n_tokens)?;
                types.iter().map(|&value| TokenAttr::from_gguf(value)).collect()
            }
        };

        let mut token_to_id = HashMap::with_capacity(n_tokens);
        for (id, text) in (0u32..).zip(&texts) {
            token_to_id.insert(text.clone(), id);
        }

        let in_range = |id: u32| (id as usize) < n_tokens;
        // llama.cpp's defaults when the file names no special ids.
        let (default_bos, default_eos, default_unk) = match model {
            Model::Spm => (Some(1), Some(2), Some(0)),
            Model::Bpe => (Some(11), Some(11), None),
        };
        let bos = special_id(file, "tokenizer.ggml.bos_token_id", default_bos.filter(|&id| in_range(id)), n_tokens)?;
        let eos = special_id(file, "tokenizer.ggml.eos_token_id", default_eos.filter(|&id| in_range(id)), n_tokens)?;
        let unk =
            special_id(file, "tokenizer.ggml.unknown_token_id", default_unk.filter(|&id| in_range(id)), n_tokens)?;
        let mut eot = special_id(file, "tokenizer.ggml.eot_token_id", None, n_tokens)?;
        let mut eom = special_id(file, "tokenizer.ggml.eom_token_id", None, n_tokens)?;

        // Detection by text, in id order so that the result does not depend on
        // hash order; every detected token is forced to CONTROL, as llama.cpp
        // does, which hides it from plain-text parsing and rendering.
        let find = |candidates: &[&str]| -> Option<u32> {
            (0u32..).zip(&texts).find(|(_, text)| candidates.contains(&text.as_str())).map(|(id, _)| id)
        };
        let mut force_control = Vec::new();
        if eot.is_none() {
            eot = find(EOT_TEXTS);
            force_control.extend(eot);
        }
        if eom.is_none() {
            eom = find(&["<|eom_id|>"]);
            force_control.extend(eom);
        }
        let mut eog = Vec::new();
        for (key, candidates) in FIM_EOG {
            let id = match special_id(file, key, None, n_tokens)? {
                Some(id) => Some(id),
                None => {
                    let found = find(candidates);
                    force_control.extend(found);
                    found
                }
            };
            eog.extend(id);
        }
        for (id, text) in (0u32..).zip(&texts) {
            if EOG_TEXTS.contains(&text.as_str()) {
                eog.push(id);
                force_control.push(id);
            }
        }
        eog.extend(eos.into_iter().chain(eot).chain(eom));
        eog.sort_unstable();
        eog.dedup();
        for id in force_control {
            attrs[id as usize] = TokenAttr::Control;
        }
        harmony(&texts, &mut attrs, &mut eog);

        let add_space_prefix = file.opt_bool(KEY_ADD_SPACE_PREFIX)?.unwrap_or(model == Model::Spm);
        Ok(Vocab { model, texts, scores, attrs, token_to_id, bos, eos, unk, add_space_prefix, eog })
    }

    /// BOS/EOS flags: the metadata when present, else the given defaults.
    pub(super) fn flags(file: &GgufFile, default_add_bos: bool) -> Result<Flags, TokenizerError> {
        Ok(Flags {
            add_bos: file.opt_bool(KEY_ADD_BOS)?.unwrap_or(default_add_bos),
            add_eos: file.opt_bool(KEY_ADD_EOS)?.unwrap_or(false),
        })
    }

    pub(super) fn len(&self) -> usize {
        self.texts.len()
    }

    pub(super) fn attr(&self, id: u32) -> Option<TokenAttr> {
        self.attrs.get(id as usize).copied()
    }

    /// The bytes a token stands for when rendered with special tokens shown:
    /// byte-level (BPE) or `▁`/`<0xXX>` (SentencePiece) decoding applied.
    pub(super) fn piece_bytes(&self, id: u32) -> Vec<u8> {
        let Some(text) = self.texts.get(id as usize) else { return Vec::new() };
        match (self.model, self.attrs[id as usize]) {
            (_, TokenAttr::Control | TokenAttr::Unknown | TokenAttr::UserDefined) => text.as_bytes().to_vec(),
            (Model::Bpe, TokenAttr::Normal) => super::byte_level::decode(text),
            (Model::Spm, TokenAttr::Normal) => text.replace('\u{2581}', " ").into_bytes(),
            (Model::Spm, TokenAttr::Byte) => parse_byte_token(text).map(|byte| vec![byte]).unwrap_or_default(),
            // llama.cpp renders unused and undefined tokens (and BPE byte
            // tokens, which byte-level vocabularies never have) as nothing.
            _ => Vec::new(),
        }
    }
}

fn check_len(key: &'static str, len: usize, expected: usize) -> Result<(), TokenizerError> {
    if len == expected { Ok(()) } else { Err(TokenizerError::Length { key, len, expected }) }
}

/// A special id from metadata; an id outside the vocabulary keeps the default,
/// as llama.cpp does (converted files sometimes carry such ids for padding).
fn special_id(
    file: &GgufFile,
    key: &str,
    default: Option<u32>,
    n_tokens: usize,
) -> Result<Option<u32>, TokenizerError> {
    match file.opt_u32(key)? {
        Some(id) if (id as usize) < n_tokens => Ok(Some(id)),
        Some(id) => {
            tracing::warn!("{key} = {id} is outside the vocabulary of {n_tokens} tokens; using {default:?}");
            Ok(default)
        }
        None => Ok(default),
    }
}

/// `<0xAB>` → 0xAB.
pub(super) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(0x0a));
        assert_eq!(parse_byte_token("<0xff>"), Some(0xff));
        assert_eq!(parse_byte_token("<0x0>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
        assert_eq!(parse_byte_token("<0xZZ>"), None);
    }
}
