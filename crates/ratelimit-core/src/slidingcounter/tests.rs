use super::*;
use crate::{DecodeError, PACK_EPOCH_US};
use proptest::prelude::*;
use proptest::test_runner::Config as PropConfig;
use std::collections::HashMap;

// The reference model (docs/contract.md literally, exact rationals, answers
// found by searching): `reference::slidingcounter`.
use crate::reference::slidingcounter::{self as scm, Search};

/// Properties every call keeps, whatever its inputs.
fn check_invariants(state: &State, p: &Params, cost: u64, partial: bool, now: u64, d: &Decision, ns: &State) {
    assert!(d.granted <= cost);
    if !partial {
        assert!(d.granted == 0 || d.granted == cost);
    }
    assert_eq!(d.limit, p.limit);
    assert!(d.remaining <= p.limit);
    assert!(d.retry_after_ms >= -1);
    assert_eq!(d.retry_after_ms == 0, d.granted == cost);
    if d.granted == 0 {
        assert_eq!(ns, state, "a call that grants nothing must not change the state");
    } else {
        assert!(ns.cur >= 1);
        assert!(ns.start_us <= now.max(state.start_us));
    }
    // reset_after is measured to the instant fresh_at_us reports.
    let (stored, win) = (if d.granted > 0 { ns } else { state }, p.window_ms);
    match fresh_at_us(stored, win) {
        None => assert_eq!(d.reset_after_ms, 0),
        Some(f) if f < u64::MAX => {
            let want = us_to_ms_ceil(u128::from(f.saturating_sub(now)));
            assert_eq!(d.reset_after_ms, want);
        }
        Some(_) => {} // saturated at the end of time
    }
}

fn call(state: &State, limit: u64, window_ms: u64, cost: u64, partial: bool, now: u64) -> (Decision, State) {
    let p = Params { limit, window_ms };
    let (d, ns) = step(state, &p, cost, partial, now);
    check_invariants(state, &p, cost, partial, now, &d, &ns);
    (d, ns)
}

fn dec(granted: u64, limit: u64, remaining: u64, retry_after_ms: i64, reset_after_ms: u64) -> Decision {
    Decision { granted, limit, remaining, retry_after_ms, reset_after_ms }
}

// ------------------------------------------------------------------
// Hand-computed examples.
// ------------------------------------------------------------------

const MIN: u64 = 60_000; // window of 60 s, in ms
const W60: u64 = 60_000_000; // the same in µs
/// 2023-11-14T22:14:00Z, a multiple of 60 s.
const T0: u64 = 28_333_334 * W60;

#[test]
fn estimate_across_a_boundary() {
    // 100 granted in the last µs of a window.
    let (d, s) = call(&State::default(), 100, MIN, 100, false, T0 + W60 - 1);
    assert_eq!(d, dec(100, 100, 0, 0, 60_001));
    assert_eq!(s, State { start_us: T0, cur: 100, prev: 0 });

    // Just after the boundary the estimate is still 100: denied.
    let t1 = T0 + W60;
    let (d, s1) = call(&s, 100, MIN, 1, false, t1);
    // 100·(W − e') + 1·W ≤ 100·W  ⇔  e' ≥ W/100 = 600 ms.
    assert_eq!(d, dec(0, 100, 0, 600, 60_000));
    assert_eq!(s1, s);
    // 1 µs later: 100·(W−1)/W ≈ 99.9999983 → still nothing whole left.
    let (d, _) = call(&s, 100, MIN, 0, false, t1 + 1);
    assert_eq!(d, dec(0, 100, 0, 0, 60_000));
    // The exact boundary: at e = 600 ms the estimate is exactly 99.
    let (d, _) = call(&s, 100, MIN, 1, false, t1 + 599_999);
    assert_eq!(d, dec(0, 100, 0, 1, 59_401));
    let (d, n) = call(&s, 100, MIN, 1, false, t1 + 600_000);
    assert_eq!(d, dec(1, 100, 0, 0, 119_400));
    assert_eq!(n, State { start_us: t1, cur: 1, prev: 100 });

    // Halfway through the next window 50 are available.
    let half = t1 + W60 / 2;
    let (d, _) = call(&s, 100, MIN, 0, false, half);
    assert_eq!(d, dec(0, 100, 50, 0, 30_000));
    let (d, _) = call(&s, 100, MIN, 51, false, half);
    assert_eq!(d.granted, 0);
    let (d, n) = call(&s, 100, MIN, 50, false, half);
    assert_eq!(d, dec(50, 100, 0, 0, 90_000));
    assert_eq!(n, State { start_us: t1, cur: 50, prev: 100 });
    // One µs earlier, 100·(W/2 + 1)/W + 50 > 100, but 49 fit.
    let (d, _) = call(&s, 100, MIN, 50, true, half - 1);
    assert_eq!(d.granted, 49);
    assert_eq!(d.remaining, 0);

    // PARTIAL 80 at half-time: 50 now; the full 80 needs the next window
    // with prev' = 50: 50·(W − e'') + 80·W ≤ 100·W ⇔ e'' ≥ 0.6·W,
    // i.e. 30 s + 36 s from now.
    let (d, n) = call(&s, 100, MIN, 80, true, half);
    assert_eq!(d, dec(50, 100, 0, 66_000, 90_000));
    assert_eq!(n, State { start_us: t1, cur: 50, prev: 100 });
    // And that retry is exact: denied 1 µs before, granted at it.
    let (d, _) = call(&n, 100, MIN, 80, false, half + 66_000_000 - 1);
    assert_eq!(d.granted, 0);
    let (d, _) = call(&n, 100, MIN, 80, false, half + 66_000_000);
    assert_eq!(d.granted, 80);

    // Two windows later everything has aged out.
    let (d, _) = call(&s, 100, MIN, 100, false, T0 + 2 * W60);
    assert_eq!(d, dec(100, 100, 0, 0, 120_000));
}

