use super::*;
use crate::DecodeError;
use proptest::prelude::*;
use proptest::test_runner::Config as PropConfig;

// The reference model (docs/contract.md literally, answers found by
// searching): `reference::fixedwindow`.
use crate::reference::fixedwindow as fwm;
use crate::reference::slidingcounter::Search;

/// Properties every call keeps, whatever its inputs.
fn check_invariants(state: &State, p: &Params, cost: u64, partial: bool, d: &Decision, ns: &State) {
    assert!(d.granted <= cost);
    if !partial {
        assert!(d.granted == 0 || d.granted == cost);
    }
    assert_eq!(d.limit, p.limit);
    assert!(d.remaining <= p.limit);
    assert!(d.retry_after_ms >= -1);
    assert_eq!(d.retry_after_ms == 0, d.granted == cost);
    assert_eq!(d.retry_after_ms == -1, d.granted < cost && cost > p.limit);
    if d.granted == 0 {
        assert_eq!(ns, state, "a call that grants nothing must not change the state");
    } else {
        assert!(ns.count >= d.granted && ns.count <= p.limit);
        assert!(d.reset_after_ms >= 1);
    }
    if d.reset_after_ms == 0 {
        assert_eq!(d.remaining, p.limit.min(MAX_ARG), "an empty window has everything left");
    }
}

fn p(limit: u64, window_ms: u64) -> Params {
    Params { limit, window_ms, from_first: false }
}
fn pf(limit: u64, window_ms: u64) -> Params {
    Params { limit, window_ms, from_first: true }
}

