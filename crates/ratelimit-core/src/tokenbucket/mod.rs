//! RL.TOKENBUCKET — the token bucket, exact, pure (no Redis symbols).
//!
//! # Algorithm
//!
//! The bucket holds at most `capacity` tokens and regains `rate` tokens every
//! `period_ms`, continuously. With `P = period_ms × 1000` (µs), one token is
//! worth `P` *units*, and the bucket regains exactly `rate` units per µs. The
//! level is therefore an integer number of units and refill is integer
//! arithmetic with no rounding at all:
//!
//! ```text
//! level(now) = min(capacity × P, level(last) + (now − last) × rate)
//! ```
//!
//! The state stores the level as whole tokens plus a fraction `frac / den`
//! (`den` = the `P` it was written under, `frac < den`), and the time of the
//! last write. When a call arrives with another `period_ms` (a runtime rule
//! change) the fraction is rescaled to the new denominator, rounding down:
//! at most one unit (1/P of a token, i.e. under one µs of refill) is lost,
//! never gained. Whole tokens carry over unchanged and are capped at the new
//! capacity.
//!
//! # Why it is exact
//!
//! Refill is counted in units (1/P token), so it is integer arithmetic
//! with no rounding. The only roundings are the rescaling above (down, by
//! under one unit) and the waits in the reply, rounded up: to the first
//! whole µs at which the missing units have refilled, then to whole ms.
//! Products are computed in `u128`: `capacity × P < 2^53 × 2^63 = 2^116`,
//! `Δt × rate < 2^64 × 2^53 = 2^117`, so nothing can overflow.
//!
//! # Parts
//!
//! The state's binary encoding and its compact two-word in-memory form are
//! in [`encoding`]; the tests (hand-computed cases, and random sequences
//! against the exact rational model) in `tests.rs`.

pub mod encoding;
#[cfg(test)]
mod tests;

pub use encoding::ENCODING_VERSION;

use crate::{div_ceil_u128, div_rem_u128, ms_to_us, to_i64, us_to_ms_ceil, Decision};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub capacity: u64,
    pub rate: u64,
    pub period_ms: u64,
}

impl Params {
    /// From a parsed call's numbers (`args::Call::nums`, `LimitSpec::nums`):
    /// `capacity rate period_ms`. Every caller (the module, RL.MULTI, the
    /// fuzzer) builds the parameters here.
    #[inline]
    pub const fn from_nums([capacity, rate, period_ms]: [u64; 3]) -> Params {
        Params { capacity, rate, period_ms }
    }
}

/// Stored state of a bucket that is not full. `den == 0` means "no state"
/// (a fresh, full bucket); it is never stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Whole tokens.
    pub tokens: u64,
    /// Fractional token, in units of `1/den` token; `frac < den`.
    pub frac: u64,
    /// `period_ms × 1000` of the call that wrote this state.
    pub den: u64,
    /// Time of the write, µs since the Unix epoch.
    pub last_us: u64,
}

impl State {
    pub fn is_fresh(&self) -> bool {
        self.den == 0
    }
}

/// A bucket read at one instant under one call's parameters: the level
/// after refill. The single command and every token-bucket limit of
/// RL.MULTI decide through it: [`View::available`] says how many tokens a
/// call could take, [`View::answer`] is the reply after taking some, and
/// [`View::state_after`] the state to store.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Level in units (`den` units = one token), `≤ full`.
    level: u128,
    /// Units per token: `period_ms × 1000`.
    den: u128,
    /// `capacity × den`.
    full: u128,
    rate: u128,
    capacity: u64,
    /// The instant the state is read at: `max(now, last write)`.
    now_eff: u64,
    /// µs from the real clock reading to `now_eff` (clock stepped back).
    gap: u128,
}

impl View {
    #[inline]
    pub fn at(state: &State, p: &Params, now_us: u64) -> View {
        let den = u128::from(ms_to_us(p.period_ms).max(1));
        let rate = u128::from(p.rate);
        let full = u128::from(p.capacity) * den;
        // Current level in units, after refill.
        let (level, now_eff) = if state.is_fresh() {
            (full, now_us)
        } else {
            let now_eff = now_us.max(state.last_us);
            // Rescale the fraction if the period changed (rounding down).
            let frac = if u128::from(state.den) == den {
                u128::from(state.frac)
            } else {
                u128::from(state.frac) * den / u128::from(state.den)
            };
            let stored = u128::from(state.tokens) * den + frac;
            let refill = u128::from(now_eff - state.last_us) * rate;
            (stored.saturating_add(refill).min(full), now_eff)
        };
        View { level, den, full, rate, capacity: p.capacity, now_eff, gap: u128::from(now_eff - now_us) }
    }

