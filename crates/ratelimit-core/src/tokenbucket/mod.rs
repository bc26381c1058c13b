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
    /// From a parsed call's numbers (`args::Call::nums`):
    /// `capacity rate period_ms`. Every caller (the module, RL.MULTI, the
    /// fuzzer) builds the parameters here.
    #[inline]
    pub const fn from_nums([capacity, rate, period_ms]: [u64; 3]) -> Params {
        Params { capacity, rate, period_ms }
    }
}

/// Stored state of a bucket that is not full. `den == 0` means "no state"
/// (a fresh, full bucket); it is never stored.
///
/// A bucket in debt (`COST n FORCE` took more than it held) has negative
/// whole tokens: `tokens` is then the two's complement of `−debt`
/// (`tokens as i64` is in `−MAX_ARG..0`), and the level is
/// `tokens as i64 + frac / den` tokens, `frac` still in `0..den`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Whole tokens; read as `i64`, negative in debt ([`State::in_debt`]).
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

    /// Its whole tokens are negative: a debt left by `FORCE`.
    #[inline(always)]
    pub const fn in_debt(&self) -> bool {
        self.tokens >> 63 != 0
    }

    /// Its whole tokens, signed.
    #[inline]
    pub const fn whole(&self) -> i64 {
        self.tokens as i64
    }
}

/// A bucket read at one instant under one call's parameters: the level
/// after refill. The single command and every token-bucket limit of
/// RL.MULTI decide through it: [`View::available`] says how many tokens a
/// call could take, [`View::answer`] is the reply after taking some, and
/// [`View::state_after`] the state to store.
///
/// Counted in `u64` units when a full bucket (`capacity × den`) fits in 64
/// bits (every everyday bucket: 10^9 tokens an hour is 3.6·10^18 units),
/// else in `u128`: the same figures either way (the property test
/// `narrow_and_wide_views_agree`), the narrow one without 128-bit
/// arithmetic.
#[derive(Clone, Copy, Debug)]
pub struct View(Form);

#[derive(Clone, Copy, Debug)]
enum Form {
    Narrow(Lv<u64>),
    Wide(Lv<u128>),
    /// A bucket in debt, or one a FORCE call reads: a signed level.
    Signed(Sv),
}

/// The integer a view counts units in. Every product is of two `u64`
/// figures, saturating at `MAX` (`u128` never saturates: each product is
/// below 2^128); a view compares every saturated figure with `full`, which
/// fits, before it is used, so saturation changes no answer.
trait Units: Copy + Ord + core::fmt::Debug {
    fn of(v: u64) -> Self;
    /// `a × b`, saturating.
    fn mul(a: u64, b: u64) -> Self;
    /// `v`, saturating.
    fn sat(v: u128) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    /// `(self / d, self % d)`; `(MAX, 0)` for `d == 0`.
    fn div_rem(self, d: Self) -> (Self, Self);
    fn wide(self) -> u128;
    /// Milliseconds, rounded up, of `⌈deficit / rate⌉ + gap` µs
    /// (saturating; `u64::MAX` for `rate == 0`).
    fn wait_ms(deficit: Self, rate: u64, gap: u64) -> u64;
}

impl Units for u64 {
    #[inline(always)]
    fn of(v: u64) -> u64 {
        v
    }
    #[inline(always)]
    fn mul(a: u64, b: u64) -> u64 {
        a.saturating_mul(b)
    }
    #[inline(always)]
    fn sat(v: u128) -> u64 {
        u64::try_from(v).unwrap_or(u64::MAX)
    }
    #[inline(always)]
    fn add(self, o: u64) -> u64 {
        self.saturating_add(o)
    }
    #[inline(always)]
    fn sub(self, o: u64) -> u64 {
        self.saturating_sub(o)
    }
    #[inline(always)]
    fn div_rem(self, d: u64) -> (u64, u64) {
        match (self.checked_div(d), self.checked_rem(d)) {
            (Some(q), Some(r)) => (q, r),
            _ => (u64::MAX, 0),
        }
    }
    #[inline(always)]
    fn wide(self) -> u128 {
        u128::from(self)
    }
    #[inline(always)]
    fn wait_ms(deficit: u64, rate: u64, gap: u64) -> u64 {
        let (Some(q), Some(r)) = (deficit.checked_div(rate), deficit.checked_rem(rate)) else {
            return u64::MAX;
        };
        // r > 0 means q < deficit: q + 1 cannot overflow.
        let us = q + u64::from(r != 0);
        match us.checked_add(gap) {
            Some(us) => us.div_ceil(1000),
            None => us_to_ms_ceil(u128::from(us) + u128::from(gap)),
        }
    }
}

