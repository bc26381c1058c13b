//! The fixed window: docs/contract.md's definitions evaluated literally on
//! the state's two fields (`start_ms`, `count`), in `u128` milliseconds
//! that never saturate, with every answer found by searching instead of the
//! closed forms `step` uses:
//!
//! - the stored window counts at an instant when that instant (or the
//!   stored start, if the clock is behind it) lies inside it: for the
//!   epoch-aligned windows the stored start must also be a multiple of
//!   `window_ms`;
//! - the units granted, `remaining`: the largest `n` that still fits,
//!   searched;
//! - `retry_after_ms` and `reset_after_ms`: the first millisecond, searched
//!   over the next window, at which the call fits or nothing is counted.

use super::slidingcounter::Search;
use crate::fixedwindow::{Params, State};
use crate::Decision;

/// The units the stored window counts at real time `t` (ms).
pub fn counted(s: &State, p: &Params, t: u128) -> u128 {
    let w = u128::from(p.window_ms);
    let start = u128::from(s.start_ms);
    let t = t.max(start);
    let inside = start <= t && t < start + w;
    let aligned = p.from_first || start % w == 0;
    if s.count > 0 && inside && aligned {
        u128::from(s.count)
    } else {
        0
    }
}

/// Largest `n` in `0..=hi` with `pred(n)` (`pred` true then false), or 0.
fn largest(hi: u128, mode: Search, pred: impl Fn(u128) -> bool) -> u128 {
    match mode {
        Search::Linear => (0..=hi).rev().find(|&n| pred(n)).unwrap_or(0),
        Search::Bisect => {
            if !pred(0) {
                return 0;
            }
            let (mut lo, mut hi) = (0u128, hi);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if pred(mid) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            lo
        }
    }
}

/// Smallest `t` in `lo..=hi` with `pred(t)` (`pred` false then true, and
/// true at `hi`).
fn smallest(lo: u128, hi: u128, mode: Search, pred: impl Fn(u128) -> bool) -> u128 {
    assert!(pred(hi), "model: predicate must hold at the horizon");
    match mode {
        Search::Linear => (lo..=hi).find(|&t| pred(t)).unwrap(),
        Search::Bisect => {
            let (mut lo, mut hi) = (lo, hi);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if pred(mid) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            lo
        }
    }
}

/// Where a grant at real time `t` (ms) goes: the counted window's start, or
/// the start of a new one.
fn grant_window(s: &State, p: &Params, t: u128) -> u128 {
    let w = u128::from(p.window_ms);
    let t = t.max(u128::from(s.start_ms));
    if counted(s, p, t) > 0 {
        u128::from(s.start_ms)
    } else if p.from_first {
        t
    } else {
        (t / w) * w
    }
}

/// One call at `now_us`: the reply and the state after it (the same state
/// when nothing was granted).
pub fn decide(s: &State, p: &Params, cost: u64, partial: bool, now_us: u64, mode: Search) -> (Decision, State) {
    let t = u128::from(now_us / 1000);
    let limit = u128::from(p.limit);
    let c = counted(s, p, t);
    let fits = |n: u128| c + n <= limit;
    let cost_ = u128::from(cost);
    let granted = if partial {
        largest(cost_.min(limit), mode, fits)
    } else if fits(cost_) {
        cost_
    } else {
        0
    };
    take(s, p, u64::try_from(granted).unwrap(), cost, now_us, mode)
}

/// A take of exactly `taken` units (what RL.MULTI's limits do: the call's
/// common grant, which may be less than this window could give) for a call
/// of `want`, at `now_us`: the reply and the state after it.
pub fn take(s: &State, p: &Params, taken: u64, want: u64, now_us: u64, mode: Search) -> (Decision, State) {
    take_with(s, p, taken, want, now_us, mode, taken == want)
}

/// `COST n FORCE` at `now_us`: all `cost` units into the counted window,
/// past the limit if need be (as without FORCE when the count would pass
/// 2^53 − 1); the reply for a following call of `want` (its wait, 0 when
/// it fits) and the state after it.
pub fn force(s: &State, p: &Params, cost: u64, want: u64, now_us: u64, mode: Search) -> (Decision, State) {
    let c = counted(s, p, u128::from(now_us / 1000));
    if c + u128::from(cost) > u128::from(crate::MAX_ARG) {
        return decide(s, p, cost, false, now_us, mode);
    }
    take_with(s, p, cost, want, now_us, mode, false)
}

/// [`take`]; `done`: the call got all it asked for (retry 0).
pub fn take_with(s: &State, p: &Params, taken: u64, want: u64, now_us: u64, mode: Search, done: bool) -> (Decision, State) {
    let t = u128::from(now_us / 1000);
    let c = counted(s, p, t);
    let taken_ = u128::from(taken);
    let after = if taken > 0 {
        State { start_ms: u64::try_from(grant_window(s, p, t)).unwrap(), count: u64::try_from(c + taken_).unwrap() }
    } else {
        *s
    };
    (answer(&after, p, t, taken_, u128::from(want), mode, done), after)
}

/// The reply at `t` (ms) for the state `after` a call took `taken` of
/// `want` units.
fn answer(after: &State, p: &Params, t: u128, taken: u128, want: u128, mode: Search, done: bool) -> Decision {
    let limit = u128::from(p.limit);
    let c = counted(after, p, t);
    let remaining = largest(limit, mode, |n| c + n <= limit);
    // By the end of the window after `t` (or after the stored start, if
    // the clock is behind it) nothing is counted any more.
    let horizon = t.max(u128::from(after.start_ms)) + u128::from(p.window_ms);
    let retry = if done {
        0
    } else if want > limit {
        -1
    } else {
        let at = smallest(t, horizon, mode, |at| counted(after, p, at) + want <= limit);
        // The reply's signed wait saturates (a window ~2^63 ms ahead).
        super::wait_i64(u64::try_from(at - t).unwrap())
    };
    let fresh = smallest(t, horizon, mode, |at| counted(after, p, at) == 0);
    Decision {
        granted: u64::try_from(taken).unwrap(),
        limit: p.limit,
        remaining: u64::try_from(remaining).unwrap(),
        retry_after_ms: retry,
        reset_after_ms: u64::try_from(fresh - t).unwrap(),
    }
}

/// `REFUND n` at `now_us`: up to `n` units off the counted window. The
/// reply for a following call of `want` (element 1: the units given back)
/// and the state after it (the same state when nothing came back).
pub fn refund(s: &State, p: &Params, n: u64, want: u64, now_us: u64, mode: Search) -> (Decision, State) {
    let t = u128::from(now_us / 1000);
    let c = counted(s, p, t);
    let given = c.min(u128::from(n));
    let after = if given > 0 {
        State { start_ms: u64::try_from(grant_window(s, p, t)).unwrap(), count: u64::try_from(c - given).unwrap() }
    } else {
        *s
    };
    let mut d = answer(&after, p, t, 0, u128::from(want), mode, want == 0);
    d.granted = u64::try_from(given).unwrap();
    (d, after)
}
