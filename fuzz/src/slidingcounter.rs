//! The sliding counter: a valid state from arbitrary bytes, and the checks
//! of one call and of one refund against the reference model.

use crate::args::{Call, WINDOW_ARGS};
use crate::core::reference::slidingcounter::{self as scm, Search};
use crate::core::MAX_ARG;
use crate::harness::{pieces, Algorithm};
use crate::input::words;
use crate::invariants::{check_decision, check_remaining_exact, check_retry_exact};
use crate::{codec, sc};

/// `RL.SLIDINGCOUNTER key limit window_ms ...`.
pub struct SlidingCounter;

impl Algorithm for SlidingCounter {
    pieces!(sc, WINDOW_ARGS, synth: synth_sc, refund: sc_refund, call: sc_call, force: sc_force);
    fn params(nums: &[u64; 3]) -> sc::Params {
        sc::Params::from_nums(*nums)
    }
}

/// A valid sliding-counter state built from arbitrary words.
pub fn synth_sc(b: &[u8]) -> sc::State {
    let mut w = words(b);
    let mut next = || w.next().unwrap_or(0);
    let s = next();
    sc::State { start_us: s - s % 1000, cur: next() % MAX_ARG + 1, prev: next() % (MAX_ARG + 1) }
}

/// `REFUND n` on a counter: never below zero, never more than n, the
/// estimate only goes down, what is stored decodes.
pub fn sc_refund(cur: &sc::State, p: &sc::Params, n: u64, now: u64) {
    let before = sc::step(cur, p, 0, false, now).0;
    let (d, new) = sc::refund(cur, p, n, 1, now);
    assert!(
        d.granted <= n && d.remaining >= before.remaining && d.reset_after_ms <= before.reset_after_ms,
        "{d:?} {before:?}"
    );
    assert_eq!(d.granted == 0, before.reset_after_ms == 0, "only a fresh counter gives nothing back: {d:?} {before:?}");
    let (md, ms) = scm::refund(cur, p, now, n, 1, Search::Bisect);
    assert_eq!(d, md, "refund differs from the model");
    if d.granted > 0 && d.reset_after_ms > 0 {
        assert_eq!(new, ms, "refunded state differs from the model");
    }
    if d.granted > 0 {
        assert!(new.cur <= cur.cur.max(cur.prev) && new.prev <= cur.prev.max(cur.cur), "{new:?} {cur:?}");
        if d.reset_after_ms > 0 {
            assert_eq!(sc::State::decode(&new.encode()), Ok(new));
            assert_eq!(sc::step(&new, p, 0, false, now).0.remaining, d.remaining);
        } else {
            assert!(new.is_fresh(), "{new:?}");
        }
    }
}

pub fn sc_call(cur: &sc::State, p: &sc::Params, call: &Call, now: u64, now2: u64) {
    let (d, new) = sc::step(cur, p, call.cost, call.partial, now);
    check_decision(&d, p.limit, call.cost, call.partial);
    let (md, ms) = scm::decide(cur, p, call.cost, call.partial, now, Search::Bisect);
    assert_eq!(d, md, "counter differs from the model");
    if d.granted > 0 {
        assert_eq!(new, ms, "counter state differs from the model");
    }
    let after = if d.granted > 0 { new } else { *cur };
    check_retry_exact(&d, call.cost, now, |t| sc::step(&after, p, call.cost, false, t).0);
    if d.granted == 0 {
        assert_eq!(new, *cur, "a call that grants nothing must not change the state");
        return;
    }
    assert!(!new.is_fresh());
    assert_eq!(sc::State::decode(&new.encode()), Ok(new));
    let abs = now / 1000;
    let payload = codec::slidingcounter(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::SlidingCounter(new), abs)));
    assert!(new.start_us >= cur.start_us, "window start moved backwards");
    // The instant the call was evaluated at (the clock may be behind).
    let t = now.max(cur.start_us);
    check_remaining_exact(d.remaining, p.limit, |c, part| sc::step(&new, p, c, part, t).0);
    // The reply's reset is measured from the real clock reading `now`.
    let fresh_at = sc::fresh_at_us(&new, p.window_ms).expect("a written state is not fresh");
    let fresh = sc::State::default();
    if let Some(at) = d.reset_after_ms.checked_mul(1000).and_then(|r| now.checked_add(r)) {
        assert!(fresh_at <= at, "reset {} ms but fresh only at {fresh_at} (now {now})", d.reset_after_ms);
        assert!(fresh_at > at - 1000, "reset {} ms overstates (fresh at {fresh_at}, now {now})", d.reset_after_ms);
        assert_eq!(
            sc::step(&new, p, call.cost, call.partial, at).0,
            sc::step(&fresh, p, call.cost, call.partial, at).0,
            "not fresh at reset"
        );
    }
    let (d2, new2) = sc::step(&new, p, call.cost, call.partial, now2);
    check_decision(&d2, p.limit, call.cost, call.partial);
    if d2.granted > 0 {
        assert_eq!(sc::State::decode(&new2.encode()), Ok(new2));
    }
}

/// `COST n FORCE` on a counter: the reply and the state equal the model's,
/// the count stays within 2^53 - 1, what is stored round-trips.
pub fn sc_force(cur: &sc::State, p: &sc::Params, cost: u64, now: u64) {
    let (d, new) = sc::force(cur, p, cost, 1, now);
    let (md, ms) = scm::force(cur, p, now, cost, 1, Search::Bisect);
    assert_eq!(d, md, "debit differs from the model");
    if d.granted == 0 {
        return;
    }
    assert_eq!(new, ms, "state differs from the model");
    assert!(new.cur <= MAX_ARG, "{new:?}");
    assert_eq!(sc::State::decode(&new.encode()), Ok(new));
    let abs = now / 1000;
    let payload = codec::slidingcounter(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::SlidingCounter(new), abs)));
}
