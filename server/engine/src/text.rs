//! Turning generated token bytes into released text: only whole UTF-8
//! characters, and never a tail that could still become a stop string.

/// Per-request output text state.
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    stop: Vec<String>,
    /// Bytes of an incomplete UTF-8 character.
    partial: Vec<u8>,
    /// Decoded text not yet released (a possible stop-string prefix).
    held: String,
}

/// What appending a token's bytes produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Text safe to release now (possibly empty).
    Text(String),
    /// A stop string matched: release `text` (what preceded it) and stop.
    Stop { text: String, word: String },
}

impl TextStream {
    pub fn new(stop: Vec<String>) -> Self {
        TextStream { stop: stop.into_iter().filter(|word| !word.is_empty()).collect(), ..TextStream::default() }
    }

    pub fn push(&mut self, bytes: &[u8]) -> Appended {
        self.partial.extend_from_slice(bytes);
        let complete = match std::str::from_utf8(&self.partial) {
            Ok(text) => text.len(),
            // An error with no length means the tail is an incomplete
            // character that more bytes may finish; otherwise the bytes are
            // invalid and are released as U+FFFD.
            Err(error) if error.error_len().is_none() => error.valid_up_to(),
            Err(_) => self.partial.len(),
        };
        let decoded = String::from_utf8_lossy(&self.partial[..complete]).into_owned();
        self.partial.drain(..complete);
        self.held.push_str(&decoded);

        if let Some((at, word)) = self.first_stop() {
            let text = self.held[..at].to_owned();
            self.held.clear();
            self.partial.clear();
            return Appended::Stop { text, word };
        }
        let keep = self.longest_stop_prefix_suffix();
        let release = self.held.len() - keep;
        Appended::Text(self.held.drain(..release).collect())
    }

    /// Release everything held (at the end of generation).
    pub fn finish(&mut self) -> String {
        let mut text = std::mem::take(&mut self.held);
        text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.partial)));
        text
    }

    fn first_stop(&self) -> Option<(usize, String)> {
        self.stop
            .iter()
            .filter_map(|word| self.held.find(word.as_str()).map(|at| (at, word.clone())))
            .min_by_key(|(at, _)| *at)
    }

    /// Bytes at the end of `held` that are a proper prefix of a stop word.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let mut keep = 0;
        for word in &self.stop {
            for (len, _) in word.char_indices().skip(1) {
                if len > keep && self.held.ends_with(&word[..len]) {
                    keep = len;
                }
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(appended: Appended) -> String {
        match appended {
            Appended::Text(text) => text,
            Appended::Stop { .. } => panic!("unexpected stop"),
        }
    }

    #[test]
    fn incomplete_utf8_is_held_until_complete() {
        let mut stream = TextStream::new(vec![]);
        let euro = "€".as_bytes();
        assert_eq!(text(stream.push(&euro[..1])), "");
        assert_eq!(text(stream.push(&euro[1..2])), "");
        assert_eq!(text(stream.push(&euro[2..])), "€");
        assert_eq!(text(stream.push(b"ab")), "ab");
        assert_eq!(text(stream.push(&[0xf0, 0x9f])), "");
        assert_eq!(stream.finish(), "\u{fffd}");
    }

    #[test]
    fn possible_stop_prefixes_are_held_and_released_when_they_diverge() {
        let mut stream = TextStream::new(vec!["</end>".into()]);
        assert_eq!(text(stream.push(b"hello </")), "hello ");
        assert_eq!(text(stream.push(b"en")), "");
        assert_eq!(text(stream.push(b"x")), "</enx");
        assert_eq!(stream.finish(), "");
    }

    #[test]
    fn a_stop_word_ends_the_text_before_it() {
        let mut stream = TextStream::new(vec!["STOP".into(), "\n\n".into()]);
        assert_eq!(text(stream.push(b"one S")), "one ");
        assert_eq!(stream.push(b"TOP two"), Appended::Stop { text: "".into(), word: "STOP".into() });
        let mut stream = TextStream::new(vec!["STOP".into(), "\n\n".into()]);
        assert_eq!(stream.push(b"a\n\nb STOP"), Appended::Stop { text: "a".into(), word: "\n\n".into() });
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut stream = TextStream::new(vec![]);
        assert_eq!(text(stream.push(&[0xff, b'a'])), "\u{fffd}a");
    }
}
