//! RL.MULTI by the words of docs/contract.md: each limit on its own (its reference
//! model), the largest common grant found by counting down, all or nothing,
//! and the whole reply picked from the per-limit ones.

use super::concurrency::Leases;
use super::fixedwindow as fwm;
use super::slidingcounter::{self as scm, Search};
use super::slidinglog::Log;
use super::tokenbucket::Bucket;
use crate::multi::{Op, Params, Whole};
use crate::{fixedwindow as fw, slidingcounter as sc, Decision};

/// One limit of a call: its parameters and its model state.
#[derive(Clone, Debug)]
pub enum Limit {
    TokenBucket(crate::tokenbucket::Params, Bucket),
    SlidingLog(crate::slidinglog::Params, Log),
    SlidingCounter(sc::Params, sc::State),
    FixedWindow(fw::Params, fw::State),
    Concurrency(crate::concurrency::Params, Leases),
}

impl Limit {
    /// A fresh limit (no key) under `p`.
    pub fn fresh(p: &Params) -> Limit {
        match *p {
            Params::TokenBucket(p) => Limit::TokenBucket(p, Bucket::default()),
            Params::SlidingLog(p) => Limit::SlidingLog(p, Log::default()),
            Params::SlidingCounter(p) => Limit::SlidingCounter(p, sc::State::default()),
            Params::FixedWindow(p) => Limit::FixedWindow(p, fw::State::default()),
            Params::Concurrency(p) => Limit::Concurrency(p, Leases::default()),
        }
    }

    /// Units the limit could take at `now`.
    pub fn avail(&self, now: u64) -> u64 {
        match self {
            Limit::TokenBucket(p, m) => m.avail(p, now),
            Limit::SlidingLog(p, m) => m.avail(p, now),
            Limit::SlidingCounter(p, s) => scm::avail(s, p, now, Search::Bisect),
            // As much as a PARTIAL call of `limit` units is granted.
            Limit::FixedWindow(p, s) => fwm::decide(s, p, p.limit, true, now, Search::Bisect).0.granted,
            Limit::Concurrency(p, m) => m.room(p, now),
        }
    }

    /// The limit's reply after taking `taken` units for a call of `want`.
    pub fn reply(&self, now: u64, taken: u64, want: u64) -> Decision {
        match self {
            Limit::TokenBucket(p, m) => m.reply(p, now, taken, want),
            Limit::SlidingLog(p, m) => m.reply(p, now, taken, want),
            Limit::SlidingCounter(p, s) => scm::reply(s, p, now, taken, want, Search::Bisect).0,
            Limit::FixedWindow(p, s) => fwm::take(s, p, taken, want, now, Search::Bisect).0,
            Limit::Concurrency(p, m) => m.take(p, taken, want, now).0,
        }
    }

    /// FORCE can take `units` at `now` (its range holds the debt).
    pub fn can_force(&self, now: u64, units: u64) -> bool {
        let max = u128::from(crate::MAX_ARG);
        match self {
            Limit::TokenBucket(p, m) => m.can_force(p, now, units),
            Limit::SlidingLog(p, m) => m.can_force(p, now, units),
            Limit::SlidingCounter(p, s) => {
                scm::counts(s, u128::from(p.window_ms) * 1000, u128::from(now)).1 + u128::from(units) <= max
            }
            Limit::FixedWindow(p, s) => fwm::counted(s, p, u128::from(now / 1000)) + u128::from(units) <= max,
            Limit::Concurrency(..) => false,
        }
    }

    /// The reply after a FORCE call took `taken` units (past the limit),
    /// for a following call of `want`.
    pub fn reply_forced(&self, now: u64, taken: u64, want: u64) -> Decision {
        match self {
            Limit::TokenBucket(p, m) => m.reply_forced(p, now, taken, want),
            Limit::SlidingLog(p, m) => m.reply_forced(p, now, taken, want),
            Limit::SlidingCounter(p, s) => scm::reply_with(s, p, now, taken, want, Search::Bisect, false).0,
            Limit::FixedWindow(p, s) => fwm::take_with(s, p, taken, want, now, Search::Bisect, false).0,
            Limit::Concurrency(p, m) => m.take(p, taken, want, now).0,
        }
    }

