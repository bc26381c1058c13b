//! RL.SLIDINGCOUNTER — the sliding-window counter (the approximation
//! Cloudflare describes), as a pure function of (state, parameters, cost,
//! now). Nothing here knows about Redis.
//!
//! # Algorithm
//!
//! Let `W = window_ms × 1000` µs. Time is cut into fixed windows aligned to
//! multiples of `W` on the Unix clock: window `k` is `[k·W, (k+1)·W)`. The
//! state remembers `cur`, the units granted in the window that starts at
//! `start_us`, and `prev`, the units granted in the window before it.
//!
//! A call at `now_us` is evaluated at `now_eff = max(now_us, start_us)`: if
//! the clock stepped back, elapsed time counts as zero. With
//! `k_now = now_eff / W`, `k_stored = start_us / W` and
//! `e = now_eff − k_now·W` (µs elapsed in the current window):
//!
//! | `k_now − k_stored` | prev          | cur          |
//! |--------------------|---------------|--------------|
//! | 0                  | stored `prev` | stored `cur` |
//! | 1                  | stored `cur`  | 0            |
//! | ≥ 2                | 0             | 0            |
//!
//! The estimate of the units in the sliding window ending now is
//! `prev × (W − e) / W + cur`, and a call for `n` units fits when
//! estimate + n ≤ limit. That is compared **exactly**, multiplied out by `W`
//! in `u128`, with no floating point and no rounding:
//!
//! ```text
//! prev·(W − e) + (cur + n)·W  ≤  limit·W
//! ```
//!
//! The counts and the limit are at most `MAX_ARG < 2^53` and `W` is at most
//! `MAX_ARG·1000 < 2^63`, so each product is below 2^116 and the sums cannot
//! overflow a `u128`; saturating operations are used anyway so that
//! out-of-range inputs (a hand-built `State`) cannot panic.
//!
//! * The largest `n` that fits is `avail = ⌊(limit·W − prev·(W−e) − cur·W) / W⌋`
//!   (0 when the left side is negative).
//! * Without PARTIAL the call is granted `cost` units when `cost ≤ avail`,
//!   else 0. With PARTIAL it is granted `min(cost, avail)`. COST 0 is granted
//!   0 units and changes nothing.
//! * A grant of `g > 0` stores `start_us = k_now·W`, `cur = cur + g`,
//!   `prev = prev` (after the shift in the table). (Exception: a state
//!   written under another window may have `start_us` inside window `k_now`
//!   rather than at its start; then `start_us` is kept, so the instant calls
//!   are evaluated at never moves backwards.) A call that grants nothing
//!   returns the input state unchanged: the caller writes only when `g > 0`.
//!   Because a grant needs `cur + g ≤ limit`, no fixed window ever counts
//!   more than the limit in force when its last grant was made.
//! * `remaining = avail − g`.
//! * `retry_after_ms` (when `g < cost ≤ limit`) is exact: from the state
//!   after this call's grant, the smallest whole µs `e' ≥ e` of the current
//!   window with `prev·(W−e') + (cur + cost)·W ≤ limit·W`, that is
//!   `e' = max(e, W − ⌊(limit·W − (cur+cost)·W) / prev⌋)`; failing that, the
//!   same in the next window (where prev is this window's `cur` and cur is
//!   0), and failing that the start of the window after, where everything is
//!   0. It is −1 when `cost > limit` and 0 when the call was fully granted.
//!   The estimate never increases with time while nothing is granted (it is
//!   continuous across a boundary: `cur` at the end of a window, `cur·W/W`
//!   at the start of the next), so the first such instant is the answer.
//! * `reset_after_ms` is the time until both windows count zero: the end of
//!   the next window when `cur > 0`, the end of the current one when only
//!   `prev > 0`, else 0.
//!
//! Durations in the reply are measured from the real clock reading `now_us`,
//! rounded up to whole ms. Normally `now_us = now_eff` and they are
//! `⌈(e' − e)/1000⌉` etc. as above. If the clock has stepped back behind
//! `start_us`, every call until it catches up is evaluated at `start_us`, so
//! the honest waits include that gap: `retry_after_ms` and `reset_after_ms`
//! are measured to the same absolute instants from `now_us`. Thus a key whose
//! TTL is set to `reset_after_ms` expires no earlier than the instant
//! `fresh_at_us` reports, when it is indistinguishable from a fresh key.
//!
//! # Runtime rule changes
//!
//! The state holds no parameters. A state written under another `window_ms`
//! is read under the new one: its window is `start_us / W_new`, and its
//! counts are taken as that window's `cur` and the one before's `prev`. The
//! counts are carried over, never dropped or rescaled; after at most two new
//! windows the old state has aged out. A changed `limit` simply applies to
//! the counts as they are (a lowered limit denies until they age out).
//!
//! # Parts
//!
//! The state's binary encoding and its compact two-word in-memory form are
//! in [`encoding`].