#[test]
fn retry_after_searches_up_to_two_windows_ahead() {
    let w = 1_000_000u64; // 1 s
    let t = 1_000 * w;
    let (_, s) = call(&State::default(), 10, 1000, 10, false, t);
    // Another 10 cannot fit before the window after next.
    let (d, _) = call(&s, 10, 1000, 10, false, t);
    assert_eq!(d, dec(0, 10, 0, 2000, 2000));
    // 1 fits in the next window once 10·(W − e'') ≤ 9·W: e'' ≥ 0.1 s.
    let (d, _) = call(&s, 10, 1000, 1, false, t);
    assert_eq!(d, dec(0, 10, 0, 1100, 2000));
    // Over the limit: never.
    let (d, _) = call(&s, 10, 1000, 11, false, t);
    assert_eq!(d, dec(0, 10, 0, -1, 2000));
    let (d, n) = call(&State::default(), 10, 1000, 11, true, t);
    assert_eq!(d, dec(10, 10, 0, -1, 2000));
    assert_eq!(n, State { start_us: t, cur: 10, prev: 0 });

    // Rounding: smallest whole µs, then ms rounded up. prev = 3 after
    // the shift, limit 3, e = 0: 3·(W − e') ≤ 2·W ⇔ W − e' ≤ 666_666.
    let s = State { start_us: t - w, cur: 3, prev: 0 };
    let (d, _) = call(&s, 3, 1000, 1, false, t);
    assert_eq!(d, dec(0, 3, 0, 334, 1000));
    let (d, _) = call(&s, 3, 1000, 1, false, t + 333_000);
    assert_eq!(d.retry_after_ms, 1); // 334 µs → 1 ms
    let (d, _) = call(&s, 3, 1000, 1, false, t + 333_333);
    assert_eq!(d.retry_after_ms, 1); // 1 µs → 1 ms
    let (d, _) = call(&s, 3, 1000, 1, false, t + 333_334);
    assert_eq!(d.granted, 1);
}

#[test]
fn cost_zero_reports_and_changes_nothing() {
    let s = State { start_us: T0, cur: 30, prev: 40 };
    let (d, n) = call(&s, 100, MIN, 0, false, T0 + W60 / 4);
    // 40·3/4 + 30 = 60 → 40 remain.
    assert_eq!(d, dec(0, 100, 40, 0, 105_000));
    assert_eq!(n, s);
    let (d, n) = call(&State::default(), 100, MIN, 0, true, T0);
    assert_eq!(d, dec(0, 100, 100, 0, 0));
    assert_eq!(n, State::default());
    // Even when over the limit it reports, with retry 0.
    let (d, n) = call(&s, 10, MIN, 0, false, T0);
    assert_eq!(d, dec(0, 10, 0, 0, 120_000));
    assert_eq!(n, s);
}

