//! The token bucket: a valid state from arbitrary bytes, and the checks of
//! one call and of one refund against the reference model.

use crate::args::{Call, TOKENBUCKET_ARGS};
use crate::core::reference::tokenbucket::Bucket;
use crate::core::Decision;
use crate::core::MAX_ARG;
use crate::harness::{pieces, Algorithm};
use crate::input::words;
use crate::invariants::{check_decision, check_remaining_exact, check_retry_exact};
use crate::{codec, tb};

/// `RL.TOKENBUCKET key capacity rate period_ms ...`.
pub struct TokenBucket;

impl Algorithm for TokenBucket {
    pieces!(tb, TOKENBUCKET_ARGS, synth: synth_tb, refund: tb_refund, call: tb_call, force: tb_force);
    fn params(nums: &[u64; 3]) -> tb::Params {
        tb::Params::from_nums(*nums)
    }
}

/// A valid token-bucket state built from arbitrary words.
pub fn synth_tb(b: &[u8]) -> tb::State {
    let mut w = words(b);
    let mut next = || w.next().unwrap_or(0);
    let t = next();
    // Now and then a bucket in debt (COST n FORCE): whole tokens down to
    // -(2^53 - 1).
    let tokens = if t >> 60 == 0xF { (-((t % MAX_ARG) as i64 + 1)) as u64 } else { t % MAX_ARG };
    let den = (next() % MAX_ARG + 1) * 1000;
    let frac = next() % den;
    tb::State { tokens, frac, den, last_us: next() }
}

/// tokens, element 1 says how many came back, a full bucket is fresh.
pub fn tb_refund(cur: &tb::State, p: &tb::Params, n: u64, now: u64) {
    let before = tb::step(cur, p, 0, false, now).0.remaining;
    let (d, new) = tb::refund(cur, p, n, 1, now);
    // In debt (COST n FORCE) a refund repays the debt first: what follows
    // holds of a bucket not in debt; the model's answer holds of both.
    if !cur.in_debt() {
        assert_eq!(d.remaining, p.capacity.min(before.saturating_add(n)), "{d:?}");
        assert_eq!(d.granted, d.remaining - before, "{d:?}");
        assert_eq!(
            d.reset_after_ms == 0,
            d.remaining == p.capacity && tb::step(&new, p, 0, false, now).0.reset_after_ms == 0
        );
        assert_eq!(d.retry_after_ms, 0, "one token is there after a refund of one or more");
    } else {
        assert!(d.granted <= n && d.remaining <= p.capacity, "{d:?}");
    }
    let mut m = Bucket::from_state(cur);
    assert_eq!(d, m.refund(p, now, n, 1), "refund differs from the model");
    if d.granted > 0 && d.reset_after_ms > 0 {
        assert_eq!(Bucket::from_state(&new).level(p, now), m.level(p, now), "stored level differs from the model");
        assert_eq!(tb::State::decode(&new.encode()), Ok(new));
        assert_eq!(tb::step(&new, p, 0, false, now).0, tb::View::at(&new, p, now).answer(0, 0));
    }
}

/// One token-bucket call and everything that must hold after it.
pub fn tb_call(cur: &tb::State, p: &tb::Params, call: &Call, now: u64, now2: u64) {
    let (d, new) = tb::step(cur, p, call.cost, call.partial, now);
    check_decision(&d, p.capacity, call.cost, call.partial);
    // The reference model: the level as an exact rational (refill `rate`
    // units of 1/P token per µs up to `capacity × P`; a fraction written
    // under another period rescaled rounding down).
    let mut m = Bucket::from_state(cur);
    assert_eq!(d, m.call(p, call.cost, call.partial, now, true), "bucket differs from the model");
    if d.granted > 0 {
        let stored = Bucket::from_state(&new);
        assert_eq!((stored.num, stored.d, stored.last), (m.num, m.d, m.last), "stored level differs from the model");
    }
    let after = if d.granted > 0 { new } else { *cur };
    check_retry_exact(&d, call.cost, now, |t| tb::step(&after, p, call.cost, false, t).0);
    if d.granted == 0 {
        return;
    }
    // What the key would hold: a valid, non-fresh state that round-trips
    // through RDB/RESTORE and the RL.STATE payload.
    assert!(!new.is_fresh());
    assert_eq!(tb::State::decode(&new.encode()), Ok(new));
    let abs = now / 1000;
    let payload = codec::tokenbucket(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::TokenBucket(new), abs)));
    let t = new.last_us;
    assert_eq!(t, now.max(if cur.is_fresh() { 0 } else { cur.last_us }));
    check_remaining_exact(d.remaining, p.capacity, |c, part| tb::step(&new, p, c, part, t).0);
    // Fresh exactly when reset_after_ms says (the key's TTL).
    // Waits are measured from the real clock reading `now`.
    let fresh = tb::State::default();
    if let Some(at) = d.reset_after_ms.checked_mul(1000).and_then(|r| now.checked_add(r)) {
        assert_eq!(
            tb::step(&new, p, call.cost, call.partial, at).0,
            tb::step(&fresh, p, call.cost, call.partial, at).0,
            "not fresh at reset"
        );
        let before = at - 1000;
        assert!(tb::step(&new, p, 0, false, before).0.reset_after_ms > 0, "fresh before reset");
    }
    // A follow-up at another time (the clock may step back).
    let (d2, new2) = tb::step(&new, p, call.cost, call.partial, now2);
    check_decision(&d2, p.capacity, call.cost, call.partial);
    if d2.granted > 0 {
        assert_eq!(tb::State::decode(&new2.encode()), Ok(new2));
        assert!(new2.last_us >= new.last_us, "time went backwards");
    }
}

/// `COST n FORCE` on a bucket: the reply and the stored level equal the
/// signed model's, the debt stays in range, what is stored round-trips
/// (encoding version 2 in debt) and a following call of one token is
/// granted exactly at the reply's wait.
pub fn tb_force(cur: &tb::State, p: &tb::Params, cost: u64, now: u64) {
    let (d, new) = tb::force(cur, p, cost, 1, now);
    let mut m = Bucket::from_state(cur);
    assert_eq!(d, m.force(p, cost, 1, now, true), "debit differs from the model");
    assert!(d.remaining <= p.capacity && d.retry_after_ms >= -1, "{d:?}");
    if d.granted == 0 {
        return;
    }
    let stored = Bucket::from_state(&new);
    assert_eq!((stored.num, stored.d, stored.last), (m.num, m.d, m.last), "stored level differs from the model");
    assert!(new.whole() >= -(MAX_ARG as i64), "{new:?}");
    assert_eq!(d.remaining == 0, new.whole() <= 0 || new.in_debt(), "{d:?} {new:?}");
    assert_eq!(tb::State::decode(&new.encode()), Ok(new));
    if let Some(w) = new.pack() {
        assert_eq!(tb::State::unpack(w), new);
    }
    let abs = now / 1000;
    let payload = codec::tokenbucket(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::TokenBucket(new), abs)));
    let after = d;
    check_retry_exact(&Decision { granted: 0, ..after }, 1, now, |t| tb::step(&new, p, 1, false, t).0);
}