pub mod encoding;

pub use encoding::ENCODING_VERSION;

use crate::{ms_to_us, to_i64, us_to_ms_ceil, Decision, MAX_ARG};

/// The rule of a call. Both fields are validated by the caller to be in
/// `1..=MAX_ARG`. Out-of-range values never panic: for the arithmetic a limit
/// above `MAX_ARG` counts as `MAX_ARG` (0 grants nothing) and `window_ms` is
/// clamped to `1..=MAX_ARG`; `Decision::limit` reports `limit` as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub window_ms: u64,
}

impl Params {
    /// From a parsed call's numbers (`args::Call::nums`):
    /// `limit window_ms` (the third is 0). Every caller builds the
    /// parameters here.
    #[inline]
    pub const fn from_nums([limit, window_ms, _]: [u64; 3]) -> Params {
        Params { limit, window_ms }
    }
}

/// The stored state of one key. `Default` is the fresh state (all zero).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Start (µs since the Unix epoch) of the window that `cur` counts.
    pub start_us: u64,
    /// Units granted in the window starting at `start_us`.
    pub cur: u64,
    /// Units granted in the window before it.
    pub prev: u64,
}

impl State {
    /// Both windows count zero: indistinguishable from no key at all.
    pub fn is_fresh(&self) -> bool {
        self.cur == 0 && self.prev == 0
    }
}

/// Window length in µs for the arithmetic: `window_ms` clamped to
/// `1..=MAX_ARG`, so it is never 0 and always a whole number of ms.
fn window_us(window_ms: u64) -> u64 {
    ms_to_us(window_ms.clamp(1, MAX_ARG))
}

/// The window as seen at an instant: counts shifted into the window of
/// `now_eff`, and the position inside that window.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// Window length in µs (≥ 1000).
    w: u64,
    /// `max(now_us, start_us)`.
    now_eff: u64,
    /// Start of the window containing `now_eff`.
    window_start: u64,
    /// µs elapsed in that window, `< w`.
    e: u64,
    prev: u64,
    cur: u64,
}

impl Window {
    #[inline]
    fn at(state: &State, w: u64, now_us: u64) -> Window {
        let now_eff = now_us.max(state.start_us);
        let e = now_eff % w;
        let window_start = now_eff - e; // e ≤ now_eff: cannot underflow
        let k_now = now_eff / w;
        let k_stored = state.start_us / w; // ≤ k_now since start_us ≤ now_eff
        let (prev, cur) = match k_now.saturating_sub(k_stored) {
            0 => (state.prev, state.cur),
            1 => (state.cur, 0),
            _ => (0, 0),
        };
        Window { w, now_eff, window_start, e, prev, cur }
    }

    /// Largest `n` with `prev·(W−e) + (cur + n)·W ≤ limit·W`, or 0 if none.
    #[inline]
    fn available(&self, limit: u64) -> u64 {
        max_fit(u128::from(self.prev), u128::from(self.cur), u128::from(limit), u128::from(self.w), u128::from(self.e))
    }
}

/// `⌊(limit·W − prev·(W−e) − cur·W) / W⌋`, or 0 when that is negative.
/// The result is at most `limit`, so it fits back in a `u64`.
#[inline]
fn max_fit(prev: u128, cur: u128, limit: u128, w: u128, e: u128) -> u64 {
    let cap = limit.saturating_mul(w);
    let used = prev.saturating_mul(w.saturating_sub(e)).saturating_add(cur.saturating_mul(w));
    match cap.checked_sub(used) {
        Some(free) => u64::try_from(crate::div_rem_u128(free, w.max(1)).0).unwrap_or(u64::MAX),
        None => 0,
    }
}

