//! Saved slots (llama-server's `POST /slots/{id}?action=save|restore|erase`
//! under `--slot-save-path`): what the HTTP layer asks of the engine, and
//! the file a saved slot is.
//!
//! A slot's cache is the KV of the last sequence that named it (`id_slot`)
//! or ran in it naming none (its prompt and the tokens generated after
//! it), as far as the prefix cache still holds it: sluice releases a
//! finished request's blocks to the prefix cache
//! instead of keeping them in the slot. Saving copies those blocks out;
//! restoring writes them into fresh blocks and caches them, so the next
//! request that starts with those tokens borrows them, on any slot.
//!
//! The file is sluice's own (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SLUICEKV` |
//! | 4 | version, 2 |
//! | 8 | model fingerprint (see [`KvLayout::new`]) |
//! | 4 × 4 | `n_layer`, `kv_dim`, `n_vocab`, tokens per KV block |
//! | 16 | the KV store's element type (`f16`), NUL-padded |
//! | 8 | bytes per KV block |
//! | 8 | the LoRA configuration the KV was computed under (its prefix-cache root, see `engine::adapters`; 0 = none) |
//! | 4 | `n_tokens` |
//!
//! then `n_tokens` token ids (u32), then ⌈`n_tokens` / block tokens⌉ KV
//! blocks as the backend stores them (every layer's keys, then its values:
//! `Backend::read_kv_block`). Cells of the last block past `n_tokens` are
//! whatever the block held; they are never read. A model with recurrent
//! layers then has its recurrent state after those tokens (f32, every
//! recurrent layer's convolution window then delta-rule state:
//! `Context::read_state`), as many values as the model's state holds; the
//! model fingerprint pins that number. Such a slot holds the tokens up to
//! the longest state snapshot the prefix cache kept for it
//! (`engine::state_cache`), and restoring one keeps its state there.

use std::io::{self, Write};

use sha2::{Digest, Sha256};
use sluice_kernels::backend::{BackendError, KvBlockFormat};
use tokio::sync::oneshot;

use super::request::IMAGE_ROW;
use sluice_model::Model;

const MAGIC: &[u8; 8] = b"SLUICEKV";
const VERSION: u32 = 2;
const ELEMENT_LEN: usize = 16;
/// Bytes before the token ids.
pub const HEADER_LEN: usize = 8 + 4 + 8 + 4 * 4 + ELEMENT_LEN + 8 + 8 + 4;

/// What a slot file must match to be restored here: the model and how its
/// KV is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    pub model: u64,
    pub n_layer: u32,
    pub kv_dim: u32,
    pub n_vocab: u32,
    pub block_tokens: u32,
    pub element: [u8; ELEMENT_LEN],
    pub block_bytes: u64,
    /// Values of one sequence's recurrent state (0: no recurrent layers).
    pub state_values: u64,
}

impl KvLayout {
    /// The layout of `model`'s KV in blocks of `block_tokens` cells stored
    /// as `format`. The model fingerprint hashes what KV values depend on:
    /// the architecture, the shape and rotary settings, and every tensor's
    /// name, type, shape and first 256 bytes (cheap, and tells apart
    /// quantizations and fine-tunes of one shape).
    pub fn new(model: &dyn Model, format: KvBlockFormat, block_tokens: usize) -> Self {
        let hp = model.hparams();
        let mut hash = Sha256::new();
        hash.update(hp.arch.name());
        hash.update(format!("{:?}", hp.rope));
        for value in [hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot] {
            hash.update((value as u64).to_le_bytes());
        }
        hash.update(hp.rope_base.to_bits().to_le_bytes());
        hash.update(hp.rope_freq_scale.to_bits().to_le_bytes());
        let file = model.file();
        for tensor in file.tensors() {
            hash.update(tensor.name.as_bytes());
            hash.update(tensor.dtype.name());
            tensor.dims.iter().for_each(|dim| hash.update(dim.to_le_bytes()));
            let data = file.data(tensor);
            hash.update(data.get(..256).unwrap_or(data));
        }
        let digest = hash.finalize();
        let mut model_id = [0u8; 8];
        model_id.copy_from_slice(&digest[..8]);
        let mut element = [0u8; ELEMENT_LEN];
        let name = format.element.as_bytes();
        element[..name.len().min(ELEMENT_LEN)].copy_from_slice(&name[..name.len().min(ELEMENT_LEN)]);
        let narrow = |value: usize| u32::try_from(value).unwrap_or(u32::MAX);
        KvLayout {
            model: u64::from_le_bytes(model_id),
            n_layer: narrow(hp.n_layer),
            kv_dim: narrow(hp.kv_dim()),
            n_vocab: narrow(hp.n_vocab),
            block_tokens: narrow(block_tokens),
            element,
            block_bytes: format.bytes as u64,
            state_values: model.recurrent_state_bytes().map_or(0, |bytes| bytes as u64 / 4),
        }
    }

