//! Images into a prompt: a Qwen2-VL-family vision tower loaded from a
//! projector (mmproj) file, the preprocessing its images need, and its
//! forward pass on the text model's backend. The engine places the output
//! rows with M-RoPE positions (`engine::request::ImageInput`).

pub mod image;
mod projector;
mod tower;

pub use projector::{Projector, ProjectorInfo, ProjectorKind, Windows};
pub use tower::{EncodeError, Encoded};

use image::Prepared;
use sluice_kernels::backend::Backend;

/// A loaded tower, whatever its backend.
pub trait Encoder: Send + Sync {
    fn info(&self) -> &ProjectorInfo;

    /// The rows of one prepared image.
    fn encode(&self, image: &Prepared) -> Result<Encoded, EncodeError>;
}

impl<B: Backend> Encoder for Projector<B> {
    fn info(&self) -> &ProjectorInfo {
        Projector::info(self)
    }

    fn encode(&self, image: &Prepared) -> Result<Encoded, EncodeError> {
        Projector::encode(self, image)
    }
}
