//! RL.FIXEDWINDOW — the fixed-window counter (envoyproxy/ratelimit's
//! INCRBY + EXPIRE, or with FROMFIRST INCR + `PEXPIRE … NX`), as a pure
//! function of (state, parameters, cost, now). Nothing here knows about
//! Redis.
//!
//! # Algorithm
//!
//! Unlike the rest of the crate, a fixed window works in whole
//! milliseconds: `now = ⌊now_us / 1000⌋` (the server's clock in ms), and
//! the state is `(start_ms, count)`. Let `W = window_ms`.
//!
//! - **Epoch-aligned (default).** The current window is
//!   `[now − now % W, that + W)`. The stored count counts only when the
//!   stored start is that window's start; otherwise (an old window, or a
//!   state written under another `window_ms`) the count is 0.
//! - **FROMFIRST.** The stored window `[start_ms, start_ms + W)` (W as
//!   given in this call) counts while `now` is inside it. Otherwise the
//!   count is 0, and a grant of at least one unit starts a new window at
//!   `start_ms = now`.
//! - **Clock stepping back.** As everywhere in the crate, a call is
//!   evaluated at `now_eff = max(now, start_ms)`: elapsed time counts as
//!   zero, so a clock behind the stored window never opens a fresh one.
//!   The waits are measured from the real `now` (they include the gap).
//!
//! Then with `count` the units counted in the current window, which ends at
//! `end` (for an empty FROMFIRST window: `now + W`, where a grant would end
//! it):
//!
//! * `avail = limit − count` (0 when the count is above a lowered limit).
//!   A call of `cost` is granted `cost` when `cost ≤ avail`, with PARTIAL
//!   `min(cost, avail)`, else 0. COST 0 is granted 0 and changes nothing.
//! * `remaining = avail − granted`.
//! * `retry_after_ms`: 0 when fully granted, −1 when `cost > limit`, else
//!   `end − now`: the next window is empty, and nothing frees units
//!   earlier.
//! * `reset_after_ms`: `end − now` when the window counts units after the
//!   call, else 0 (the empty window: the limiter is already fresh).
//! * A grant stores `(window_start, count + granted)`, a call that grants
//!   nothing returns the input state unchanged. The key's expiry is then
//!   `now + reset_after_ms = end`, exactly the window's end.
//!
//! `limit` and `window_ms` are in `1..=MAX_ARG`; out-of-range values never
//! panic (a limit above MAX_ARG counts as MAX_ARG, `window_ms` is clamped to
//! `1..=MAX_ARG`); every sum saturates, so a hand-built state at the end of
//! `u64` time cannot overflow.
//!
//! # Parts
//!
//! The state's binary encoding and its compact two-word form are in
//! [`encoding`].

pub mod encoding;

pub use encoding::ENCODING_VERSION;

use crate::{to_i64, Decision, MAX_ARG};

/// The rule of a call: `limit` and `window_ms` in `1..=MAX_ARG`, and whether
/// a window starts at its first grant (`FROMFIRST`) instead of on a
/// multiple of `window_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub window_ms: u64,
    pub from_first: bool,
}

impl Params {
    /// From a parsed call's numbers (`args::Call::nums`): `limit window_ms
    /// mode`, where the parser sets `mode` to [`FROMFIRST`] for the option
    /// and leaves it 0 otherwise.
    #[inline]
    pub const fn from_nums([limit, window_ms, mode]: [u64; 3]) -> Params {
        Params { limit, window_ms, from_first: mode == FROMFIRST }
    }
}

/// The third number of a fixed window's parsed call when FROMFIRST was given.
pub const FROMFIRST: u64 = 1;

/// The stored state of one key. `Default` is the fresh state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Start of the counted window, ms since the Unix epoch.
    pub start_ms: u64,
    /// Units granted in it.
    pub count: u64,
}

impl State {
    /// Counts nothing: indistinguishable from no key at all.
    pub fn is_fresh(&self) -> bool {
        self.count == 0
    }
}

/// A counter read at one instant under one call's parameters. The single
/// command (and RL.MULTI's fixed-window limits) decide through it.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// `limit` as given (the reply's element 2).
    limit_given: u64,
    /// `limit` for the arithmetic (≤ MAX_ARG).
    limit: u64,
    /// The real clock, ms: waits are measured from it.
    now_ms: u64,
    /// Start of the current window (where a grant goes).
    window_start: u64,
    /// Its end (exclusive), saturating.
    end: u64,
    /// Units counted in it.
    count: u64,
}

