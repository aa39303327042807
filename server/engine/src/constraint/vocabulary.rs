//! The model's vocabulary as llguidance sees it: each token's bytes, with
//! control tokens marked special (llguidance's 0xFF prefix) so that no
//! grammar can write them as text.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use sluice_model::tokenizer::Tokenizer;

struct Vocabulary {
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The trie's greedy split, declared non-canonical: llguidance then
    /// never forces tokens from it. The model's own tokenizer is no
    /// substitute, as a SentencePiece one puts a space before the text,
    /// and llguidance would force that space's token.
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(bytes)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The tokenizer environment llguidance compiles grammars against.
pub(super) fn environment(tokenizer: &Tokenizer) -> Result<TokEnv, String> {
    let vocab = tokenizer.vocab_size();
    let words: Vec<Vec<u8>> = (0..vocab as u32)
        .map(|id| {
            let bytes = tokenizer.token_bytes(id);
            if tokenizer.is_control(id) {
                [&[TokTrie::SPECIAL_TOKEN_MARKER][..], bytes].concat()
            } else {
                bytes.to_vec()
            }
        })
        .collect();
    let eog = tokenizer.end_of_generation_ids();
    let Some(&eos) = tokenizer.eos().as_ref().or(eog.first()) else {
        return Err("the model has no end-of-generation token".into());
    };
    let vocab_size = u32::try_from(vocab).map_err(|_| format!("{vocab} tokens is too many"))?;
    let mut info = TokRxInfo::new(vocab_size, eos);
    info.tok_bos = tokenizer.bos();
    let mut ends: Vec<u32> = eog.iter().copied().filter(|&id| id < vocab_size).collect();
    if ends.is_empty() {
        ends.push(eos);
    }
    if eos >= vocab_size {
        return Err(format!("the end-of-generation token {eos} is outside the vocabulary of {vocab}"));
    }
    // The trie asserts what it assumes of a vocabulary; a model file that
    // breaks an assumption leaves constrained decoding off, not the server.
    let trie = std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(&ends))
        .map_err(|_| "the token trie refused the vocabulary".to_owned())?;
    Ok(Arc::new(Vocabulary { trie }))
}
