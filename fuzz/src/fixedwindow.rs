//! The fixed window: a valid state from arbitrary bytes, and the checks of
//! one call and of one refund against the reference model.

use crate::args::{Call, WINDOW_ARGS};
use crate::core::reference::fixedwindow as fwm;
use crate::core::reference::slidingcounter::Search;
use crate::core::MAX_ARG;
use crate::harness::{pieces, Algorithm};
use crate::input::words;
use crate::invariants::{check_decision, check_remaining_exact, check_retry_exact};
use crate::{codec, fw};

/// `RL.FIXEDWINDOW key limit window_ms ... [FROMFIRST]`.
pub struct FixedWindow;

impl Algorithm for FixedWindow {
    pieces!(fw, WINDOW_ARGS, synth: synth_fw, refund: fw_refund, call: fw_call, force: fw_force);
    const FROMFIRST: bool = true;
    fn params(nums: &[u64; 3]) -> fw::Params {
        fw::Params::from_nums(*nums)
    }
}

/// A valid fixed-window state built from arbitrary words.
pub fn synth_fw(b: &[u8]) -> fw::State {
    let mut w = words(b);
    let mut next = || w.next().unwrap_or(0);
    fw::State { start_ms: next(), count: next() % MAX_ARG + 1 }
}

/// The reference model's answer, when its unsaturated times agree with the
/// implementation's (`u64` ms: only a window ending past `u64::MAX` ms
/// saturates).
pub fn in_range(s: &fw::State, p: &fw::Params, now: u64) -> bool {
    let w = p.window_ms.clamp(1, MAX_ARG);
    s.start_ms.max(now / 1000).checked_add(w.saturating_mul(2)).is_some()
        && p.limit <= MAX_ARG
        && (1..=MAX_ARG).contains(&p.window_ms)
}

/// `REFUND n`: never more than counted, what is stored decodes, a refund to
/// zero leaves nothing to store, and every field equals the model's.
pub fn fw_refund(cur: &fw::State, p: &fw::Params, n: u64, now: u64) {
    let before = fw::step(cur, p, 0, false, now).0;
    let (d, new) = fw::refund(cur, p, n, 1, now);
    assert!(d.granted <= n && d.remaining >= before.remaining, "{d:?} {before:?}");
    assert_eq!(d.granted == 0, before.reset_after_ms == 0, "only an empty window gives nothing back: {d:?} {before:?}");
    if in_range(cur, p, now) {
        assert_eq!((d, new), fwm::refund(cur, p, n, 1, now, Search::Bisect), "refund differs from the model");
    }
    if d.granted == 0 {
        assert_eq!(new, *cur, "a refund of nothing changes nothing");
    } else if d.reset_after_ms > 0 {
        assert_eq!(fw::State::decode(&new.encode()), Ok(new));
        assert_eq!(fw::step(&new, p, 0, false, now).0.remaining, d.remaining);
        assert_eq!(new.start_ms, cur.start_ms, "a refund keeps the window");
    } else {
        assert!(new.is_fresh(), "{new:?}");
    }
}

pub fn fw_call(cur: &fw::State, p: &fw::Params, call: &Call, now: u64, now2: u64) {
    let (d, new) = fw::step(cur, p, call.cost, call.partial, now);
    check_decision(&d, p.limit, call.cost, call.partial);
    if in_range(cur, p, now) {
        assert_eq!((d, new), fwm::decide(cur, p, call.cost, call.partial, now, Search::Bisect), "differs from the model");
    }
    let after = if d.granted > 0 { new } else { *cur };
    check_retry_exact(&d, call.cost, now, |t| fw::step(&after, p, call.cost, false, t).0);
    // The empty window: everything left, nothing to reset.
    if d.reset_after_ms == 0 {
        assert_eq!(d.remaining, p.limit.min(MAX_ARG), "{d:?}");
    }
    if d.granted == 0 {
        assert_eq!(new, *cur, "a call that grants nothing must not change the state");
        return;
    }
    assert!(!new.is_fresh() && new.count <= p.limit);
    assert_eq!(fw::State::decode(&new.encode()), Ok(new));
    assert_eq!(new.pack().map(fw::State::unpack), Some(new), "always compact");
    let abs = (now / 1000).saturating_add(d.reset_after_ms);
    let payload = codec::fixedwindow(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::FixedWindow(new), abs)));
    // The key expires exactly at the window's end.
    if let Some(end) = new.start_ms.checked_add(p.window_ms.clamp(1, MAX_ARG)) {
        if end < u64::MAX {
            assert_eq!(abs, end, "expiry {abs} is not the window's end {end}");
        }
    }
    check_remaining_exact(d.remaining, p.limit, |c, part| fw::step(&new, p, c, part, now).0);
    // Fresh exactly at reset_after_ms, not a millisecond earlier.
    if let Some(at) = d.reset_after_ms.checked_mul(1000).and_then(|r| now.checked_add(r)) {
        if abs < u64::MAX {
            assert_eq!(fw::step(&new, p, 0, false, at).0.reset_after_ms, 0, "not fresh at reset");
            assert!(fw::step(&new, p, 0, false, at - 1000).0.reset_after_ms > 0, "fresh before reset");
        }
    }
    let (d2, new2) = fw::step(&new, p, call.cost, call.partial, now2);
    check_decision(&d2, p.limit, call.cost, call.partial);
    if d2.granted > 0 {
        assert_eq!(fw::State::decode(&new2.encode()), Ok(new2));
    }
}

/// `COST n FORCE` on a fixed window: the reply and the state equal the
/// model's, the count stays within 2^53 - 1, what is stored round-trips.
pub fn fw_force(cur: &fw::State, p: &fw::Params, cost: u64, now: u64) {
    let (d, new) = fw::force(cur, p, cost, 1, now);
    if in_range(cur, p, now) {
        assert_eq!((d, new), fwm::force(cur, p, cost, 1, now, Search::Bisect), "debit differs from the model");
    }
    if d.granted == 0 {
        return;
    }
    assert!(!new.is_fresh() && new.count <= MAX_ARG, "{new:?}");
    assert_eq!(fw::State::decode(&new.encode()), Ok(new));
    let abs = (now / 1000).saturating_add(d.reset_after_ms);
    let payload = codec::fixedwindow(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::FixedWindow(new), abs)));
}