fn call(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> (Decision, State) {
    let (d, ns) = step(state, p, cost, partial, now_us);
    check_invariants(state, p, cost, partial, &d, &ns);
    let (md, ms) = fwm::decide(state, p, cost, partial, now_us, Search::Bisect);
    assert_eq!((d, ns), (md, ms), "model differs: {state:?} {p:?} cost {cost} partial {partial} now {now_us}");
    (d, ns)
}

fn dec(granted: u64, limit: u64, remaining: u64, retry_after_ms: i64, reset_after_ms: u64) -> Decision {
    Decision { granted, limit, remaining, retry_after_ms, reset_after_ms }
}

const MIN: u64 = 60_000; // a window of 60 s, in ms
/// 2023-11-14T22:14:00Z in ms, a multiple of 60 s.
const T0: u64 = 28_333_334 * MIN;
/// ms to µs.
const fn us(ms: u64) -> u64 {
    ms * 1000
}

// ------------------------------------------------------------------
// Hand-computed examples.
// ------------------------------------------------------------------

#[test]
fn epoch_windows_count_and_reset_at_the_boundary() {
    let pp = p(3, MIN);
    let s = State::default();
    // 10.5 s into the window: 49.5 s left, the reply in whole ms: 49 500.
    let now = us(T0 + 10_000) + 500;
    let (d, s) = call(&s, &pp, 1, false, now);
    assert_eq!(d, dec(1, 3, 2, 0, 50_000)); // now_ms = T0 + 10 000
    assert_eq!(s, State { start_ms: T0, count: 1 });
    let (d, s) = call(&s, &pp, 2, false, us(T0 + 59_999));
    assert_eq!(d, dec(2, 3, 0, 0, 1));
    assert_eq!(s.count, 3);
    // Full: denied until the window ends, exactly.
    let (d, s2) = call(&s, &pp, 1, false, us(T0 + 59_999) + 999);
    assert_eq!(d, dec(0, 3, 0, 1, 1));
    assert_eq!(s2, s);
    // The next window starts empty: a full limit again (the boundary burst).
    let (d, s) = call(&s, &pp, 3, false, us(T0 + MIN));
    assert_eq!(d, dec(3, 3, 0, 0, MIN));
    assert_eq!(s, State { start_ms: T0 + MIN, count: 3 });
    // An old window counts nothing, even two windows on.
    let (d, _) = call(&s, &pp, 0, false, us(T0 + 3 * MIN + 7));
    assert_eq!(d, dec(0, 3, 3, 0, 0));
}

#[test]
fn boundary_burst_is_two_limits_in_two_ms() {
    let pp = p(5, 1000);
    let (d1, s) = call(&State::default(), &pp, 5, false, us(T0 + 999));
    let (d2, _) = call(&s, &pp, 5, false, us(T0 + 1000));
    assert_eq!((d1.granted, d2.granted), (5, 5));
}

#[test]
fn from_first_starts_at_the_first_grant() {
    let pp = pf(2, 1000);
    let t = T0 + 123;
    let (d, s) = call(&State::default(), &pp, 1, false, us(t) + 456);
    assert_eq!(d, dec(1, 2, 1, 0, 1000));
    assert_eq!(s, State { start_ms: t, count: 1 });
    let (d, s) = call(&s, &pp, 1, false, us(t + 999));
    assert_eq!(d, dec(1, 2, 0, 0, 1));
    let (d, _) = call(&s, &pp, 1, false, us(t + 999));
    assert_eq!(d, dec(0, 2, 0, 1, 1));
    // At start + window the window is over: the next grant starts another.
    let (d, s) = call(&s, &pp, 1, false, us(t + 1000) + 1);
    assert_eq!(d, dec(1, 2, 1, 0, 1000));
    assert_eq!(s, State { start_ms: t + 1000, count: 1 });
    // Much later: a new window at that instant.
    let (d, s) = call(&s, &pp, 2, false, us(t + 10_007));
    assert_eq!(d, dec(2, 2, 0, 0, 1000));
    assert_eq!(s.start_ms, t + 10_007);
}

#[test]
fn from_first_with_no_window_denies_only_above_the_limit() {
    let pp = pf(4, 500);
    assert_eq!(call(&State::default(), &pp, 5, false, us(T0)).0, dec(0, 4, 4, -1, 0));
    assert_eq!(call(&State::default(), &pp, 5, true, us(T0)).0, dec(4, 4, 0, -1, 500));
    assert_eq!(call(&State::default(), &pp, 4, false, us(T0)).0, dec(4, 4, 0, 0, 500));
    assert_eq!(call(&State::default(), &pp, 0, false, us(T0)).0, dec(0, 4, 4, 0, 0));
}

#[test]
fn window_ms_changes() {
    // Written under 60 s windows at T0, a multiple of 1 s and 30 s but not
    // of 7 s: under 1 s windows it counts until T0 + 1 s, under 30 s windows
    // until T0 + 30 s, under 7 s windows never.
    let s = State { start_ms: T0, count: 2 };
    assert_eq!(call(&s, &p(5, 1000), 0, false, us(T0 + 500)).0, dec(0, 5, 3, 0, 500));
    assert_eq!(call(&s, &p(5, 1000), 0, false, us(T0 + 1000)).0, dec(0, 5, 5, 0, 0));
    assert_eq!(call(&s, &p(5, 30_000), 0, false, us(T0 + 100)).0, dec(0, 5, 3, 0, 29_900));
    // A grant under the new window goes on counting the old units.
    assert_eq!(call(&s, &p(5, 30_000), 3, false, us(T0 + 100)).1, State { start_ms: T0, count: 5 });
    assert_ne!(T0 % 7000, 0);
    assert_eq!(call(&s, &p(5, 7000), 0, false, us(T0 + 1)).0, dec(0, 5, 5, 0, 0));
    // FROMFIRST: the window as given in this call.
    let s = State { start_ms: T0 + 3, count: 2 };
    assert_eq!(call(&s, &pf(5, 100), 0, false, us(T0 + 50)).0, dec(0, 5, 3, 0, 53));
    assert_eq!(call(&s, &pf(5, 47), 0, false, us(T0 + 50)).0, dec(0, 5, 5, 0, 0));
    assert_eq!(call(&s, &pf(5, 48), 0, false, us(T0 + 50)).0, dec(0, 5, 3, 0, 1));
    // A FROMFIRST state read epoch-aligned counts only if it is aligned.
    assert_eq!(call(&s, &p(5, 100), 0, false, us(T0 + 50)).0, dec(0, 5, 5, 0, 0));
    assert_eq!(call(&State { start_ms: T0, count: 2 }, &pf(5, 100), 0, false, us(T0 + 50)).0, dec(0, 5, 3, 0, 50));
}

#[test]
fn partial_takes_what_is_left() {
    let pp = p(10, 1000);
    let (_, s) = call(&State::default(), &pp, 7, false, us(T0 + 200));
    let (d, s) = call(&s, &pp, 5, true, us(T0 + 300));
    assert_eq!(d, dec(3, 10, 0, 700, 700));
    assert_eq!(s.count, 10);
    let (d, s2) = call(&s, &pp, 5, true, us(T0 + 300));
    assert_eq!(d, dec(0, 10, 0, 700, 700));
    assert_eq!(s2, s);
    // More than the limit: what fits, and −1.
    let (d, _) = call(&State::default(), &pp, 11, true, us(T0));
    assert_eq!(d, dec(10, 10, 0, -1, 1000));
}

#[test]
fn cost_zero_reports_and_changes_nothing() {
    let pp = p(10, 1000);
    let (_, s) = call(&State::default(), &pp, 4, false, us(T0 + 250));
    let (d, s2) = call(&s, &pp, 0, false, us(T0 + 400));
    assert_eq!(d, dec(0, 10, 6, 0, 600));
    assert_eq!(d.allowed(0, false), 1);
    assert_eq!(d.allowed(0, true), 0);
    assert_eq!(s2, s);
    assert_eq!(call(&State::default(), &pp, 0, false, us(T0)).0, dec(0, 10, 10, 0, 0));
}

#[test]
fn cost_above_the_limit_never_fits() {
    let pp = p(3, 1000);
    assert_eq!(call(&State::default(), &pp, 4, false, us(T0)).0, dec(0, 3, 3, -1, 0));
    let (_, s) = call(&State::default(), &pp, 1, false, us(T0 + 10));
    assert_eq!(call(&s, &pp, 4, false, us(T0 + 20)).0, dec(0, 3, 2, -1, 980));
    assert_eq!(call(&s, &pp, MAX_ARG, false, us(T0 + 20)).0, dec(0, 3, 2, -1, 980));
}

#[test]
fn a_lowered_limit_answers_zero_remaining() {
    let (_, s) = call(&State::default(), &p(10, 1000), 8, false, us(T0));
    assert_eq!(call(&s, &p(5, 1000), 1, false, us(T0 + 1)).0, dec(0, 5, 0, 999, 999));
    assert_eq!(call(&s, &p(5, 1000), 0, false, us(T0 + 1)).0, dec(0, 5, 0, 0, 999));
}

#[test]
fn refunds() {
    let pp = p(5, 1000);
    let (_, s) = call(&State::default(), &pp, 4, false, us(T0 + 100));
    let (d, s2) = refund(&s, &pp, 3, 1, us(T0 + 200));
    assert_eq!(d, dec(3, 5, 4, 0, 800));
    assert_eq!(s2, State { start_ms: T0, count: 1 });
    assert_eq!(fwm::refund(&s, &pp, 3, 1, us(T0 + 200), Search::Linear), (d, s2));
    // More than counted: back to 0, fresh (the caller deletes the key).
    let (d, s3) = refund(&s2, &pp, 9, 1, us(T0 + 200));
    assert_eq!(d, dec(1, 5, 5, 0, 0));
    assert_eq!(s3.count, 0);
    // An old window has nothing to give back.
    let (d, s4) = refund(&s, &pp, 2, 1, us(T0 + 1000));
    assert_eq!(d, dec(0, 5, 5, 0, 0));
    assert_eq!(s4, s);
    // A full window refunded by 0 units stays; the reply for one more unit
    // waits for the end.
    let (_, full) = call(&State::default(), &pp, 5, false, us(T0));
    assert_eq!(refund(&full, &pp, 1, 1, us(T0 + 1)).0, dec(1, 5, 1, 0, 999));
    // FROMFIRST: the window as given.
    let (_, f) = call(&State::default(), &pf(5, 100), 2, false, us(T0 + 7));
    assert_eq!(refund(&f, &pf(5, 100), 1, 1, us(T0 + 50)).0, dec(1, 5, 4, 0, 57));
    assert_eq!(refund(&f, &pf(5, 100), 1, 1, us(T0 + 107)).0, dec(0, 5, 5, 0, 0));
}

#[test]
fn clock_stepping_back_keeps_the_window() {
    let pp = p(2, 1000);
    let (_, s) = call(&State::default(), &pp, 2, false, us(T0 + 1500));
    assert_eq!(s.start_ms, T0 + 1000);
    // The clock is back in the previous window: still counted, and the
    // waits run to the stored window's end from the real clock.
    let (d, s2) = call(&s, &pp, 1, false, us(T0 + 400));
    assert_eq!(d, dec(0, 2, 0, 1600, 1600));
    assert_eq!(s2, s);
    let pf2 = pf(2, 1000);
    let (_, f) = call(&State::default(), &pf2, 1, false, us(T0 + 1500));
    let (d, f2) = call(&f, &pf2, 1, false, us(T0 + 1000));
    assert_eq!(d, dec(1, 2, 0, 0, 1500));
    assert_eq!(f2, State { start_ms: T0 + 1500, count: 2 });
}

#[test]
fn extremes_never_panic() {
    let edges = [0, 1, 999, 1000, MAX_ARG, MAX_ARG + 1, u64::MAX - 1, u64::MAX];
    for &start_ms in &edges {
        for &count in &[0, 1, MAX_ARG, u64::MAX] {
            for &limit in &[0, 1, MAX_ARG, u64::MAX] {
                for &window_ms in &[0, 1, MAX_ARG, u64::MAX] {
                    for &now in &edges {
                        for &cost in &[0, 1, MAX_ARG, u64::MAX] {
                            for from_first in [false, true] {
                                let s = State { start_ms, count };
                                let pp = Params { limit, window_ms, from_first };
                                let _ = step(&s, &pp, cost, true, now);
                                let _ = step(&s, &pp, cost, false, now);
                                let _ = refund(&s, &pp, cost, 1, now);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn extreme_arguments_give_exact_answers() {
    let pp = p(MAX_ARG, MAX_ARG);
    let now = us(T0);
    let (d, s) = call(&State::default(), &pp, MAX_ARG, false, now);
    assert_eq!(d.granted, MAX_ARG);
    assert_eq!(d.remaining, 0);
    // The window of 2^53 − 1 ms starting at 0 holds every instant of today.
    assert_eq!(s.start_ms, 0);
    assert_eq!(d.reset_after_ms, MAX_ARG - T0);
    assert_eq!(call(&s, &pp, 1, false, now).0.retry_after_ms, to_i64(MAX_ARG - T0));
    let (d, _) = call(&State::default(), &pf(MAX_ARG, MAX_ARG), 1, false, now);
    assert_eq!(d.reset_after_ms, MAX_ARG);
    // A FROMFIRST window at the last millisecond of u64 time still counts
    // (its end saturates; the comparison does not).
    let last = State { start_ms: u64::MAX, count: 3 };
    let (d, s) = step(&last, &pf(10, 1000), 2, false, now);
    assert_eq!((d.granted, d.remaining, s.count), (2, 5, 5));
    assert_eq!(d.reset_after_ms, u64::MAX - now / 1000);
}

// ------------------------------------------------------------------
// Property tests against the model.
// ------------------------------------------------------------------

fn cfg(cases: u32) -> PropConfig {
    PropConfig { cases, failure_persistence: None, ..PropConfig::default() }
}

/// Times whose windows end well before `u64::MAX` ms (the model never
/// saturates; the implementation does only at the end of u64 time).
fn now_us() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..=10_000_000, 1_600_000_000_000_000u64..=1_800_000_000_000_000, 0u64..=u64::MAX / 4]
}

proptest! {
    #![proptest_config(cfg(20_000))]

    /// Any state, any parameters, any call: equal to the model, searched.
    #[test]
    fn single_calls_match_model(
        start_ms in prop_oneof![0u64..=20_000, 1_600_000_000_000u64..=1_800_000_000_000, 0u64..=u64::MAX / 8],
        count in prop_oneof![1u64..=20, 1u64..=MAX_ARG],
        limit in prop_oneof![1u64..=20, 1u64..=MAX_ARG],
        window_ms in prop_oneof![1u64..=20, 1u64..=100_000, 1u64..=MAX_ARG],
        from_first in any::<bool>(),
        cost in prop_oneof![0u64..=25, 0u64..=MAX_ARG],
        partial in any::<bool>(),
        now in now_us(),
        near in any::<bool>(),
        n in 1u64..=MAX_ARG,
    ) {
        // Often the clock near the stored window.
        let now = if near { start_ms.saturating_add(window_ms % 50).saturating_mul(1000) } else { now };
        let s = State { start_ms, count };
        let pp = Params { limit, window_ms, from_first };
        let (d, ns) = step(&s, &pp, cost, partial, now);
        check_invariants(&s, &pp, cost, partial, &d, &ns);
        prop_assert_eq!((d, ns), fwm::decide(&s, &pp, cost, partial, now, Search::Bisect));
        prop_assert_eq!(refund(&s, &pp, n, 1, now), fwm::refund(&s, &pp, n, 1, now, Search::Bisect));
    }

    /// Small numbers: the model's linear scans agree with its bisection
    /// and with `step`.
    #[test]
    fn linear_model_matches(
        start_ms in 0u64..=60, count in 1u64..=8, limit in 1u64..=8, window_ms in 1u64..=12,
        from_first in any::<bool>(), cost in 0u64..=10, partial in any::<bool>(), now_ms in 0u64..=80,
        sub in 0u64..1000,
    ) {
        let s = State { start_ms, count };
        let pp = Params { limit, window_ms, from_first };
        let now = now_ms * 1000 + sub;
        let lin = fwm::decide(&s, &pp, cost, partial, now, Search::Linear);
        prop_assert_eq!(lin, fwm::decide(&s, &pp, cost, partial, now, Search::Bisect));
        prop_assert_eq!(step(&s, &pp, cost, partial, now), lin);
    }

    #[test]
    fn decode_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        match State::decode(&bytes) {
            Ok(s) => prop_assert_eq!(s.encode().to_vec(), bytes),
            Err(e) => prop_assert!(matches!(e, DecodeError::Truncated | DecodeError::TrailingBytes
                | DecodeError::UnknownVersion | DecodeError::Invalid(_))),
        }
    }
}

// ------------------------------------------------------------------
// Long random call sequences against a log of grants.
// ------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Call { dt: i64, cost: u64, partial: bool },
    Refund { dt: i64, n: u64 },
    Limit(u64),
}

fn op() -> impl Strategy<Value = Op> {
    // µs; windows here are 1–5 ms.
    let dt = || {
        prop_oneof![
            8 => Just(0i64),
            24 => 0i64..=700,
            16 => 0i64..=4_000,
            4 => 0i64..=12_000,
            2 => -3_000i64..0,
            1 => -12_000i64..-3_000,
        ]
    };
    let cost = prop_oneof![1 => Just(0u64), 8 => 1u64..=4, 3 => 0u64..=15];
    prop_oneof![
        80 => (dt(), cost, any::<bool>()).prop_map(|(dt, cost, partial)| Op::Call { dt, cost, partial }),
        6 => (dt(), 1u64..=6).prop_map(|(dt, n)| Op::Refund { dt, n }),
        1 => (1u64..=12).prop_map(Op::Limit),
    ]
}

/// What the test itself knows: the grants (ms of the call, units) of the
/// window open now, that window's start, and the latest instant the clock
/// has been evaluated at (time never runs behind it for the state).
#[derive(Default)]
struct GrantLog {
    /// (window start, units in it) of the open window, if any.
    open: Option<(u64, u64)>,
}

impl GrantLog {
    /// Units the log counts at `t_eff` ms, and where a grant would go.
    fn view(&self, w: u64, from_first: bool, t_eff: u64) -> (u64, u64) {
        let fresh_start = if from_first { t_eff } else { t_eff / w * w };
        match self.open {
            Some((start, units)) if units > 0 && start <= t_eff && t_eff < start + w => (units, start),
            _ => (0, fresh_start),
        }
    }
}

fn run_sequence(start: u64, limit0: u64, w: u64, from_first: bool, ops: &[Op]) -> Result<u64, TestCaseError> {
    let mut limit = limit0;
    let mut now = start;
    let mut stored = State::default();
    let mut log = GrantLog::default();
    // The instant the state pins (time is evaluated at no earlier).
    let mut anchor = 0u64;
    // Simulated key expiry at now_ms + reset_after_ms (PEXPIREAT: the key
    // is gone once the clock in ms is past it).
    let mut expiry: Option<u64> = None;
    let mut calls = 0u64;
    for op in ops {
        let dt = match *op {
            Op::Limit(l) => {
                limit = l;
                continue;
            }
            Op::Call { dt, .. } | Op::Refund { dt, .. } => dt,
        };
        calls += 1;
        now = if dt >= 0 { now.saturating_add(dt as u64) } else { now.saturating_sub(dt.unsigned_abs()) };
        let now_ms = now / 1000;
        if let Some(at) = expiry {
            if now_ms > at {
                // The key expires only once its window is over.
                prop_assert_eq!(log.view(w, from_first, now_ms.max(anchor)).0, 0);
                stored = State::default();
                log = GrantLog::default();
                anchor = 0;
                expiry = None;
            }
        }
        let t_eff = now_ms.max(anchor);
        let (counted, goes_to) = log.view(w, from_first, t_eff);
        let pp = Params { limit, window_ms: w, from_first };
        let (d, ns) = match *op {
            Op::Call { cost, partial, .. } => {
                let (d, ns) = step(&stored, &pp, cost, partial, now);
                check_invariants(&stored, &pp, cost, partial, &d, &ns);
                prop_assert_eq!((d, ns), fwm::decide(&stored, &pp, cost, partial, now, Search::Bisect));
                // The log's own answer.
                let avail = limit.saturating_sub(counted);
                let want = if cost <= avail {
                    cost
                } else if partial {
                    avail
                } else {
                    0
                };
                prop_assert_eq!(d.granted, want);
                prop_assert_eq!(d.remaining, avail - want);
                if d.granted > 0 {
                    log.open = Some((goes_to, counted + d.granted));
                    prop_assert!(counted + d.granted <= limit, "never more than the limit in a window");
                }
                (d, ns)
            }
            Op::Refund { n, .. } => {
                let (d, ns) = refund(&stored, &pp, n, 1, now);
                prop_assert_eq!((d, ns), fwm::refund(&stored, &pp, n, 1, now, Search::Bisect));
                prop_assert_eq!(d.granted, n.min(counted));
                if d.granted > 0 {
                    log.open = Some((goes_to, counted - d.granted));
                }
                (d, ns)
            }
            Op::Limit(_) => unreachable!(),
        };
        if d.granted > 0 {
            prop_assert_eq!(ns.start_ms, goes_to);
            if ns.count == 0 {
                // A refund to 0: the key is deleted.
                prop_assert_eq!(d.reset_after_ms, 0);
                stored = State::default();
                log = GrantLog::default();
                anchor = 0;
                expiry = None;
            } else {
                prop_assert_eq!(State::decode(&ns.encode()), Ok(ns));
                prop_assert_eq!(State::unpack(ns.pack().unwrap()), ns);
                // The key expires exactly at the window's end.
                prop_assert_eq!(now_ms + d.reset_after_ms, goes_to + w);
                expiry = Some(now_ms + d.reset_after_ms);
                stored = ns;
                anchor = anchor.max(ns.start_ms);
            }
        }
    }
    Ok(calls)
}

proptest! {
    #![proptest_config(cfg(1_500))]

    /// ~1 million calls: random time steps (equal, forward, backward),
    /// costs 0..15 (often above the limit), PARTIAL, refunds, limit
    /// changes, both window modes; every reply equals the model's, and the
    /// counts what the log of grants says.
    #[test]
    fn random_sequences_match_log_and_model(
        start in prop_oneof![0u64..=100_000, 1_600_000_000_000_000u64..=1_800_000_000_000_000],
        limit in 1u64..=12, window_ms in 1u64..=5, from_first in any::<bool>(),
        ops in prop::collection::vec(op(), 300..=1_000),
    ) {
        run_sequence(start, limit, window_ms, from_first, &ops)?;
    }
}

/// COST 7 FORCE on a window of 5: granted, the count 7, remaining 0, and
/// every call waits for the window's end (the reply's wait for one unit);
/// a debit that would pass 2^53 - 1 is decided as without FORCE.
#[test]
fn force_passes_the_limit_until_the_window_ends() {
    let pw = p(5, 1000);
    let t = 1_700_000_000_250_000; // 250 ms into a window
    let (d, s) = force(&State::default(), &pw, 7, 1, t);
    assert_eq!(d, dec(7, 5, 0, 750, 750));
    assert_eq!(s.count, 7);
    let (d, _) = step(&s, &pw, 1, false, t + 749_999);
    assert_eq!((d.granted, d.remaining, d.retry_after_ms), (0, 0, 1));
    assert_eq!(step(&s, &pw, 1, false, t + 750_000).0.granted, 1);
    // FROMFIRST: the window starts at the debit.
    let (d, s) = force(&State::default(), &pf(5, 1000), 7, 1, t);
    assert_eq!((d.remaining, d.retry_after_ms, s.start_ms), (0, 1000, t / 1000));
    let full = State { start_ms: t / 1000 - t / 1000 % 1000, count: crate::MAX_ARG };
    assert_eq!(force(&full, &pw, 1, 1, t).0.granted, 0);
}
