//! Model tests for RL.MULTI: random sequences of multi-limit calls (2–4
//! limits, mixed algorithms (fixed windows epoch-aligned and FROMFIRST), WEIGHT, PARTIAL, DRYRUN, COST 0, REFUND, clock
//! steps back, steps onto the instant a grant leaves a window) against the
//! reference (`reference::multi`), which evaluates each limit on its own
//! model, by brute force over exact integers and rationals, and commits all
//! or nothing. Every reply field must agree.

use super::*;
use crate::reference::multi::{self as model, Limit};
use crate::{concurrency as cc, fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision};
use proptest::prelude::*;

// ---- The implementation under test, driven like the handler drives it. ----

#[derive(Clone, Debug)]
enum Real {
    Tb(tb::State),
    Log(sl::State),
    Counter(sc::State),
    Fw(fw::State),
    Cc(cc::State),
}

fn run_real(states: &mut [Real], params: &[Params], weights: &[u64], op: Op, now: u64) -> (Whole, Vec<Decision>) {
    run_real_flagged(states, params, weights, &[], op, now)
}

/// [`run_real`] with each limit's flags (none: [`run`], else [`run_flagged`]).
fn run_real_flagged(
    states: &mut [Real],
    params: &[Params],
    weights: &[u64],
    flags: &[u8],
    op: Op,
    now: u64,
) -> (Whole, Vec<Decision>) {
    let mut per = [Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 }; MAX_LIMITS];
    let whole = {
        let mut refs: Vec<Option<Entry>> = states
            .iter_mut()
            .zip(params)
            .zip(weights)
            .map(|((s, p), &weight)| {
                let limit = match (s, *p) {
                    (Real::Tb(s), Params::TokenBucket(p)) => LimitMut::TokenBucket(s, p),
                    (Real::Log(s), Params::SlidingLog(p)) => LimitMut::SlidingLog(s, p),
                    (Real::Counter(s), Params::SlidingCounter(p)) => LimitMut::SlidingCounter(s, p),
                    (Real::Fw(s), Params::FixedWindow(p)) => LimitMut::FixedWindow(s, p),
                    (Real::Cc(s), Params::Concurrency(p)) => LimitMut::Concurrency(s, p),
                    _ => panic!("a state under another algorithm's parameters"),
                };
                Some(Entry { limit, weight })
            })
            .collect();
        if flags.iter().any(|&f| f != 0) {
            run_flagged(&mut refs, flags, op, now, &mut per)
        } else {
            run(&mut refs, op, now, &mut per)
        }
    };
    let per = per[..states.len()].to_vec();
    // The handler deletes a key that a refund made fresh.
    if let Op::Refund(_) = op {
        for (s, d) in states.iter_mut().zip(&per) {
            if d.granted > 0 && d.reset_after_ms == 0 {
                *s = match s {
                    Real::Tb(_) => Real::Tb(tb::State::default()),
                    Real::Log(_) => Real::Log(sl::State::default()),
                    Real::Counter(_) => Real::Counter(sc::State::default()),
                    Real::Fw(_) => Real::Fw(fw::State::default()),
                    Real::Cc(_) => Real::Cc(cc::State::default()),
                };
            }
        }
    }
    (whole, per)
}

#[derive(Clone, Debug)]
enum Step {
    Take {
        dt: i64,
        cost: u64,
        partial: bool,
        dryrun: bool,
    },
    Refund {
        dt: i64,
        n: u64,
    },
    /// `COST n FORCE` (a debit past the limits).
    Force {
        dt: i64,
        cost: u64,
        dryrun: bool,
    },
    /// A take at an earlier call's instant plus one limit's window (or
    /// period), -1, 0 or +1 µs: where a grant leaves a window, the edge the
    /// random steps rarely land on (the clock stays put if that is past).
    Edge {
        call: prop::sample::Index,
        limit: prop::sample::Index,
        off: i64,
        cost: u64,
        partial: bool,
    },
}

fn cost_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0u64), 6 => 1u64..4, 2 => 1u64..15]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let dt = prop_oneof![6 => 0i64..400_000, 2 => Just(0i64), 1 => 0i64..5_000_000, 1 => -3_000_000i64..0];
    prop_oneof![
        5 => (dt.clone(), cost_strategy(), any::<bool>(), prop::bool::weighted(0.15))
            .prop_map(|(dt, cost, partial, dryrun)| Step::Take { dt, cost, partial, dryrun }),
        1 => (dt.clone(), 1u64..6).prop_map(|(dt, n)| Step::Refund { dt, n }),
        1 => (dt, prop_oneof![cost_strategy(), 1u64..40], prop::bool::weighted(0.15))
            .prop_map(|(dt, cost, dryrun)| Step::Force { dt, cost, dryrun }),
        2 => (any::<prop::sample::Index>(), any::<prop::sample::Index>(), -1i64..=1, cost_strategy(), any::<bool>())
            .prop_map(|(call, limit, off, cost, partial)| Step::Edge { call, limit, off, cost, partial }),
    ]
}