#[test]
fn denied_calls_leave_the_state_unchanged_even_when_stale() {
    // A state from long ago, and one whose window has just shifted: a
    // denial returns the input untouched (the caller writes nothing).
    let s = State { start_us: T0, cur: 100, prev: 0 };
    let (d, n) = call(&s, 100, MIN, 1, false, T0 + W60 + 5);
    assert_eq!(d.granted, 0);
    assert_eq!(n, s);
    // After both windows passed, the stale state behaves as no state.
    let later = T0 + 2 * W60;
    assert_eq!(fresh_at_us(&s, MIN), Some(later));
    // Only `prev` left: fresh at the end of the stored window.
    assert_eq!(fresh_at_us(&State { start_us: T0, cur: 0, prev: 5 }, MIN), Some(T0 + W60));
    assert_eq!(fresh_at_us(&State { start_us: T0, cur: 0, prev: 0 }, MIN), None);
    // Read under another window, the stored instant's window counts.
    assert_eq!(fresh_at_us(&State { start_us: T0 + 1_500_000, cur: 1, prev: 0 }, 1000), Some(T0 + 3_000_000));
    assert_eq!(
        step(&s, &Params { limit: 100, window_ms: MIN }, 7, false, later).0,
        step(&State::default(), &Params { limit: 100, window_ms: MIN }, 7, false, later).0
    );
}

#[test]
fn clock_stepping_back_counts_as_zero_elapsed() {
    let w = 1_000_000u64;
    let t = 5_000 * w;
    let (_, s) = call(&State::default(), 5, 1000, 5, false, t + 500_000);
    assert_eq!(s, State { start_us: t, cur: 5, prev: 0 });
    // 10 s back: evaluated at the stored window start (e = 0), so the
    // same counts apply, and the waits include the 10 s the clock needs
    // to catch up: the next window is at t + 1 s, where
    // 5·(W − e'') + W ≤ 5·W ⇔ e'' ≥ 0.2 s.
    let back = t - 10 * w;
    let (d, n) = call(&s, 5, 1000, 1, false, back);
    assert_eq!(d, dec(0, 5, 0, 11_200, 12_000));
    assert_eq!(n, s);
    let (d, _) = call(&s, 5, 1000, 1, false, back + 11_200_000 - 1);
    assert_eq!(d.granted, 0);
    let (d, _) = call(&s, 5, 1000, 1, false, back + 11_200_000);
    assert_eq!(d.granted, 1);
    // A grant while the clock is behind goes into the stored window and
    // never lets that window exceed the limit.
    let s2 = State { start_us: t, cur: 2, prev: 0 };
    let (d, n) = call(&s2, 5, 1000, 9, true, back);
    assert_eq!(d, dec(3, 5, 0, -1, 12_000));
    assert_eq!(n, State { start_us: t, cur: 5, prev: 0 });
    // Stepping back inside the window: elapsed is as stored (e = 0 at
    // start_us), so the estimate uses prev fully.
    let s3 = State { start_us: t, cur: 1, prev: 4 };
    let (d, _) = call(&s3, 5, 1000, 0, false, t - 1);
    assert_eq!(d.remaining, 0); // 4·W/W + 1 = 5
    let (d, _) = call(&s3, 5, 1000, 0, false, t + 250_000);
    assert_eq!(d.remaining, 1); // 4·3/4 + 1 = 4
}

