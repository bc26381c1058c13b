//! The token bucket as an exact rational level.

use super::{ceil_ms, wait_i64};
use crate::tokenbucket::{Params, State};
use crate::Decision;

/// The level is `num / d` tokens, `d` the period (µs) it was written under;
/// the bucket regains `rate / P` tokens per µs (`P` = the call's period in
/// µs) up to `capacity`. On a period change the fractional part is rounded
/// down to a multiple of `1 / P`, the documented quantization.
#[derive(Clone, Debug)]
pub struct Bucket {
    pub num: u128,
    pub d: u128,
    /// Instant of the last write, µs.
    pub last: u64,
    /// No state: a full bucket.
    pub fresh: bool,
}

impl Default for Bucket {
    fn default() -> Bucket {
        Bucket { num: 0, d: 1, last: 0, fresh: true }
    }
}

/// Units per token under `p`: the period in µs.
fn per_token(p: &Params) -> u128 {
    u128::from(p.period_ms) * 1000
}

impl Bucket {
    /// The bucket a stored state describes.
    pub fn from_state(s: &State) -> Bucket {
        if s.den == 0 {
            return Bucket::default();
        }
        Bucket {
            num: u128::from(s.tokens) * u128::from(s.den) + u128::from(s.frac),
            d: u128::from(s.den),
            last: s.last_us,
            fresh: false,
        }
    }

    /// (level in units of `1 / P` token, instant read at) at `now`: the
    /// stored level rescaled to `P`, plus `rate` per µs since the last
    /// write, capped at `capacity × P`. A clock behind the last write reads
    /// the bucket at the last write.
    pub fn level(&self, p: &Params, now: u64) -> (u128, u64) {
        let d = per_token(p);
        let full = u128::from(p.capacity) * d;
        if self.fresh {
            return (full, now);
        }
        let at = now.max(self.last);
        let whole = self.num / self.d;
        let frac = (self.num % self.d) * d / self.d;
        let refill = u128::from(at - self.last) * u128::from(p.rate);
        ((whole * d + frac + refill).min(full), at)
    }

    /// Whole tokens a call could take at `now`.
    pub fn avail(&self, p: &Params, now: u64) -> u64 {
        u64::try_from(self.level(p, now).0 / per_token(p)).unwrap_or(u64::MAX)
    }

    /// The reply after taking `taken` tokens at `now` for a call that asked
    /// for `want`.
    pub fn reply(&self, p: &Params, now: u64, taken: u64, want: u64) -> Decision {
        let (level, at) = self.level(p, now);
        Self::reply_at(p, level, at, now, taken, want)
    }

    fn reply_at(p: &Params, level: u128, at: u64, now: u64, taken: u64, want: u64) -> Decision {
        let d = per_token(p);
        let after = level - u128::from(taken) * d;
        // The clock gap (the bucket is read at `at`, the waits are measured
        // from the real `now`).
        let gap = u128::from(at - now);
        // Smallest whole µs after which the level reaches `target`: the
        // deficit over the rate, rounded up, then to whole ms.
        let wait = |target: u128| -> u64 {
            if after >= target {
                0
            } else {
                ceil_ms((target - after).div_ceil(u128::from(p.rate)) + gap)
            }
        };
        Decision {
            granted: taken,
            limit: p.capacity,
            remaining: u64::try_from(after / d).unwrap_or(u64::MAX),
            retry_after_ms: if taken == want {
                0
            } else if want > p.capacity {
                -1
            } else {
                wait_i64(wait(u128::from(want) * d))
            },
            reset_after_ms: wait(u128::from(p.capacity) * d),
        }
    }

    /// Write the bucket after taking `taken` tokens at `now`.
    pub fn commit(&mut self, p: &Params, now: u64, taken: u64) {
        let (level, at) = self.level(p, now);
        *self = Bucket { num: level - u128::from(taken) * per_token(p), d: per_token(p), last: at, fresh: false };
    }

    /// One call: take `cost` if it fits, with PARTIAL what is there, else
    /// nothing; write when something was taken and `write` (not DRYRUN).
    pub fn call(&mut self, p: &Params, cost: u64, partial: bool, now: u64, write: bool) -> Decision {
        let avail = self.avail(p, now);
        let g = if cost <= avail {
            cost
        } else if partial {
            avail
        } else {
            0
        };
        let dec = self.reply(p, now, g, cost);
        if write && g > 0 {
            self.commit(p, now, g);
        }
        dec
    }

    /// `REFUND n`: `n` tokens back, up to the capacity. Element 1 is the
    /// whole tokens that came back; the reply is for a following call of
    /// `want`. Written only when something came back; fresh when full.
    pub fn refund(&mut self, p: &Params, now: u64, n: u64, want: u64) -> Decision {
        let d = per_token(p);
        let (level, at) = self.level(p, now);
        let new = (level + u128::from(n) * d).min(u128::from(p.capacity) * d);
        let mut dec = Self::reply_at(p, new, at, now, 0, want);
        dec.granted = u64::try_from(new / d - level / d).unwrap_or(u64::MAX);
        if dec.granted > 0 {
            *self = Bucket { num: new, d, last: at, fresh: dec.reset_after_ms == 0 };
        }
        dec
    }
}
