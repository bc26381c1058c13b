//! The sliding log: a valid log from arbitrary bytes (built by grants and
//! mirrored in the model), and the checks of one call (master and replica)
//! and of one refund against the reference model.

use crate::args::{Call, WINDOW_ARGS};
use crate::core::reference::slidinglog::Log;
use crate::core::MAX_ARG;
use crate::harness::{pieces, Algorithm};
use crate::input::words;
use crate::invariants::{check_decision, check_remaining_exact, check_retry_exact};
use crate::log::{log_entries, sl_encode};
use crate::{codec, sl};

/// `RL.SLIDINGLOG key limit window_ms ...`.
pub struct SlidingLog;

impl Algorithm for SlidingLog {
    pieces!(sl, WINDOW_ARGS, synth: synth_sl, refund: sl_refund, call: sl_call, force: sl_force);
    fn params(nums: &[u64; 3]) -> sl::Params {
        sl::Params::from_nums(*nums)
    }
}

/// A sliding log built by grants read from arbitrary words (window, start
/// time, then `(dt, units)` pairs), mirrored in the model, which must agree
/// with what the state encodes.
pub fn synth_sl(b: &[u8]) -> sl::State {
    let mut w = words(b);
    let window_ms = w.next().unwrap_or(0) % MAX_ARG + 1;
    let mut t = w.next().unwrap_or(0);
    let mut s = sl::State::default();
    let mut m = Log::default();
    let unlimited = sl::Params { limit: MAX_ARG, window_ms };
    for _ in 0..64 {
        let (Some(dt), Some(u)) = (w.next(), w.next()) else { break };
        // Mostly small steps and counts, sometimes anything.
        let dt = if dt >> 63 == 1 { dt & !(1 << 63) } else { dt % 100_000 };
        let units = if u >> 63 == 1 { u % MAX_ARG + 1 } else { u % 1000 + 1 };
        // A master never grants past the limit: keep the log's sum ≤ MAX_ARG.
        let used = m.decide(&unlimited, 0, false, t).remaining;
        let units = units.min(used);
        t = t.saturating_add(dt);
        if units > 0 {
            sl::grant(&mut s, window_ms, units, t);
            m.grant(window_ms, units, t);
        }
    }
    let mut enc = Vec::new();
    s.encode(&mut enc);
    assert_eq!(log_entries(&enc), m.entries(), "synthesized log differs from the model");
    s
}

/// `REFUND n` on a log: the newest units in the window go, at most n of
/// them; nothing changes when the window holds none.
pub fn sl_refund(cur: &sl::State, p: &sl::Params, n: u64, now: u64) {
    let before = sl::decide(cur, p, 0, false, now);
    let mut model = Log::from_entries(&log_entries(&sl_encode(cur)));
    let in_window = u64::try_from(model.used(p.window_ms, now)).expect("a stored log holds at most u64::MAX units");
    let mut s = cur.clone();
    let removed = sl::refund(&mut s, p.window_ms, n, now);
    assert_eq!(removed, n.min(in_window));
    // The reply of RL.SLIDINGLOG ... REFUND n.
    let mut d = sl::View::at(&s, p, now).answer(0, 1);
    d.granted = removed;
    assert_eq!(d, model.refund(p, now, n, 1), "refund differs from the model");
    if removed == 0 {
        assert_eq!(sl_encode(&s), sl_encode(cur), "a refund of nothing changed the log");
        return;
    }
    // The newest entries lost `removed` units; older ones are untouched.
    let enc = sl_encode(&s);
    assert_eq!(log_entries(&enc), model.entries(), "refund removed the wrong units");
    assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc.clone()));
    let after = sl::decide(&s, p, 0, false, now);
    assert!(after.remaining >= before.remaining && after.remaining <= p.limit);
}

