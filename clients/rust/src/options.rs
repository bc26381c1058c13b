//! The settings of a [`RateLimit`](crate::RateLimit), checked without I/O.

use crate::breaker::Breaker;
use crate::error::{Error, Result};
use crate::request::Backend;

/// The settings of a [`RateLimit`](crate::RateLimit).
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The bound of every call, in ms (default 5). A decision never waits
    /// longer than this plus scheduling slack.
    pub timeout_ms: u64,
    /// Which backend (default: detected).
    pub backend: Backend,
    /// The breaker's settings.
    pub breaker: Breaker,
    /// Strict mode: `WAIT` after each call that can grant (default off).
    pub strict: Option<Strict>,
}

impl Default for Options {
    fn default() -> Options {
        Options { timeout_ms: 5, backend: Backend::Auto, breaker: Breaker::default(), strict: None }
    }
}

/// Strict mode (clients/DESIGN.md, "Strict mode"): each call that can
/// grant (not a refund, not a dry run) goes in one pipeline with
/// `WAIT replicas ms`, and units it granted count only when at least
/// `replicas` replicas acknowledged them; otherwise the call is a failure
/// (`unreplicated`): the breaker counts it and the panic limits decide. A
/// denial needs no acknowledgement. Not on a cluster (refused before the
/// first call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strict {
    /// Replicas that must acknowledge a grant (at least 1; set it to every
    /// replica Sentinel may promote).
    pub replicas: u64,
    /// WAIT's timeout in ms (default ⌊0.8 × `timeout_ms`⌋): at least 1 and
    /// below `timeout_ms`.
    pub wait_ms: Option<u64>,
}

impl Default for Strict {
    fn default() -> Strict {
        Strict { replicas: 1, wait_ms: None }
    }
}

impl Options {
    /// Refuses settings out of range; strict mode's (replicas, WAIT's ms).
    pub(crate) fn check(&self) -> Result<Option<(u64, u64)>> {
        if self.timeout_ms == 0 {
            return Err(Error::Invalid("timeout_ms must be >= 1".into()));
        }
        self.breaker.check()?;
        let Some(st) = self.strict else { return Ok(None) };
        if st.replicas == 0 {
            return Err(Error::Invalid("strict: replicas must be >= 1".into()));
        }
        let wait = st.wait_ms.unwrap_or(self.timeout_ms * 4 / 5);
        if wait == 0 || wait >= self.timeout_ms {
            return Err(Error::Invalid(format!(
                "strict: WAIT's timeout ({wait} ms) must be >= 1 and below timeout_ms ({})",
                self.timeout_ms
            )));
        }
        Ok(Some((st.replicas, wait)))
    }
}