    /// Bytes of a file of `n_tokens` tokens.
    pub fn file_len(&self, n_tokens: u64) -> u64 {
        let blocks = n_tokens.div_ceil(u64::from(self.block_tokens.max(1)));
        HEADER_LEN as u64 + 4 * n_tokens + blocks * self.block_bytes + 4 * self.state_values
    }

    fn element_name(element: &[u8]) -> String {
        String::from_utf8_lossy(element).trim_end_matches('\0').to_owned()
    }
}

/// A saved slot: its tokens, their KV blocks back to back, and the
/// recurrent state after them (empty without recurrent layers).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotFile {
    /// The adapter configuration's prefix-cache root.
    pub root: u64,
    pub tokens: Vec<u32>,
    pub blocks: Vec<u8>,
    pub state: Vec<f32>,
}

/// Why a file cannot be restored here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotFileError {
    #[error("not a sluice slot file (no `SLUICEKV` header)")]
    Magic,
    #[error("slot file version {0}; this sluice reads version {VERSION}")]
    Version(u32),
    #[error("saved for another {what}: the file has {file}, this server {here}")]
    Mismatch { what: &'static str, file: String, here: String },
    #[error("it holds {n_tokens} tokens; a slot here holds at most {max}")]
    TooLong { n_tokens: u64, max: usize },
    #[error("{len} bytes where its header calls for {expected}: truncated, or not a slot file")]
    Length { len: u64, expected: u64 },
    #[error("token {token} (at {at}) is outside the vocabulary of {n_vocab}")]
    Token { at: usize, token: u32, n_vocab: u32 },
}

impl SlotFile {
    /// Write the file; the number of bytes written.
    pub fn write_to(&self, layout: &KvLayout, out: &mut impl Write) -> io::Result<u64> {
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&layout.model.to_le_bytes());
        for value in [layout.n_layer, layout.kv_dim, layout.n_vocab, layout.block_tokens] {
            header.extend_from_slice(&value.to_le_bytes());
        }
        header.extend_from_slice(&layout.element);
        header.extend_from_slice(&layout.block_bytes.to_le_bytes());
        header.extend_from_slice(&self.root.to_le_bytes());
        let n_tokens = u32::try_from(self.tokens.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "more tokens than a slot file holds"))?;
        header.extend_from_slice(&n_tokens.to_le_bytes());
        out.write_all(&header)?;
        let tokens: Vec<u8> = self.tokens.iter().flat_map(|token| token.to_le_bytes()).collect();
        out.write_all(&tokens)?;
        out.write_all(&self.blocks)?;
        if self.state.len() as u64 != layout.state_values {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a recurrent state of another size"));
        }
        let state: Vec<u8> = self.state.iter().flat_map(|value| value.to_le_bytes()).collect();
        out.write_all(&state)?;
        Ok((header.len() + tokens.len() + self.blocks.len() + state.len()) as u64)
    }

    /// Read a file written for `layout` holding at most `max_tokens`
    /// tokens. Checks every header field before trusting any of it.
    pub fn parse(mut bytes: Vec<u8>, layout: &KvLayout, max_tokens: usize) -> Result<SlotFile, SlotFileError> {
        let len = bytes.len() as u64;
        let mut fields = Fields(bytes.get(..HEADER_LEN).ok_or(if bytes.starts_with(MAGIC) {
            SlotFileError::Length { len, expected: HEADER_LEN as u64 }
        } else {
            SlotFileError::Magic
        })?);
        if fields.take(8) != MAGIC {
            return Err(SlotFileError::Magic);
        }
        let version = fields.u32();
        if version != VERSION {
            return Err(SlotFileError::Version(version));
        }
        let model = fields.u64();
        if model != layout.model {
            return Err(SlotFileError::Mismatch {
                what: "model",
                file: format!("fingerprint {model:016x}"),
                here: format!("{:016x}", layout.model),
            });
        }
        let numbers = [
            ("number of layers (n_layer)", layout.n_layer),
            ("KV width (kv_dim)", layout.kv_dim),
            ("vocabulary (n_vocab)", layout.n_vocab),
            ("KV block size (tokens per block)", layout.block_tokens),
        ];
        for (what, here) in numbers {
            let file = fields.u32();
            if file != here {
                return Err(SlotFileError::Mismatch { what, file: file.to_string(), here: here.to_string() });
            }
        }
        let element = fields.take(ELEMENT_LEN);
        if element != layout.element {
            return Err(SlotFileError::Mismatch {
                what: "KV element type",
                file: KvLayout::element_name(element),
                here: KvLayout::element_name(&layout.element),
            });
        }
        let block_bytes = fields.u64();
        if block_bytes != layout.block_bytes {
            return Err(SlotFileError::Mismatch {
                what: "KV block size in bytes",
                file: block_bytes.to_string(),
                here: layout.block_bytes.to_string(),
            });
        }
        let root = fields.u64();
        let n_tokens = u64::from(fields.u32());
        if n_tokens > max_tokens as u64 {
            return Err(SlotFileError::TooLong { n_tokens, max: max_tokens });
        }
        let expected = layout.file_len(n_tokens);
        if len != expected {
            return Err(SlotFileError::Length { len, expected });
        }
        let blocks_at = HEADER_LEN + 4 * n_tokens as usize;
        let tokens: Vec<u32> = bytes[HEADER_LEN..blocks_at]
            .chunks_exact(4)
            .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
            .collect();
        // Image rows carry placeholder ids with `IMAGE_ROW` set.
        if let Some((at, &token)) =
            tokens.iter().enumerate().find(|(_, token)| **token & IMAGE_ROW == 0 && **token >= layout.n_vocab)
        {
            return Err(SlotFileError::Token { at, token, n_vocab: layout.n_vocab });
        }
        let state_at = bytes.len() - 4 * layout.state_values as usize;
        let state = bytes[state_at..]
            .chunks_exact(4)
            .map(|word| f32::from_le_bytes([word[0], word[1], word[2], word[3]]))
            .collect();
        bytes.truncate(state_at);
        bytes.drain(..blocks_at);
        Ok(SlotFile { root, tokens, blocks: bytes, state })
    }
}