impl Units for u128 {
    #[inline(always)]
    fn of(v: u64) -> u128 {
        u128::from(v)
    }
    #[inline(always)]
    fn mul(a: u64, b: u64) -> u128 {
        // Below 2^128: never saturates.
        u128::from(a) * u128::from(b)
    }
    #[inline(always)]
    fn sat(v: u128) -> u128 {
        v
    }
    #[inline(always)]
    fn add(self, o: u128) -> u128 {
        self.saturating_add(o)
    }
    #[inline(always)]
    fn sub(self, o: u128) -> u128 {
        self.saturating_sub(o)
    }
    #[inline(always)]
    fn div_rem(self, d: u128) -> (u128, u128) {
        div_rem_u128(self, d)
    }
    #[inline(always)]
    fn wide(self) -> u128 {
        self
    }
    #[inline(always)]
    fn wait_ms(deficit: u128, rate: u64, gap: u64) -> u64 {
        us_to_ms_ceil(div_ceil_u128(deficit, u128::from(rate)).saturating_add(u128::from(gap)))
    }
}

/// The level of a [`View`] in one integer width.
#[derive(Clone, Copy, Debug)]
struct Lv<W> {
    /// Level in units (`den` units = one token), `≤ full`.
    level: W,
    /// `capacity × den`.
    full: W,
    /// Units per token: `period_ms × 1000`.
    den: u64,
    rate: u64,
    capacity: u64,
    /// The instant the state is read at: `max(now, last write)`.
    now_eff: u64,
    /// µs from the real clock reading to `now_eff` (clock stepped back).
    gap: u64,
}

impl<W: Units> Lv<W> {
    #[inline(always)]
    fn at(state: &State, p: &Params, den: u64, full: W, now_us: u64) -> Lv<W> {
        // Current level in units, after refill.
        let (level, now_eff) = if state.is_fresh() {
            (full, now_us)
        } else {
            let now_eff = now_us.max(state.last_us);
            // Rescale the fraction if the period changed (rounding down).
            let frac = if state.den == den {
                W::of(state.frac)
            } else {
                W::sat(u128::from(state.frac) * u128::from(den) / u128::from(state.den))
            };
            let stored = W::mul(state.tokens, den).add(frac);
            let refill = W::mul(now_eff - state.last_us, p.rate);
            (stored.add(refill).min(full), now_eff)
        };
        Lv { level, full, den, rate: p.rate, capacity: p.capacity, now_eff, gap: now_eff - now_us }
    }

    #[inline(always)]
    fn tokens(&self, level: W) -> (u64, W) {
        let (q, r) = level.div_rem(W::of(self.den));
        (u64::try_from(q.wide()).unwrap_or(u64::MAX), r)
    }

    /// Milliseconds, rounded up, until the level reaches `target` units.
    #[inline(always)]
    fn wait_ms(&self, level: W, target: W) -> u64 {
        let deficit = target.sub(level);
        if deficit == W::of(0) {
            return 0;
        }
        W::wait_ms(deficit, self.rate, self.gap)
    }

    #[inline(always)]
    fn take(&self, taken: u64, want: u64) -> (Decision, State) {
        let after = self.level.sub(W::mul(taken, self.den));
        let (tokens, frac) = self.tokens(after);
        let retry_after_ms = if taken == want {
            0
        } else if want > self.capacity {
            -1
        } else {
            to_i64(self.wait_ms(after, W::mul(want, self.den)))
        };
        let d = Decision {
            granted: taken,
            limit: self.capacity,
            remaining: tokens,
            retry_after_ms,
            reset_after_ms: self.wait_ms(after, self.full),
        };
        let s = State { tokens, frac: u64::try_from(frac.wide()).unwrap_or(0), den: self.den, last_us: self.now_eff };
        (d, s)
    }

