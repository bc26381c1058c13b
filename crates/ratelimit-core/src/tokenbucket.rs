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

use crate::{
    div_ceil_u128, low_bits, ms_to_us, split, to_i64, us_to_ms_ceil, Decision, DecodeError, Reader, MAX_ARG, PACK_EPOCH_US,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub capacity: u64,
    pub rate: u64,
    pub period_ms: u64,
}

/// Stored state of a bucket that is not full. `den == 0` means "no state"
/// (a fresh, full bucket); it is never stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Whole tokens.
    pub tokens: u64,
    /// Fractional token, in units of `1/den` token; `frac < den`.
    pub frac: u64,
    /// `period_ms × 1000` of the call that wrote this state.
    pub den: u64,
    /// Time of the write, µs since the Unix epoch.
    pub last_us: u64,
}

/// Encoding version written by `encode` (first byte).
pub const ENCODING_VERSION: u8 = 1;

/// Compact in-memory form (`State::pack`), one 128-bit word, low bits first:
/// `last_us − PACK_EPOCH_US` (51 bits: until 2091), `pb` = the bit length of
/// `period_ms` (6 bits), `period_ms` (`pb` bits), `frac` (as many bits as
/// `den` has), then `tokens` in the bits left (`61 − 2·pb` or so: about
/// 2·10^12 tokens for a per-second bucket, 4·10^8 per minute, 1.3·10^5 per
/// hour). Anything else stays in the wide form. No division either way.
const PACK_T_BITS: u32 = 51;
const PACK_PB_BITS: u32 = 6;

impl State {
    pub const ENCODED_LEN: usize = 1 + 4 * 8;

    pub fn is_fresh(&self) -> bool {
        self.den == 0
    }

    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0] = ENCODING_VERSION;
        out[1..9].copy_from_slice(&self.tokens.to_le_bytes());
        out[9..17].copy_from_slice(&self.frac.to_le_bytes());
        out[17..25].copy_from_slice(&self.den.to_le_bytes());
        out[25..33].copy_from_slice(&self.last_us.to_le_bytes());
        out
    }

    /// The state in two words, when it fits the compact form (see
    /// `PACK_T_BITS`); `unpack` gives back exactly this state. `None` for
    /// states outside it, which are then stored in full.
    pub fn pack(&self) -> Option<[u64; 2]> {
        let t = self.last_us.checked_sub(PACK_EPOCH_US)?;
        if t >> PACK_T_BITS != 0 || self.den == 0 || !self.den.is_multiple_of(1000) || self.frac >= self.den {
            return None;
        }
        let period = self.den / 1000;
        let pb = bit_len(period); // 1..=54
        let tokens_at = PACK_T_BITS + PACK_PB_BITS + pb + bit_len(self.den);
        if tokens_at > u128::BITS || u128::from(self.tokens) >> (u128::BITS - tokens_at) != 0 {
            return None;
        }
        let x = u128::from(t)
            | (u128::from(pb) << PACK_T_BITS)
            | (u128::from(period) << (PACK_T_BITS + PACK_PB_BITS))
            | (u128::from(self.frac) << (PACK_T_BITS + PACK_PB_BITS + pb))
            | u128::from(self.tokens).checked_shl(tokens_at).unwrap_or(0);
        Some(split(x))
    }

    /// Inverse of `pack`. Total: any two words give some state (only words
    /// written by `pack` are ever passed).
    pub fn unpack(w: [u64; 2]) -> State {
        let x = u128::from(w[0]) | (u128::from(w[1]) << 64);
        let t = low_bits(x, PACK_T_BITS);
        let pb = low_bits(x >> PACK_T_BITS, PACK_PB_BITS) as u32; // < 64
        let period = low_bits(x >> (PACK_T_BITS + PACK_PB_BITS), pb);
        let den = period.saturating_mul(1000);
        let frac_at = PACK_T_BITS + PACK_PB_BITS + pb; // ≤ 120
        let tokens_at = frac_at + bit_len(den);
        State {
            tokens: x.checked_shr(tokens_at).map_or(0, |v| low_bits(v, 64)),
            frac: low_bits(x >> frac_at, bit_len(den)),
            den,
            last_us: t + PACK_EPOCH_US,
        }
    }

    /// Strict decoder: every invariant is checked, trailing bytes refused.
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err(DecodeError::UnknownVersion);
        }
        let s = State { tokens: r.u64()?, frac: r.u64()?, den: r.u64()?, last_us: r.u64()? };
        r.finish()?;
        if s.den == 0 || !s.den.is_multiple_of(1000) || s.den / 1000 > MAX_ARG {
            return Err(DecodeError::Invalid("period"));
        }
        if s.frac >= s.den {
            return Err(DecodeError::Invalid("fraction"));
        }
        if s.tokens >= MAX_ARG {
            // A stored bucket is never full, so it holds fewer than
            // capacity ≤ MAX_ARG tokens.
            return Err(DecodeError::Invalid("tokens"));
        }
        Ok(s)
    }
}

