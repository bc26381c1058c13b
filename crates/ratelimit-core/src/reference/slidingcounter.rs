//! The sliding counter: docs/contract.md's definitions evaluated literally in exact
//! rational arithmetic, with every answer found by searching (linear scans,
//! or bisection over predicates whose monotonicity the linear scans confirm
//! in the core's `linear_model_matches_step_and_bisection`) instead of the
//! closed forms `step` uses. The model works on the state's three fields
//! (`start_us`, `cur`, `prev`: what a key holds), for parameters in
//! `1..=MAX_ARG`, costs up to `MAX_ARG` and any `u64` times.

use crate::slidingcounter::{Params, State};
use crate::Decision;

/// An exact non-negative rational `n / d` (`d > 0`), never rounded.
#[derive(Clone, Copy, Debug)]
struct Ratio {
    n: u128,
    d: u128,
}

impl Ratio {
    fn new(n: u128, d: u128) -> Ratio {
        assert!(d > 0);
        Ratio { n, d }
    }
    /// `self + k ≤ limit`, i.e. `n + k·d ≤ limit·d`.
    fn plus_int_le(self, k: u128, limit: u128) -> bool {
        let lhs = self.n.checked_add(k.checked_mul(self.d).unwrap()).unwrap();
        lhs <= limit.checked_mul(self.d).unwrap()
    }
}

/// What a key's two windows count for a call arriving at real time `t`
/// (evaluated at `max(t, start_us)`): (prev, cur, µs into the window).
/// Times are u128 so instants past `u64::MAX` can be searched.
pub fn counts(s: &State, w: u128, t: u128) -> (u128, u128, u128) {
    let t = t.max(u128::from(s.start_us));
    let (ks, kt) = (u128::from(s.start_us) / w, t / w);
    let e = t - kt * w;
    if kt == ks {
        (u128::from(s.prev), u128::from(s.cur), e)
    } else if kt == ks + 1 {
        (u128::from(s.cur), 0, e)
    } else {
        (0, 0, e)
    }
}

/// `prev × (W − elapsed) / W + cur` as an exact rational over `W`.
fn estimate(s: &State, w: u128, t: u128) -> Ratio {
    let (prev, cur, e) = counts(s, w, t);
    Ratio::new(prev * (w - e) + cur * w, w)
}

/// How the model searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    Linear,
    Bisect,
}

/// Largest `n` in `0..=hi` with `pred(n)`, for `pred` true then false.
fn largest(hi: u128, mode: Search, pred: impl Fn(u128) -> bool) -> Option<u128> {
    match mode {
        Search::Linear => (0..=hi).rev().find(|&n| pred(n)),
        Search::Bisect => {
            if !pred(0) {
                return None;
            }
            let (mut lo, mut hi) = (0u128, hi); // pred(lo) holds
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if pred(mid) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            Some(lo)
        }
    }
}

