//! Images in requests, as llama-server takes them: base64 files beside a
//! prompt whose media markers say where each goes (`/completion`'s
//! `multimodal_data`), or `data:` URIs in chat `image_url` parts. Each
//! image is wrapped in the projector's begin and end texts, encoded by the
//! vision tower (a few recent images are kept, by content, so a repeated
//! image is not encoded again) and placed as M-RoPE rows in the prompt.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use sha2::{Digest, Sha256};

use super::error::Error;
use sluice_engine::request::ImageInput;
use sluice_model::tokenizer::Tokenizer;
use sluice_model::vision::image::ImageSpec;
use sluice_model::vision::{Encoder, ProjectorKind};

/// Encoded images kept for reuse: at most this many…
const CACHED_IMAGES: usize = 16;
/// …and at most this many values in all (256 MB of f32).
const CACHED_VALUES: usize = 64 << 20;

/// A tokenized prompt and the images among its tokens.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    pub tokens: Vec<u32>,
    pub images: Vec<ImageInput>,
}

impl From<Vec<u32>> for Prompt {
    fn from(tokens: Vec<u32>) -> Self {
        Prompt { tokens, images: Vec::new() }
    }
}

/// The vision tower as the API uses it.
pub struct Vision {
    encoder: Arc<dyn Encoder>,
    /// The projector's image spec with the configured token bounds.
    spec: ImageSpec,
    marker: String,
    /// By the SHA-256 of the file: the rows, shared with every request
    /// that sends the image (`start` is set per prompt).
    cache: Mutex<VecDeque<([u8; 32], ImageInput)>>,
}

/// base64 as llama-server accepts it: padding optional.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The bytes of base64 text `data`, or a 400 naming `field`.
pub fn decode_base64(data: &str, field: &str) -> Result<Vec<u8>, Error> {
    let bytes = BASE64
        .decode(data.trim())
        .map_err(|error| Error::invalid(format!("`{field}` is not valid base64: {error}")))?;
    if bytes.is_empty() {
        return Err(Error::invalid(format!("`{field}` is empty")));
    }
    Ok(bytes)
}

/// The file of an `image_url` part's `url`: only `data:image/…;base64,`
/// URIs (sluice fetches nothing).
pub fn image_url(url: &str, field: &str) -> Result<Vec<u8>, Error> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("a bare string", |(scheme, _)| scheme);
        return Err(Error::invalid(format!(
            "`{field}`: only data: URIs are accepted (sluice fetches nothing; send the image as \
             data:image/png;base64,…), not {scheme}"
        )));
    };
    let Some((kind, data)) = rest.split_once(',') else {
        return Err(Error::invalid(format!("`{field}`: a data: URI needs a comma before its data")));
    };
    if !kind.starts_with("image/") {
        return Err(Error::invalid(format!("`{field}`: data:{kind} is not an image")));
    }
    if !kind.ends_with("base64") {
        return Err(Error::invalid(format!("`{field}`: the data: URI must be base64 encoded")));
    }
    decode_base64(data, field)
}

impl Vision {
    /// The tower with images resized within `min_tokens..=max_tokens`
    /// output rows where given (else within the projector's bounds).
    pub fn new(encoder: Arc<dyn Encoder>, min_tokens: Option<u32>, max_tokens: Option<u32>) -> Self {
        let spec = encoder.info().image.clone().with_token_bounds(min_tokens, max_tokens);
        Vision { encoder, spec, marker: media_marker(), cache: Mutex::new(VecDeque::new()) }
    }

