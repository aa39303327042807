//! Incremental detokenization. A token may end in the middle of a UTF-8
//! character (byte-level BPE splits emoji across tokens; SentencePiece spells
//! rare characters as `<0xXX>` bytes), so bytes are held back until the
//! character they start is complete.

use super::Tokenizer;

/// Turns a stream of token ids into text, yielding only complete UTF-8.
///
/// Concatenating every [`push`](Self::push) and the final
/// [`finish`](Self::finish) gives exactly what [`Tokenizer::decode`] gives for
/// the whole sequence (when special tokens are rendered).
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    render_special: bool,
}

impl StreamDecoder {
    /// `render_special`: whether control and unknown tokens appear as their
    /// text (`/detokenize`, `special: true`) or as nothing (generated text, as
    /// llama-server streams it by default).
    pub fn new(render_special: bool) -> StreamDecoder {
        StreamDecoder { pending: Vec::new(), render_special }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tokenizer.render_bytes(id, self.render_special));
        self.take_complete()
    }

    /// Ends the stream: whatever is held back comes out, an unfinished
    /// character as U+FFFD.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn take_complete(&mut self) -> String {
        let mut text = String::new();
        let mut consumed = 0;
        for chunk in self.pending.utf8_chunks() {
            text.push_str(chunk.valid());
            consumed += chunk.valid().len();
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            // Only the last chunk can be the start of a character that later
            // bytes complete; anything else is invalid for good and becomes
            // U+FFFD, exactly as a lossy decode of the whole would.
            let at_end = consumed + invalid.len() == self.pending.len();
            if at_end && is_incomplete(invalid) {
                break;
            }
            text.push(char::REPLACEMENT_CHARACTER);
            consumed += invalid.len();
        }
        self.pending.drain(..consumed);
        text
    }
}

/// Whether `bytes` is a proper prefix of some UTF-8 encoded character.
fn is_incomplete(bytes: &[u8]) -> bool {
    matches!(std::str::from_utf8(bytes), Err(error) if error.error_len().is_none())
}
