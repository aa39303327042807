//! Byte-level mutations, for binary formats (GGUF) and raw text: bit flips,
//! interesting bytes, inserted, deleted and duplicated ranges, splices of two
//! corpus entries, and interesting little-endian `u32`/`u64` values written
//! over the bytes (the shape of every count, length and offset in a GGUF
//! header).

use super::Rng;

/// Bytes at the edges of signed and unsigned ranges.
const BYTES: [u8; 7] = [0, 1, 0x7f, 0x80, 0xff, 0x20, 0x0a];

/// One mutation of `data`; `corpus` gives the other half of a splice.
/// `data` never grows past `max_len`.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>], max_len: usize) {
    if data.is_empty() {
        data.extend((0..1 + rng.below(16)).map(|_| rng.next_u64() as u8));
        return;
    }
    match rng.below(13) {
        0 => {
            let at = position(rng, data.len());
            data[at] ^= 1 << rng.below(8);
        }
        1 => {
            let at = position(rng, data.len());
            data[at] = *rng.pick(&BYTES);
        }
        2 => {
            let at = position(rng, data.len());
            data[at] = rng.next_u64() as u8;
        }
        3 => {
            let at = position(rng, data.len() + 1);
            let inserted: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, inserted);
        }
        4 => {
            let (start, end) = range(rng, data.len());
            data.drain(start..end);
        }
        5 => {
            let (start, end) = range(rng, data.len());
            let copy = data[start..end].to_vec();
            let at = position(rng, data.len() + 1);
            data.splice(at..at, copy);
        }
        6 => {
            let value = interesting_u32(rng, data.len());
            overwrite(rng, data, &value.to_le_bytes());
        }
        7 => {
            let value = interesting_u64(rng, data.len());
            overwrite(rng, data, &value.to_le_bytes());
        }
        8 => {
            // Small steps on a little-endian field: off-by-one lengths.
            let width = *rng.pick(&[1usize, 4, 8]);
            if data.len() >= width {
                let at = position(rng, data.len() - width + 1);
                let mut field = [0u8; 8];
                field[..width].copy_from_slice(&data[at..at + width]);
                let delta = rng.below(33) as i64 - 16;
                let stepped = u64::from_le_bytes(field).wrapping_add(delta as u64).to_le_bytes();
                data[at..at + width].copy_from_slice(&stepped[..width]);
            }
        }
        9 => {
            let other = rng.pick(corpus);
            let keep = position(rng, data.len() + 1);
            let from = rng.below(other.len() + 1);
            data.truncate(keep);
            data.extend_from_slice(&other[from..]);
        }
        10 => {
            let other = rng.pick(corpus);
            if !other.is_empty() {
                let (start, end) = range(rng, other.len());
                let at = position(rng, data.len());
                let end = end.min(start + data.len() - at);
                data[at..at + end - start].copy_from_slice(&other[start..end]);
            }
        }
        11 => data.truncate(position(rng, data.len())),
        _ => {
            // A run of one byte: long lengths, repeated characters.
            let at = position(rng, data.len() + 1);
            let byte = if rng.one_in(2) { *rng.pick(&BYTES) } else { data[rng.below(data.len())] };
            let run = vec![byte; 1 + rng.below(256)];
            data.splice(at..at, run);
        }
    }
    data.truncate(max_len);
}

/// A position below `len`, mostly near the start, where headers are:
/// half the time within 512 bytes, a quarter within 8 KiB.
fn position(rng: &mut Rng, len: usize) -> usize {
    let window = match rng.below(4) {
        0 | 1 => len.min(512),
        2 => len.min(8192),
        _ => len,
    };
    rng.below(window)
}

/// A range of at most 64 bytes within `len` bytes (`len` > 0).
fn range(rng: &mut Rng, len: usize) -> (usize, usize) {
    let start = position(rng, len);
    let end = (start + 1 + rng.below(64)).min(len);
    (start, end)
}

fn overwrite(rng: &mut Rng, data: &mut [u8], value: &[u8]) {
    if data.len() >= value.len() {
        let at = position(rng, data.len() - value.len() + 1);
        data[at..at + value.len()].copy_from_slice(value);
    }
}

fn interesting_u32(rng: &mut Rng, len: usize) -> u32 {
    let len = len as u32;
    *rng.pick(&[
        0,
        1,
        2,
        3,
        8,
        9,
        12,
        13,
        32,
        0x7f,
        0xff,
        0x100,
        0xffff,
        0x7fff_ffff,
        0x8000_0000,
        u32::MAX,
        u32::MAX - 1,
        len,
        len.wrapping_sub(1),
        len.wrapping_add(1),
        len / 2,
    ])
}

fn interesting_u64(rng: &mut Rng, len: usize) -> u64 {
    let len = len as u64;
    *rng.pick(&[
        0,
        1,
        2,
        4,
        24,
        32,
        u64::from(u32::MAX),
        1 << 32,
        1 << 40,
        1 << 62,
        i64::MAX as u64,
        1 << 63,
        u64::MAX,
        u64::MAX - 31,
        len,
        len.wrapping_sub(1),
        len.wrapping_add(1),
        len / 2,
        len * 8,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_within_the_bound_and_are_seeded() {
        let corpus = vec![b"GGUF\x03\0\0\0".to_vec(), vec![7; 100]];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut data = corpus[1].clone();
            for _ in 0..1000 {
                mutate(&mut rng, &mut data, &corpus, 300);
                assert!(data.len() <= 300);
            }
            data
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }
}