    /// The text that stands for an image in a prompt.
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// `text` with an image for each marker, in order, tokenized as mtmd
    /// does: each text piece alone (special tokens parsed), each image
    /// between the projector's begin and end texts, BOS first when
    /// `add_special` and the vocabulary wants it.
    pub fn prompt(
        &self,
        text: &str,
        images: &[Vec<u8>],
        tokenizer: &Tokenizer,
        add_special: bool,
        field: &str,
    ) -> Result<Prompt, Error> {
        let pieces: Vec<&str> = text.split(self.marker.as_str()).collect();
        if pieces.len() - 1 != images.len() {
            return Err(Error::invalid(format!(
                "the prompt has {} media markers ({}) for {} images in `{field}`",
                pieces.len() - 1,
                self.marker,
                images.len()
            )));
        }
        let (begin, end) = match self.encoder.info().kind {
            ProjectorKind::Qwen2Vl | ProjectorKind::Qwen25Vl => ("<|vision_start|>", "<|vision_end|>"),
        };
        let mut prompt = Prompt::default();
        if add_special
            && tokenizer.adds_bos()
            && let Some(bos) = tokenizer.bos()
        {
            prompt.tokens.push(bos);
        }
        for (index, piece) in pieces.iter().enumerate() {
            prompt.tokens.extend(tokenizer.encode(piece, false, true));
            let Some(bytes) = images.get(index) else { break };
            if index + 1 < pieces.len() - 1 && pieces[index + 1].is_empty() {
                return Err(Error::invalid(format!(
                    "images {} and {} of `{field}` are adjacent; llama.cpp merges adjacent images into \
                     video frames, which sluice does not support: put text between them",
                    index + 1,
                    index + 2
                )));
            }
            let image = self.encode(bytes, &format!("{field}[{index}]"))?;
            prompt.tokens.extend(tokenizer.encode(begin, false, true));
            let image = ImageInput { start: prompt.tokens.len(), ..image };
            prompt.tokens.extend(image.placeholders());
            prompt.images.push(image);
            prompt.tokens.extend(tokenizer.encode(end, false, true));
        }
        Ok(prompt)
    }

    /// One image file's rows, from the cache when the same bytes were
    /// encoded lately.
    fn encode(&self, bytes: &[u8], field: &str) -> Result<ImageInput, Error> {
        let key: [u8; 32] = Sha256::digest(bytes).into();
        if let Ok(cache) = self.cache.lock()
            && let Some((_, encoded)) = cache.iter().find(|(cached, _)| *cached == key)
        {
            return Ok(encoded.clone());
        }
        let prepared = self.spec.prepare(bytes).map_err(|error| Error::invalid(format!("`{field}`: {error}")))?;
        let encoded = self.encoder.encode(&prepared).map_err(|error| Error::Server(format!("`{field}`: {error}")))?;
        let encoded = ImageInput { start: 0, nx: encoded.nx, ny: encoded.ny, embeddings: Arc::from(encoded.rows) };
        if let Ok(mut cache) = self.cache.lock() {
            cache.retain(|(cached, _)| *cached != key);
            cache.push_front((key, encoded.clone()));
            while cache.len() > CACHED_IMAGES
                || cache.iter().map(|(_, image)| image.embeddings.len()).sum::<usize>() > CACHED_VALUES
            {
                cache.pop_back();
            }
        }
        Ok(encoded)
    }
}

/// llama-server's marker: `<__media_…__>` with a random middle, unless
/// `LLAMA_MEDIA_MARKER` pins one.
fn media_marker() -> String {
    if let Ok(marker) = std::env::var("LLAMA_MEDIA_MARKER")
        && !marker.is_empty()
    {
        return marker;
    }
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("<__media_{:016x}__>", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_urls_must_be_base64_data() {
        assert_eq!(image_url("data:image/png;base64,aGk=", "u").ok(), Some(b"hi".to_vec()));
        assert_eq!(image_url("data:image/png;base64,aGk", "u").ok(), Some(b"hi".to_vec()));
        for (url, says) in [
            ("https://example.invalid/cat.png", "not https"),
            ("file:///etc/passwd", "not file"),
            ("data:text/plain;base64,aGk=", "not an image"),
            ("data:image/png,hi", "must be base64"),
            ("data:image/png;base64", "needs a comma"),
            ("data:image/png;base64,!!!", "not valid base64"),
            ("data:image/png;base64,", "is empty"),
        ] {
            let error = image_url(url, "messages[0].content[1].image_url.url").expect_err(url);
            assert!(error.to_string().contains(says), "{url}: {error}");
            assert!(error.to_string().contains("messages[0].content[1].image_url.url"));
        }
    }
}
