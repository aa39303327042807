//! Models: the GGUF reader, hyper-parameters, tokenizers, chat templates and
//! the architectures' forward passes.

pub mod batch;
pub mod chat_template;
pub mod dflash;
pub mod gguf;
pub mod hparams;
pub mod kv;
pub mod session;
pub mod tokenizer;
pub mod transformer;