    /// Take what a call of `cost` (with `partial`) gets: [`View::available`]
    /// then [`View::take`] of this level.
    #[inline(always)]
    fn step(&self, cost: u64, partial: bool) -> (Decision, State) {
        let granted = crate::grant_size(self.tokens(self.level).0, cost, partial);
        // One take gives both: the state after it does not depend on `want`.
        self.take(granted, cost)
    }

    #[inline(always)]
    fn refunded(&self, n: u64) -> Lv<W> {
        Lv { level: self.level.add(W::mul(n, self.den)).min(self.full), ..*self }
    }
}

impl View {
    #[inline]
    pub fn at(state: &State, p: &Params, now_us: u64) -> View {
        if state.in_debt() {
            return View::at_signed(state, p, now_us);
        }
        let den = ms_to_us(p.period_ms).max(1);
        match p.capacity.checked_mul(den) {
            Some(full) => View(Form::Narrow(Lv::at(state, p, den, full, now_us))),
            None => View::at_wide(state, p, now_us),
        }
    }

    /// [`View::at`] counted in `u128` whatever the parameters (the wide
    /// form, which the narrow one must agree with).
    #[inline(never)]
    pub fn at_wide(state: &State, p: &Params, now_us: u64) -> View {
        if state.in_debt() {
            return View::at_signed(state, p, now_us);
        }
        let den = ms_to_us(p.period_ms).max(1);
        View(Form::Wide(Lv::at(state, p, den, u128::from(p.capacity) * u128::from(den), now_us)))
    }

    /// [`View::at`] as a signed level, whatever the state (a bucket in
    /// debt, and every FORCE call).
    #[inline(never)]
    pub fn at_signed(state: &State, p: &Params, now_us: u64) -> View {
        View(Form::Signed(Sv::at(state, p, now_us)))
    }

    /// Whole tokens a call could take now (`≤ capacity`; 0 in debt).
    #[inline]
    pub fn available(&self) -> u64 {
        match &self.0 {
            Form::Narrow(v) => v.tokens(v.level).0,
            Form::Wide(v) => v.tokens(v.level).0,
            Form::Signed(v) => v.available(),
        }
    }

    /// A FORCE call can take `units` (past the level if need be): the whole
    /// tokens after it stay at or above `−MAX_ARG`.
    #[inline]
    pub fn can_force(&self, units: u64) -> bool {
        match &self.0 {
            Form::Signed(v) => v.can_force(units),
            _ => self.signed().can_force(units),
        }
    }

    /// The reply after a FORCE call took `taken` tokens (possibly more than
    /// [`View::available`], when [`View::can_force`]), answering for a
    /// following call of `want`: retry_after_ms is its wait (0 when it fits
    /// now), not 0 for this grant.
    #[inline]
    pub fn answer_forced(&self, taken: u64, want: u64) -> Decision {
        self.signed().take(taken, want, false).0
    }

    /// This view as a signed one (the same level).
    #[inline]
    fn signed(&self) -> Sv {
        match &self.0 {
            Form::Narrow(v) => Sv::of(v),
            Form::Wide(v) => Sv::of(v),
            Form::Signed(v) => *v,
        }
    }

    /// The reply after taking `taken` tokens (`≤ available()`) for a call
    /// that asked for `want`: retry_after_ms is 0 when it got them all, −1
    /// when `want` exceeds the capacity, else the time until `want` tokens
    /// are there again after this take. Waits are measured from the real
    /// `now_us`: while the clock is behind the stored time, the refill
    /// resumes only once it catches up, so the gap is part of every wait
    /// (and of the key's TTL).
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        self.take(taken, want).0
    }

    /// The state to store after taking `taken` tokens (never fresh when
    /// `taken > 0`).
    #[inline]
    pub fn state_after(&self, taken: u64) -> State {
        self.take(taken, taken).1
    }

    /// The state after a FORCE call took `taken` tokens
    /// ([`View::can_force`]), in debt when they were more than the level.
    #[inline]
    pub fn state_after_forced(&self, taken: u64) -> State {
        self.signed().take(taken, taken, true).1
    }

    /// [`View::answer`] and [`View::state_after`] of one take (`taken ≤
    /// available()` of `want`) at once: they share the level after the take
    /// and its division into tokens (RL.MULTI's fast path).
    #[inline(always)]
    pub fn take(&self, taken: u64, want: u64) -> (Decision, State) {
        match &self.0 {
            Form::Narrow(v) => v.take(taken, want),
            Form::Wide(v) => v.take(taken, want),
            Form::Signed(v) => v.take(taken, want, taken == want),
        }
    }

    /// The bucket after `n` tokens are given back: min(capacity, tokens + n).
    #[inline]
    pub fn refunded(&self, n: u64) -> View {
        View(match &self.0 {
            Form::Narrow(v) => Form::Narrow(v.refunded(n)),
            Form::Wide(v) => Form::Wide(v.refunded(n)),
            Form::Signed(v) => Form::Signed(v.refunded(n)),
        })
    }

    /// Nothing taken: the bucket is full.
    #[inline]
    pub fn is_full(&self) -> bool {
        match &self.0 {
            Form::Narrow(v) => v.level >= v.full,
            Form::Wide(v) => v.level >= v.full,
            Form::Signed(v) => v.level >= v.full,
        }
    }

    /// Whole tokens, signed (negative in debt): a refund gives back the
    /// difference of two of these.
    #[inline]
    fn whole(&self) -> i128 {
        let v = self.signed();
        v.level.div_euclid(i128::from(v.den.max(1)))
    }
}