#[test]
fn runtime_window_change_reinterprets_the_stored_window() {
    // Written under 1 s windows: window 5 counts 3, window 4 counted 2.
    let s = State { start_us: 5_000_000, cur: 3, prev: 2 };
    // Read under 2 s windows: 5_000_000 lies in window 2 = [4 s, 6 s), the
    // same window as 5.5 s: prev 2, cur 3, e = 1.5 s →
    // 2·0.5/2 + 3 = 3.5, so 1 of 5 remains.
    let (d, _) = call(&s, 5, 2000, 0, false, 5_500_000);
    assert_eq!(d, dec(0, 5, 1, 0, 2_500));
    // Read under 0.5 s windows: stored window 10, now (5.6 s) is in 11:
    // prev 3, cur 0, e = 0.1 s → 3·0.4/0.5 = 2.4 → 2 remain.
    let (d, _) = call(&s, 5, 500, 0, false, 5_600_000);
    assert_eq!(d, dec(0, 5, 2, 0, 400));
    let (d, n) = call(&s, 5, 500, 2, false, 5_600_000);
    assert_eq!(d, dec(2, 5, 0, 0, 900));
    assert_eq!(n, State { start_us: 5_500_000, cur: 2, prev: 3 });
    // A lowered limit applies to the carried counts: denied, not reset.
    let (d, _) = call(&s, 2, 1000, 1, false, 5_100_000);
    assert_eq!(d.granted, 0);
    assert_eq!(d.remaining, 0);
    // 2·(W − e') + 4·W ≤ 2·W has no solution in this window; next
    // window: 3·(W − e'') + W ≤ 2·W ⇔ e'' ≥ 2/3 W; 0.9 s + 666_667 µs.
    assert_eq!(d.retry_after_ms, 1_567);
}

#[test]
fn never_more_than_limit_per_fixed_window_under_hammering() {
    // One call per 37 µs for 30 windows of 20 ms, limit 9, mixed costs.
    let (limit, window_ms) = (9u64, 20u64);
    let w = window_ms * 1000;
    let mut s = State::default();
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    let mut total = 0u64;
    let mut t = 123 * w;
    let end = t + 30 * w;
    let mut i = 0u64;
    while t < end {
        let cost = 1 + i % 3;
        let (d, n) = call(&s, limit, window_ms, cost, i.is_multiple_of(5), t);
        if d.granted > 0 {
            s = n;
            let k = t / w;
            let c = *per_window.entry(k).and_modify(|c| *c += d.granted).or_insert(d.granted);
            assert!(c <= limit);
            // Sliding estimate over the grants themselves ≤ limit.
            let prev = per_window.get(&(k - 1)).copied().unwrap_or(0);
            let e = t % w;
            assert!(
                u128::from(prev) * u128::from(w - e) + u128::from(c) * u128::from(w) <= u128::from(limit) * u128::from(w)
            );
            total += d.granted;
        }
        t += 37;
        i += 1;
    }
    // Not overly strict either: with steady demand each window after the
    // first gets at least some, and the whole run at least half the
    // fixed-window maximum.
    assert!(total >= 30 * limit / 2, "total {total}");
}

// ------------------------------------------------------------------
// Extremes.
// ------------------------------------------------------------------

#[test]
fn extremes_never_panic_and_match_the_model_in_range() {
    let big_start = u64::MAX - u64::MAX % 1000;
    let limits = [1, 2, MAX_ARG - 1, MAX_ARG, 0, MAX_ARG + 1, u64::MAX];
    let windows = [1, 2, MAX_ARG, 0, MAX_ARG + 1, u64::MAX];
    let costs = [0, 1, 2, MAX_ARG - 1, MAX_ARG, MAX_ARG + 1, u64::MAX];
    let nows = [0, 1, 999, 1000, MAX_ARG * 1000 - 1, MAX_ARG * 1000, u64::MAX - 1, u64::MAX];
    let states = [
        State::default(),
        State { start_us: 0, cur: 1, prev: 0 },
        State { start_us: 0, cur: MAX_ARG, prev: MAX_ARG },
        State { start_us: big_start, cur: MAX_ARG, prev: MAX_ARG },
        State { start_us: big_start, cur: 1, prev: MAX_ARG },
        State { start_us: (MAX_ARG - 1) * 1000, cur: MAX_ARG, prev: 1 },
        State { start_us: u64::MAX, cur: u64::MAX, prev: u64::MAX },
        State { start_us: 12_345, cur: 7, prev: u64::MAX },
        State { start_us: u64::MAX - 1, cur: 0, prev: 3 },
    ];
    let in_range = |v: u64| (1..=MAX_ARG).contains(&v);
    let mut compared = 0;
    for &limit in &limits {
        for &window_ms in &windows {
            for &cost in &costs {
                for &now in &nows {
                    for s in &states {
                        for partial in [false, true] {
                            let (d, ns) = call(s, limit, window_ms, cost, partial, now);
                            let valid_state = s.is_fresh() || State::decode(&s.encode()).is_ok();
                            if in_range(limit) && in_range(window_ms) && cost <= MAX_ARG && valid_state {
                                let p = Params { limit, window_ms };
                                let (md, ms) = scm::decide(s, &p, cost, partial, now, Search::Bisect);
                                assert_eq!(d, md, "{s:?} {p:?} cost {cost} partial {partial} now {now}");
                                assert_eq!(ns, ms);
                                if d.granted > 0 {
                                    assert_eq!(State::decode(&ns.encode()), Ok(ns));
                                }
                                compared += 1;
                            }
                            let _ = fresh_at_us(&ns, window_ms);
                            let _ = fresh_at_us(s, window_ms);
                        }
                    }
                }
            }
        }
    }
    assert!(compared > 1000);
}

