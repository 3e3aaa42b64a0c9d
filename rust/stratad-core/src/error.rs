//! The one error type of the core.
//!
//! Every fallible function returns [`Error`]; the Python bindings map each
//! variant to one exception class of `stratad.errors` in a single place, so
//! the variants are kinds of failure a caller can act on, not sources.

/// Why a core operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An argument is out of range or malformed (`InvalidArgumentError`).
    #[error("{0}")]
    InvalidInput(String),
    /// Stored bytes failed to decode or to verify (`CorruptObjectError`).
    #[error("{0}")]
    Corrupt(String),
    /// Producing the output would exceed the caller's limit
    /// (`DecompressionLimitError`).
    #[error("output would exceed the limit of {limit} bytes")]
    TooLarge {
        /// The limit the caller set, in bytes.
        limit: u64,
    },
    /// A resource the library needs could not be had, e.g. a zstd context
    /// (`InternalError`).
    #[error("{0}")]
    Internal(String),
}

/// `Result` with the core's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidInput(message.into())
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Error::Corrupt(message.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_problem() {
        assert_eq!(Error::invalid("bad level").to_string(), "bad level");
        assert_eq!(Error::corrupt("bad magic").to_string(), "bad magic");
        assert_eq!(
            Error::TooLarge { limit: 10 }.to_string(),
            "output would exceed the limit of 10 bytes"
        );
        assert_eq!(Error::Internal("x".into()).to_string(), "x");
    }
}
