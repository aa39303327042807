//! What crosses the http ↔ engine seam: a generation request in, a stream
//! of events out.

use super::constraint::Grammar;
use super::sampling::{SamplingParams, TokenProb};
use sluice_model::batch::{ImageSpan, Layout};

/// Host-assigned request id, unique for the life of the process.
pub type RequestId = u64;

/// A tokenized generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// Prompt tokens (BOS and specials already applied).
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens to generate; `None` = until EOS, a stop word or the
    /// context is full.
    pub n_predict: Option<usize>,
    /// Stop strings (removed from the output).
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Top-N probabilities to report per generated token (0 = none).
    pub n_probs: usize,
    /// Report probabilities after the sampler chain instead of a raw
    /// softmax.
    pub post_sampling_probs: bool,
    /// Borrow the longest cached prefix (and offer this prompt's blocks to
    /// the cache).
    pub cache_prompt: bool,
    /// The slot it must run in (llama-server's `id_slot`; see
    /// `engine::pinning`).
    pub id_slot: Option<u32>,
    /// Passed to the scheduling policy; larger is more urgent.
    pub priority: i32,
    /// LoRA adapters (id, scale); requests with equal lists share a group.
    pub lora: Vec<(u32, f32)>,
    /// Report prompt progress ([`Event::Progress`]) as the prompt is
    /// processed.
    pub return_progress: bool,
    /// Context shift: prompt tokens never dropped (`None` = the whole
    /// prompt).
    pub n_keep: Option<usize>,
    /// Context shift: tokens dropped at once (0 = half of what follows
    /// `n_keep`).
    pub n_discard: usize,
    /// What the output must match (structured outputs, tool calls).
    pub grammar: Option<Grammar>,
    /// Image segments of the prompt (M-RoPE targets): each holds
    /// `nx × ny` cells of the prompt, which carry placeholder ids (see
    /// [`GenerationRequest::push_image`]).
    pub images: Vec<ImageInput>,
}

/// Embedding rows positioned as an image (an encoder's output).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageInput {
    /// The prompt cell of its first row.
    pub start: usize,
    pub nx: u32,
    pub ny: u32,
    /// `nx × ny` rows of the model's hidden size, row-major.
    pub embeddings: std::sync::Arc<[f32]>,
}

/// Placeholder ids of image rows have this bit set (no vocabulary is that
/// large); the rest is a hash of the image's content and the row, so equal
/// images share cached prefixes and different ones never do.
pub const IMAGE_ROW: u32 = 1 << 31;

impl ImageInput {
    /// The prompt ids standing for its rows.
    pub fn placeholders(&self) -> Vec<u32> {
        // FNV-1a over the grid and the embedding bits.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |value: u32| {
            for byte in value.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        mix(self.nx);
        mix(self.ny);
        self.embeddings.iter().for_each(|value| mix(value.to_bits()));
        (0..self.nx * self.ny)
            .map(|row| {
                let spread = (hash ^ u64::from(row)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                IMAGE_ROW | (spread >> 33) as u32
            })
            .collect()
    }
}

impl GenerationRequest {
    /// A request with llama-server's defaults.
    pub fn new(prompt: Vec<u32>) -> Self {
        GenerationRequest {
            prompt,
            sampling: SamplingParams::default(),
            n_predict: None,
            stop: Vec::new(),
            ignore_eos: false,
            n_probs: 0,
            post_sampling_probs: false,
            cache_prompt: true,
            id_slot: None,
            priority: 0,
            lora: Vec::new(),
            return_progress: false,
            n_keep: Some(0),
            n_discard: 0,
            grammar: None,
            images: Vec::new(),
        }
    }

    /// Append an image of `nx × ny` embedding rows to the prompt.
    pub fn push_image(&mut self, nx: u32, ny: u32, embeddings: Vec<f32>) {
        let image = ImageInput { start: self.prompt.len(), nx, ny, embeddings: embeddings.into() };
        self.prompt.extend(image.placeholders());
        self.images.push(image);
    }

    /// The cells' layout (positions); `None` if the images overlap or are
    /// empty.
    pub fn layout(&self) -> Option<Layout> {
        Layout::new(
            self.images.iter().map(|image| ImageSpan { start: image.start, nx: image.nx, ny: image.ny }).collect(),
        )
    }

    /// Whether every image's cells carry its placeholders (hashes the
    /// embeddings: checked once, when the request is submitted).
    pub fn images_match_prompt(&self) -> bool {
        self.images.iter().all(|image| {
            let end = image.start + (image.nx * image.ny) as usize;
            self.prompt.get(image.start..end).is_some_and(|ids| ids == image.placeholders())
        })
    }

    /// The embedding row of prompt cell `cell`, if it is an image row.
    pub fn image_row(&self, cell: usize, n_embd: usize) -> Option<&[f32]> {
        let image = self
            .images
            .iter()
            .find(|image| (image.start..image.start + (image.nx * image.ny) as usize).contains(&cell))?;
        let row = cell - image.start;
        image.embeddings.get(row * n_embd..(row + 1) * n_embd)
    }
}

/// Probabilities around one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenProbs {
    /// The chosen token's probability (from the same distribution as `top`).
    pub chosen: TokenProb,
    /// The most likely tokens, most likely first.
    pub top: Vec<TokenProb>,
    /// Whether these are post-sampling probabilities.
    pub post_sampling: bool,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Text this token releases: empty while an incomplete UTF-8 character
    /// or a possible stop-string prefix is held back; may include text
    /// held back from earlier tokens.
    pub text: String,
    pub probs: Option<TokenProbs>,
}

/// Why generation stopped (llama-server's `stop_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopType {
    /// Not stopped normally (cancelled).
    None,
    Eos,
    Word,
    Limit,
}

impl StopType {
    pub fn as_str(self) -> &'static str {
        match self {
            StopType::None => "none",
            StopType::Eos => "eos",
            StopType::Word => "word",
            StopType::Limit => "limit",
        }
    }
}

/// Timings of a finished request (llama-server's `timings`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Timings {
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub draft_n: usize,
    pub draft_n_accepted: usize,
}

/// The end of a successful request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub stop_type: StopType,
    /// The stop string that matched (empty otherwise).
    pub stopping_word: String,
    /// Held-back text released at the end (never part of a stop string).
    pub text: String,
    /// The context filled up before any other stop.
    pub truncated: bool,
    pub tokens_predicted: usize,
    pub tokens_evaluated: usize,
    pub tokens_cached: usize,
    pub id_slot: u32,
    pub timings: Timings,
}

/// Why a request failed inside the engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The scheduling policy failed closed, or the engine is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// The request cannot fit (prompt longer than the context, no KV blocks).
    #[error("{0}")]
    ResourceExhausted(String),
    /// An internal failure.
    #[error("{0}")]
    Internal(String),
    /// The client left too much of its stream unread (see
    /// `engine::delivery`).
    #[error("{0}")]
    ClientBehind(String),
}

/// How far a request's prompt is (llama-server's `prompt_progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Prompt tokens.
    pub total: usize,
    /// Of which borrowed from the prefix cache.
    pub cache: usize,
    /// Of which in the KV cache now (cached ones included).
    pub processed: usize,
    /// Since the request got its slot.
    pub time_ms: u64,
}

/// What the engine tells a request's owner.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request left the queue and got a slot.
    Started {
        id_slot: u32,
    },
    /// Its prompt got this far: once when it gets its slot, then after
    /// every step that processed some of it (only if it asked,
    /// [`GenerationRequest::return_progress`]).
    Progress(Progress),
    Token(TokenEvent),
    Done(Completion),
    Failed(EngineError),
}