#[test]
fn extreme_values_give_exact_answers() {
    // Largest limit, window and cost from fresh: granted, 0 left, and the
    // key is fresh again two windows (2·MAX_ARG ms) later.
    let t = MAX_ARG * 1000; // window 1 of the largest window
    let (d, s) = call(&State::default(), MAX_ARG, MAX_ARG, MAX_ARG, false, t);
    assert_eq!(d, dec(MAX_ARG, MAX_ARG, 0, 0, 2 * MAX_ARG));
    assert_eq!(s, State { start_us: t, cur: MAX_ARG, prev: 0 });
    // (3·W is past u64::MAX µs: the instant saturates, the reply does not.)
    assert_eq!(fresh_at_us(&s, MAX_ARG), Some(u64::MAX));
    // One more unit needs the next window: MAX·(W − e'') + W ≤ MAX·W,
    // e'' ≥ W/MAX = 1000 µs, so MAX_ARG + 1 ms.
    let (d, _) = call(&s, MAX_ARG, MAX_ARG, 1, false, t);
    assert_eq!(d, dec(0, MAX_ARG, 0, to_i64(MAX_ARG + 1), 2 * MAX_ARG));
    // Smallest everything.
    let (d, s) = call(&State::default(), 1, 1, 1, false, 0);
    assert_eq!(d, dec(1, 1, 0, 0, 2));
    assert_eq!(s, State { start_us: 0, cur: 1, prev: 0 });
    let (d, _) = call(&s, 1, 1, 1, false, 0);
    assert_eq!(d, dec(0, 1, 0, 2, 2));
    // The end of time: the window start is representable, fresh_at
    // saturates, and no arithmetic overflows.
    let (d, s) = call(&State::default(), 3, 1, 2, false, u64::MAX);
    assert_eq!(d.granted, 2);
    assert_eq!(s.start_us, u64::MAX - u64::MAX % 1000);
    assert_eq!(fresh_at_us(&s, 1), Some(u64::MAX));
    let (d, _) = call(&s, 3, 1, 2, false, u64::MAX);
    assert_eq!(d.granted, 0);
    assert!(d.retry_after_ms > 0);
}

// ------------------------------------------------------------------
// Property tests.
// ------------------------------------------------------------------

fn cfg(cases: u32) -> PropConfig {
    // No regression files: this crate's source tree belongs to others.
    PropConfig { cases, failure_persistence: None, ..PropConfig::default() }
}

/// Numbers that hit both ends of `0..=MAX_ARG`.
fn wide(lo: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => lo..=lo + 3,
        2 => MAX_ARG - 3..=MAX_ARG,
        3 => lo..=MAX_ARG,
        2 => lo..=1_000u64,
        1 => lo..=(1u64 << 32),
    ]
}

fn time_from(base: u64, delta: u64, back: bool) -> u64 {
    if back {
        base.saturating_sub(delta)
    } else {
        base.saturating_add(delta)
    }
}