/// Number of significant bits of `v` (0 for 0).
fn bit_len(v: u64) -> u32 {
    u64::BITS - v.leading_zeros()
}

/// A bucket read at one instant under one call's parameters: the level
/// after refill. The single command and every token-bucket limit of
/// RL.MULTI decide through it: [`View::available`] says how many tokens a
/// call could take, [`View::answer`] is the reply after taking some, and
/// [`View::state_after`] the state to store.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Level in units (`den` units = one token), `≤ full`.
    level: u128,
    /// Units per token: `period_ms × 1000`.
    den: u128,
    /// `capacity × den`.
    full: u128,
    rate: u128,
    capacity: u64,
    /// The instant the state is read at: `max(now, last write)`.
    now_eff: u64,
    /// µs from the real clock reading to `now_eff` (clock stepped back).
    gap: u128,
}

impl View {
    #[inline]
    pub fn at(state: &State, p: &Params, now_us: u64) -> View {
        let den = u128::from(ms_to_us(p.period_ms).max(1));
        let rate = u128::from(p.rate);
        let full = u128::from(p.capacity) * den;
        // Current level in units, after refill.
        let (level, now_eff) = if state.is_fresh() {
            (full, now_us)
        } else {
            let now_eff = now_us.max(state.last_us);
            // Rescale the fraction if the period changed (rounding down).
            let frac = if u128::from(state.den) == den {
                u128::from(state.frac)
            } else {
                u128::from(state.frac) * den / u128::from(state.den)
            };
            let stored = u128::from(state.tokens) * den + frac;
            let refill = u128::from(now_eff - state.last_us) * rate;
            (stored.saturating_add(refill).min(full), now_eff)
        };
        View { level, den, full, rate, capacity: p.capacity, now_eff, gap: u128::from(now_eff - now_us) }
    }

    /// Whole tokens a call could take now (`≤ capacity`).
    #[inline]
    pub fn available(&self) -> u64 {
        u64::try_from(self.level / self.den).unwrap_or(u64::MAX)
    }

    /// Milliseconds, rounded up, until the level reaches `target` units.
    /// Waits are measured from the real `now_us`: while the clock is behind
    /// the stored time, the refill resumes only once it catches up, so the
    /// gap is part of every wait (and of the key's TTL).
    #[inline]
    fn wait_ms(&self, level: u128, target: u128) -> u64 {
        let deficit = target.saturating_sub(level);
        if deficit == 0 {
            return 0;
        }
        us_to_ms_ceil(div_ceil_u128(deficit, self.rate).saturating_add(self.gap))
    }

    /// The reply after taking `taken` tokens (`≤ available()`) for a call
    /// that asked for `want`: retry_after_ms is 0 when it got them all, −1
    /// when `want` exceeds the capacity, else the time until `want` tokens
    /// are there again after this take.
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        let after = self.level.saturating_sub(u128::from(taken) * self.den);
        let retry_after_ms = if taken == want {
            0
        } else if want > self.capacity {
            -1
        } else {
            to_i64(self.wait_ms(after, u128::from(want) * self.den))
        };
        Decision {
            granted: taken,
            limit: self.capacity,
            remaining: u64::try_from(after / self.den).unwrap_or(u64::MAX),
            retry_after_ms,
            reset_after_ms: self.wait_ms(after, self.full),
        }
    }

    /// The state to store after taking `taken` tokens (never fresh when
    /// `taken > 0`).
    #[inline]
    pub fn state_after(&self, taken: u64) -> State {
        let after = self.level.saturating_sub(u128::from(taken) * self.den);
        State {
            tokens: u64::try_from(after / self.den).unwrap_or(u64::MAX),
            frac: u64::try_from(after % self.den).unwrap_or(0),
            den: u64::try_from(self.den).unwrap_or(0),
            last_us: self.now_eff,
        }
    }

    /// The bucket after `n` tokens are given back: min(capacity, tokens + n).
    #[inline]
    pub fn refunded(&self, n: u64) -> View {
        View { level: self.level.saturating_add(u128::from(n) * self.den).min(self.full), ..*self }
    }

    /// Nothing taken: the bucket is full.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.level >= self.full
    }
}