    /// Write a take of `taken` units.
    pub fn commit(&mut self, now: u64, taken: u64) {
        match self {
            Limit::TokenBucket(p, m) => m.commit(p, now, taken),
            Limit::SlidingLog(p, m) => m.grant(p.window_ms, taken, now),
            Limit::SlidingCounter(p, s) => *s = scm::reply(s, p, now, taken, taken, Search::Bisect).1,
            Limit::FixedWindow(p, s) => *s = fwm::take(s, p, taken, taken, now, Search::Bisect).1,
            Limit::Concurrency(p, m) => *m = m.take(p, taken, taken, now).1,
        }
    }

    /// `REFUND n` on this limit (reply for a following call of `want`); a
    /// limit the refund leaves fresh is deleted, i.e. becomes no key.
    pub fn refund(&mut self, now: u64, n: u64, want: u64) -> Decision {
        let d = match self {
            Limit::TokenBucket(p, m) => m.refund(p, now, n, want),
            Limit::SlidingLog(p, m) => m.refund(p, now, n, want),
            Limit::SlidingCounter(p, s) => {
                let (d, after) = scm::refund(s, p, now, n, want, Search::Bisect);
                *s = after;
                d
            }
            Limit::FixedWindow(p, s) => {
                let (d, after) = fwm::refund(s, p, n, want, now, Search::Bisect);
                *s = after;
                d
            }
            Limit::Concurrency(p, m) => m.give_back(p, n, want, now),
        };
        if d.granted > 0 && d.reset_after_ms == 0 {
            *self = match self {
                Limit::TokenBucket(p, _) => Limit::TokenBucket(*p, Bucket::default()),
                Limit::SlidingLog(p, _) => Limit::SlidingLog(*p, Log::default()),
                Limit::SlidingCounter(p, _) => Limit::SlidingCounter(*p, sc::State::default()),
                Limit::FixedWindow(p, _) => Limit::FixedWindow(*p, fw::State::default()),
                Limit::Concurrency(p, _) => Limit::Concurrency(*p, Leases::default()),
            };
        }
        d
    }
}

/// One RL.MULTI call on the models: the per-limit replies (written when
/// the call writes) and the whole reply. Counts down from COST, so keep
/// COST small (a few thousand).
pub fn call(limits: &mut [Limit], weights: &[u64], op: Op, now: u64) -> (Whole, Vec<Decision>) {
    let per: Vec<Decision> = match op {
        Op::Take { cost, partial, dryrun } => {
            // The most requests every limit can take, counting down.
            let avail: Vec<u64> = limits.iter().map(|m| m.avail(now)).collect();
            let mut g = cost;
            while g > 0 && !avail.iter().zip(weights).all(|(&a, &w)| g * w <= a) {
                g -= 1;
            }
            if !partial && g != cost {
                g = 0;
            }
            let per = limits.iter().zip(weights).map(|(m, &w)| m.reply(now, g * w, cost * w)).collect();
            if g > 0 && !dryrun {
                for (m, &w) in limits.iter_mut().zip(weights) {
                    m.commit(now, g * w);
                }
            }
            per
        }
        Op::Force { cost, dryrun } => {
            if !limits.iter().zip(weights).all(|(m, &w)| m.can_force(now, cost * w)) {
                // As without FORCE.
                return call(limits, weights, Op::Take { cost, partial: false, dryrun }, now);
            }
            // Every limit takes COST × WEIGHT; each answers for one
            // following request (WEIGHT units).
            let per = limits.iter().zip(weights).map(|(m, &w)| m.reply_forced(now, cost * w, w)).collect();
            if cost > 0 && !dryrun {
                for (m, &w) in limits.iter_mut().zip(weights) {
                    m.commit(now, cost * w);
                }
            }
            per
        }
        Op::Refund(n) => limits.iter_mut().zip(weights).map(|(m, &w)| m.refund(now, n * w, w)).collect(),
    };
    (whole(&per, weights, op), per)
}

