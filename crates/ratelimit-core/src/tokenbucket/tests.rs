//! The token bucket's tests: hand-computed cases, and random call
//! sequences against the exact rational model (`reference::tokenbucket`).

use super::*;
use crate::reference::tokenbucket::Bucket;
use crate::MAX_ARG;
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
    #![proptest_config(ProptestConfig { cases: 12000, failure_persistence: None, ..ProptestConfig::default() })]

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
        let mut m = Bucket::default();
        let mut now = t0;
        for op in ops {
            now = now.saturating_add_signed(op.dt);
            let p = &params[op.params];
            let (d, n) = step(&s, p, op.cost, op.partial, now);
            let md = m.call(p, op.cost, op.partial, now, !op.dryrun);
            prop_assert_eq!(d, md);
            // RL.MULTI's fast path answers and computes the state in one.
            prop_assert_eq!(View::at(&s, p, now).take(d.granted, op.cost), (d, n));
            if d.granted > 0 && !op.dryrun {
                prop_assert!(!n.is_fresh());
                prop_assert!(d.reset_after_ms > 0);
                prop_assert_eq!(State::decode(&n.encode()), Ok(n));
                s = n;
            }
        }
    }

    /// Debits: COST n FORCE (into debt), plain calls and REFUND mixed, with
    /// parameter changes and clock steps back: every reply field agrees
    /// with the signed rational model, every stored state round-trips its
    /// encoding (version 2 in debt) and its compact form, and the debt
    /// never passes 2^53 − 1 tokens.
    #[test]
    fn debits_agree_with_rational_model(
        caps in proptest::collection::vec((1u64..50, 1u64..20, 1u64..5000), 4),
        ops in ops(),
        kinds in proptest::collection::vec(0u8..6, 400),
        t0 in 0u64..u64::MAX / 2,
    ) {
        let params: Vec<Params> = caps.iter().map(|&(c, r, p)| tb(c, r, p)).collect();
        let mut s = State::default();
        let mut m = Bucket::default();
        let mut now = t0;
        for (op, kind) in ops.into_iter().zip(kinds) {
            now = now.saturating_add_signed(op.dt);
            let p = &params[op.params];
            let (d, n, md) = match kind {
                0 | 1 => {
                    let (d, n) = force(&s, p, op.cost, 1, now);
                    (d, n, m.force(p, op.cost, 1, now, !op.dryrun))
                }
                2 if op.cost > 0 => {
                    let (d, n) = refund(&s, p, op.cost, 1, now);
                    (d, n, m.refund(p, now, op.cost, 1))
                }
                _ => {
                    let (d, n) = step(&s, p, op.cost, op.partial, now);
                    (d, n, m.call(p, op.cost, op.partial, now, !op.dryrun))
                }
            };
            prop_assert_eq!(d, md, "kind {} cost {} at {}", kind, op.cost, now);
            let writes = d.granted > 0 && (kind == 2 && op.cost > 0 || !op.dryrun);
            if writes {
                prop_assert_eq!(State::decode(&n.encode()), Ok(n));
                if let Some(w) = n.pack() {
                    prop_assert_eq!(State::unpack(w), n);
                }
                prop_assert!(n.whole() >= -(MAX_ARG as i64));
                if n.in_debt() {
                    prop_assert_eq!(d.remaining, 0);
                }
                s = if d.reset_after_ms == 0 { State::default() } else { n };
            } else if kind == 2 && op.cost > 0 {
                prop_assert_eq!(d.granted, 0);
            }
            // The model, read back from the state, agrees too.
            if !s.is_fresh() {
                let back = Bucket::from_state(&s);
                prop_assert_eq!(back.avail(p, now), m.avail(p, now));
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

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20000, failure_persistence: None, ..ProptestConfig::default() })]

    /// The narrow view (`u64` units, when a full bucket fits in 64 bits)
    /// answers exactly what the wide one (`u128`) does: every figure of
    /// `available`, `take`, `answer`, `state_after`, `refunded` and
    /// `is_full`, over everyday and extreme parameters (around the 2^64
    /// boundary of `capacity × den` too), stored states under another
    /// period, clock steps back, takes beyond what is there.
    #[test]
    fn narrow_and_wide_views_agree(
        capacity in prop_oneof![1u64..50, 1u64..=MAX_ARG, any::<u64>()],
        edge in prop_oneof![3 => Just(None), 1 => (0u64..3).prop_map(Some)],
        rate in prop_oneof![1u64..20, 1u64..=MAX_ARG, any::<u64>()],
        period in prop_oneof![1u64..5000, 1u64..=MAX_ARG, Just(3_600_000u64)],
        tokens in prop_oneof![0u64..50, 0u64..MAX_ARG, any::<u64>()],
        frac in any::<u64>(),
        stored_period in prop_oneof![Just(0u64), 1u64..5000, 1u64..=MAX_ARG],
        same_period in any::<bool>(),
        last in any::<u64>(),
        dt in prop_oneof![0u64..2_000_000, any::<u64>()],
        back in any::<bool>(),
        taken in any::<u64>(),
        want in prop_oneof![0u64..50, any::<u64>()],
        n in prop_oneof![0u64..50, any::<u64>()],
    ) {
        let den = ms_to_us(period).max(1);
        // With `edge`, capacity × den just below, at or just above 2^64.
        let capacity = edge.map_or(capacity, |d| (u64::MAX / den).saturating_add(d).saturating_sub(1).max(1));
        let p = tb(capacity, rate, period);
        let sden = if same_period { den } else { ms_to_us(stored_period) };
        let s = State { tokens, frac: frac.checked_rem(sden).unwrap_or(0), den: sden, last_us: last };
        let now = if back { last.saturating_sub(dt) } else { last.saturating_add(dt) };
        let (a, b) = (View::at(&s, &p, now), View::at_wide(&s, &p, now));
        let avail = a.available();
        prop_assert_eq!(avail, b.available());
        for t in [taken.checked_rem(avail.saturating_add(1)).unwrap_or(0), taken, 0, avail] {
            prop_assert_eq!(a.take(t, want), b.take(t, want));
            prop_assert_eq!(a.take(t, t), b.take(t, t));
            prop_assert_eq!(a.answer(t, want), b.answer(t, want));
            prop_assert_eq!(a.state_after(t), b.state_after(t));
        }
        let (ra, rb) = (a.refunded(n), b.refunded(n));
        prop_assert_eq!(ra.available(), rb.available());
        prop_assert_eq!(ra.answer(0, want), rb.answer(0, want));
        prop_assert_eq!(ra.state_after(0), rb.state_after(0));
        prop_assert_eq!((a.is_full(), ra.is_full()), (b.is_full(), rb.is_full()));
    }
}