/// Smallest whole `x` in `[from, w)` with `prev·(w − x) + base ≤ cap`, if any.
/// (`base` is `(cur + cost)·W`, `cap` is `limit·W`.)
#[inline]
fn first_fit(prev: u128, base: u128, cap: u128, w: u128, from: u128) -> Option<u128> {
    let room = cap.checked_sub(base)?;
    // prev·(w − x) ≤ room  ⇔  w − x ≤ ⌊room / prev⌋  ⇔  x ≥ w − ⌊room / prev⌋.
    let lowest = if prev == 0 {
        0 // every x fits
    } else {
        w.saturating_sub(crate::div_rem_u128(room, prev).0)
    };
    let x = lowest.max(from);
    (x < w).then_some(x)
}

/// A counter read at one instant under one call's parameters. The single
/// command and every sliding-counter limit of RL.MULTI decide through it.
#[derive(Clone, Copy, Debug)]
pub struct View {
    v: Window,
    /// `limit` as given (the reply's element 2).
    limit_given: u64,
    /// `limit` for the arithmetic (≤ MAX_ARG).
    limit: u64,
    /// The stored window start (kept when later than `window_start`).
    start_us: u64,
    /// The real clock reading; waits are measured from it.
    now_us: u64,
}

impl View {
    #[inline]
    pub fn at(state: &State, p: &Params, now_us: u64) -> View {
        View {
            v: Window::at(state, window_us(p.window_ms), now_us),
            limit_given: p.limit,
            limit: p.limit.min(MAX_ARG),
            start_us: state.start_us,
            now_us,
        }
    }

    /// Units a call could take now.
    #[inline]
    pub fn available(&self) -> u64 {
        self.v.available(self.limit)
    }

    /// The reply after taking `taken` units (`≤ available()`) for a call
    /// that asked for `want`: retry_after_ms is 0 when it got them all, −1
    /// when `want` exceeds the limit, else the exact time until `want`
    /// units fit again after this take.
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        let v = &self.v;
        let limit = self.limit;
        let avail = self.available();
        // Subtracting g whole units from the numerator lowers the floor by g.
        let remaining = avail - taken.min(avail);
        let cur_after = v.cur.saturating_add(taken);
        let w = u128::from(v.w);
        let e = u128::from(v.e);
        // µs between the real clock reading and the instant the call is
        // evaluated at (non-zero only if the clock stepped back).
        let lag = u128::from(v.now_eff - self.now_us.min(v.now_eff));
        let retry_after_ms = if taken == want {
            0
        } else if want > limit {
            -1
        } else if want <= remaining {
            0
        } else {
            let cap = u128::from(limit).saturating_mul(w);
            let want128 = u128::from(want);
            let cur128 = u128::from(cur_after);
            let base_now = cur128.saturating_add(want128).saturating_mul(w);
            let wait_us = match first_fit(u128::from(v.prev), base_now, cap, w, e) {
                Some(x) => x - e,
                None => {
                    let base_next = want128.saturating_mul(w);
                    match first_fit(cur128, base_next, cap, w, 0) {
                        Some(x) => (w - e).saturating_add(x),
                        None => (w - e).saturating_add(w),
                    }
                }
            };
            to_i64(us_to_ms_ceil(wait_us.saturating_add(lag)))
        };
        let reset_after_ms = if cur_after > 0 {
            us_to_ms_ceil(w.saturating_mul(2).saturating_sub(e).saturating_add(lag))
        } else if v.prev > 0 {
            us_to_ms_ceil((w - e).saturating_add(lag))
        } else {
            0
        };
        Decision { granted: taken, limit: self.limit_given, remaining, retry_after_ms, reset_after_ms }
    }

    /// A FORCE call can take `units` past the limit: the current
    /// window's count stays within `MAX_ARG`.
    #[inline]
    pub fn can_force(&self, units: u64) -> bool {
        self.v.cur.checked_add(units).is_some_and(|c| c <= MAX_ARG)
    }

    /// The reply after a FORCE call took `taken` units ([`View::can_force`],
    /// possibly past the limit), answering for a following call of `want`:
    /// remaining 0 while the estimate is past the limit, retry_after_ms that
    /// call's exact wait (0 when it fits now).
    #[inline]
    pub fn answer_forced(&self, taken: u64, want: u64) -> Decision {
        let mut after = *self;
        after.v.cur = self.v.cur.saturating_add(taken);
        Decision { granted: taken, ..after.answer(0, want) }
    }

    /// The state to store after taking `taken` units (`> 0`).
    ///
    /// `max`: a state written under another window may start inside this
    /// window (after `window_start`); keeping that instant keeps the
    /// evaluation time from moving backwards if the clock is behind it.
    /// Both lie in window k_now, so the reading is the same.
    #[inline]
    pub fn state_after(&self, taken: u64) -> State {
        State { start_us: self.v.window_start.max(self.start_us), cur: self.v.cur.saturating_add(taken), prev: self.v.prev }
    }

    /// The counter after `n` units are given back: off the current window's
    /// count first, what is left of `n` off the previous window's, never
    /// below zero. Returns it with the units given back.
    #[inline]
    pub fn refunded(&self, n: u64) -> (View, u64) {
        let from_cur = n.min(self.v.cur);
        let from_prev = (n - from_cur).min(self.v.prev);
        let mut after = *self;
        after.v.cur -= from_cur;
        after.v.prev -= from_prev;
        (after, from_cur + from_prev)
    }
}

