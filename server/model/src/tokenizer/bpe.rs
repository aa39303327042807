//! Byte-level BPE (`tokenizer.ggml.model = gpt2`) on the `tokenizers` crate:
//! the regex splits that `tokenizer.ggml.pre` names (llama.cpp's table), then
//! GPT-2's byte-to-character mapping, then merges ranked by their order in
//! `tokenizer.ggml.merges`.

use tokenizers::models::bpe::{BPE, Vocab as BpeVocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::byte_level;
use super::error::TokenizerError;
use super::vocab::{KEY_MERGES, KEY_PRE, Vocab};
use crate::gguf::GgufFile;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's splits whose words take combining marks with their letters
/// (Qwen3.5).
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's splits with the contractions' case spelled out per letter.
const GLM4: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
/// Mistral's Tekken split as llama.cpp spells it: "upper-case" is any
/// letter but a–z and "lower-case" any letter but A–Z (the original's
/// Unicode case classes, approximated that way), so a word of non-ASCII
/// letters is one piece whatever their case.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The o200k split (gpt-oss, Llama 4): Tekken's, a word keeping an
/// English contraction that follows it, numbers in threes.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a pre-tokenizer name selects.
pub(super) struct PreTokenizer {
    /// Regexes applied in turn, each splitting the pieces the previous left
    /// (matches and the text between them both become pieces).
    regexes: &'static [&'static str],
    /// Whether a piece that is itself a token skips the merges.
    ignore_merges: bool,
    /// Whether BOS is added when the file has no `add_bos_token`.
    add_bos: bool,
}

impl PreTokenizer {
    /// llama.cpp's pre-tokenizers by `tokenizer.ggml.pre` name; a file without
    /// the key gets llama.cpp's "default" set.
    pub(super) fn named(name: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let plain = |regexes| PreTokenizer { regexes, ignore_merges: false, add_bos: false };
        Ok(match name.unwrap_or("default") {
            "default" => plain(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => {
                PreTokenizer { regexes: &[LLAMA3], ignore_merges: true, add_bos: true }
            }
            "dbrx" | "smaug-bpe" => plain(&[LLAMA3]),
            "tekken" => PreTokenizer { regexes: &[TEKKEN], ignore_merges: true, add_bos: true },
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => plain(&[GPT4O]),
            "chatglm-bpe" => plain(&[GLM4]),
            "glm4" | "glm5" => PreTokenizer { regexes: &[GLM4], ignore_merges: true, add_bos: false },
            "qwen2" | "stablelm2" | "megrez" => plain(&[QWEN2]),
            "qwen35" => plain(&[QWEN35]),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
                plain(&[r"\p{N}", GPT2])
            }
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de"
            | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" => plain(&[GPT2]),
            "falcon" => plain(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
            "poro-chat" | "bloom" | "gpt3-finnish" => plain(&[BLOOM]),
            "viking" => plain(&[BLOOM, r"\p{N}"]),
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_owned())),
        })
    }

    pub(super) fn add_bos(&self) -> bool {
        self.add_bos
    }
}

pub(super) struct Bpe {
    inner: tokenizers::Tokenizer,
}

impl Bpe {
    pub(super) fn new(file: &GgufFile, vocab: &Vocab, pre: &PreTokenizer) -> Result<Bpe, TokenizerError> {
        let mut ids = BpeVocab::default();
        for (id, text) in (0u32..).zip(&vocab.texts) {
            ids.insert(text.clone(), id);
        }
        let mut merges = Vec::new();
        for (index, merge) in file.strs(KEY_MERGES)?.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let split = merge.bytes().skip(1).position(|byte| byte == b' ').map(|at| at + 1);
            let Some(at) = split else {
                return Err(TokenizerError::Merge { index, merge: merge.clone() });
            };
            let (left, right) = (&merge[..at], &merge[at + 1..]);
            // The crate refuses merges whose parts or result are not tokens.
            // llama.cpp would apply such a merge and then spell the result out
            // byte by byte; dropping it keeps the other merges' relative ranks.
            if [left, right, &format!("{left}{right}")].iter().all(|text| vocab.token_to_id.contains_key(*text)) {
                merges.push((left.to_owned(), right.to_owned()));
            }
        }
        let model = BPE::builder()
            .vocab_and_merges(ids, merges)
            .ignore_merges(pre.ignore_merges)
            .build()
            .map_err(|error| TokenizerError::Build { key: KEY_MERGES, message: error.to_string() })?;

