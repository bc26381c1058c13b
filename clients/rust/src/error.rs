//! The errors of this library, one enum.

/// Everything a call or a construction can fail with.
///
/// A Redis outage is not an error of a decision: a limiter answers it with
/// its panic limits (`Source::Panic`). `Unavailable` is what a call without
/// panic limits (`RateLimit::detect`, a refund) returns instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An argument out of its range (a policy, a key, a cost, a setting):
    /// refused at construction or before any call.
    #[error("{0}")]
    Invalid(String),
    /// The keys of one `all_of` call map to different cluster slots
    /// (refused before any call, on every deployment).
    #[error("{0}")]
    CrossSlot(String),
    /// The backend lacks what this call needs (RL.MULTI, the module when
    /// `Backend::Module` is forced).
    #[error("{0}")]
    Unsupported(String),
    /// Redis did not answer within the timeout, the connection failed, or
    /// the breaker is open.
    #[error("{0}")]
    Unavailable(String),
    /// Redis refused the call for a reason that is not an outage (a key of
    /// another type, bad arguments): a bug to fix, not a reason to panic.
    #[error("Redis refused the call: {0}")]
    Reply(String),
    /// A reply of an unexpected shape.
    #[error("unexpected reply from Redis: {0}")]
    Protocol(String),
}

/// `Result` with this library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