/// The instant a step runs at, and what it does. `calls` holds the instants
/// of the calls made so far; `spans` each limit's window or period in µs.
fn place(step: &Step, now: u64, calls: &[u64], spans: &[u64]) -> (u64, Op) {
    match *step {
        Step::Take { dt, cost, partial, dryrun } => (now.saturating_add_signed(dt), Op::Take { cost, partial, dryrun }),
        Step::Refund { dt, n } => (now.saturating_add_signed(dt), Op::Refund(n)),
        Step::Force { dt, cost, dryrun } => (now.saturating_add_signed(dt), Op::Force { cost, dryrun }),
        Step::Edge { ref call, ref limit, off, cost, partial } => {
            let at = match calls {
                [] => now,
                _ => {
                    calls[call.index(calls.len())].saturating_add(spans[limit.index(spans.len())]).saturating_add_signed(off)
                }
            };
            (at.max(now), Op::Take { cost, partial, dryrun: false })
        }
    }
}

fn span_us(p: &Params) -> u64 {
    match p {
        Params::TokenBucket(p) => p.period_ms * 1000,
        Params::SlidingLog(p) => p.window_ms * 1000,
        Params::SlidingCounter(p) => p.window_ms * 1000,
        Params::FixedWindow(p) => p.window_ms * 1000,
        Params::Concurrency(p) => p.lease_ms * 1000,
    }
}