        let mut steps = Vec::with_capacity(pre.regexes.len() + 1);
        for regex in pre.regexes {
            let split =
                Split::new(SplitPattern::Regex((*regex).to_owned()), SplitDelimiterBehavior::Isolated, false).map_err(
                    |error| TokenizerError::Build { key: KEY_PRE, message: format!("regex {regex:?}: {error}") },
                )?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        // The splits above replace ByteLevel's own GPT-2 regex.
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));

        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(steps))));
        Ok(Bpe { inner })
    }

    /// Appends the tokens of `text` (plain text, no special tokens in it),
    /// a part of about [`PART_BYTES`] at a time: the crate holds tens of
    /// bytes per byte of what it encodes at once (pieces with offsets and
    /// alignments, then tokens with their strings), which for a
    /// many-megabyte text was gigabytes.
    pub(super) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        for part in parts(text, PART_BYTES) {
            self.encode_part(vocab, part, out);
        }
    }

    fn encode_part(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        match self.inner.encode_fast(text, false) {
            Ok(encoding) => out.extend_from_slice(encoding.get_ids()),
            Err(error) => {
                // The crate fails only on internal limits (a regex running out
                // of backtracking budget). Rather than fail the request, spell
                // the text out one byte token at a time: it still decodes to
                // the same text.
                tracing::warn!("BPE encoding failed ({error}); falling back to byte tokens");
                out.extend(text.bytes().filter_map(|byte| {
                    vocab.token_to_id.get(byte_level::byte_to_char(byte).encode_utf8(&mut [0; 4])).copied()
                }));
            }
        }
    }
}

/// About how much text the crate encodes at once.
const PART_BYTES: usize = 64 << 10;

/// `text` in parts of at least `size` bytes (the last may be shorter), each
/// cut before a space that has an ASCII letter on either side ("a| b").
/// Every pre-tokenizer above splits there anyway, and no match of their
/// regexes can span it (none matches a letter followed by a space) or look
/// past it (their one lookahead, `\s+(?!\S)`, ends on whitespace, and the
/// cut follows a letter), so each regex finds in the parts exactly what it
/// finds in the whole, and BPE, which runs within pieces, gives the same
/// tokens. A text without such a place (no spaces, or not Latin) is one
/// part.
fn parts(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let bytes = rest.as_bytes();
        let cut = (size.max(1)..bytes.len().saturating_sub(1))
            .find(|&at| bytes[at] == b' ' && bytes[at - 1].is_ascii_alphabetic() && bytes[at + 1].is_ascii_alphabetic())
            .unwrap_or(bytes.len());
        // The cut is at an ASCII space, so a character boundary.
        let (part, after) = rest.split_at(cut);
        rest = after;
        Some(part)
    })
}

#[cfg(test)]
mod tests {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _};

    use super::super::testing::bpe_entries;
    use super::*;

    const NAMES: [&str; 14] = [
        "default",
        "gpt-4o",
        "llama3",
        "dbrx",
        "qwen2",
        "smollm",
        "gpt-2",
        "falcon",
        "bloom",
        "viking",
        "poro-chat",
        "tekken",
        "glm4",
        "qwen35",
    ];

    /// Texts with every kind of character the regexes tell apart, around
    /// the places the parts are cut.
    fn texts() -> Vec<String> {
        let atoms = [
            "a", "Zq", "é", "日本", " ", "  ", "\n", "\r\n", "\t", "1", "234567", ".", ",", "!?", "'s", "'T", "(", "|",
            "…", "$", "+=", "\u{a0}", "٣", "x y", "ab cd", "e\u{301}", "\u{301}",
        ];
        let mut state = 0x9e37_79b9u32;
        let mut next = |bound: usize| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as usize % bound
        };
        (0..300).map(|_| (0..next(40) + 1).map(|_| atoms[next(atoms.len())]).collect()).collect()
    }

    fn splits(pre: &PreTokenizerWrapper, text: &str) -> Vec<String> {
        let mut pieces = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut pieces).expect("pre-tokenized");
        pieces
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, ..)| piece.to_owned())
            .collect()
    }

    #[test]
    fn parts_are_cut_only_between_a_letter_and_a_space_before_a_letter() {
        let text = "ab cd  e f1 gh";
        let cut: Vec<&str> = parts(text, 1).collect();
        assert_eq!(cut, ["ab", " cd  e", " f1 gh"]);
        assert_eq!(parts("日本 語", 1).collect::<Vec<_>>(), ["日本 語"]);
        assert_eq!(parts("", 1).count(), 0);
    }

    #[test]
    fn every_pre_tokenizer_splits_the_parts_as_it_splits_the_whole() {
        let file = GgufFile::from_bytes(bpe_entries(None).build()).expect("a valid GGUF file");
        let vocab = Vocab::from_gguf(&file).expect("a vocabulary");
        for name in NAMES {
            let bpe = Bpe::new(&file, &vocab, &PreTokenizer::named(Some(name)).expect("known")).expect("built");
            let pre = bpe.inner.get_pre_tokenizer().expect("a pre-tokenizer");
            for text in texts() {
                let whole = splits(pre, &text);
                let joined: Vec<String> = parts(&text, 1).flat_map(|part| splits(pre, part)).collect();
                assert_eq!(joined, whole, "{name}: {text:?}");
            }
        }
    }
}
