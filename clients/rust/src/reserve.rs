//! Reserve, then settle (clients/DESIGN.md, "Reservations"): take an
//! estimate before the work, then give back what it did not use (`REFUND`)
//! or take what it used beyond the estimate (`COST n FORCE`, a debit past
//! the limit), once: `settle` consumes the handle.

use crate::client::Limiter;
use crate::decision::{Decision, Source};
use crate::error::Result;
use crate::request::Call;
use crate::transport::Connection;

/// What [`Limiter::reserve`] returns: the decision on the estimate, and
/// [`Reservation::settle`] once the real cost is known. Dropped unsettled,
/// it stays charged at its estimate (nothing is sent from `Drop`).
pub struct Reservation<C> {
    limiter: Limiter<C>,
    key: String,
    estimate: u64,
    decision: Decision,
}

impl<C> Reservation<C> {
    /// The decision on `limit(key, Call::cost(estimate))`.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The estimate was granted.
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }
}

impl<C: Connection> Reservation<C> {
    /// Settles with the real cost: `REFUND (estimate − actual)` when it
    /// cost less, `COST (actual − estimate) FORCE` when it cost more (taken
    /// even past the limit), nothing when equal, nor for a reservation that
    /// was denied or decided by the panic limits (nothing was taken on
    /// Redis). That call's decision, `None` when nothing was sent.
    pub async fn settle(self, actual: u64) -> Result<Option<Decision>> {
        crate::policy::check_int("actual", actual, 0)?;
        let d = &self.decision;
        if !d.allowed || !matches!(d.source, Source::Module | Source::Lua) {
            return Ok(None);
        }
        match actual.cmp(&self.estimate) {
            std::cmp::Ordering::Less => Ok(Some(self.limiter.refund(&self.key, self.estimate - actual).await?)),
            std::cmp::Ordering::Greater => {
                Ok(Some(self.limiter.limit(&self.key, Call::debit(actual - self.estimate)).await?))
            }
            std::cmp::Ordering::Equal => Ok(None),
        }
    }
}

impl<C: Connection> Limiter<C> {
    /// `limit(key, Call::cost(estimate))` as a [`Reservation`] to settle
    /// once the real cost is known.
    pub async fn reserve(&self, key: &str, estimate: u64) -> Result<Reservation<C>> {
        crate::policy::check_int("estimate", estimate, 1)?;
        let decision = self.limit(key, Call::cost(estimate)).await?;
        Ok(Reservation { limiter: self.clone(), key: key.to_owned(), estimate, decision })
    }
}
