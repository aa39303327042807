//! Tokenizers built from GGUF metadata, matching llama.cpp's token ids.
//!
//! Two families, chosen by `tokenizer.ggml.model`:
//! - `gpt2`: byte-level BPE. The regex pre-tokenizer is the one llama.cpp
//!   pairs with `tokenizer.ggml.pre`; BPE itself runs on the `tokenizers`
//!   crate.
//! - `llama`: SentencePiece-style merges by score with byte fallback
//!   (written here: small, and llama.cpp's semantics differ from the crate's).
//!
//! Before either runs, special tokens written in the text are split out the
//! way llama.cpp does it: longest text first, every occurrence. Control and
//! unknown tokens are split out only when the caller asks for special parsing;
//! user-defined tokens always are.

mod bpe;
mod byte_level;
mod error;
mod spm;
mod stream;
#[cfg(test)]
mod testing;
mod vocab;

pub use error::TokenizerError;
pub use stream::StreamDecoder;

use crate::gguf::GgufFile;
use bpe::{Bpe, PreTokenizer};
use vocab::{Model, TokenAttr, Vocab};

enum Engine {
    // Boxed: the BPE model is large and the SentencePiece arm holds nothing.
    Bpe(Box<Bpe>),
    Spm,
}

/// A text piece of a prompt or a special token split out of it.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// A model's tokenizer. Cheap to share (`Arc`); every method takes `&self`.
pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    add_bos: bool,
    add_eos: bool,
    /// Tokens split out of text before tokenizing, longest text first.
    special_tokens: Vec<u32>,
    /// Each token's bytes as `/detokenize` renders it.
    pieces: Vec<Vec<u8>>,
    /// The most bytes of text one token can stand for.
    longest: usize,
    /// The bytes the tokenizer always spells (others it may drop: bytes
    /// without a token of their own, or without a byte-fallback token).
    spelled: [bool; 256],
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.vocab.model)
            .field("vocab_size", &self.vocab.len())
            .field("bos", &self.vocab.bos)
            .field("eos", &self.vocab.eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_gguf(file)?;
        let (engine, default_add_bos) = match vocab.model {
            Model::Bpe => {
                let pre = PreTokenizer::named(file.opt_str(vocab::KEY_PRE)?)?;
                (Engine::Bpe(Box::new(Bpe::new(file, &vocab, &pre)?)), pre.add_bos())
            }
            Model::Spm => (Engine::Spm, true),
        };
        let flags = Vocab::flags(file, default_add_bos)?;

        let mut special_tokens: Vec<u32> = (0u32..)
            .zip(&vocab.attrs)
            .filter(|(_, attr)| matches!(attr, TokenAttr::Control | TokenAttr::UserDefined | TokenAttr::Unknown))
            .map(|(id, _)| id)
            .collect();
        // Longest first, so `<|im_start|>` wins over any shorter token inside it.
        special_tokens.sort_by_key(|&id| std::cmp::Reverse(vocab.texts[id as usize].len()));
        let pieces: Vec<Vec<u8>> = (0u32..).take(vocab.len()).map(|id| vocab.piece_bytes(id)).collect();
        // A token stands for its piece (byte-level BPE, SentencePiece
        // pieces), or for its text (special tokens split out of the text;
        // SentencePiece's `▁` is longer than the space it stands for).
        let longest = vocab.texts.iter().map(String::len).chain(pieces.iter().map(Vec::len)).max().unwrap_or(1).max(1);
        let spelled = std::array::from_fn(|byte| {
            let byte = byte as u8;
            match vocab.model {
                Model::Bpe => vocab.token_to_id.contains_key(byte_level::byte_to_char(byte).encode_utf8(&mut [0; 4])),
                Model::Spm => spm::byte_token(&vocab, byte).is_some(),
            }
        });
        Ok(Tokenizer {
            vocab,
            engine,
            add_bos: flags.add_bos,
            add_eos: flags.add_eos,
            special_tokens,
            pieces,
            longest,
            spelled,
        })
    }

    /// The fewest tokens `text` encodes to, with any flags, found without
    /// encoding it: every token stands for at most the longest token's
    /// bytes of the text, and every byte the tokenizer always spells is in
    /// some token. A text too long for a context can be refused so before
    /// the tokenizer spends memory on it.
    pub fn least_tokens(&self, text: &str) -> usize {
        text.bytes().filter(|&byte| self.spelled[usize::from(byte)]).count().div_ceil(self.longest)
    }

    /// Text to token ids.
    ///
    /// `add_special` adds BOS and EOS where the model asks for them
    /// (`tokenizer.ggml.add_bos_token` / `add_eos_token`, else llama.cpp's
    /// defaults). `parse_special` lets control tokens written in the text
    /// (`<|im_start|>`) become their ids; without it they are plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.vocab.bos);
        }
        // SentencePiece puts a space before the first text and before text
        // that follows a special token.
        let mut after_special = true;
        for fragment in self.split_special(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(text) => {
                    match &self.engine {
                        Engine::Bpe(bpe) => bpe.encode(&self.vocab, text, &mut out),
                        Engine::Spm => {
                            spm::encode(&self.vocab, text, self.vocab.add_space_prefix && after_special, &mut out)
                        }
                    }
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.vocab.eos);
        }
        out
    }

    fn split_special<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            fragments.push(Fragment::Text(text));
        }
        for &id in &self.special_tokens {
            let attr = self.vocab.attrs[id as usize];
            if !parse_special && matches!(attr, TokenAttr::Control | TokenAttr::Unknown) {
                continue;
            }
            let needle = self.vocab.texts[id as usize].as_str();
            if !fragments.iter().any(|fragment| matches!(fragment, Fragment::Text(text) if text.contains(needle))) {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Token(id));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }

    /// The bytes of a token's piece with special tokens shown as their text,
    /// as `/detokenize` renders it. Empty for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// A token's bytes as generated text shows it: control and unknown
    /// tokens are empty unless `render_special` (llama-server's `special`
    /// request flag, off by default).
    pub fn render_bytes(&self, id: u32, render_special: bool) -> &[u8] {
        if !render_special && self.is_control(id) {
            return &[];
        }
        self.token_bytes(id)
    }

    /// Token ids to text, special tokens shown. Bytes that are not valid
    /// UTF-8 once all are joined become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| self.token_bytes(id)).copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The token's text exactly as the vocabulary stores it (`Ġworld`,
    /// `▁world`, `<0x0A>`). Empty for an id outside the vocabulary.
    pub fn piece(&self, id: u32) -> &str {
        self.vocab.texts.get(id as usize).map_or("", String::as_str)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// Whether `add_special` adds BOS for this model.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `add_special` adds EOS for this model.
    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether generating `id` ends the generation: EOS, EOT, EOM, the
    /// end-of-turn tokens llama.cpp recognises by text (`<|im_end|>`,
    /// `<|eot_id|>`, …) and the FIM pad/repo/file-separator tokens.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// Whether `id` is a control (or unknown) token: never text, so
    /// generated output shows nothing for it.
    pub fn is_control(&self, id: u32) -> bool {
        matches!(self.vocab.attr(id), Some(TokenAttr::Control | TokenAttr::Unknown))
    }

    /// All end-of-generation ids, sorted (for `ignore_eos` biases).
    pub fn end_of_generation_ids(&self) -> &[u32] {
        &self.vocab.eog
    }
}

#[cfg(test)]
mod tests;