fn limit_strategy() -> impl Strategy<Value = (u8, u64, u64, u64, u64)> {
    // (algorithm, limit/capacity, rate, period/window/lease ms, weight);
    // the fixed window's `rate` odd: FROMFIRST; a concurrency limit's id
    // hash is `rate % 3`
    (0u8..5, 1u64..20, 1u64..8, prop_oneof![1u64..50, 50u64..3000], prop_oneof![3 => Just(1u64), 1 => 1u64..4])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn multi_agrees_with_independent_limits(
        limits in proptest::collection::vec(limit_strategy(), 2..=4),
        steps in proptest::collection::vec(step_strategy(), 1..120),
        t0 in prop_oneof![Just(1_700_000_000_000_000u64), 0u64..10_000_000],
    ) {
        let mut params = Vec::new();
        let mut weights = Vec::new();
        let mut states = Vec::new();
        for &(algo, limit, rate, ms, weight) in &limits {
            weights.push(weight);
            match algo {
                0 => {
                    params.push(Params::TokenBucket(tb::Params { capacity: limit, rate, period_ms: ms }));
                    states.push(Real::Tb(tb::State::default()));
                }
                1 => {
                    params.push(Params::SlidingLog(sl::Params { limit, window_ms: ms }));
                    states.push(Real::Log(sl::State::default()));
                }
                2 => {
                    params.push(Params::SlidingCounter(sc::Params { limit, window_ms: ms }));
                    states.push(Real::Counter(sc::State::default()));
                }
                3 => {
                    params.push(Params::FixedWindow(fw::Params { limit, window_ms: ms, from_first: rate % 2 == 1 }));
                    states.push(Real::Fw(fw::State::default()));
                }
                _ => {
                    params.push(Params::Concurrency(cc::Params { limit, lease_ms: ms, id_hash: rate % 3 }));
                    states.push(Real::Cc(cc::State::default()));
                }
            }
        }
        let mut models: Vec<Limit> = params.iter().map(Limit::fresh).collect();
        let spans: Vec<u64> = params.iter().map(span_us).collect();
        let mut calls = Vec::new();
        let mut now = t0;
        let has_cc = params.iter().any(|p| matches!(p, Params::Concurrency(_)));
        for step in steps {
            let mut op;
            (now, op) = place(&step, now, &calls, &spans);
            if let (true, Op::Force { cost, dryrun }) = (has_cc, op) {
                // The parser refuses FORCE with a CONCURRENCY limit.
                op = Op::Take { cost, partial: false, dryrun };
            }
            calls.push(now);
            // The reference: each limit on its own, then all or nothing.
            let (expect, per_model) = model::call(&mut models, &weights, op, now);
            let (whole, per) = run_real(&mut states, &params, &weights, op, now);
            prop_assert_eq!(&per, &per_model, "op {:?} at {}", op, now);
            prop_assert_eq!(whole, expect, "op {:?} at {}", op, now);
        }
    }

    /// CHECK and SHADOW limits mixed with plain ones (takes only: the
    /// parser refuses flags with REFUND): the implementation agrees with
    /// the reference's words (`reference::multi::call_flagged`), field by
    /// field; a denied call writes nothing, a CHECK limit never changes.
    #[test]
    fn flagged_multi_agrees_with_the_reference(
        limits in proptest::collection::vec(limit_strategy(), 1..=4),
        flags in proptest::collection::vec(0u8..4, 4),
        steps in proptest::collection::vec(step_strategy(), 1..80),
    ) {
        let n = limits.len();
        let flags = &flags[..n];
        let (params, mut states): (Vec<Params>, Vec<Real>) = limits.iter().map(|&(algo, limit, rate, ms, _)| match algo {
            0 => (Params::TokenBucket(tb::Params { capacity: limit, rate, period_ms: ms }), Real::Tb(Default::default())),
            1 => (Params::SlidingLog(sl::Params { limit, window_ms: ms }), Real::Log(Default::default())),
            2 => (Params::SlidingCounter(sc::Params { limit, window_ms: ms }), Real::Counter(Default::default())),
            3 => (Params::FixedWindow(fw::Params { limit, window_ms: ms, from_first: rate % 2 == 1 }), Real::Fw(Default::default())),
            _ => (Params::Concurrency(cc::Params { limit, lease_ms: ms, id_hash: rate % 3 }), Real::Cc(Default::default())),
        }).unzip();
        let weights: Vec<u64> = limits.iter().map(|l| l.4).collect();
        let mut models: Vec<Limit> = params.iter().map(Limit::fresh).collect();
        let spans: Vec<u64> = params.iter().map(span_us).collect();
        let (mut calls, mut now) = (Vec::new(), 1_700_000_000_000_000u64);
        for step in steps {
            let op;
            (now, op) = place(&step, now, &calls, &spans);
            let (cost, partial, dryrun) = match op {
                Op::Take { cost, partial, dryrun } => (cost, partial, dryrun),
                Op::Refund(n) => (n, false, false),
                // The parser refuses FORCE with CHECK or SHADOW.
                Op::Force { cost, dryrun } => (cost, false, dryrun),
            };
            let op = Op::Take { cost, partial, dryrun };
            calls.push(now);
            let (expect, per_model) = model::call_flagged(&mut models, &weights, flags, (cost, partial, dryrun), now);
            let (whole, per) = run_real_flagged(&mut states, &params, &weights, flags, op, now);
            prop_assert_eq!(&per, &per_model, "op {:?} at {} flags {:?}", op, now, flags);
            prop_assert_eq!(whole, expect, "op {:?} at {} flags {:?}", op, now, flags);
            for (i, d) in per.iter().enumerate() {
                if flags[i] & CHECK != 0 || (whole.allowed == 0 && flags.iter().any(|f| f & SHADOW == 0)) {
                    prop_assert_eq!(d.granted, 0, "limit {} took units", i);
                }
            }
        }
    }

    /// One limit of weight 1: RL.MULTI answers exactly what the single
    /// command answers, and leaves the same state.
    #[test]
    fn one_limit_is_the_single_command(
        limit in limit_strategy(),
        steps in proptest::collection::vec(step_strategy(), 1..150),
    ) {
        let (algo, lim, rate, ms, _) = limit;
        let mut now = 1_700_000_000_000_000u64;
        let (params, mut multi_state, mut single_state) = match algo {
            0 => (Params::TokenBucket(tb::Params { capacity: lim, rate, period_ms: ms }), Real::Tb(Default::default()), Real::Tb(Default::default())),
            1 => (Params::SlidingLog(sl::Params { limit: lim, window_ms: ms }), Real::Log(Default::default()), Real::Log(Default::default())),
            2 => (Params::SlidingCounter(sc::Params { limit: lim, window_ms: ms }), Real::Counter(Default::default()), Real::Counter(Default::default())),
            3 => (Params::FixedWindow(fw::Params { limit: lim, window_ms: ms, from_first: rate % 2 == 1 }), Real::Fw(Default::default()), Real::Fw(Default::default())),
            _ => (Params::Concurrency(cc::Params { limit: lim, lease_ms: ms, id_hash: rate % 3 }), Real::Cc(Default::default()), Real::Cc(Default::default())),
        };
        let spans = [span_us(&params)];
        let mut calls = Vec::new();
        for step in steps {
            let mut op;
            (now, op) = place(&step, now, &calls, &spans);
            if let (Params::Concurrency(_), Op::Force { cost, dryrun }) = (params, op) {
                op = Op::Take { cost, partial: false, dryrun };
            }
            calls.push(now);
            let (whole, per) = run_real(std::slice::from_mut(&mut multi_state), &[params], &[1], op, now);
            let single = single_call(&mut single_state, &params, op, now);
            match op {
                Op::Take { cost, partial, .. } => {
                    prop_assert_eq!(per[0], single);
                    prop_assert_eq!(whole.allowed, single.allowed(cost, partial));
                }
                Op::Refund(n) => {
                    prop_assert_eq!(per[0], single);
                    prop_assert_eq!(whole.allowed, if single.granted > 0 { n } else { 0 });
                }
                Op::Force { cost, .. } => {
                    prop_assert_eq!(per[0], single);
                    prop_assert_eq!(whole.allowed, single.allowed(cost, false));
                }
            }
            prop_assert_eq!((whole.limit, whole.remaining, whole.retry_after_ms, whole.reset_after_ms, whole.binding),
                (single.limit, single.remaining, single.retry_after_ms, single.reset_after_ms, 0));
            let same = match (&multi_state, &single_state) {
                (Real::Tb(a), Real::Tb(b)) => a == b,
                (Real::Log(a), Real::Log(b)) => a == b,
                (Real::Counter(a), Real::Counter(b)) => a == b,
                (Real::Fw(a), Real::Fw(b)) => a == b,
                (Real::Cc(a), Real::Cc(b)) => a == b,
                _ => false,
            };
            prop_assert!(same);
        }
    }
}

