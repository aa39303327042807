//! sluice's models: the GGUF reader, hyper-parameters, tokenizers, chat
//! templates, the model families and their forward passes, computed through
//! a [`Backend`](sluice_kernels::backend::Backend), and vision towers.
//!
//! The engine and the drafters see a model only through [`Model`] and its
//! [`Context`]s, which name no device: the backend a model was loaded on
//! (the server's start-up picks it) does the arithmetic.
//!
//! What the layers above use:
//! - loading: [`Transformer::load`] (or `from_file`, `with_adapters`) gives a
//!   [`Model`]; [`LoadError`] says why not;
//! - running: [`Model::context`] → [`Context::forward`] over a
//!   [`batch::Batch`] (built by [`batch::Layout`] or
//!   [`batch::forward_in_parts`]), giving a [`ForwardOutput`] or a
//!   [`ForwardError`]; [`session::Session`] runs one sequence for the CLI;
//! - reading files: [`gguf::GgufFile`] (a split model's shards as one),
//!   [`hparams::HParams`], [`dflash::DflashParams`], and
//!   [`inspect::summarize`] (a file's family and layer kinds);
//! - text: [`tokenizer::Tokenizer`] and [`chat_template::ChatTemplate`];
//! - images: [`vision`] (preprocessing and the [`vision::Encoder`] seam).
//!
//! Inside, a family is one file in `families/` declaring its layers'
//! kinds (`layer.rs`), composed from the shared blocks of `blocks/`
//! (docs/architecture.md, "Model families and layers").

pub mod batch;
mod blocks;
pub mod chat_template;
pub mod dflash;
mod families;
mod forward;
pub mod gguf;
pub mod hparams;
pub mod inspect;
mod layer;
mod lora;
mod model;
mod recurrent;
mod rope;
pub mod session;
pub mod tokenizer;
mod transformer;
pub mod vision;
mod weights;
pub mod window;

pub use batch::{Context, ForwardError, ForwardOutput, StateSnapshot};
pub use lora::AdapterInfo;
pub use model::Model;
pub use transformer::Transformer;
pub use weights::LoadError;
