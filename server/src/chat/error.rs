//! Why a request's chat input cannot be assembled. Each kind is one answer
//! of the API (the HTTP layer maps it to its status and error type); the
//! message names the field the client must fix.

/// A chat assembly error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is wrong (400).
    #[error("{0}")]
    Invalid(String),
    /// A feature sluice does not implement yet (501); the text names it.
    #[error("{0} is not supported by sluice yet")]
    Unsupported(String),
    /// The prompt cannot fit the context: it has at least `least` tokens,
    /// found without tokenizing it whole (400, as the engine would refuse
    /// it).
    #[error(
        "the request exceeds the available context size (at least {least} prompt tokens, found without \
         tokenizing the whole text; context {n_ctx})"
    )]
    ExceedsContext { least: usize, n_ctx: usize },
    /// Other large texts hold the tokenizer (503; worth a retry).
    #[error(
        "the server is tokenizing other large texts (server.limits.tokenizing_mib); this one ({kib} KiB) \
         waited {waited_s} s for its turn"
    )]
    Busy { kib: usize, waited_s: u64 },
    /// The server failed at its own part (500), such as the vision tower.
    #[error("{0}")]
    Server(String),
}

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }
}