/// A bucket's level as a signed number of units (`den` units = one
/// token): below zero in debt. Every figure fits an `i128` with room to
/// spare: `|tokens| ≤ 2^64` times `den < 2^64`, a refill below 2^128 is
/// compared before it is added, `full = capacity × den` saturates.
#[derive(Clone, Copy, Debug)]
struct Sv {
    /// Level in units, `≤ full`, negative in debt.
    level: i128,
    full: i128,
    den: u64,
    rate: u64,
    capacity: u64,
    now_eff: u64,
    gap: u64,
}

/// `v` as `i128`, saturating.
#[inline]
fn sat_i128(v: u128) -> i128 {
    i128::try_from(v).unwrap_or(i128::MAX)
}

impl Sv {
    #[inline]
    fn at(state: &State, p: &Params, now_us: u64) -> Sv {
        let den = ms_to_us(p.period_ms).max(1);
        let full = sat_i128(u128::from(p.capacity) * u128::from(den));
        let (level, now_eff) = if state.is_fresh() {
            (full, now_us)
        } else {
            let now_eff = now_us.max(state.last_us);
            let frac = if state.den == den {
                u128::from(state.frac)
            } else {
                u128::from(state.frac) * u128::from(den) / u128::from(state.den)
            };
            // |whole × den| < 2^127; frac < 2^64 (it is below den once
            // rescaled; a hand-built one saturates).
            let stored = i128::from(state.whole()).saturating_mul(i128::from(den)).saturating_add(sat_i128(frac));
            let refill = u128::from(now_eff - state.last_us) * u128::from(p.rate);
            // stored ≤ full: room ≥ 0 (a stored level above full is capped).
            let room = u128::try_from(full.saturating_sub(stored)).unwrap_or(0);
            let level = if refill >= room { full } else { stored.saturating_add(sat_i128(refill)) };
            (level.min(full), now_eff)
        };
        Sv { level, full, den, rate: p.rate, capacity: p.capacity, now_eff, gap: now_eff - now_us }
    }

    /// A view of the same level, from an unsigned one.
    #[inline]
    fn of<W: Units>(v: &Lv<W>) -> Sv {
        Sv {
            level: sat_i128(v.level.wide()),
            full: sat_i128(v.full.wide()),
            den: v.den,
            rate: v.rate,
            capacity: v.capacity,
            now_eff: v.now_eff,
            gap: v.gap,
        }
    }

    #[inline]
    fn units(&self, tokens: u64) -> i128 {
        i128::from(tokens).saturating_mul(i128::from(self.den))
    }

    #[inline]
    fn available(&self) -> u64 {
        u64::try_from(self.level.div_euclid(i128::from(self.den.max(1)))).unwrap_or(0)
    }

    #[inline]
    fn can_force(&self, units: u64) -> bool {
        self.level.saturating_sub(self.units(units)) >= -self.units(crate::MAX_ARG)
    }