    /// Whole tokens a call could take now (`≤ capacity`).
    #[inline]
    pub fn available(&self) -> u64 {
        u64::try_from(div_rem_u128(self.level, self.den).0).unwrap_or(u64::MAX)
    }

    /// Milliseconds, rounded up, until the level reaches `target` units.
    /// Waits are measured from the real `now_us`: while the clock is behind
    /// the stored time, the refill resumes only once it catches up, so the
    /// gap is part of every wait (and of the key's TTL).
    #[inline]
    fn wait_ms(&self, level: u128, target: u128) -> u64 {
        let deficit = target.saturating_sub(level);
        if deficit == 0 {
            return 0;
        }
        us_to_ms_ceil(div_ceil_u128(deficit, self.rate).saturating_add(self.gap))
    }

    /// The reply after taking `taken` tokens (`≤ available()`) for a call
    /// that asked for `want`: retry_after_ms is 0 when it got them all, −1
    /// when `want` exceeds the capacity, else the time until `want` tokens
    /// are there again after this take.
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        let after = self.level.saturating_sub(u128::from(taken) * self.den);
        let retry_after_ms = if taken == want {
            0
        } else if want > self.capacity {
            -1
        } else {
            to_i64(self.wait_ms(after, u128::from(want) * self.den))
        };
        Decision {
            granted: taken,
            limit: self.capacity,
            remaining: u64::try_from(div_rem_u128(after, self.den).0).unwrap_or(u64::MAX),
            retry_after_ms,
            reset_after_ms: self.wait_ms(after, self.full),
        }
    }

    /// The state to store after taking `taken` tokens (never fresh when
    /// `taken > 0`).
    #[inline]
    pub fn state_after(&self, taken: u64) -> State {
        let after = self.level.saturating_sub(u128::from(taken) * self.den);
        let (tokens, frac) = div_rem_u128(after, self.den);
        State {
            tokens: u64::try_from(tokens).unwrap_or(u64::MAX),
            frac: u64::try_from(frac).unwrap_or(0),
            den: u64::try_from(self.den).unwrap_or(0),
            last_us: self.now_eff,
        }
    }

    /// [`View::answer`] and [`View::state_after`] of one take (`taken ≤
    /// available()` of `want`) at once: they share the level after the take
    /// and its division into tokens (RL.MULTI's fast path).
    #[inline(always)]
    pub fn take(&self, taken: u64, want: u64) -> (Decision, State) {
        let after = self.level.saturating_sub(u128::from(taken) * self.den);
        let (tokens, frac) = div_rem_u128(after, self.den);
        let tokens = u64::try_from(tokens).unwrap_or(u64::MAX);
        let retry_after_ms = if taken == want {
            0
        } else if want > self.capacity {
            -1
        } else {
            to_i64(self.wait_ms(after, u128::from(want) * self.den))
        };
        let d = Decision {
            granted: taken,
            limit: self.capacity,
            remaining: tokens,
            retry_after_ms,
            reset_after_ms: self.wait_ms(after, self.full),
        };
        let s = State {
            tokens,
            frac: u64::try_from(frac).unwrap_or(0),
            den: u64::try_from(self.den).unwrap_or(0),
            last_us: self.now_eff,
        };
        (d, s)
    }

    /// The bucket after `n` tokens are given back: min(capacity, tokens + n).
    #[inline]
    pub fn refunded(&self, n: u64) -> View {
        View { level: self.level.saturating_add(u128::from(n) * self.den).min(self.full), ..*self }
    }

    /// Nothing taken: the bucket is full.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.level >= self.full
    }
}

/// `(state, params, cost, now) -> (decision, new state)`. Pure. The new state
/// is what the key must hold if the call is written (granted > 0, not
/// DRYRUN); it is never fresh then.
#[inline]
pub fn step(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    let v = View::at(state, p, now_us);
    let granted = crate::grant_size(v.available(), cost, partial);
    (v.answer(granted, cost), v.state_after(granted))
}

/// `REFUND n`: the bucket gets `n` tokens back, up to its capacity.
/// Returns the reply (element 1: the whole tokens given back, 0 only when
/// the bucket was already full, then nothing changed) for a following call
/// of `want` tokens, and the state to store. When the reply's
/// `reset_after_ms` is 0 the bucket is full again: the key is deleted, not
/// stored.
pub fn refund(state: &State, p: &Params, n: u64, want: u64, now_us: u64) -> (Decision, State) {
    let v = View::at(state, p, now_us);
    let after = v.refunded(n);
    let mut d = after.answer(0, want);
    d.granted = after.available().saturating_sub(v.available());
    (d, after.state_after(0))
}