/// Little-endian fields off the front of a header known to be whole.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    fn u32(&mut self) -> u32 {
        let mut word = [0u8; 4];
        word.copy_from_slice(self.take(4));
        u32::from_le_bytes(word)
    }

    fn u64(&mut self) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8));
        u64::from_le_bytes(word)
    }
}

/// Where a slot action's outcome goes.
pub type SlotReply<T> = oneshot::Sender<Result<T, SlotActionError>>;

/// What the HTTP layer asks of a slot, and where the answer goes.
#[derive(Debug)]
pub enum SlotAction {
    /// Its cached tokens and their KV, for the caller to write.
    Save(SlotReply<SlotFile>),
    /// Cache these tokens' KV as the slot's; answers the token count.
    Restore(SlotFile, SlotReply<usize>),
    /// Drop the slot's cached tokens; answers how many were cached.
    Erase(SlotReply<usize>),
}

impl SlotAction {
    /// Whether the caller stopped waiting.
    pub fn abandoned(&self) -> bool {
        match self {
            SlotAction::Save(reply) => reply.is_closed(),
            SlotAction::Restore(_, reply) | SlotAction::Erase(reply) => reply.is_closed(),
        }
    }

    /// Answer with `error`.
    pub fn fail(self, error: SlotActionError) {
        match self {
            SlotAction::Save(reply) => drop(reply.send(Err(error))),
            SlotAction::Restore(_, reply) | SlotAction::Erase(reply) => drop(reply.send(Err(error))),
        }
    }
}