/// The contract's example: 7 of a bucket of 5 (1 token a second) with
/// FORCE is granted and leaves a debt of 2 tokens; remaining is 0, the
/// next call waits until the debt and its own token are back (3 s), the
/// bucket is full after 7 s; a REFUND repays the debt first.
#[test]
fn force_leaves_a_debt_the_refill_repays() {
    let p = tb(5, 1, 1000);
    let t = 1_700_000_000_000_000;
    let (d, s) = force(&State::default(), &p, 7, 1, t);
    assert_eq!(d, Decision { granted: 7, limit: 5, remaining: 0, retry_after_ms: 3000, reset_after_ms: 7000 });
    assert_eq!((s.whole(), s.frac, s.in_debt()), (-2, 0, true));
    assert_eq!(State::decode(&s.encode()), Ok(s));
    assert_eq!(s.encode()[0], super::encoding::ENCODING_VERSION_DEBT);
    assert_eq!(s.pack(), None);
    // Denied until the debt is repaid: 1 ms before, and at, 3 s.
    let (d, _) = step(&s, &p, 1, false, t + 2_999_999);
    assert_eq!((d.granted, d.remaining, d.retry_after_ms), (0, 0, 1));
    assert_eq!(step(&s, &p, 1, true, t + 2_999_999).0.granted, 0);
    let (d, _) = step(&s, &p, 1, false, t + 3_000_000);
    assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (1, 0, 0, 5000));
    // Half a token into the debt: −1.5 tokens stored as −2 + 0.5.
    let (d, r) = refund(&s, &p, 3, 1, t + 500_000);
    assert_eq!((d.granted, d.remaining, d.retry_after_ms), (3, 1, 0));
    assert_eq!((r.whole(), r.frac), (1, 500_000));
    // A debit of the whole range is taken; one more token is not (as
    // without FORCE: denied).
    let big = tb(MAX_ARG, 1, 1);
    let (d, deep) = force(&State::default(), &big, MAX_ARG, 1, t);
    assert_eq!(d.granted, MAX_ARG);
    let (d, deep) = force(&deep, &big, MAX_ARG, 1, t);
    assert_eq!((d.granted, deep.whole()), (MAX_ARG, -(MAX_ARG as i64)));
    assert_eq!(State::decode(&deep.encode()), Ok(deep));
    let (d, _) = force(&deep, &big, 1, 1, t);
    assert_eq!(d.granted, 0);
}
