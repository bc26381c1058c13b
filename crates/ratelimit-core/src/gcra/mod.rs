//! GCRA as `CL.THROTTLE key max_burst count_per_period period [quantity]`
//! answers it, call for call the way redis-cell 0.5 does (its source read
//! at commit 4d42338; none of it is copied here).
//!
//! The state is one number: the theoretical arrival time (TAT), in
//! nanoseconds since the Unix epoch. redis-cell keeps it as a decimal string
//! key (`SET key <tat> PX <ttl>`); this module keeps it in a 9-byte native
//! value and reads the string form too ([`parse_cell_string`]), so a server
//! moved from redis-cell goes on from the same state.
//!
//! With `T` the emission interval (`period` seconds / `count`, in ns, as
//! redis-cell computes it: through `f64`, truncated), `τ = T × (max_burst +
//! 1)` (the delay variation tolerance) and `inc = T × quantity`:
//!
//! ```text
//! tat      = stored TAT if the key is alive, else now
//! new_tat  = max(now, tat) + inc
//! allowed  ⟺ now − (new_tat − τ) ≥ 0            (then TAT := new_tat)
//! ttl      = new_tat − now if allowed, else tat − now
//! remaining = ⌊µs(τ − ttl) / µs(T)⌋ in f64, when τ − ttl > −T, else 0
//! retry_after = now − (new_tat − τ) negated when denied and inc ≤ τ, else −1 s
//! ```
//!
//! and the two durations are replied in seconds the way redis-cell rounds
//! them: `as_seconds_f64` truncated, plus one when the sub-second part has
//! at least a whole millisecond ([`cell_seconds`]). A written key expires
//! `⌊ttl⌋` ms after the call's millisecond, as redis-cell's `PEXPIRE` does,
//! so a key that redis-cell would have seen expire is gone here too.
//!
//! Where redis-cell's arithmetic wraps, panics or writes a key and then
//! fails (negative arguments, products past `i64`), this module refuses the
//! call instead ([`ParamError`]); every product is computed in `i128`.

use crate::{DecodeError, Reader};

/// Nanoseconds in a second.
pub const NS_PER_S: i128 = 1_000_000_000;

/// The stored state: the theoretical arrival time, ns since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub tat_ns: u64,
}

/// The parameters of one call, derived from its four numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Emission interval `T`, ns (≥ 1).
    pub emission_ns: i64,
    /// `τ = T × (max_burst + 1)`, ns.
    pub tolerance_ns: i64,
    /// `T × quantity`, ns.
    pub increment_ns: i64,
    /// `max_burst + 1`, the reply's second field.
    pub limit: i64,
}

/// Why a call's numbers are refused (each has its own reply text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamError {
    /// count or period is 0, or the interval rounds to 0 ns: redis-cell's
    /// `Zero rates are not supported`.
    ZeroRate,
    /// A negative max_burst, count, period or quantity (redis-cell computes
    /// with them and can write a key before failing).
    Negative,
    /// `T × (max_burst + 1)` or `T × quantity` past `i64` nanoseconds (≈ 292
    /// years), where redis-cell's products wrap.
    TooLarge,
}

/// The emission interval redis-cell derives: `period × 10⁹` and `count`
/// each converted to `f64`, divided, truncated to `i64` (saturating).
pub fn emission_ns(count: i64, period: i64) -> i64 {
    let ns = i128::from(period) * NS_PER_S;
    if count == 0 || ns == 0 {
        return 0;
    }
    (to_f64(ns) / count as f64) as i64
}

// The request path's arithmetic is i128 (no overflow anywhere), but i128
// division and conversion to f64 are library calls of ~50-100 instructions
// each, i64's one instruction: where the value fits in i64 (every value
// of a call in range: durations of at most 2^63 ns) the i64 form is used.
// Both give the same result: truncation toward zero, and the f64 nearest
// to the exact integer.

/// `x / d`, truncated toward zero (`d` > 0).
#[inline]
fn div(x: i128, d: i64) -> i128 {
    match i64::try_from(x) {
        Ok(v) => i128::from(v / d),
        Err(_) => div_wide(x, d),
    }
}

/// The f64 nearest to `x`.
#[inline]
fn to_f64(x: i128) -> f64 {
    match i64::try_from(x) {
        Ok(v) => v as f64,
        Err(_) => to_f64_wide(x),
    }
}