    /// Milliseconds, rounded up, until the level reaches `target` units.
    #[inline]
    fn wait_ms(&self, level: i128, target: i128) -> u64 {
        let deficit = target.saturating_sub(level);
        if deficit <= 0 {
            return 0;
        }
        let deficit = u128::try_from(deficit).unwrap_or(0);
        us_to_ms_ceil(div_ceil_u128(deficit, u128::from(self.rate)).saturating_add(u128::from(self.gap)))
    }

    /// Take `taken` tokens (the level may go below zero); the reply for a
    /// call of `want` (`done`: it got them all, retry_after_ms 0), and the
    /// state to store.
    #[inline]
    fn take(&self, taken: u64, want: u64, done: bool) -> (Decision, State) {
        let after = self.level.saturating_sub(self.units(taken));
        let den = i128::from(self.den.max(1));
        let (whole, frac) = (after.div_euclid(den), after.rem_euclid(den));
        let retry_after_ms = if done {
            0
        } else if want > self.capacity {
            -1
        } else {
            to_i64(self.wait_ms(after, self.units(want)))
        };
        let d = Decision {
            granted: taken,
            limit: self.capacity,
            remaining: u64::try_from(whole).unwrap_or(0),
            retry_after_ms,
            reset_after_ms: self.wait_ms(after, self.full),
        };
        // whole ≥ −MAX_ARG for every take a caller makes (`can_force`);
        // its two's complement is the stored form.
        let tokens = i64::try_from(whole).unwrap_or(i64::MIN) as u64;
        let s = State { tokens, frac: u64::try_from(frac).unwrap_or(0), den: self.den, last_us: self.now_eff };
        (d, s)
    }

    #[inline]
    fn refunded(&self, n: u64) -> Sv {
        Sv { level: self.level.saturating_add(self.units(n)).min(self.full), ..*self }
    }
}

/// `(state, params, cost, now) -> (decision, new state)`. Pure. The new state
/// is what the key must hold if the call is written (granted > 0, not
/// DRYRUN); it is never fresh then.
///
/// The width is chosen first and the level computed, counted and taken
/// from in it ([`Lv::step`]): the same figures as a [`View`]'s
/// `available` and `take`, without building the view of either width.
#[inline(always)]
pub fn step(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    if state.in_debt() {
        return step_signed(state, p, cost, partial, now_us);
    }
    let den = ms_to_us(p.period_ms).max(1);
    match p.capacity.checked_mul(den) {
        Some(full) => Lv::at(state, p, den, full, now_us).step(cost, partial),
        None => step_wide(state, p, den, cost, partial, now_us),
    }
}

/// [`step`] counted in `u128` (a full bucket beyond 64 bits), with
/// `step`'s `den`. Inlined
/// too, though rarely run: out of line, its returned pair made the
/// narrow path's decision and state merge with it through memory.
#[inline(always)]
fn step_wide(state: &State, p: &Params, den: u64, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    Lv::at(state, p, den, u128::from(p.capacity) * u128::from(den), now_us).step(cost, partial)
}

/// [`step`] of a bucket in debt: nothing is available until the debt is
/// repaid.
#[cold]
#[inline(never)]
fn step_signed(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    let v = Sv::at(state, p, now_us);
    let granted = crate::grant_size(v.available(), cost, partial);
    v.take(granted, cost, granted == cost)
}

/// `COST n FORCE`: take `cost` tokens even when fewer are there, leaving
/// the bucket in debt (negative whole tokens, repaid by the refill like
/// any missing token), unless the debt would pass `MAX_ARG` tokens: then
/// the call is decided as without FORCE. The reply of a forced grant
/// answers for a following call of `want` tokens (remaining 0 in debt;
/// retry_after_ms its wait, 0 when it fits now; reset_after_ms until
/// full). Returns it, and the state to store when `granted > 0`.
pub fn force(state: &State, p: &Params, cost: u64, want: u64, now_us: u64) -> (Decision, State) {
    let v = Sv::at(state, p, now_us);
    if v.can_force(cost) {
        let (d, s) = v.take(cost, want, false);
        (d, s)
    } else {
        let granted = crate::grant_size(v.available(), cost, false);
        v.take(granted, cost, granted == cost)
    }
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
    let (mut d, s) = after.take(0, want);
    // Whole tokens gained, debt repaid included (a level is at most full,
    // so this is at most n).
    d.granted = u64::try_from(after.whole().saturating_sub(v.whole())).unwrap_or(0);
    (d, s)
}
