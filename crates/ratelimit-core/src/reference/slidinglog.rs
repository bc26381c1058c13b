//! The sliding log as a plain list of grants.

use super::wait_i64;
use crate::slidinglog::Params;
use crate::Decision;

/// The grants `(time µs, units)`, oldest first, one entry per distinct
/// time (a grant at the newest entry's time adds to it). Sums in `i128`,
/// so no input overflows.
#[derive(Clone, Debug, Default)]
pub struct Log {
    pub log: Vec<(u64, u128)>,
}

/// µs to ms, rounded up (`us` may be anything).
fn ceil_ms(us: i128) -> i128 {
    (us + 999).div_euclid(1000)
}

impl Log {
    /// A log holding `entries` (e.g. read back from an encoding).
    pub fn from_entries(entries: &[(u64, u64)]) -> Log {
        Log { log: entries.iter().map(|&(t, u)| (t, u128::from(u))).collect() }
    }

    /// The entries with their units as `u64`.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        self.log.iter().map(|&(t, u)| (t, u64::try_from(u).unwrap_or(u64::MAX))).collect()
    }

    /// The instant a call at `now` reads the log at: `now`, or the newest
    /// entry when the clock is behind it.
    pub fn now_eff(&self, now: u64) -> u64 {
        self.log.last().map_or(now, |&(t, _)| now.max(t))
    }

    /// An entry at `t` counts at `now` iff `now − W < t`.
    pub fn in_window(t: u64, now: u64, window_ms: u64) -> bool {
        i128::from(now) - i128::from(window_ms) * 1000 < i128::from(t)
    }

    fn live(&self, now: u64, window_ms: u64) -> Vec<(u64, u128)> {
        self.log.iter().copied().filter(|&(t, _)| Self::in_window(t, now, window_ms)).collect()
    }

    /// Units in the window at `now` (read at `now_eff`).
    pub fn used(&self, window_ms: u64, now: u64) -> u128 {
        let at = self.now_eff(now);
        self.live(at, window_ms).iter().map(|&(_, u)| u).sum()
    }

    /// Units a call at `now` could take.
    pub fn avail(&self, p: &Params, now: u64) -> u64 {
        let free = i128::from(p.limit) - self.used(p.window_ms, now) as i128;
        u64::try_from(free.max(0)).unwrap_or(u64::MAX)
    }

    /// One call, not written: take `cost` if it fits, with PARTIAL what is
    /// there, else nothing.
    pub fn decide(&self, p: &Params, cost: u64, partial: bool, now: u64) -> Decision {
        let avail = self.avail(p, now);
        let granted = if cost <= avail {
            cost
        } else if partial {
            avail
        } else {
            0
        };
        self.reply(p, now, granted, cost)
    }

    /// The reply after taking `taken` units at `now` for a call that asked
    /// for `want`. The wait for `want` walks the log (with this grant
    /// appended) from the oldest entry until the units that will have left
    /// the window cover the excess: the call fits once that entry leaves.
    pub fn reply(&self, p: &Params, now_real: u64, taken: u64, want: u64) -> Decision {
        self.reply_with(p, now_real, taken, want, taken == want)
    }

    /// The reply after a FORCE call took `taken` units (past the limit),
    /// for a following call of `want`: its wait, 0 when it fits.
    pub fn reply_forced(&self, p: &Params, now_real: u64, taken: u64, want: u64) -> Decision {
        self.reply_with(p, now_real, taken, want, false)
    }

    /// FORCE can take `units` at `now`: the units in the window stay at
    /// most 2^53 − 1.
    pub fn can_force(&self, p: &Params, now: u64, units: u64) -> bool {
        self.used(p.window_ms, now) + u128::from(units) <= u128::from(crate::MAX_ARG)
    }

    /// `COST n FORCE`: one entry of all `cost` units, past the limit if need
    /// be (as without FORCE when the window would pass 2^53 − 1); the reply
    /// for a following call of `want`; written when `write` and `cost > 0`.
    pub fn force(&mut self, p: &Params, cost: u64, want: u64, now: u64, write: bool) -> Decision {
        let d = if self.can_force(p, now, cost) {
            self.reply_forced(p, now, cost, want)
        } else {
            self.decide(p, cost, false, now)
        };
        if write && d.granted > 0 {
            self.grant(p.window_ms, d.granted, now);
        }
        d
    }

    fn reply_with(&self, p: &Params, now_real: u64, taken: u64, want: u64, done: bool) -> Decision {
        let now = self.now_eff(now_real);
        let mut after = self.live(now, p.window_ms);
        let used: i128 = after.iter().map(|&(_, u)| u as i128).sum();
        let (limit, taken_i, want_i) = (i128::from(p.limit), i128::from(taken), i128::from(want));
        if taken > 0 {
            after.push((now, u128::from(taken)));
        }
        let w = i128::from(p.window_ms) * 1000;
        let leaves = |t: u64| ceil_ms(i128::from(t) + w - i128::from(now_real));
        let excess = used + taken_i + want_i - limit;
        let retry = if done {
            0
        } else if want_i > limit {
            -1
        } else if excess <= 0 {
            // `want` fits at the instant the call is read at.
            0
        } else {
            let mut acc = 0i128;
            let mut found = None;
            for &(t, u) in &after {
                acc += u as i128;
                if acc >= excess {
                    found = Some(t);
                    break;
                }
            }
            leaves(found.expect("model: the walk must reach the excess"))
        };
        Decision {
            granted: taken,
            limit: p.limit,
            remaining: u64::try_from((limit - used - taken_i).max(0)).unwrap_or(u64::MAX),
            retry_after_ms: i64::try_from(retry).unwrap_or(wait_i64(u64::MAX)),
            reset_after_ms: after.last().map_or(0, |&(t, _)| u64::try_from(leaves(t)).unwrap_or(u64::MAX)),
        }
    }

    /// Write a grant of `units` at `now`; entries that left the window go.
    pub fn grant(&mut self, window_ms: u64, units: u64, now: u64) {
        let now = self.now_eff(now);
        match self.log.last_mut() {
            Some((t, u)) if *t == now => *u += u128::from(units),
            _ => self.log.push((now, u128::from(units))),
        }
        self.log = self.live(now, window_ms);
    }

    /// `REFUND n`: the newest units in the window go, at most `n`; written
    /// (the entries that left the window dropped) only when some went. The
    /// reply is for a following call of `want`, element 1 the units given
    /// back.
    pub fn refund(&mut self, p: &Params, now: u64, n: u64, want: u64) -> Decision {
        let at = self.now_eff(now);
        let mut after = self.live(at, p.window_ms);
        let mut left = u128::from(n);
        while left > 0 {
            let Some(last) = after.last_mut() else { break };
            let take = left.min(last.1);
            last.1 -= take;
            left -= take;
            if last.1 == 0 {
                after.pop();
            }
        }
        let given = n - u64::try_from(left).unwrap_or(n);
        if given > 0 {
            self.log = after;
        }
        let mut d = self.reply(p, now, 0, want);
        d.granted = given;
        d
    }
}