// Out of line: otherwise the compiler sees that both arms compute the same
// value and keeps only the library call.
#[cold]
#[inline(never)]
fn div_wide(x: i128, d: i64) -> i128 {
    x / i128::from(d)
}

#[cold]
#[inline(never)]
fn to_f64_wide(x: i128) -> f64 {
    x as f64
}

impl Params {
    /// The parameters of `max_burst count period quantity`, or why not.
    pub fn new(max_burst: i64, count: i64, period: i64, quantity: i64) -> Result<Params, ParamError> {
        // redis-cell checks the rate first (after parsing): keep its order.
        if count == 0 || period == 0 {
            return Err(ParamError::ZeroRate);
        }
        if max_burst < 0 || count < 0 || period < 0 || quantity < 0 {
            return Err(ParamError::Negative);
        }
        let t = emission_ns(count, period);
        if t == 0 {
            return Err(ParamError::ZeroRate);
        }
        let limit = max_burst.checked_add(1).ok_or(ParamError::TooLarge)?;
        let tolerance_ns = t.checked_mul(limit).ok_or(ParamError::TooLarge)?;
        let increment_ns = t.checked_mul(quantity).ok_or(ParamError::TooLarge)?;
        Ok(Params { emission_ns: t, tolerance_ns, increment_ns, limit })
    }
}

/// What a call answers, before the seconds rounding, and what it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub limited: bool,
    pub limit: i64,
    pub remaining: i64,
    /// ns; −10⁹ (−1 s) when allowed or when the quantity can never pass.
    pub retry_after_ns: i128,
    /// ns (may be slightly negative: see the module doc).
    pub reset_after_ns: i128,
    /// The state to store when allowed (`None`: write nothing).
    pub write: Option<State>,
    /// When written: the key's TTL in whole ms (truncated, as redis-cell's
    /// `PEXPIRE`), from the call's millisecond.
    pub ttl_ms: u64,
}

/// Why a state cannot be stepped: a TAT so far ahead that the new one would
/// not fit in `u64` ns (only a hand-written string can hold one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfRange;

/// One call at `now_ns` on the state `cur` (`None`: no live key).
pub fn step(cur: Option<State>, p: &Params, now_ns: u64) -> Result<Outcome, OutOfRange> {
    match step_i64(cur, p, now_ns) {
        Some(o) => Ok(o),
        None => step_wide(cur, p, now_ns),
    }
}

/// [`step`] in `i64` (half the instructions of i128's): None where any
/// value leaves `i64` (a TAT or an instant past 2262, a hand-written
/// string), which [`step_wide`] then answers the same way.
#[inline]
fn step_i64(cur: Option<State>, p: &Params, now_ns: u64) -> Option<Outcome> {
    let now = i64::try_from(now_ns).ok()?;
    let tat = match cur {
        Some(s) => i64::try_from(s.tat_ns).ok()?,
        None => now,
    };
    let (inc, tau) = (p.increment_ns, p.tolerance_ns);
    let new_tat = if now > tat { now.checked_add(inc)? } else { tat.checked_add(inc)? };
    let diff = now.checked_sub(new_tat.checked_sub(tau)?)?;
    let (limited, ttl, retry, write) = if diff < 0 {
        let retry = if inc <= tau { diff.checked_neg()? } else { -1_000_000_000 };
        (true, tat.checked_sub(now)?, retry, None)
    } else {
        let tat_ns = u64::try_from(new_tat).ok()?;
        (false, new_tat.checked_sub(now)?, -1_000_000_000, Some(State { tat_ns }))
    };
    let t = p.emission_ns; // ≥ 1
    let next = tau.checked_sub(ttl)?;
    let remaining = if next > -t { ((next / 1000) as f64 / (t / 1000) as f64) as i64 } else { 0 };
    let ttl_ms = u64::try_from(ttl / 1_000_000).unwrap_or(0);
    Some(Outcome {
        limited,
        limit: p.limit,
        remaining,
        retry_after_ns: i128::from(retry),
        reset_after_ns: i128::from(ttl),
        write,
        ttl_ms,
    })
}