proptest! {
    #![proptest_config(cfg(4_000))]

    /// Small everything: the model with plain linear scans agrees with
    /// `step` and with its own bisection (which the big tests rely on).
    #[test]
    fn linear_model_matches_step_and_bisection(
        limit in 1u64..=8, window_ms in 1u64..=3,
        k in 0u64..=6, cur in 0u64..=10, prev in 0u64..=10,
        offset in -3_000i64..=9_000, cost in 0u64..=10, partial: bool,
    ) {
        let s = State { start_us: (1_000 + k) * 1000, cur, prev };
        let now = (1_000 * 1000 + 6 * 1000u64).checked_add_signed(offset).unwrap();
        let p = Params { limit, window_ms };
        let (d, ns) = step(&s, &p, cost, partial, now);
        check_invariants(&s, &p, cost, partial, now, &d, &ns);
        let lin = scm::decide(&s, &p, cost, partial, now, Search::Linear);
        let bis = scm::decide(&s, &p, cost, partial, now, Search::Bisect);
        prop_assert_eq!(lin, bis);
        prop_assert_eq!(d, lin.0);
        prop_assert_eq!(ns, lin.1);
    }
}

proptest! {
    #![proptest_config(cfg(20_000))]

    /// Full ranges: exact agreement with the model on huge limits,
    /// windows, costs and times, including the clock behind the state.
    #[test]
    fn large_values_match_model(
        limit in wide(1), window_ms in wide(1), cost in wide(0),
        start_ms in prop_oneof![0u64..=u64::MAX / 1000, Just(u64::MAX / 1000)],
        cur in wide(0), prev in wide(0), partial: bool,
        delta in prop_oneof![wide(0), any::<u64>(), 0u64..=10_000_000], back in prop::bool::weighted(0.2),
        unaligned: bool,
    ) {
        let mut start_us = start_ms * 1000;
        if unaligned {
            // Written under another window: not aligned to this one.
            start_us = start_us.saturating_sub(start_us % (window_ms.saturating_mul(1000)) / 2 / 1000 * 1000);
        }
        let s = if cur == 0 { State::default() } else { State { start_us, cur, prev } };
        let now = time_from(start_us, delta, back);
        let p = Params { limit, window_ms };
        let (d, ns) = step(&s, &p, cost, partial, now);
        check_invariants(&s, &p, cost, partial, now, &d, &ns);
        let (md, ms) = scm::decide(&s, &p, cost, partial, now, Search::Bisect);
        prop_assert_eq!(d, md);
        prop_assert_eq!(ns, ms);
        if d.granted > 0 {
            prop_assert_eq!(State::decode(&ns.encode()), Ok(ns));
        }
    }

    /// Any u64 anywhere (state fields, params out of range, cost): no
    /// panic or overflow (overflow checks are on in the scratch build),
    /// and the basic invariants hold.
    #[test]
    fn arbitrary_u64_inputs_never_panic(
        start_us: u64, cur: u64, prev: u64, limit: u64, window_ms: u64,
        cost: u64, partial: bool, now: u64,
    ) {
        let s = State { start_us, cur, prev };
        let p = Params { limit, window_ms };
        let (d, ns) = step(&s, &p, cost, partial, now);
        prop_assert!(d.granted <= cost);
        prop_assert_eq!(d.limit, limit);
        prop_assert!(d.retry_after_ms >= -1);
        if d.granted == 0 {
            prop_assert_eq!(ns, s);
        } else {
            prop_assert!(ns.cur <= limit.min(MAX_ARG));
            // A stored state never holds more than MAX_ARG in either
            // count; from such a state, the new one is storable too (the
            // window shift may move `cur` into `prev`, so both matter).
            if cur <= MAX_ARG && prev <= MAX_ARG {
                prop_assert_eq!(State::decode(&ns.encode()), Ok(ns));
            }
        }
        let _ = fresh_at_us(&s, window_ms);
        let _ = fresh_at_us(&ns, window_ms);
    }

    /// Random bytes never make decode panic; whatever it accepts
    /// re-encodes to exactly the same bytes.
    #[test]
    fn decode_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        if let Ok(s) = State::decode(&bytes) {
            prop_assert_eq!(s.encode().to_vec(), bytes);
            prop_assert!(!s.is_fresh());
        }
    }

    /// Version-1 payloads with random fields: the accepted ones satisfy
    /// the invariants and round-trip; the rest are `Invalid`.
    #[test]
    fn decode_random_v1_payloads(
        start_ms in prop_oneof![any::<u64>(), 0u64..=u64::MAX / 1000],
        cur in prop_oneof![any::<u64>(), 0u64..=MAX_ARG + 2],
        prev in prop_oneof![any::<u64>(), 0u64..=MAX_ARG + 2],
        scale: bool,
    ) {
        let start_us = if scale { start_ms.saturating_mul(1000) } else { start_ms };
        let s = State { start_us, cur, prev };
        let bytes = s.encode();
        match State::decode(&bytes) {
            Ok(d) => {
                prop_assert_eq!(d, s);
                prop_assert!(cur <= MAX_ARG && prev <= MAX_ARG && cur + prev > 0 && start_us.is_multiple_of(1000));
            }
            Err(e) => {
                prop_assert!(matches!(e, DecodeError::Invalid(_)));
                prop_assert!((cur == 0 && prev == 0) || cur > MAX_ARG || prev > MAX_ARG || start_us % 1000 != 0);
            }
        }
    }
}