/// Decide a call and compute the state the key should hold if the caller
/// writes (it writes only when `granted > 0`; otherwise the returned state is
/// `*state`, unchanged).
#[inline]
pub fn step(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    let a = View::at(state, p, now_us);
    let granted = crate::grant_size(a.available(), cost, partial);
    let new_state = if granted > 0 { a.state_after(granted) } else { *state };
    (a.answer(granted, cost), new_state)
}

/// `COST n FORCE`: take `cost` units even past the limit (the current
/// window's count stays at most `MAX_ARG`; a call that would pass it is
/// decided as without FORCE). The reply answers for a following call of
/// `want` units ([`View::answer_forced`]). Returns it and the state to
/// store when `granted > 0` (else `*state`).
pub fn force(state: &State, p: &Params, cost: u64, want: u64, now_us: u64) -> (Decision, State) {
    let a = View::at(state, p, now_us);
    if !a.can_force(cost) {
        return step(state, p, cost, false, now_us);
    }
    let new_state = if cost > 0 { a.state_after(cost) } else { *state };
    (a.answer_forced(cost, want), new_state)
}

/// `REFUND n`: `n` units come off the current window's count, what is left
/// off the previous window's, never below zero. Returns the reply (element
/// 1: the units given back, 0 only when both windows counted zero, then
/// nothing changed) for a following call of `want` units, and the state to
/// store. When the reply's `reset_after_ms` is 0 the counter is fresh: the
/// key is deleted, not stored. The state may count 0 in the current window
/// and some units in the previous one.
pub fn refund(state: &State, p: &Params, n: u64, want: u64, now_us: u64) -> (Decision, State) {
    let a = View::at(state, p, now_us);
    let (after, given) = a.refunded(n);
    let mut d = after.answer(0, want);
    d.granted = given;
    let new_state = State { start_us: after.v.window_start.max(after.start_us), cur: after.v.cur, prev: after.v.prev };
    (d, new_state)
}

/// The instant (µs since the epoch) from which `state` is indistinguishable
/// from a fresh one under `window_ms` (both windows count zero), or `None` if
/// it already is fresh whatever the time. The instant may lie in the past;
/// it saturates at `u64::MAX`. For the state `step` returns,
/// `reset_after_ms = ⌈(fresh_at_us − now_us) / 1000⌉` (0 if in the past).
pub fn fresh_at_us(state: &State, window_ms: u64) -> Option<u64> {
    if state.is_fresh() {
        return None;
    }
    let w = window_us(window_ms);
    let window_start = state.start_us - state.start_us % w;
    let windows = if state.cur > 0 { 2 } else { 1 };
    Some(window_start.saturating_add(w.saturating_mul(windows)))
}

#[cfg(test)]
mod tests;