/// [`step`] in `i128`, for every value.
#[cold]
#[inline(never)]
fn step_wide(cur: Option<State>, p: &Params, now_ns: u64) -> Result<Outcome, OutOfRange> {
    let now = i128::from(now_ns);
    let tat = cur.map_or(now, |s| i128::from(s.tat_ns));
    let inc = i128::from(p.increment_ns);
    let tau = i128::from(p.tolerance_ns);
    let new_tat = if now > tat { now + inc } else { tat + inc };
    let diff = now - (new_tat - tau);
    let (limited, ttl, retry, write) = if diff < 0 {
        let retry = if inc <= tau { -diff } else { -NS_PER_S };
        (true, tat - now, retry, None)
    } else {
        let tat_ns = u64::try_from(new_tat).map_err(|_| OutOfRange)?;
        (false, new_tat - now, -NS_PER_S, Some(State { tat_ns }))
    };
    let t = i128::from(p.emission_ns);
    let next = tau - ttl;
    let remaining = if next > -t { (to_f64(div(next, 1000)) / to_f64(div(t, 1000))) as i64 } else { 0 };
    // ttl ≥ 0 whenever a state is written (new_tat ≥ now).
    let ttl_ms = u64::try_from(div(ttl, 1_000_000)).unwrap_or(0);
    Ok(Outcome { limited, limit: p.limit, remaining, retry_after_ns: retry, reset_after_ns: ttl, write, ttl_ms })
}

/// A duration in ns as redis-cell replies it in seconds: the `f64` seconds
/// (whole seconds plus the signed sub-second ns over 10⁹) truncated to
/// `i64`, plus 1 when the sub-second part holds a whole positive millisecond.
pub fn cell_seconds(ns: i128) -> i64 {
    match i64::try_from(ns) {
        Ok(v) => {
            let (secs, sub) = (v / 1_000_000_000, v % 1_000_000_000);
            let s = (secs as f64 + sub as f64 / 1e9) as i64;
            if sub >= 1_000_000 {
                s.saturating_add(1)
            } else {
                s
            }
        }
        Err(_) => cell_seconds_wide(ns),
    }
}

/// [`cell_seconds`] of a duration past `i64` ns (a hand-written TAT).
#[cold]
#[inline(never)]
fn cell_seconds_wide(ns: i128) -> i64 {
    let secs = div(ns, 1_000_000_000);
    let sub = ns - secs * NS_PER_S; // |sub| < 10⁹, the sign of ns
    let f = to_f64(secs) + to_f64(sub) / 1e9;
    let mut s = f as i64;
    if sub / 1_000_000 > 0 {
        s = s.saturating_add(1);
    }
    s
}

/// The five integers of the reply.
pub fn reply(o: &Outcome) -> [i64; 5] {
    [i64::from(o.limited), o.limit, o.remaining, cell_seconds(o.retry_after_ns), cell_seconds(o.reset_after_ns)]
}

/// A redis-cell string value as its TAT, read as Rust's `str::parse::<u64>`
/// (what redis-cell uses) reads it: an optional `+`, then one or more ASCII
/// digits, at most `u64::MAX`. Anything else is not redis-cell's (redis-cell
/// itself would panic on it).
pub fn parse_cell_string(b: &[u8]) -> Option<u64> {
    let digits = b.strip_prefix(b"+").unwrap_or(b);
    if digits.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(v)
}

impl State {
    /// Body length: version byte + TAT.
    pub const ENCODED_LEN: usize = 9;
    const VERSION: u8 = 1;

    /// The versioned body (RDB, DUMP, DEBUG DIGEST, RL.STATE).
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[0] = Self::VERSION;
        b[1..].copy_from_slice(&self.tat_ns.to_le_bytes());
        b
    }

    /// Strict decoder: exactly a version-1 body (every TAT is valid).
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != Self::VERSION {
            return Err(DecodeError::UnknownVersion);
        }
        let tat_ns = r.u64()?;
        r.finish()?;
        Ok(State { tat_ns })
    }

    /// Always compact: the TAT and a zero word.
    pub fn pack(&self) -> Option<[u64; 2]> {
        Some([self.tat_ns, 0])
    }

    pub fn unpack(w: [u64; 2]) -> State {
        State { tat_ns: w[0] }
    }
}

/// A numeric argument as redis-cell reads it: UTF-8, then Rust's
/// `str::parse::<i64>` (an optional sign, ASCII digits, nothing else).
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    // What `str::parse::<i64>` accepts, byte by byte (its UTF-8 check
    // cannot fail where every byte must be an ASCII digit or sign).
    let (neg, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = i64::from(c.wrapping_sub(b'0'));
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?;
        v = if neg { v.checked_sub(d)? } else { v.checked_add(d)? };
    }
    Some(v)
}

#[cfg(test)]
mod tests;