/// `(state, params, cost, now) -> (decision, new state)`. Pure. The new state
/// is what the key must hold if the call is written (granted > 0, not
/// DRYRUN); it is never fresh then.
pub fn step(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    let v = View::at(state, p, now_us);
    let granted = crate::grant_size(v.available(), cost, partial);
    (v.answer(granted, cost), v.state_after(granted))
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
    let mut d = after.answer(0, want);
    d.granted = after.available().saturating_sub(v.available());
    (d, after.state_after(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tb(capacity: u64, rate: u64, period_ms: u64) -> Params {
        Params { capacity, rate, period_ms }
    }

    /// Apply a call the way the glue does: write only when something was
    /// granted (and not DRYRUN).
    fn call(s: &mut State, p: &Params, cost: u64, partial: bool, now: u64) -> Decision {
        let (d, n) = step(s, p, cost, partial, now);
        if d.granted > 0 {
            *s = n;
        }
        d
    }

    #[test]
    fn fresh_bucket_is_full() {
        let s = State::default();
        let (d, n) = step(&s, &tb(10, 1, 1000), 1, false, 5_000_000);
        assert_eq!(d, Decision { granted: 1, limit: 10, remaining: 9, retry_after_ms: 0, reset_after_ms: 1000 });
        assert_eq!(n, State { tokens: 9, frac: 0, den: 1_000_000, last_us: 5_000_000 });
    }

    #[test]
    fn drains_then_refills_continuously() {
        let p = tb(3, 10, 1000); // one token every 100 ms
        let mut s = State::default();
        let t0 = 1_000_000_000;
        for i in 0..3 {
            let d = call(&mut s, &p, 1, false, t0);
            assert_eq!(d.granted, 1);
            assert_eq!(d.remaining, 2 - i);
        }
        let d = call(&mut s, &p, 1, false, t0);
        assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (0, 0, 100, 300));
        // 99.999 ms later: still not a whole token; retry rounds up to 1 ms.
        let d = call(&mut s, &p, 1, false, t0 + 99_999);
        assert_eq!((d.granted, d.retry_after_ms), (0, 1));
        let d = call(&mut s, &p, 1, false, t0 + 100_000);
        assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (1, 0, 0, 300));
        // Half a token accrued: reset accounts for it exactly.
        let d = call(&mut s, &p, 1, false, t0 + 150_000);
        assert_eq!((d.granted, d.retry_after_ms, d.reset_after_ms), (0, 50, 250));
    }

    #[test]
    fn one_per_hour() {
        let p = tb(1, 1, 3_600_000);
        let mut s = State::default();
        assert_eq!(call(&mut s, &p, 1, false, 0).granted, 1);
        let d = call(&mut s, &p, 1, false, 1);
        assert_eq!((d.granted, d.retry_after_ms, d.reset_after_ms), (0, 3_600_000, 3_600_000));
        assert_eq!(call(&mut s, &p, 1, false, 3_600_000_000).granted, 1);
    }

    #[test]
    fn cost_above_capacity_never() {
        let p = tb(5, 1, 1000);
        let s = State::default();
        let (d, _) = step(&s, &p, 6, false, 0);
        assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (0, 5, -1, 0));
        let (d, n) = step(&s, &p, 6, true, 0);
        assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (5, 0, -1, 5000));
        assert_eq!(n.tokens, 0);
    }

    #[test]
    fn partial_takes_what_is_there() {
        let p = tb(10, 1, 1000);
        let mut s = State::default();
        call(&mut s, &p, 7, false, 0);
        let d = call(&mut s, &p, 5, true, 0);
        assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (3, 0, 5000, 10_000));
        assert_eq!(d.allowed(5, true), 3);
        assert_eq!(d.allowed(5, false), 0);
    }

    #[test]
    fn cost_zero_reports_and_changes_nothing() {
        let p = tb(10, 1, 1000);
        let mut s = State::default();
        call(&mut s, &p, 4, false, 0);
        let before = s;
        let (d, _) = step(&s, &p, 0, false, 500_000);
        assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (0, 6, 0, 3500));
        assert_eq!(d.allowed(0, false), 1);
        assert_eq!(s, before);
    }

    #[test]
    fn clock_step_back_counts_as_zero() {
        let p = tb(2, 1, 1000);
        let mut s = State::default();
        call(&mut s, &p, 2, false, 10_000_000);
        // Ten seconds earlier: no refill, no error, no wrap-around; the wait
        // includes the time until the clock is back where it was.
        let d = call(&mut s, &p, 1, false, 0);
        assert_eq!((d.granted, d.retry_after_ms, d.reset_after_ms), (0, 11_000, 12_000));
        assert_eq!(call(&mut s, &p, 1, false, 10_999_999).granted, 0);
        assert_eq!(call(&mut s, &p, 1, false, 11_000_000).granted, 1);
    }

    #[test]
    fn capacity_lowered_caps_tokens() {
        let mut s = State::default();
        call(&mut s, &tb(100, 1, 1000), 1, false, 0); // 99 left
        let (d, _) = step(&s, &tb(10, 1, 1000), 0, false, 0);
        assert_eq!((d.remaining, d.reset_after_ms), (10, 0));
        let d = call(&mut s, &tb(10, 1, 1000), 1, false, 0);
        assert_eq!((d.granted, d.remaining, d.reset_after_ms), (1, 9, 1000));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let m = MAX_ARG;
        for &(c, r, per) in &[(m, m, m), (1, 1, m), (m, 1, m), (1, m, 1), (m, m, 1), (1, 1, 1)] {
            let p = tb(c, r, per);
            let mut s = State::default();
            for &now in &[0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX, 0] {
                for &cost in &[0, 1, m, m - 1] {
                    for partial in [false, true] {
                        let d = call(&mut s, &p, cost, partial, now);
                        assert!(d.granted <= cost && d.remaining <= c);
                        assert!(d.retry_after_ms >= -1);
                        let enc = s.encode();
                        if !s.is_fresh() {
                            assert_eq!(State::decode(&enc), Ok(s));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn decode_rejects_bad_payloads() {
        let good = State { tokens: 3, frac: 5, den: 1000, last_us: 7 };
        let enc = good.encode();
        assert_eq!(State::decode(&enc), Ok(good));
        for n in 0..enc.len() {
            assert_eq!(State::decode(&enc[..n]), Err(DecodeError::Truncated));
        }
        let mut long = enc.to_vec();
        long.push(0);
        assert_eq!(State::decode(&long), Err(DecodeError::TrailingBytes));
        let mut v = enc;
        v[0] = 2;
        assert_eq!(State::decode(&v), Err(DecodeError::UnknownVersion));
        for bad in [
            State { den: 0, ..good },
            State { den: 1001, ..good },
            State { frac: 1000, ..good },
            State { tokens: MAX_ARG, ..good },
            State { den: (MAX_ARG + 1) * 1000, ..good },
        ] {
            assert!(matches!(State::decode(&bad.encode()), Err(DecodeError::Invalid(_))), "{bad:?}");
        }
    }

    // ---- Reference model: exact rationals (num / den as u128 pairs, reduced
    // by never dividing: levels are kept as num over a common denominator
    // that changes only when the period changes). ----

    /// The model keeps the level as an exact rational `num / d` tokens where
    /// `d = period_us`; on a period change it rounds the fractional part down
    /// to a multiple of 1/d_new, the documented quantization.
    #[derive(Clone, Debug)]
    struct Model {
        num: u128,
        d: u128,
        last: u64,
        fresh: bool,
    }

    impl Model {
        fn call(&mut self, p: &Params, cost: u64, partial: bool, now: u64, write: bool) -> Decision {
            let d = u128::from(p.period_ms) * 1000;
            let full = u128::from(p.capacity) * d;
            let (mut num, now_eff) = if self.fresh {
                (full, now)
            } else {
                let now_eff = now.max(self.last);
                let whole = self.num / self.d;
                let frac = (self.num % self.d) * d / self.d;
                let num = whole * d + frac + u128::from(now_eff - self.last) * u128::from(p.rate);
                (num.min(full), now_eff)
            };
            let avail = num / d;
            let g = if u128::from(cost) <= avail {
                cost
            } else if partial {
                avail as u64
            } else {
                0
            };
            num -= u128::from(g) * d;
            // Waits by brute force over rationals: smallest t (µs, real) with
            // num + t*rate >= target*d, i.e. t = (target*d - num)/rate; in ms
            // rounded up.
            let gap = u128::from(now_eff - now);
            let ceil_ms = |target: u128| -> u64 {
                if num >= target {
                    return 0;
                }
                // Real-valued wait (deficit / rate µs) plus the clock gap,
                // rounded up to whole µs (time is counted in µs), then ms.
                let deficit = target - num;
                let r = u128::from(p.rate);
                let us = deficit.div_ceil(r) + gap;
                us.div_ceil(1000) as u64
            };
            let dec = Decision {
                granted: g,
                limit: p.capacity,
                remaining: (num / d) as u64,
                retry_after_ms: if g == cost {
                    0
                } else if cost > p.capacity {
                    -1
                } else {
                    ceil_ms(u128::from(cost) * d) as i64
                },
                reset_after_ms: ceil_ms(full),
            };
            if write && g > 0 {
                self.num = num;
                self.d = d;
                self.last = now_eff;
                self.fresh = false;
            }
            dec
        }
    }

    #[derive(Clone, Debug)]
    struct Op {
        dt: i64,
        cost: u64,
        partial: bool,
        dryrun: bool,
        params: usize,
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = (
            prop_oneof![8 => 0i64..2_000_000, 1 => Just(0i64), 1 => -5_000_000i64..0],
            prop_oneof![6 => 0u64..6, 1 => 0u64..40, 1 => Just(u64::from(u32::MAX))],
            any::<bool>(),
            prop_oneof![9 => Just(false), 1 => Just(true)],
            prop_oneof![12 => Just(0usize), 1 => 0usize..4],
        )
            .prop_map(|(dt, cost, partial, dryrun, params)| Op { dt, cost, partial, dryrun, params });
        proptest::collection::vec(op, 1..400)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12000, ..ProptestConfig::default() })]

        /// Every reply field agrees with the exact rational model over random
        /// sequences with clock steps back, equal times, parameter changes,
        /// PARTIAL and DRYRUN (~2.4 million steps).
        #[test]
        fn agrees_with_rational_model(
            caps in proptest::collection::vec((1u64..50, 1u64..20, 1u64..5000), 4),
            ops in ops(),
            t0 in 0u64..u64::MAX / 2,
        ) {
            let params: Vec<Params> = caps.iter().map(|&(c, r, p)| tb(c, r, p)).collect();
            let mut s = State::default();
            let mut m = Model { num: 0, d: 1, last: 0, fresh: true };
            let mut now = t0;
            for op in ops {
                now = now.saturating_add_signed(op.dt);
                let p = &params[op.params];
                let (d, n) = step(&s, p, op.cost, op.partial, now);
                let md = m.call(p, op.cost, op.partial, now, !op.dryrun);
                prop_assert_eq!(d, md);
                if d.granted > 0 && !op.dryrun {
                    prop_assert!(!n.is_fresh());
                    prop_assert!(d.reset_after_ms > 0);
                    prop_assert_eq!(State::decode(&n.encode()), Ok(n));
                    s = n;
                }
            }
        }

        /// Never more than capacity + refill: over any sequence at one
        /// parameter set, total granted ≤ capacity + rate × elapsed / period.
        #[test]
        fn grants_never_exceed_the_limit(
            c in 1u64..1000, r in 1u64..100, per in 1u64..100_000,
            steps in proptest::collection::vec((0u64..50_000, 0u64..50, any::<bool>()), 1..300),
        ) {
            let p = tb(c, r, per);
            let mut s = State::default();
            let t0 = 1_700_000_000_000_000u64;
            let mut now = t0;
            let mut total: u128 = 0;
            for (dt, cost, partial) in steps {
                now += dt;
                total += u128::from(call(&mut s, &p, cost, partial, now).granted);
                let bound = u128::from(c) + u128::from(now - t0) * u128::from(r) / (u128::from(per) * 1000);
                prop_assert!(total <= bound, "granted {} > bound {}", total, bound);
            }
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(s) = State::decode(&bytes) {
                prop_assert_eq!(&s.encode()[..], &bytes[..]);
            }
        }

        /// Whatever the compact form accepts, it gives back exactly; and any
        /// two words unpack without panicking.
        #[test]
        fn pack_round_trips_or_declines(
            tokens in prop_oneof![any::<u64>(), 0u64..1_000_000],
            frac in any::<u64>(),
            period in prop_oneof![any::<u64>(), 1u64..10_000_000],
            last_us in prop_oneof![any::<u64>(), PACK_EPOCH_US - 10..PACK_EPOCH_US + (1u64 << 52)],
            words in any::<[u64; 2]>(),
        ) {
            let den = period.saturating_mul(1000);
            let s = State { tokens, frac: frac % den.max(1), den, last_us };
            if let Some(w) = s.pack() {
                prop_assert_eq!(State::unpack(w), s);
                prop_assert!(last_us >= PACK_EPOCH_US);
            }
            let _ = State::unpack(words);
        }

        /// The states real buckets reach (per second up to per hour, up to
        /// 100,000 tokens, any time from 2020 to 2090) all fit the compact
        /// form, which is what keeps a bucket key at 16 bytes of state.
        #[test]
        fn typical_buckets_are_compact(
            capacity in 1u64..=100_000, rate in 1u64..=100_000, period in 1u64..=3_600_000,
            t in PACK_EPOCH_US..PACK_EPOCH_US + 70 * 365 * 86_400_000_000,
            steps in proptest::collection::vec((0u64..10_000_000, 0u64..1000, any::<bool>()), 1..50),
        ) {
            let p = tb(capacity, rate, period);
            let mut s = State::default();
            let mut now = t;
            for (dt, cost, partial) in steps {
                now += dt;
                let (d, n) = step(&s, &p, cost, partial, now);
                if d.granted > 0 {
                    let w = n.pack();
                    prop_assert!(w.is_some(), "{:?} did not pack", n);
                    prop_assert_eq!(w.map(State::unpack), Some(n));
                    s = n;
                }
            }
        }
    }

    #[test]
    fn pack_edges() {
        let s = State { tokens: 5, frac: 7, den: 1_000_000, last_us: PACK_EPOCH_US };
        assert_eq!(s.pack().map(State::unpack), Some(s));
        // Before the epoch, at the end of the 51-bit range, bad fractions
        // and periods that are not whole ms: wide form.
        assert_eq!(State { last_us: PACK_EPOCH_US - 1, ..s }.pack(), None);
        let last = PACK_EPOCH_US + (1u64 << 51) - 1;
        assert_eq!(State { last_us: last, ..s }.pack().map(State::unpack), Some(State { last_us: last, ..s }));
        assert_eq!(State { last_us: last + 1, ..s }.pack(), None);
        assert_eq!(State { frac: 1_000_000, ..s }.pack(), None);
        assert_eq!(State { den: 1_000_001, frac: 0, ..s }.pack(), None);
        assert_eq!(State { den: 0, frac: 0, ..s }.pack(), None);
        // Tokens fill exactly the bits left: 128 − 51 − 6 − 10 (period 1000)
        // − 20 (den 10^6) = 41.
        let top = State { tokens: (1 << 41) - 1, frac: 999_999, den: 1_000_000, last_us: last };
        assert_eq!(top.pack().map(State::unpack), Some(top));
        assert_eq!(State { tokens: 1 << 41, ..top }.pack(), None);
        // The largest period and capacity the arguments allow: wide.
        assert_eq!(State { tokens: MAX_ARG - 1, frac: 0, den: MAX_ARG * 1000, last_us: last }.pack(), None);
    }
}
