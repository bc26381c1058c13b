//! RL.SLIDINGLOG — the exact sliding-window log, pure (no Redis symbols).
//!
//! # Algorithm
//!
//! The state is the log of the grants still inside the window: entries
//! `(time µs, units)` in strictly increasing time order. Two grants at the
//! same microsecond merge into one entry, so a grant of COST n costs one entry
//! exactly like a grant of 1. With `W = window_ms × 1000` µs and
//! `now_eff = max(now, newest entry time)` (a clock that steps back counts as
//! no elapsed time), an entry at `t` is in the window iff `now_eff − W < t`
//! (always `t ≤ now_eff`).
//!
//! - [`decide`] (pure) sums the units in the window — `used` — and answers:
//!   without PARTIAL `granted = cost` if `used + cost ≤ limit`, else 0; with
//!   PARTIAL `granted = min(cost, limit − used)`. `retry_after_ms` walks the
//!   log (with this call's grant appended) from the oldest entry until the
//!   units that will have expired cover the excess `used_after + cost −
//!   limit`; the call becomes grantable exactly when that entry leaves the
//!   window. `reset_after_ms` is when the newest entry leaves the window.
//!   Both waits are measured from the real clock reading `now` (if it is
//!   behind the newest entry they include the gap), so a TTL of
//!   `reset_after_ms` covers the whole time the log matters.
//!   Expired entries that no grant has trimmed yet are skipped by walking
//!   from the oldest (`decide` never mutates); when the oldest entry is still
//!   in the window, `used` is the O(1) running total.
//! - [`grant`] trims the entries that left the window from the head (O(1)
//!   per trimmed entry) and appends the grant at the tail (or adds it to the
//!   tail entry when it has the same time).
//!
//! # Why it is exact
//!
//! Times are integer microseconds and window comparisons are made as
//! `t + W > now` in `u128`, so nothing overflows or rounds. Units are summed
//! in integers; the only rounding is the final ⌈µs / 1000⌉ of the two
//! durations in the reply. The packed entries ([`packed`]) are lossless: when a
//! delta or a count does not fit the current entry format, the whole log is
//! re-packed in a wider format (up to 128-bit entries, which hold any `u64`
//! delta and count), never truncated. The only saturation is in [`grant`]
//! for inputs a master can never produce (the sum of all units in the log
//! beyond `u64::MAX`; on a master it is at most `limit ≤ 2^53 − 1`), so it
//! keeps the invariants for any replayed input without panicking.
//!
//! # Parts
//!
//! [`packed`]: the log's container (entries packed at a variable width, its
//! memory bounds); [`encoding`]: its canonical binary encoding.

pub mod encoding;
pub mod packed;
#[cfg(test)]
mod testutil;

pub use encoding::ENCODING_VERSION;
pub use packed::State;

use crate::{ms_to_us, to_i64, us_to_ms_ceil, Decision};

/// The command's parameters (both `1..=MAX_ARG`, validated by the caller).
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

/// A log read at one instant under one call's parameters. The single
/// command and every sliding-log limit of RL.MULTI decide through it:
/// [`View::available`] says how many units a call could take and
/// [`View::answer`] is the reply after taking some ([`grant`] then records
/// them).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    state: &'a State,
    /// Window in µs.
    w: u128,
    /// The instant the window is evaluated at: `max(now, newest entry)`.
    now: u64,
    /// The real clock reading; waits are measured from it.
    real: u64,
    limit: u64,
    /// Units granted in the window ending at `now`.
    used: u64,
}

impl<'a> View<'a> {
    #[inline]
    pub fn at(state: &'a State, p: &Params, now_us: u64) -> View<'a> {
        let w = u128::from(ms_to_us(p.window_ms));
        // The window is evaluated at `now` (never earlier than the newest
        // entry); waits are measured from the real clock reading `now_us`.
        let now = if state.len > 0 { now_us.max(state.tail_time) } else { now_us };
        View { state, w, now, real: now_us, limit: p.limit, used: state.used_at(now, w) }
    }

    /// Units a call could take now.
    #[inline]
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// The reply after taking `taken` units (`≤ available()`, recorded at
    /// `now` by [`grant`]) for a call that asked for `want`: retry_after_ms
    /// is 0 when it got them all, −1 when `want` exceeds the limit, else the
    /// time until `want` units fit again after this take.
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        self.answer_with(taken, want, taken == want)
    }

    /// A FORCE call can take `units` past the limit: the units in the
    /// window stay within `MAX_ARG`.
    #[inline]
    pub fn can_force(&self, units: u64) -> bool {
        self.used.checked_add(units).is_some_and(|u| u <= crate::MAX_ARG)
    }

    /// The reply after a FORCE call took `taken` units ([`View::can_force`],
    /// possibly past the limit; [`grant`] records them as one entry),
    /// answering for a following call of `want`: remaining 0 past the limit,
    /// retry_after_ms that call's wait (0 when it fits now).
    #[inline]
    pub fn answer_forced(&self, taken: u64, want: u64) -> Decision {
        self.answer_with(taken, want, false)
    }