// ------------------------------------------------------------------
// Long random call sequences against the model and a log of grants.
// ------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Call { dt: i64, cost: u64, partial: bool },
    Limit(u64),
    Window(u64),
}

fn op() -> impl Strategy<Value = Op> {
    // µs; mostly forward, sometimes equal, sometimes back (by less or
    // more than a window: windows here are 1–4 ms).
    let dt = prop_oneof![
        8 => Just(0i64),
        24 => 0i64..=400,
        16 => 0i64..=4_000,
        6 => 0i64..=15_000,
        2 => -3_000i64..0,
        1 => -12_000i64..-3_000,
    ];
    let cost = prop_oneof![1 => Just(0u64), 8 => 1u64..=4, 3 => 0u64..=15];
    prop_oneof![
        80 => (dt, cost, any::<bool>()).prop_map(|(dt, cost, partial)| Op::Call { dt, cost, partial }),
        1 => (1u64..=12).prop_map(Op::Limit),
        1 => (1u64..=4).prop_map(Op::Window),
    ]
}

/// What the test itself knows: units granted per fixed window (keyed by
/// window index, i128 so "the window before 0" exists), and the instant
/// time can no longer run behind: the start of the latest window a
/// grant went into (or, after a window change, the stored `start_us`).
#[derive(Default)]
struct GrantLog {
    per_window: HashMap<i128, u64>,
    anchor: u64,
}

impl GrantLog {
    fn get(&self, k: i128) -> u64 {
        self.per_window.get(&k).copied().unwrap_or(0)
    }
    /// (window, prev, cur, e) a call at `now` sees.
    fn view(&self, w: u64, now: u64) -> (i128, u64, u64, u64) {
        let t = now.max(self.anchor);
        let k = i128::from(t / w);
        (k, self.get(k - 1), self.get(k), t % w)
    }
}