/// The whole reply: the binding limit's fields (fewest requests left, or
/// the longest wait when not granted), element 1 by the call's kind.
pub fn whole(per: &[Decision], weights: &[u64], op: Op) -> Whole {
    let n = per.len();
    let fewest = (0..n).min_by_key(|&i| (per[i].remaining / weights[i], i)).unwrap();
    let never = per.iter().any(|d| d.retry_after_ms == -1);
    let longest = if never { -1 } else { per.iter().map(|d| d.retry_after_ms).max().unwrap() };
    let pick = |b: usize, allowed: u64, retry: i64| Whole {
        allowed,
        limit: per[b].limit,
        remaining: per[b].remaining,
        retry_after_ms: retry,
        reset_after_ms: per[b].reset_after_ms,
        binding: b,
    };
    match op {
        Op::Refund(units) => pick(fewest, if per.iter().any(|d| d.granted > 0) { units } else { 0 }, longest),
        // Granted; the wait is the longest for one following request.
        Op::Force { .. } => pick(fewest, 1, longest),
        Op::Take { cost, partial, .. } => {
            let g = per[0].granted / weights[0];
            let allowed = if partial { g } else { u64::from(g == cost) };
            if g == cost {
                pick(fewest, allowed, 0)
            } else {
                let b = (0..n).find(|&i| per[i].retry_after_ms == longest).unwrap();
                pick(b, allowed, longest)
            }
        }
    }
}

/// A take whose limits have `flags` ([`crate::multi::CHECK`],
/// [`crate::multi::SHADOW`]), by the words of docs/contract.md: the most
/// requests `g ≤ COST` every limit without SHADOW can take, counting down
/// (all or nothing unless PARTIAL; `COST` when every limit has SHADOW);
/// a CHECK limit takes nothing, a SHADOW limit `g × WEIGHT` when that fits
/// it, else nothing, any other `g × WEIGHT`; each replies for what it took
/// of `COST × WEIGHT`, and what took units is written (unless DRYRUN). The
/// whole reply is picked among the limits without SHADOW (all when every
/// limit has it).
pub fn call_flagged(
    limits: &mut [Limit],
    weights: &[u64],
    flags: &[u8],
    (cost, partial, dryrun): (u64, bool, bool),
    now: u64,
) -> (Whole, Vec<Decision>) {
    use crate::multi::{CHECK, SHADOW};
    let n = limits.len();
    let avail: Vec<u64> = limits.iter().map(|m| m.avail(now)).collect();
    let all_shadow = flags.iter().all(|f| f & SHADOW != 0);
    let decides: Vec<usize> = (0..n).filter(|&i| all_shadow || flags[i] & SHADOW == 0).collect();
    let mut g = cost;
    if !all_shadow {
        while g > 0 && !decides.iter().all(|&i| g * weights[i] <= avail[i]) {
            g -= 1;
        }
        if !partial && g != cost {
            g = 0;
        }
    }
    let taken: Vec<u64> = (0..n)
        .map(|i| {
            let t = g * weights[i];
            if flags[i] & CHECK != 0 || (flags[i] & SHADOW != 0 && t > avail[i]) {
                0
            } else {
                t
            }
        })
        .collect();
    let per: Vec<Decision> = (0..n).map(|i| limits[i].reply(now, taken[i], cost * weights[i])).collect();
    if !dryrun {
        for i in 0..n {
            if taken[i] > 0 {
                limits[i].commit(now, taken[i]);
            }
        }
    }
    let pick = |b: usize, retry: i64| Whole {
        allowed: if partial { g } else { u64::from(g == cost) },
        limit: per[b].limit,
        remaining: per[b].remaining,
        retry_after_ms: retry,
        reset_after_ms: per[b].reset_after_ms,
        binding: b,
    };
    let whole = if g == cost {
        pick(*decides.iter().min_by_key(|&&i| (per[i].remaining / weights[i], i)).unwrap(), 0)
    } else {
        let never = decides.iter().any(|&i| per[i].retry_after_ms == -1);
        let longest = if never { -1 } else { decides.iter().map(|&i| per[i].retry_after_ms).max().unwrap() };
        pick(*decides.iter().find(|&&i| per[i].retry_after_ms == longest).unwrap(), longest)
    };
    (whole, per)
}