/// The single commands, driven like their handlers: `step`/`decide` +
/// `grant`, and the refunds.
fn single_call(s: &mut Real, p: &Params, op: Op, now: u64) -> Decision {
    match (s, p, op) {
        (Real::Tb(s), Params::TokenBucket(p), Op::Take { cost, partial, dryrun }) => {
            let (d, n) = tb::step(s, p, cost, partial, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Log(s), Params::SlidingLog(p), Op::Take { cost, partial, dryrun }) => {
            let d = sl::decide(s, p, cost, partial, now);
            if d.granted > 0 && !dryrun {
                sl::grant(s, p.window_ms, d.granted, now);
            }
            d
        }
        (Real::Counter(s), Params::SlidingCounter(p), Op::Take { cost, partial, dryrun }) => {
            let (d, n) = sc::step(s, p, cost, partial, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Fw(s), Params::FixedWindow(p), Op::Take { cost, partial, dryrun }) => {
            let (d, n) = fw::step(s, p, cost, partial, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Tb(s), Params::TokenBucket(p), Op::Force { cost, dryrun }) => {
            let (d, n) = tb::force(s, p, cost, 1, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Log(s), Params::SlidingLog(p), Op::Force { cost, dryrun }) => {
            let d = sl::decide_forced(s, p, cost, 1, now);
            if d.granted > 0 && !dryrun {
                sl::grant(s, p.window_ms, d.granted, now);
            }
            d
        }
        (Real::Counter(s), Params::SlidingCounter(p), Op::Force { cost, dryrun }) => {
            let (d, n) = sc::force(s, p, cost, 1, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Fw(s), Params::FixedWindow(p), Op::Force { cost, dryrun }) => {
            let (d, n) = fw::force(s, p, cost, 1, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Fw(s), Params::FixedWindow(p), Op::Refund(n)) => {
            let (d, new) = fw::refund(s, p, n, 1, now);
            if d.granted > 0 {
                *s = if d.reset_after_ms == 0 { fw::State::default() } else { new };
            }
            d
        }
        (Real::Tb(s), Params::TokenBucket(p), Op::Refund(n)) => {
            let (d, new) = tb::refund(s, p, n, 1, now);
            if d.granted > 0 {
                *s = if d.reset_after_ms == 0 { tb::State::default() } else { new };
            }
            d
        }
        (Real::Log(s), Params::SlidingLog(p), Op::Refund(n)) => {
            let given = sl::refund(s, p.window_ms, n, now);
            let mut d = sl::View::at(s, p, now).answer(0, 1);
            d.granted = given;
            if given > 0 && d.reset_after_ms == 0 {
                *s = sl::State::default();
            }
            d
        }
        (Real::Counter(s), Params::SlidingCounter(p), Op::Refund(n)) => {
            let (d, new) = sc::refund(s, p, n, 1, now);
            if d.granted > 0 {
                *s = if d.reset_after_ms == 0 { sc::State::default() } else { new };
            }
            d
        }
        (Real::Cc(s), Params::Concurrency(p), Op::Take { cost, partial, dryrun }) => {
            let call = cc::Call { params: *p, action: cc::Action::Acquire { cost, partial, dryrun } };
            let (d, change) = cc::step(s, &call, now);
            if let Some(c) = change {
                s.apply(&c).unwrap();
            }
            d
        }
        (Real::Cc(s), Params::Concurrency(p), Op::Refund(n)) => {
            let (d, change) = cc::View::at(s, p, now).give_back(n, 1);
            if let Some(c) = change {
                s.apply(&c).unwrap();
                if s.is_fresh_at(now) {
                    *s = cc::State::default();
                }
            }
            d
        }
        _ => unreachable!(),
    }
}

#[test]
fn partial_with_weight_grants_what_every_limit_can_take() {
    // 7 and 10 units left, weights 1 and 2: COST 8 PARTIAL takes 5.
    let now = 1_700_000_000_000_000;
    let pa = tb::Params { capacity: 10, rate: 1, period_ms: 1 << 40 };
    let pb = sl::Params { limit: 20, window_ms: 1 << 40 };
    let (_, mut a) = tb::step(&tb::State::default(), &pa, 3, false, now);
    let mut b = sl::State::default();
    sl::grant(&mut b, pb.window_ms, 10, now);
    let mut per = [Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 }; 2];
    let mut states = [
        Some(Entry { limit: LimitMut::TokenBucket(&mut a, pa), weight: 1 }),
        Some(Entry { limit: LimitMut::SlidingLog(&mut b, pb), weight: 2 }),
    ];
    let whole = run(&mut states, Op::Take { cost: 8, partial: true, dryrun: false }, now + 1, &mut per);
    assert_eq!(whole.allowed, 5);
    assert_eq!((per[0].granted, per[0].remaining, per[1].granted, per[1].remaining), (5, 2, 10, 0));
    // Without PARTIAL nothing moves.
    let before = (a, b.clone());
    let mut states = [
        Some(Entry { limit: LimitMut::TokenBucket(&mut a, pa), weight: 1 }),
        Some(Entry { limit: LimitMut::SlidingLog(&mut b, pb), weight: 2 }),
    ];
    let whole = run(&mut states, Op::Take { cost: 1, partial: false, dryrun: false }, now + 2, &mut per);
    assert_eq!(whole.allowed, 0);
    assert_eq!(whole.binding, 1);
    assert_eq!((a, b), before);
}

#[test]
fn requests_is_the_largest_common_grant() {
    assert_eq!(requests([(7, 1), (10, 2)].into_iter(), 8, true), 5);
    assert_eq!(requests([(7, 1), (10, 2)].into_iter(), 8, false), 0);
    assert_eq!(requests([(7, 1), (10, 2)].into_iter(), 5, false), 5);
    assert_eq!(requests([(0, 1)].into_iter(), 0, false), 0);
    assert_eq!(requests([(u64::MAX, 1), (3, 0)].into_iter(), 9, true), 3);
    assert_eq!(units(1 << 27, 1 << 26), Some(1 << 53).filter(|_| false).or(None));
    assert_eq!(units((1 << 53) - 1, 1), Some((1 << 53) - 1));
    assert_eq!(units(u64::MAX, 2), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    /// The fast path's `combine_unweighted` is `combine` with every WEIGHT 1
    /// (ties included: the remaining and retry values come from small ranges).
    #[test]
    fn combine_unweighted_is_combine_of_weight_one(
        per in proptest::collection::vec((0u64..3, 0u64..4, -1i64..3, 0u64..3), 1..=MAX_LIMITS),
        g in 0u64..3,
        cost in 0u64..3,
        partial in any::<bool>(),
    ) {
        let per: Vec<Decision> = per
            .iter()
            .map(|&(granted, remaining, retry_after_ms, reset_after_ms)| Decision {
                granted,
                limit: remaining + 7,
                remaining,
                retry_after_ms,
                reset_after_ms,
            })
            .collect();
        let ones = [1u64; MAX_LIMITS];
        prop_assert_eq!(combine_unweighted(&per, g, cost, partial), combine(&per, &ones[..per.len()], g, cost, partial));
    }
}