fn run_sequence(start: u64, limit0: u64, window0: u64, ops: &[Op]) -> Result<u64, TestCaseError> {
    let (mut limit, mut window_ms) = (limit0, window0);
    let mut now = start;
    let mut stored = State::default();
    let mut log = GrantLog::default();
    // Simulated key expiry: the caller sets TTL = reset_after_ms.
    let mut expiry: Option<(u64, u64)> = None; // (expires at µs, window_ms then)
    let mut calls = 0u64;
    for op in ops {
        match *op {
            Op::Limit(l) => limit = l,
            Op::Window(wm) => {
                window_ms = wm;
                // The stored state is now read under the new window:
                // seed the log with that reading.
                log = GrantLog::default();
                if !stored.is_fresh() {
                    let k = i128::from(stored.start_us / (wm * 1000));
                    log.per_window.insert(k, stored.cur);
                    log.per_window.insert(k - 1, stored.prev);
                    log.anchor = stored.start_us;
                }
            }
            Op::Call { dt, cost, partial } => {
                calls += 1;
                now = if dt >= 0 { now.saturating_add(dt as u64) } else { now.saturating_sub(dt.unsigned_abs()) };
                let w = window_ms * 1000;
                if let Some((at, win)) = expiry {
                    if now >= at {
                        if win == window_ms {
                            // The key expires only once it is fresh.
                            let (_, lp, lc, _) = log.view(w, now);
                            prop_assert_eq!((lp, lc), (0, 0));
                        }
                        stored = State::default();
                        log = GrantLog::default();
                        expiry = None;
                    }
                }
                // The state agrees with the log of grants.
                let (k, lp, lc, le) = log.view(w, now);
                let (sp, sc, se) = scm::counts(&stored, u128::from(w), u128::from(now));
                prop_assert_eq!((u128::from(lp), u128::from(lc), u128::from(le)), (sp, sc, se));

                let p = Params { limit, window_ms };
                let (d, ns) = step(&stored, &p, cost, partial, now);
                check_invariants(&stored, &p, cost, partial, now, &d, &ns);
                let (md, ms) = scm::decide(&stored, &p, cost, partial, now, Search::Bisect);
                prop_assert_eq!(d, md, "now {} stored {:?} params {:?} cost {} partial {}", now, stored, p, cost, partial);
                prop_assert_eq!(ns, ms);
                // A state past its fresh instant acts exactly as no key.
                if let Some(f) = fresh_at_us(&stored, window_ms) {
                    if now >= f && f < u64::MAX {
                        prop_assert_eq!(d, step(&State::default(), &p, cost, partial, now).0);
                    }
                }
                if d.granted > 0 {
                    prop_assert_eq!(State::decode(&ns.encode()), Ok(ns));
                    // The compact in-memory form holds every state of
                    // the years it covers, exactly.
                    let packed = ns.pack();
                    prop_assert_eq!(packed.map(State::unpack).unwrap_or(ns), ns);
                    if (PACK_EPOCH_US..PACK_EPOCH_US + (1u64 << 51)).contains(&ns.start_us) {
                        prop_assert!(packed.is_some(), "{:?} did not pack", ns);
                    }
                    prop_assert_eq!(i128::from(ns.start_us / w), k);
                    let c = log.per_window.entry(k).or_insert(0);
                    *c += d.granted;
                    let c = *c;
                    log.anchor = log.anchor.max(now.max(log.anchor) - le);
                    // Never more than the limit in a fixed window, and the
                    // sliding estimate over the actual grants ≤ limit.
                    prop_assert!(c <= limit);
                    let est = u128::from(lp) * u128::from(w - le) + u128::from(c) * u128::from(w);
                    prop_assert!(est <= u128::from(limit) * u128::from(w));
                    let at = now.saturating_add(d.reset_after_ms.saturating_mul(1000));
                    if let Some(f) = fresh_at_us(&ns, window_ms) {
                        prop_assert!(at >= f || at == u64::MAX);
                    }
                    // (At the end of u64 time the expiry saturates: never.)
                    expiry = (at < u64::MAX).then_some((at, window_ms));
                    stored = ns;
                }
            }
        }
    }
    Ok(calls)
}

proptest! {
    #![proptest_config(cfg(5_000))]

    /// ~5 million calls in total: random time steps (equal, forward,
    /// backward), costs 0..15 (often above the limit), PARTIAL, limit
    /// and window changes; every reply field equals the model's, and
    /// the state always equals what the log of grants says.
    #[test]
    fn random_sequences_match_model(
        start in prop_oneof![
            0u64..=100_000,
            1_600_000_000_000_000u64..=1_800_000_000_000_000,
            u64::MAX - 300_000..=u64::MAX,
        ],
        limit in 1u64..=12, window_ms in 1u64..=4,
        ops in prop::collection::vec(op(), 600..=1_400),
    ) {
        run_sequence(start, limit, window_ms, &ops)?;
    }

}

/// COST 7 FORCE on a counter of 5 a second: granted, remaining 0; the
/// next unit fits once the estimate 7·(W − x)/W + 1 ≤ 5 in the next
/// window, x ≥ 3W/7; both windows are empty after two.
#[test]
fn force_passes_the_limit_and_the_estimate_decays() {
    let p = Params { limit: 5, window_ms: 1000 };
    let t = 1_700_000_000_000_000; // a window's start
    let (d, s) = force(&State::default(), &p, 7, 1, t);
    // 1000 ms to the next window, then ⌈3000/7⌉ = 429 ms (428,572 µs).
    assert_eq!((d.granted, d.limit, d.remaining, d.retry_after_ms, d.reset_after_ms), (7, 5, 0, 1429, 2000));
    assert_eq!(s.cur, 7);
    assert_eq!(step(&s, &p, 1, false, t + 1_428_571).0.granted, 0);
    assert_eq!(step(&s, &p, 1, false, t + 1_428_572).0.granted, 1);
}
