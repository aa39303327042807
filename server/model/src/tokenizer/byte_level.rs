//! GPT-2's byte-level alphabet: every byte is stored in a BPE vocabulary as
//! one printable character. Printable Latin-1 bytes (`!`..=`~`, `¡`..=`¬`,
//! `®`..=`ÿ`) stand for themselves; the other 68 bytes, in increasing order,
//! are shifted to U+0100..=U+0143 (so a space is `Ġ`, a newline `Ċ`).

fn is_printable(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff)
}

/// The character that stands for `byte`.
pub(super) fn byte_to_char(byte: u8) -> char {
    if is_printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&lower| !is_printable(lower)).count() as u32;
    char::from_u32(0x100 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The byte a character stands for, if it is part of the alphabet.
fn char_to_byte(c: char) -> Option<u8> {
    let code = u32::from(c);
    if let Ok(byte) = u8::try_from(code) {
        return is_printable(byte).then_some(byte);
    }
    let rank = code.checked_sub(0x100)?;
    (0..=u8::MAX).filter(|&byte| !is_printable(byte)).nth(rank as usize)
}

/// A vocabulary text back to the bytes it encodes. Characters outside the
/// alphabet (malformed vocabularies only) are kept as their own UTF-8, where
/// llama.cpp would splice in an `[UNK_BYTE_…]` marker.
pub(super) fn decode(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(byte) => bytes.push(byte),
            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips_every_byte() {
        for byte in 0..=u8::MAX {
            assert_eq!(char_to_byte(byte_to_char(byte)), Some(byte), "byte {byte:#04x}");
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0xad), '\u{143}');
        assert_eq!(char_to_byte('\u{144}'), None);
    }

    #[test]
    fn decodes_text() {
        assert_eq!(decode("ĠHello"), b" Hello");
        assert_eq!(decode("Ã©"), "é".as_bytes());
        assert_eq!(decode("日"), "日".as_bytes());
    }
}