pub fn sl_call(cur: &sl::State, p: &sl::Params, call: &Call, now: u64, now2: u64) {
    let enc_before = sl_encode(cur);
    let mut model = Log::from_entries(&log_entries(&enc_before));
    let t = model.now_eff(now);
    let d = sl::decide(cur, p, call.cost, call.partial, now);
    check_decision(&d, p.limit, call.cost, call.partial);
    let md = model.decide(p, call.cost, call.partial, now);
    assert_eq!(d, md, "sliding log differs from the model: {:?}", model.log);
    if d.granted == 0 {
        check_retry_exact(&d, call.cost, now, |t| sl::decide(cur, p, call.cost, false, t));
        return;
    }
    // Master: grant in place. Replica: decode the same state and apply the
    // replicated grant. Both must encode (and so DEBUG DIGEST) equally.
    let mut new = cur.clone();
    sl::grant(&mut new, p.window_ms, d.granted, now);
    let enc = sl_encode(&new);
    let mut replica = sl::State::decode(&enc_before).expect("a stored log decodes");
    let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: d.granted };
    let payload = codec::log_grant(&g, 0);
    match codec::decode(payload.as_bytes()) {
        Ok((codec::Effect::LogGrant(g2), 0)) => {
            assert_eq!(g2, g);
            sl::grant(&mut replica, g2.window_ms, g2.units, g2.now_us);
        }
        other => panic!("grant payload does not decode: {other:?}"),
    }
    assert_eq!(sl_encode(&replica), enc, "replica diverges");
    check_retry_exact(&d, call.cost, now, |t| sl::decide(&new, p, call.cost, false, t));
    let decoded = sl::State::decode(&enc).expect("a written log decodes");
    assert_eq!(decoded, new);
    assert_eq!(sl_encode(&decoded), enc);
    // Memory bound (docs/contract.md, "Memory": at most 8 bytes per distinct grant time).
    let n = log_entries(&enc).len();
    assert!(new.heap_bytes() <= 16 * (n + 1) * 2, "heap {} bytes for {n} entries", new.heap_bytes());
    model.grant(p.window_ms, d.granted, now);
    assert_eq!(log_entries(&enc), model.entries(), "log after grant differs from the model");
    // Evaluated at max(now, newest entry), where the grant now is.
    let fresh_at = sl::fresh_at_us(&new, p.window_ms).expect("a written log is not empty");
    assert_eq!(fresh_at, t.saturating_add(p.window_ms * 1000));
    check_remaining_exact(d.remaining, p.limit, |c, part| sl::decide(&new, p, c, part, t));
    // Waits are measured from the real clock reading `now`.
    let fresh = sl::State::default();
    if let Some(at) = d.reset_after_ms.checked_mul(1000).and_then(|r| now.checked_add(r)) {
        assert!(fresh_at <= at, "reset {} ms but fresh only at {fresh_at} (now {now})", d.reset_after_ms);
        assert!(fresh_at > at - 1000, "reset {} ms overstates (fresh at {fresh_at}, now {now})", d.reset_after_ms);
        assert_eq!(
            sl::decide(&new, p, call.cost, call.partial, at),
            sl::decide(&fresh, p, call.cost, call.partial, at),
            "not fresh at reset"
        );
    }
    let d2 = sl::decide(&new, p, call.cost, call.partial, now2);
    check_decision(&d2, p.limit, call.cost, call.partial);
    if d2.granted > 0 {
        sl::grant(&mut new, p.window_ms, d2.granted, now2);
        let enc2 = sl_encode(&new);
        assert_eq!(sl::State::decode(&enc2).map(|s| sl_encode(&s)), Ok(enc2));
    }
}

/// `COST n FORCE` on a log: the reply equals the model's, the grant is one
/// entry (merged with one at the same µs) whatever its units, and the log
/// the model's.
pub fn sl_force(cur: &sl::State, p: &sl::Params, cost: u64, now: u64) {
    let before = log_entries(&sl_encode(cur));
    let mut model = Log::from_entries(&before);
    let d = sl::decide_forced(cur, p, cost, 1, now);
    assert_eq!(d, model.force(p, cost, 1, now, true), "debit differs from the model");
    if d.granted == 0 {
        return;
    }
    let mut new = cur.clone();
    sl::grant(&mut new, p.window_ms, d.granted, now);
    let enc = sl_encode(&new);
    assert_eq!(log_entries(&enc), model.entries(), "log differs from the model");
    assert!(log_entries(&enc).len() <= before.len() + 1, "one entry per debit");
    assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc.clone()));
}