    /// [`View::answer`]; `done`: the call got all it asked for
    /// (retry_after_ms 0).
    #[inline(always)]
    fn answer_with(&self, taken: u64, want: u64, done: bool) -> Decision {
        let now128 = u128::from(self.now);
        let real = u128::from(self.real);
        let w = self.w;
        let limit = self.limit;
        let remaining = self.available().saturating_sub(taken);
        // Every entry in the window has `t + w > now ≥ real`, so the waits
        // below are positive.
        let retry_after_ms = if done {
            0
        } else if want > limit {
            -1
        } else {
            // Units that must leave the window before `want` fits, in the
            // log as it is after this take.
            let excess = (u128::from(self.used) + u128::from(taken) + u128::from(want)).saturating_sub(u128::from(limit));
            if excess == 0 {
                0
            } else {
                let mut acc = 0u128;
                // Not reached before this call's own take (at `now`, the newest).
                let mut leaves_at = now128 + w;
                for (t, count) in self.state.entries() {
                    if u128::from(t) + w <= now128 {
                        continue;
                    }
                    acc += u128::from(count);
                    if acc >= excess {
                        leaves_at = u128::from(t) + w;
                        break;
                    }
                }
                to_i64(us_to_ms_ceil(leaves_at.saturating_sub(real)))
            }
        };
        let st = self.state;
        let reset_after_ms = if taken > 0 {
            us_to_ms_ceil((now128 + w).saturating_sub(real))
        } else if st.len > 0 && u128::from(st.tail_time) + w > now128 {
            us_to_ms_ceil((u128::from(st.tail_time) + w).saturating_sub(real))
        } else {
            0
        };
        Decision { granted: taken, limit, remaining, retry_after_ms, reset_after_ms }
    }
}

/// Pure: what the call would answer at `now_us`, without changing anything.
#[inline]
pub fn decide(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> Decision {
    let v = View::at(state, p, now_us);
    v.answer(crate::grant_size(v.available(), cost, partial), cost)
}

/// Pure: what a `COST n FORCE` call would answer at `now_us` (its reply
/// for a following call of `want`), without changing anything; the caller
/// records `granted` units with [`grant`], one entry whatever their
/// number. It takes `cost` even past the limit, unless the units in the
/// window would pass `MAX_ARG`: then it decides as without FORCE.
#[inline]
pub fn decide_forced(state: &State, p: &Params, cost: u64, want: u64, now_us: u64) -> Decision {
    let v = View::at(state, p, now_us);
    if v.can_force(cost) {
        v.answer_forced(cost, want)
    } else {
        v.answer(crate::grant_size(v.available(), cost, false), cost)
    }
}

/// `REFUND units` at `now_us` under window `window_ms`: trims the entries
/// that left the window, then removes the newest `units` units still in it
/// (the most recent grant first). Returns the units removed (0 only when
/// the window held none; then nothing changed but the trim, which no reply
/// can tell). Deterministic and total like [`grant`]: the replica applies
/// it with the same arguments.
pub fn refund(state: &mut State, window_ms: u64, units: u64, now_us: u64) -> u64 {
    if state.len == 0 || units == 0 {
        return 0;
    }
    let w = ms_to_us(window_ms);
    let now = now_us.max(state.tail_time);
    // Nothing in the window: change nothing, not even the trim (a replica
    // is sent no effect for this call).
    if state.used_at(now, u128::from(w)) == 0 {
        return 0;
    }
    // Decide everything first, then apply infallibly (as for a grant).
    let (plan, removed) = state.plan_refund(now, units, w);
    state.apply(plan);
    removed
}

/// Apply a grant of `units` made at `now_us` under window `window_ms`: trims
/// the entries that left the window and records the grant at
/// `max(now_us, newest entry)`. Deterministic, and total for any `u64`
/// inputs: `units == 0` changes nothing, `window_ms` saturates, and units
/// that would push the log's sum beyond `u64::MAX` (impossible on a master,
/// whose log never holds more than `limit`) are dropped.
#[inline]
pub fn grant(state: &mut State, window_ms: u64, units: u64, now_us: u64) {
    if units == 0 {
        return;
    }
    let w = ms_to_us(window_ms);
    let now = if state.len > 0 { now_us.max(state.tail_time) } else { now_us };
    // The common grant (nothing to trim, a new entry that fits the format
    // and the buffer's room) is the plan's Push, written directly.
    if state.append_in_place(now, units, w) {
        return;
    }
    // Decide everything first (this may panic on a bug), then apply
    // infallibly: the log is never left half-updated.
    let plan = state.plan_grant(now, units, w);
    state.apply(plan);
}

/// Microseconds at which the state becomes fresh (every entry has left the
/// window of `window_ms`), or None when it already is empty.
pub fn fresh_at_us(state: &State, window_ms: u64) -> Option<u64> {
    if state.len == 0 {
        None
    } else {
        Some(state.tail_time.saturating_add(ms_to_us(window_ms)))
    }
}

#[cfg(test)]
mod tests;
