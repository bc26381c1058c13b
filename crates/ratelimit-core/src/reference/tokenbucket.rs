//! The token bucket as an exact rational level.

use super::{ceil_ms, wait_i64};
use crate::tokenbucket::{Params, State};
use crate::Decision;

/// The level is `num / d` tokens, `d` the period (µs) it was written under;
/// the bucket regains `rate / P` tokens per µs (`P` = the call's period in
/// µs) up to `capacity`. On a period change the fractional part is rounded
/// down to a multiple of `1 / P`, the documented quantization. `num` is
/// negative when a FORCE call left a debt: the whole tokens are then
/// negative (rounded towards −∞) and the fraction still in `0..1`.
#[derive(Clone, Debug)]
pub struct Bucket {
    pub num: i128,
    pub d: i128,
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
fn per_token(p: &Params) -> i128 {
    i128::from(p.period_ms) * 1000
}

impl Bucket {
    /// The bucket a stored state describes (negative whole tokens in debt).
    pub fn from_state(s: &State) -> Bucket {
        if s.den == 0 {
            return Bucket::default();
        }
        Bucket {
            num: i128::from(s.tokens as i64) * i128::from(s.den) + i128::from(s.frac),
            d: i128::from(s.den),
            last: s.last_us,
            fresh: false,
        }
    }

    /// (level in units of `1 / P` token, instant read at) at `now`: the
    /// stored level rescaled to `P`, plus `rate` per µs since the last
    /// write, capped at `capacity × P`. A clock behind the last write reads
    /// the bucket at the last write.
    pub fn level(&self, p: &Params, now: u64) -> (i128, u64) {
        let d = per_token(p);
        let full = i128::from(p.capacity) * d;
        if self.fresh {
            return (full, now);
        }
        let at = now.max(self.last);
        let whole = self.num.div_euclid(self.d);
        let frac = self.num.rem_euclid(self.d) * d / self.d;
        let refill = i128::from(at - self.last) * i128::from(p.rate);
        ((whole * d + frac + refill).min(full), at)
    }

    /// Whole tokens a call could take at `now` (0 in debt).
    pub fn avail(&self, p: &Params, now: u64) -> u64 {
        u64::try_from(self.level(p, now).0.div_euclid(per_token(p))).unwrap_or(0)
    }

    /// The reply after taking `taken` tokens at `now` for a call that asked
    /// for `want`.
    pub fn reply(&self, p: &Params, now: u64, taken: u64, want: u64) -> Decision {
        let (level, at) = self.level(p, now);
        Self::reply_at(p, level, at, now, taken, want, taken == want)
    }

    fn reply_at(p: &Params, level: i128, at: u64, now: u64, taken: u64, want: u64, done: bool) -> Decision {
        let d = per_token(p);
        let after = level - i128::from(taken) * d;
        // The clock gap (the bucket is read at `at`, the waits are measured
        // from the real `now`).
        let gap = u128::from(at - now);
        // Smallest whole µs after which the level reaches `target`: the
        // deficit over the rate, rounded up, then to whole ms.
        let wait = |target: i128| -> u64 {
            if after >= target {
                0
            } else {
                ceil_ms(((target - after) as u128).div_ceil(u128::from(p.rate)) + gap)
            }
        };
        Decision {
            granted: taken,
            limit: p.capacity,
            remaining: u64::try_from(after.div_euclid(d)).unwrap_or(0),
            retry_after_ms: if done {
                0
            } else if want > p.capacity {
                -1
            } else {
                wait_i64(wait(i128::from(want) * d))
            },
            reset_after_ms: wait(i128::from(p.capacity) * d),
        }
    }

    /// Write the bucket after taking `taken` tokens at `now` (past the
    /// level for FORCE).
    pub fn commit(&mut self, p: &Params, now: u64, taken: u64) {
        let (level, at) = self.level(p, now);
        *self = Bucket { num: level - i128::from(taken) * per_token(p), d: per_token(p), last: at, fresh: false };
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

    /// FORCE can take `units` at `now`: the whole tokens after it are at
    /// least −(2^53 − 1).
    pub fn can_force(&self, p: &Params, now: u64, units: u64) -> bool {
        let (level, _) = self.level(p, now);
        (level - i128::from(units) * per_token(p)).div_euclid(per_token(p)) >= -i128::from(crate::MAX_ARG)
    }

    /// The reply after a FORCE call took `taken` tokens (past the level),
    /// for a following call of `want`: its wait, 0 when it fits.
    pub fn reply_forced(&self, p: &Params, now: u64, taken: u64, want: u64) -> Decision {
        let (level, at) = self.level(p, now);
        Self::reply_at(p, level, at, now, taken, want, false)
    }

    /// `COST n FORCE`: all `cost` tokens, into debt if need be, unless the
    /// debt would pass 2^53 − 1 tokens (then as without FORCE); the reply
    /// for a following call of `want`. Written when something was taken
    /// and `write`.
    pub fn force(&mut self, p: &Params, cost: u64, want: u64, now: u64, write: bool) -> Decision {
        if !self.can_force(p, now, cost) {
            return self.call(p, cost, false, now, write);
        }
        let dec = self.reply_forced(p, now, cost, want);
        if write && cost > 0 {
            self.commit(p, now, cost);
        }
        dec
    }

    /// `REFUND n`: `n` tokens back, up to the capacity. Element 1 is the
    /// whole tokens that came back (debt repaid included); the reply is for
    /// a following call of `want`. Written only when something came back;
    /// fresh when full.
    pub fn refund(&mut self, p: &Params, now: u64, n: u64, want: u64) -> Decision {
        let d = per_token(p);
        let (level, at) = self.level(p, now);
        let new = (level + i128::from(n) * d).min(i128::from(p.capacity) * d);
        let mut dec = Self::reply_at(p, new, at, now, 0, want, want == 0);
        dec.granted = u64::try_from(new.div_euclid(d) - level.div_euclid(d)).unwrap_or(u64::MAX);
        if dec.granted > 0 {
            *self = Bucket { num: new, d, last: at, fresh: dec.reset_after_ms == 0 };
        }
        dec
    }
}
