//! Why a request gets no decision: one error type for the plan, the
//! backend and the service.

/// Why a request gets no decision (a gRPC error; `/json` answers 400, as
/// envoyproxy/ratelimit's does for any error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceError {
    /// The request is malformed or asks for what is not supported.
    Invalid(String),
    /// Redis could not decide within the bound (timeout, connection, breaker open).
    Unavailable(String),
    /// Anything else (a Redis error reply).
    Internal(String),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Invalid(m) | ServiceError::Unavailable(m) | ServiceError::Internal(m) => f.write_str(m),
        }
    }
}
