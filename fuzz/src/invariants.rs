//! The invariants every reply keeps, whatever the algorithm.

use crate::core::Decision;

/// The reply invariants every command keeps (docs/contract.md, "Reply").
pub fn check_decision(d: &Decision, limit: u64, cost: u64, partial: bool) {
    assert!(d.granted <= cost, "{d:?}");
    if !partial {
        assert!(d.granted == 0 || d.granted == cost, "{d:?}");
    }
    assert_eq!(d.limit, limit, "{d:?}");
    assert!(d.remaining <= limit, "{d:?}");
    assert!(d.granted.saturating_add(d.remaining) <= limit, "{d:?}");
    assert!(d.retry_after_ms >= -1, "{d:?}");
    assert_eq!(d.retry_after_ms == 0, d.granted == cost, "{d:?} cost {cost}");
    assert_eq!(d.retry_after_ms == -1, d.granted < cost && cost > limit, "{d:?} cost {cost}");
    if d.granted > 0 {
        assert!(d.reset_after_ms > 0, "{d:?}");
    }
    if cost == 0 {
        assert_eq!(d.allowed(cost, partial), if partial { 0 } else { 1 });
    }
    let allowed = d.allowed(cost, partial);
    assert!(allowed <= cost.max(1));
}

/// `remaining` is exact: right after the call, at the same instant, exactly
/// `remaining` more units fit, and no more. `probe(cost, partial)` asks the
/// stored state.
pub fn check_remaining_exact(remaining: u64, limit: u64, mut probe: impl FnMut(u64, bool) -> Decision) {
    let d0 = probe(0, false);
    assert_eq!(d0.remaining, remaining, "cost 0 after the call");
    if remaining > 0 {
        assert_eq!(probe(remaining, false).granted, remaining, "remaining units must fit");
    }
    if remaining < limit {
        assert_eq!(probe(remaining + 1, false).granted, 0, "one more than remaining must not fit");
    }
}

/// `retry_after_ms` is exact: `probe(t)` asks the state the call left
/// behind for the same call (without PARTIAL) at time `t`. It is fully
/// granted exactly `retry_after_ms` after the real clock reading `now` and
/// not one millisecond earlier (availability only grows while nothing is
/// granted, so two probes decide it).
pub fn check_retry_exact(d: &Decision, cost: u64, now: u64, mut probe: impl FnMut(u64) -> Decision) {
    if d.retry_after_ms <= 0 {
        return;
    }
    let r = d.retry_after_ms as u64;
    let Some(at) = r.checked_mul(1000).and_then(|x| now.checked_add(x)) else { return };
    assert_eq!(probe(at).granted, cost, "the call is not granted retry_after_ms ({r}) later");
    assert_eq!(probe(at - 1000).granted, 0, "the call is granted before retry_after_ms ({r})");
}