impl View {
    #[inline]
    pub fn at(state: &State, p: &Params, now_us: u64) -> View {
        let w = p.window_ms.clamp(1, MAX_ARG);
        let now_ms = now_us / 1000;
        let now_eff = now_ms.max(state.start_ms);
        let (window_start, count) = if p.from_first {
            // now_eff ≥ start_ms: the difference cannot underflow, and
            // unlike `start_ms + w` it cannot saturate at the end of time.
            if state.count > 0 && now_eff - state.start_ms < w {
                (state.start_ms, state.count)
            } else {
                (now_eff, 0)
            }
        } else {
            let ws = now_eff - now_eff % w; // ≤ now_eff: cannot underflow
            (ws, if state.start_ms == ws { state.count } else { 0 })
        };
        View {
            limit_given: p.limit,
            limit: p.limit.min(MAX_ARG),
            now_ms,
            window_start,
            end: window_start.saturating_add(w),
            count,
        }
    }

    /// Units a call could take now.
    #[inline]
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.count)
    }

    /// The reply after taking `taken` units (`≤ available()`) for a call
    /// that asked for `want`.
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        let count_after = self.count.saturating_add(taken);
        let remaining = self.limit.saturating_sub(count_after);
        let to_end = self.end.saturating_sub(self.now_ms);
        let retry_after_ms = if taken == want || want <= remaining {
            0
        } else if want > self.limit {
            -1
        } else {
            to_i64(to_end)
        };
        let reset_after_ms = if count_after > 0 { to_end } else { 0 };
        Decision { granted: taken, limit: self.limit_given, remaining, retry_after_ms, reset_after_ms }
    }

    /// The state to store after taking `taken` units (`> 0`).
    #[inline]
    pub fn state_after(&self, taken: u64) -> State {
        State { start_ms: self.window_start, count: self.count.saturating_add(taken) }
    }

    /// The counter after `n` units are given back (never below zero), with
    /// the units given back.
    #[inline]
    pub fn refunded(&self, n: u64) -> (View, u64) {
        let given = n.min(self.count);
        let mut after = *self;
        after.count -= given;
        (after, given)
    }

    /// A FORCE call can take `units` past the limit: the count stays
    /// within `MAX_ARG`.
    #[inline]
    pub fn can_force(&self, units: u64) -> bool {
        self.count.checked_add(units).is_some_and(|c| c <= MAX_ARG)
    }

    /// The reply after a FORCE call took `taken` units ([`View::can_force`],
    /// possibly past the limit), answering for a following call of `want`:
    /// remaining 0 past the limit, retry_after_ms that call's wait (the
    /// window's end; 0 when it fits now).
    #[inline]
    pub fn answer_forced(&self, taken: u64, want: u64) -> Decision {
        let after = View { count: self.count.saturating_add(taken), ..*self };
        Decision { granted: taken, ..after.answer(0, want) }
    }

    /// The absolute end of the current window, ms (the key's expiry).
    #[inline]
    pub fn window_end_ms(&self) -> u64 {
        self.end
    }
}

/// Decide a call and compute the state the key should hold if the caller
/// writes (it writes only when `granted > 0`; otherwise the returned state
/// is `*state`, unchanged).
#[inline]
pub fn step(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    let v = View::at(state, p, now_us);
    let granted = crate::grant_size(v.available(), cost, partial);
    let new_state = if granted > 0 { v.state_after(granted) } else { *state };
    (v.answer(granted, cost), new_state)
}

/// `COST n FORCE`: take `cost` units even past the limit (the count
/// stays at most `MAX_ARG`; a call that would pass it is decided as without
/// FORCE). The reply answers for a following call of `want` units
/// ([`View::answer_forced`]). Returns it and the state to store when
/// `granted > 0` (else `*state`).
pub fn force(state: &State, p: &Params, cost: u64, want: u64, now_us: u64) -> (Decision, State) {
    let v = View::at(state, p, now_us);
    if !v.can_force(cost) {
        return step(state, p, cost, false, now_us);
    }
    let new_state = if cost > 0 { v.state_after(cost) } else { *state };
    (v.answer_forced(cost, want), new_state)
}

/// `REFUND n`: up to `n` units come off the current window's count (an old
/// window has nothing to give back). Returns the reply for a following call
/// of `want` units (element 1: the units given back) and the state to
/// store. When the count drops to 0 the reply's `reset_after_ms` is 0 and
/// the key is deleted, not stored.
pub fn refund(state: &State, p: &Params, n: u64, want: u64, now_us: u64) -> (Decision, State) {
    let v = View::at(state, p, now_us);
    let (after, given) = v.refunded(n);
    let mut d = after.answer(0, want);
    d.granted = given;
    let new_state = if given > 0 { State { start_ms: after.window_start, count: after.count } } else { *state };
    (d, new_state)
}

#[cfg(test)]
mod tests;