/// Why a slot action failed.
#[derive(Debug, thiserror::Error)]
pub enum SlotActionError {
    #[error("there is no slot {slot}; slots are 0 to {}", n_slots.saturating_sub(1))]
    NoSlot { slot: usize, n_slots: usize },
    #[error("the KV cache has no room for {n_tokens} restored tokens ({n_blocks} blocks): the running requests use it")]
    NoRoom { n_tokens: usize, n_blocks: usize },
    #[error("restoring a slot needs the prefix cache, which is off (engine.prefix_cache = false, or --cache-ram 0)")]
    NoPrefixCache,
    #[error("restoring a slot is not supported with a draft model: slot files hold no draft KV")]
    Draft,
    #[error(
        "slot files hold the prefix cache's KV, which this model's sliding-window layers do not keep: \
         start with --swa-full (engine.swa_full) to save and restore slots"
    )]
    Window,
    #[error("{n_tokens} tokens with {len} bytes of KV blocks: not what this store holds")]
    Malformed { n_tokens: usize, len: usize },
    #[error("the KV store refused the slot's blocks")]
    Backend(#[from] BackendError),
    #[error("the engine has stopped")]
    Stopped,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        let mut element = [0u8; ELEMENT_LEN];
        element[..3].copy_from_slice(b"f16");
        KvLayout {
            model: 0x1234,
            n_layer: 2,
            kv_dim: 4,
            n_vocab: 100,
            block_tokens: 2,
            element,
            block_bytes: 32,
            state_values: 0,
        }
    }

    fn file(n_tokens: usize) -> SlotFile {
        let tokens = (0..n_tokens as u32).map(|token| token * 7 % 100).collect();
        let blocks = (0..n_tokens.div_ceil(2) * 32).map(|byte| (byte * 13) as u8).collect();
        SlotFile { root: 0x5eed, tokens, blocks, state: Vec::new() }
    }

    fn bytes(file: &SlotFile, layout: &KvLayout) -> Vec<u8> {
        let mut bytes = Vec::new();
        let written = file.write_to(layout, &mut bytes).expect("to memory");
        assert_eq!(written, bytes.len() as u64);
        bytes
    }

    #[test]
    fn files_read_back_exactly() {
        let layout = layout();
        for n_tokens in [0, 1, 2, 5] {
            let saved = file(n_tokens);
            let bytes = bytes(&saved, &layout);
            assert_eq!(bytes.len() as u64, layout.file_len(n_tokens as u64));
            assert_eq!(SlotFile::parse(bytes, &layout, 8), Ok(saved));
        }
        // A recurrent model's state follows the blocks; its size is the
        // model's, so a file without it is short.
        let recurrent = KvLayout { state_values: 3, ..layout.clone() };
        let saved = SlotFile { state: vec![0.5, -1.0, 2.25], ..file(3) };
        let written = bytes(&saved, &recurrent);
        assert_eq!(written.len() as u64, recurrent.file_len(3));
        assert_eq!(SlotFile::parse(written.clone(), &recurrent, 8), Ok(saved.clone()));
        assert!(matches!(SlotFile::parse(written, &layout, 8), Err(SlotFileError::Length { .. })));
        let dense = bytes(&file(3), &layout);
        assert!(matches!(SlotFile::parse(dense, &recurrent, 8), Err(SlotFileError::Length { .. })));
        assert!(SlotFile { state: vec![1.0], ..file(3) }.write_to(&recurrent, &mut Vec::new()).is_err());
    }

    #[test]
    fn a_file_for_another_layout_names_what_differs() {
        let layout = layout();
        let saved = bytes(&file(3), &layout);
        let cases: [(KvLayout, &str); 6] = [
            (KvLayout { model: 9, ..layout.clone() }, "another model"),
            (KvLayout { n_layer: 3, ..layout.clone() }, "n_layer"),
            (KvLayout { kv_dim: 8, ..layout.clone() }, "kv_dim"),
            (KvLayout { n_vocab: 50, ..layout.clone() }, "n_vocab"),
            (KvLayout { block_tokens: 4, ..layout.clone() }, "tokens per block"),
            (KvLayout { block_bytes: 34, ..layout.clone() }, "size in bytes: the file has 32, this server 34"),
        ];
        for (here, named) in cases {
            let error = SlotFile::parse(saved.clone(), &here, 8).expect_err("another layout").to_string();
            assert!(error.contains(named), "{named}: {error}");
        }
        let mut q8 = layout.clone();
        q8.element = [0; ELEMENT_LEN];
        q8.element[..4].copy_from_slice(b"q8_0");
        let error = SlotFile::parse(saved, &q8, 8).expect_err("another element type").to_string();
        assert_eq!(error, "saved for another KV element type: the file has f16, this server q8_0");
    }

    #[test]
    fn truncated_garbage_and_oversized_files_are_refused_without_panicking() {
        let layout = layout();
        let saved = bytes(&file(5), &layout);
        for cut in 0..saved.len() {
            assert!(SlotFile::parse(saved[..cut].to_vec(), &layout, 8).is_err(), "cut at {cut}");
        }
        let mut longer = saved.clone();
        longer.push(0);
        assert!(matches!(SlotFile::parse(longer, &layout, 8), Err(SlotFileError::Length { .. })));
        assert_eq!(SlotFile::parse(b"GGUF and more".to_vec(), &layout, 8), Err(SlotFileError::Magic));
        assert_eq!(SlotFile::parse(Vec::new(), &layout, 8), Err(SlotFileError::Magic));
        assert_eq!(SlotFile::parse(saved.clone(), &layout, 4), Err(SlotFileError::TooLong { n_tokens: 5, max: 4 }));
        let mut version = saved.clone();
        version[8] = 1;
        assert_eq!(SlotFile::parse(version, &layout, 8), Err(SlotFileError::Version(1)), "before adapters");
        let mut huge = saved.clone();
        huge[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(SlotFile::parse(huge, &layout, usize::MAX), Err(SlotFileError::Length { .. })));
        let mut token = saved;
        token[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&100u32.to_le_bytes());
        assert_eq!(SlotFile::parse(token, &layout, 8), Err(SlotFileError::Token { at: 1, token: 100, n_vocab: 100 }));
    }
}
