//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`), with
//! llama.cpp's semantics: spaces become `▁`, the text starts as one symbol per
//! character, and the adjacent pair whose concatenation is the best-scoring
//! token (leftmost on ties) is merged until no pair forms a token. A symbol
//! left that is not a token is spelled out as `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

const SPACE: &str = "\u{2581}";

/// One symbol: a byte range of the text, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text, to recognise stale candidates.
    len: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: the higher score first; on equal scores the leftmost.
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Appends the tokens of one plain-text fragment. `space_prefix` puts a space
/// in front, as SentencePiece's `add_dummy_prefix` does.
pub(super) fn encode(vocab: &Vocab, fragment: &str, space_prefix: bool, out: &mut Vec<u32>) {
    let mut text = String::with_capacity(fragment.len() + SPACE.len());
    if space_prefix {
        text.push(' ');
    }
    text.push_str(fragment);
    let text = text.replace(' ', SPACE);
    if text.is_empty() {
        return;
    }

    let starts: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
    let mut symbols: Vec<Symbol> = starts
        .iter()
        .enumerate()
        .map(|(index, &start)| Symbol {
            start,
            len: starts.get(index + 1).unwrap_or(&text.len()) - start,
            prev: index.checked_sub(1),
            next: (index + 1 < starts.len()).then_some(index + 1),
        })
        .collect();

    let mut queue = BinaryHeap::new();
    let candidate = |symbols: &[Symbol], left: usize, right: usize| -> Option<Bigram> {
        let len = symbols[left].len + symbols[right].len;
        let start = symbols[left].start;
        let id = *vocab.token_to_id.get(&text[start..start + len])?;
        Some(Bigram { score: vocab.scores[id as usize], left, right, len })
    };
    for left in 1..symbols.len() {
        queue.extend(candidate(&symbols, left - 1, left));
    }

    while let Some(bigram) = queue.pop() {
        let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
        // Either side merged into something else since this was queued.
        if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
            continue;
        }
        symbols[bigram.left].len += right.len;
        symbols[bigram.left].next = right.next;
        symbols[bigram.right].len = 0;
        if let Some(next) = right.next {
            symbols[next].prev = Some(bigram.left);
        }
        if let Some(prev) = left.prev {
            queue.extend(candidate(&symbols, prev, bigram.left));
        }
        if let Some(next) = right.next {
            queue.extend(candidate(&symbols, bigram.left, next));
        }
    }

    let mut at = Some(0);
    while let Some(index) = at {
        let symbol = symbols[index];
        let piece = &text[symbol.start..symbol.start + symbol.len];
        match vocab.token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => piece.bytes().for_each(|byte| out.extend(byte_token(vocab, byte))),
        }
        at = symbol.next;
    }
}

/// The token for one byte: `<0xXX>`, else the byte as a one-character token,
/// else the unknown token. (llama.cpp throws when neither token exists.)
pub(super) fn byte_token(vocab: &Vocab, byte: u8) -> Option<u32> {
    let hex = format!("<0x{byte:02X}>");
    vocab
        .token_to_id
        .get(&hex)
        .or_else(|| std::str::from_utf8(&[byte]).ok().and_then(|text| vocab.token_to_id.get(text)))
        .copied()
        .or(vocab.unk)
}
