//! Random ids of responses, calls and messages.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// 32 random alphanumerics (the standard library's per-process random
/// hasher keys are random enough for ids).
pub fn random_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut id = String::with_capacity(32);
    while id.len() < 32 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_usize(id.len());
        let mut bits = hasher.finish();
        for _ in 0..8 {
            id.push(char::from(ALPHABET[(bits % ALPHABET.len() as u64) as usize]));
            bits /= ALPHABET.len() as u64;
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_32_alphanumerics() {
        let id = random_id();
        assert_eq!(id.len(), 32);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
        assert_ne!(random_id(), random_id());
    }
}