/// Smallest `t` in `lo..=hi` with `pred(t)`, for `pred` false then true;
/// `pred(hi)` must hold.
fn smallest(lo: u128, hi: u128, mode: Search, pred: impl Fn(u128) -> bool) -> u128 {
    assert!(pred(hi), "model: predicate must hold at the search horizon");
    match mode {
        Search::Linear => (lo..=hi).find(|&t| pred(t)).unwrap(),
        Search::Bisect => {
            let (mut lo, mut hi) = (lo, hi); // pred(hi) holds
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

fn ceil_ms(us: u128) -> u128 {
    us.div_ceil(1000)
}

fn fits(s: &State, p: &Params, at: u128, n: u128) -> bool {
    estimate(s, u128::from(p.window_ms) * 1000, at).plus_int_le(n, u128::from(p.limit))
}

/// Units a call at `now` could take: the largest `n ≤ limit` that keeps the
/// estimate within the limit.
pub fn avail(s: &State, p: &Params, now: u64, mode: Search) -> u64 {
    let n = largest(u128::from(p.limit), mode, |n| fits(s, p, u128::from(now), n)).unwrap_or(0);
    u64::try_from(n).unwrap()
}

/// One call: take `cost` if it fits, with PARTIAL the most that fits, else
/// nothing. Returns the reply and the state the key holds after it (the
/// same state when nothing was taken).
pub fn decide(s: &State, p: &Params, cost: u64, partial: bool, now: u64, mode: Search) -> (Decision, State) {
    let t = u128::from(now);
    let granted = if cost == 0 {
        0
    } else if partial {
        largest(u128::from(cost).min(u128::from(p.limit)), mode, |n| fits(s, p, t, n)).unwrap_or(0)
    } else if fits(s, p, t, u128::from(cost)) {
        u128::from(cost)
    } else {
        0
    };
    reply(s, p, now, u64::try_from(granted).unwrap(), cost, mode)
}

/// The reply after taking `taken` units at `now` for a call that asked for
/// `want`, and the state after the take.
pub fn reply(s: &State, p: &Params, now: u64, taken: u64, want: u64, mode: Search) -> (Decision, State) {
    reply_with(s, p, now, taken, want, mode, taken == want)
}

/// `COST n FORCE` at `now`: all `cost` units into the current window, past
/// the limit if need be (as without FORCE when its count would pass
/// 2^53 − 1); the reply for a following call of `want` (its wait, 0 when
/// it fits) and the state after it.
pub fn force(s: &State, p: &Params, now: u64, cost: u64, want: u64, mode: Search) -> (Decision, State) {
    let (_, cur, _) = counts(s, u128::from(p.window_ms) * 1000, u128::from(now));
    if cur + u128::from(cost) > u128::from(crate::MAX_ARG) {
        return decide(s, p, cost, false, now, mode);
    }
    reply_with(s, p, now, cost, want, mode, false)
}

/// [`reply`]; `done`: the call got all it asked for (retry 0).
pub fn reply_with(s: &State, p: &Params, now: u64, taken: u64, want: u64, mode: Search, done: bool) -> (Decision, State) {
    let w = u128::from(p.window_ms) * 1000;
    let want_ = u128::from(want);
    let t = u128::from(now);
    let t_eff = t.max(u128::from(s.start_us));
    let (prev, cur, e) = counts(s, w, t);
    let after = if taken > 0 {
        State {
            // The window of the call, but never earlier than the instant
            // the state already pins (only differs for states written
            // under another window, read with the clock behind them).
            start_us: u64::try_from(t_eff - e).unwrap().max(s.start_us),
            cur: u64::try_from(cur + u128::from(taken)).unwrap(),
            prev: u64::try_from(prev).unwrap(),
        }
    } else {
        *s
    };
    (answer(&after, p, now, taken, want_, t_eff - e + 2 * w, mode, done), after)
}

/// The reply for the state `after` (what the call leaves) at `now`;
/// `horizon`: an instant by which everything has aged out.
#[allow(clippy::too_many_arguments)]
fn answer(after: &State, p: &Params, now: u64, taken: u64, want: u128, horizon: u128, mode: Search, done: bool) -> Decision {
    let w = u128::from(p.window_ms) * 1000;
    let limit = u128::from(p.limit);
    let t = u128::from(now);
    let remaining = largest(limit, mode, |n| fits(after, p, t, n)).unwrap_or(0);
    let retry = if done {
        0
    } else if want > limit {
        -1
    } else {
        let at = smallest(t, horizon, mode, |at| fits(after, p, at, want));
        i64::try_from(ceil_ms(at - t)).unwrap()
    };
    let fresh = smallest(t, horizon, mode, |at| {
        let (p2, c2, _) = counts(after, w, at);
        p2 == 0 && c2 == 0
    });
    Decision {
        granted: taken,
        limit: p.limit,
        remaining: u64::try_from(remaining).unwrap(),
        retry_after_ms: retry,
        reset_after_ms: u64::try_from(ceil_ms(fresh - t)).unwrap(),
    }
}

/// `REFUND n`: up to `n` units back, from the current window first, then
/// the previous one. Returns the reply for a following call of `want`
/// (element 1: the units given back) and the state after the refund (the
/// same state when nothing came back).
pub fn refund(s: &State, p: &Params, now: u64, n: u64, want: u64, mode: Search) -> (Decision, State) {
    let w = u128::from(p.window_ms) * 1000;
    let t = u128::from(now);
    let t_eff = t.max(u128::from(s.start_us));
    let (prev, cur, e) = counts(s, w, t);
    let from_cur = u128::from(n).min(cur);
    let from_prev = (u128::from(n) - from_cur).min(prev);
    let given = u64::try_from(from_cur + from_prev).unwrap();
    let after = if given > 0 {
        State {
            start_us: u64::try_from(t_eff - e).unwrap().max(s.start_us),
            cur: u64::try_from(cur - from_cur).unwrap(),
            prev: u64::try_from(prev - from_prev).unwrap(),
        }
    } else {
        *s
    };
    let mut d = answer(&after, p, now, 0, u128::from(want), t_eff - e + 2 * w, mode, want == 0);
    d.granted = given;
    (d, after)
}
