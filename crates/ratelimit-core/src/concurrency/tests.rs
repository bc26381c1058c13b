use super::*;
use crate::reference::concurrency::Leases;
use proptest::prelude::*;
use proptest::test_runner::Config as PropConfig;

/// 2023-11-14T22:13:20Z in µs.
const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1000;

fn p(limit: u64, lease_ms: u64, id: &[u8]) -> Params {
    Params { limit, lease_ms, id_hash: id_hash(id) }
}

fn acq(cost: u64) -> Action {
    Action::Acquire { cost, partial: false, dryrun: false }
}

fn dec(granted: u64, limit: u64, remaining: u64, retry_after_ms: i64, reset_after_ms: u64) -> Decision {
    Decision { granted, limit, remaining, retry_after_ms, reset_after_ms }
}

/// Store a change as the module does: a state left with no live lease is
/// deleted (the key).
fn apply(s: &mut State, change: Option<Change>, now: u64) {
    if let Some(c) = change {
        s.apply(&c).unwrap();
        if s.is_fresh_at(now) {
            *s = State::default();
        }
    }
}

/// One call, written as the module writes it.
fn run(s: &mut State, params: Params, action: Action, now: u64) -> Decision {
    let (mut d, change) = step(s, &Call { params, action }, now);
    apply(s, change, now);
    if let Action::Acquire { cost, partial, .. } = action {
        d.granted = d.allowed(cost, partial);
    }
    d
}

#[test]
fn acquire_release_renew() {
    let mut s = State::default();
    // Three ids of 1 unit against a limit of 2.
    assert_eq!(run(&mut s, p(2, 1000, b"a"), acq(1), T0), dec(1, 2, 1, 0, 1000));
    assert_eq!(run(&mut s, p(2, 1000, b"b"), acq(1), T0 + 100 * MS), dec(1, 2, 0, 0, 1000));
    // c waits for a's lease: 1000 ms after T0, 900 from now.
    assert_eq!(run(&mut s, p(2, 1000, b"c"), acq(1), T0 + 100 * MS), dec(0, 2, 0, 900, 1000));
    // a releases: c fits at once.
    assert_eq!(run(&mut s, p(2, 1000, b"a"), Action::Release, T0 + 200 * MS), dec(1, 2, 1, 0, 900));
    // again: idempotent, nothing freed, nothing written.
    let before = s.clone();
    assert_eq!(run(&mut s, p(2, 1000, b"a"), Action::Release, T0 + 200 * MS), dec(0, 2, 1, 0, 900));
    assert_eq!(s, before);
    // b renews: its lease runs 1000 ms from now.
    assert_eq!(run(&mut s, p(2, 1000, b"b"), Action::Renew, T0 + 500 * MS), dec(1, 2, 1, 0, 1000));
    // a has nothing to renew: 0 and −1, nothing written.
    assert_eq!(run(&mut s, p(2, 1000, b"a"), Action::Renew, T0 + 500 * MS), dec(0, 2, 1, -1, 1000));
    assert_eq!(s.leases().len(), 1);
    // b's lease lapses at T0 + 1500 ms exactly: the key is fresh then.
    assert!(!s.is_fresh_at(T0 + 1500 * MS - 1));
    assert!(s.is_fresh_at(T0 + 1500 * MS));
    assert_eq!(run(&mut s, p(2, 1000, b"b"), Action::Renew, T0 + 1500 * MS), dec(0, 2, 2, -1, 0));
}

#[test]
fn a_retried_acquire_renews_and_resizes() {
    let mut s = State::default();
    assert_eq!(run(&mut s, p(3, 1000, b"a"), acq(2), T0), dec(1, 3, 1, 0, 1000));
    // The same call again later: holds once, renewed.
    assert_eq!(run(&mut s, p(3, 1000, b"a"), acq(2), T0 + 400 * MS), dec(1, 3, 1, 0, 1000));
    assert_eq!(s.leases(), [Lease { expiry_us: T0 + 1400 * MS, hash: id_hash(b"a"), units: 2 }]);
    // Up to 3: its own 2 do not count against it.
    assert_eq!(run(&mut s, p(3, 1000, b"a"), acq(3), T0 + 400 * MS), dec(1, 3, 0, 0, 1000));
    // Another id cannot; down to 1 frees 2.
    assert_eq!(run(&mut s, p(3, 1000, b"b"), acq(1), T0 + 400 * MS).granted, 0);
    assert_eq!(run(&mut s, p(3, 1000, b"a"), acq(1), T0 + 400 * MS), dec(1, 3, 2, 0, 1000));
    // A denied resize keeps the lease as it was (not renewed).
    assert_eq!(run(&mut s, p(3, 1000, b"b"), acq(2), T0 + 400 * MS).granted, 1);
    assert_eq!(run(&mut s, p(3, 1000, b"a"), acq(2), T0 + 500 * MS), dec(0, 3, 0, 900, 900));
    assert_eq!(s.leases().iter().find(|l| l.hash == id_hash(b"a")).unwrap().expiry_us, T0 + 1400 * MS);
}

#[test]
fn cost_zero_partial_dryrun_and_never() {
    let mut s = State::default();
    assert_eq!(run(&mut s, p(5, 100, b"a"), acq(3), T0), dec(1, 5, 2, 0, 100));
    let before = s.clone();
    // COST 0 reports, even for a holder, and changes nothing.
    assert_eq!(run(&mut s, p(5, 100, b"a"), acq(0), T0 + MS), dec(1, 5, 2, 0, 99));
    assert_eq!(s, before);
    // DRYRUN answers as the call would, writes nothing.
    let dry = Action::Acquire { cost: 2, partial: false, dryrun: true };
    assert_eq!(run(&mut s, p(5, 100, b"b"), dry, T0 + MS), dec(1, 5, 0, 0, 100));
    assert_eq!(s, before);
    // PARTIAL holds what is free.
    let part = Action::Acquire { cost: 4, partial: true, dryrun: false };
    assert_eq!(run(&mut s, p(5, 100, b"b"), part, T0 + MS), dec(2, 5, 0, 99, 100));
    // COST above the limit never fits.
    assert_eq!(run(&mut s, p(5, 100, b"c"), acq(6), T0 + MS), dec(0, 5, 0, -1, 100));
}

#[test]
fn the_wait_is_exact_to_the_microsecond() {
    let mut s = State::default();
    run(&mut s, p(1, 1000, b"a"), acq(1), T0 + 1);
    // a lapses at T0 + 1 + 1,000,000 µs: from T0 that is 1000.001 ms → 1001.
    let d = run(&mut s, p(1, 1000, b"b"), acq(1), T0);
    assert_eq!(d.retry_after_ms, 1001);
    assert_eq!(
        run(&mut s, p(1, 1000, b"b"), Action::Acquire { cost: 1, partial: false, dryrun: true }, T0 + 1000 * MS).granted,
        0
    );
    assert_eq!(run(&mut s, p(1, 1000, b"b"), acq(1), T0 + 1001 * MS).granted, 1);
}

#[test]
fn a_lowered_limit_and_the_clock_stepping_back() {
    let mut s = State::default();
    run(&mut s, p(4, 1000, b"a"), acq(4), T0);
    // Limit 2: held 4 is above it, remaining 0; the wait is a's lapse.
    assert_eq!(run(&mut s, p(2, 1000, b"b"), acq(1), T0), dec(0, 2, 0, 1000, 1000));
    // The clock 5 s behind: the lease lasts longer, never frees early.
    assert_eq!(run(&mut s, p(4, 1000, b"b"), acq(1), T0 - 5000 * MS), dec(0, 4, 0, 6000, 6000));
}

#[test]
fn extremes_never_panic() {
    let mut s = State::default();
    let big = p(MAX_ARG, MAX_ARG, b"a");
    assert_eq!(run(&mut s, big, acq(MAX_ARG), u64::MAX - 5).granted, 1);
    assert_eq!(run(&mut s, p(MAX_ARG, MAX_ARG, b"b"), acq(1), u64::MAX - 5).retry_after_ms, 1);
    assert_eq!(run(&mut s, big, Action::Renew, u64::MAX - 4).granted, 1);
    assert_eq!(run(&mut s, big, Action::Release, u64::MAX - 4).granted, MAX_ARG);
    // Out-of-range parameters: clamped, no panic.
    let odd = Params { limit: u64::MAX, lease_ms: 0, id_hash: 1 };
    run(&mut s, odd, acq(u64::MAX), 0);
    run(&mut s, odd, Action::Renew, 0);
    // A change a master never makes is refused.
    let mut full = State::default();
    full.apply(&Change { now_us: 0, hash: 1, units: MAX_ARG, expiry_us: 9 }).unwrap();
    assert!(full.apply(&Change { now_us: 0, hash: 2, units: 1, expiry_us: 9 }).is_err());
    assert!(full.apply(&Change { now_us: 0, hash: 1, units: MAX_ARG + 1, expiry_us: 9 }).is_err());
    assert_eq!(full.leases().len(), 1);
}

#[test]
fn parse_the_grammar() {
    fn ok(s: &str) -> Result<Call, ArgError> {
        parse(&s.split(' ').map(|w| w.as_bytes()).collect::<Vec<_>>())
    }
    let pa = p(10, 30000, b"req-1");
    assert_eq!(ok("10 30000 ACQUIRE req-1"), Ok(Call { params: pa, action: acq(1) }));
    assert_eq!(
        ok("10 30000 acquire req-1 dryrun COST 3 partial"),
        Ok(Call { params: pa, action: Action::Acquire { cost: 3, partial: true, dryrun: true } })
    );
    assert_eq!(ok("10 30000 Release req-1"), Ok(Call { params: pa, action: Action::Release }));
    assert_eq!(ok("10 30000 RENEW req-1"), Ok(Call { params: pa, action: Action::Renew }));
    // The id is any word, options included.
    assert_eq!(ok("10 30000 ACQUIRE COST").map(|c| c.params.id_hash), Ok(id_hash(b"COST")));
    assert_eq!(parse(&[b"1", b"1", b"ACQUIRE", b""]).map(|c| c.params.id_hash), Ok(id_hash(b"")));
    assert_eq!(ok("10 30000 ACQUIRE"), Err(ArgError::Arity));
    assert_eq!(ok("10 30000"), Err(ArgError::Arity));
    assert_eq!(ok("0 30000 ACQUIRE a"), Err(ArgError::Number(Arg::Limit)));
    assert_eq!(ok("10 0 ACQUIRE a"), Err(ArgError::Number(Arg::LeaseMs)));
    assert_eq!(ok("10 9007199254740992 ACQUIRE a"), Err(ArgError::Number(Arg::LeaseMs)));
    assert_eq!(ok("10 1 ACQUIRE a COST x"), Err(ArgError::Number(Arg::Cost)));
    for bad in [
        "10 1 TAKE a",
        "10 1 ACQUIRE a COST",
        "10 1 ACQUIRE a COST 1 COST 1",
        "10 1 ACQUIRE a PARTIAL PARTIAL",
        "10 1 ACQUIRE a DRYRUN DRYRUN",
        "10 1 ACQUIRE a REFUND 1",
        "10 1 RELEASE a DRYRUN",
        "10 1 RENEW a COST 1",
        "10 1 RELEASE a b",
    ] {
        assert_eq!(ok(bad), Err(ArgError::Syntax), "{bad}");
    }
}

// ------------------------------------------------------------------
// Against the reference model.

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        id: u64,
        cost: u64,
        partial: bool,
        dryrun: bool,
    },
    Release {
        id: u64,
    },
    Renew {
        id: u64,
    },
    /// RL.MULTI's REFUND: give `n` back, reply for `want`.
    GiveBack {
        id: u64,
        n: u64,
        want: u64,
    },
}

fn op() -> impl Strategy<Value = (u64, Op)> {
    let id = 0u64..6;
    (
        // mostly forward in steps up to 1.5 s, sometimes back
        prop_oneof![8 => 0u64..1_500_000, 1 => Just(u64::MAX - 2_000_000 + 1)],
        prop_oneof![
            6 => (id.clone(), 0u64..5, any::<bool>(), prop::bool::weighted(0.1))
                .prop_map(|(id, cost, partial, dryrun)| Op::Acquire { id, cost, partial, dryrun }),
            3 => id.clone().prop_map(|id| Op::Release { id }),
            2 => id.clone().prop_map(|id| Op::Renew { id }),
            1 => (id, 1u64..4, 1u64..3).prop_map(|(id, n, want)| Op::GiveBack { id, n, want }),
        ],
    )
}

fn cfg(cases: u32) -> PropConfig {
    PropConfig { cases, failure_persistence: None, ..PropConfig::default() }
}

proptest! {
    #![proptest_config(cfg(400))]

    /// Random sequences on one key under changing limits and leases: every
    /// reply and the live leases after every call equal the model's, the
    /// stored state keeps its invariants and round-trips, held units never
    /// exceed the largest limit used, and a denial's wait is exact.
    #[test]
    fn sequences_match_the_model(
        ops in prop::collection::vec(op(), 1..60),
        limits in prop::collection::vec(1u64..6, 1..3),
        leases in prop::collection::vec(1u64..3000, 1..3),
    ) {
        let mut s = State::default();
        let mut m = Leases::default();
        let mut now = T0;
        for (i, (dt, op)) in ops.iter().enumerate() {
            // a clock stepping back by up to 2 s, from the wrapped step
            now = now.wrapping_add(*dt);
            let limit = limits[i % limits.len()];
            let lease_ms = leases[i % leases.len()];
            let pp = |id: u64| Params { limit, lease_ms, id_hash: id };
            let (got, want_d) = match *op {
                Op::Acquire { id, cost, partial, dryrun } => {
                    let call = Call { params: pp(id), action: Action::Acquire { cost, partial, dryrun } };
                    let (d, change) = step(&s, &call, now);
                    apply(&mut s, change, now);
                    let md = m.acquire(&pp(id), cost, partial, now, !dryrun);
                    // exact wait: the same call fits then, not a ms earlier
                    if d.retry_after_ms > 0 {
                        let r = d.retry_after_ms as u64;
                        let dry = Call { params: pp(id), action: Action::Acquire { cost, partial: false, dryrun: true } };
                        prop_assert_eq!(step(&s, &dry, now + r * MS).0.granted, cost);
                        prop_assert_eq!(step(&s, &dry, now + (r - 1) * MS).0.granted, 0);
                    }
                    (d, md)
                }
                Op::Release { id } => {
                    let (d, change) = View::at(&s, &pp(id), now).release();
                    apply(&mut s, change, now);
                    (d, m.give_back(&pp(id), u64::MAX, 1, now))
                }
                Op::Renew { id } => {
                    let (d, change) = View::at(&s, &pp(id), now).renew();
                    apply(&mut s, change, now);
                    (d, m.renew(&pp(id), now))
                }
                Op::GiveBack { id, n, want } => {
                    let (d, change) = View::at(&s, &pp(id), now).give_back(n, want);
                    apply(&mut s, change, now);
                    (d, m.give_back(&pp(id), n, want, now))
                }
            };
            prop_assert_eq!(got, want_d, "call {} {:?} at +{} µs", i, op, now.wrapping_sub(T0));
            let mut live: Vec<(u64, u64, u64)> = s.leases().iter().filter(|l| now < l.expiry_us).map(|l| (l.hash, l.units, l.expiry_us)).collect();
            live.sort_unstable();
            prop_assert_eq!(&live, &m.live(now));
            let held: u64 = live.iter().map(|l| l.1).sum();
            prop_assert!(held <= 5);
            if !s.leases().is_empty() {
                let mut b = Vec::new();
                s.encode(&mut b);
                prop_assert_eq!(State::decode(&b), Ok(s.clone()));
            }
        }
    }
}

proptest! {
    /// The module parses at most the first eight words after the key (the
    /// most a valid call has): a longer call gets the error the whole call
    /// gets, Syntax where the first eight parse.
    #[test]
    fn a_long_call_fails_on_its_first_eight_words(
        words in prop::collection::vec(prop_oneof![
            Just("ACQUIRE"), Just("RELEASE"), Just("COST"), Just("PARTIAL"), Just("DRYRUN"), Just("1"),
            Just("0"), Just("x"), Just("10")
        ], 5..12),
    ) {
        let w: Vec<&[u8]> = words.iter().map(|s| s.as_bytes()).collect();
        let all = parse(&w);
        if w.len() > 8 {
            prop_assert!(all.is_err());
            let first = parse(&w[..8]).and(Err::<Call, _>(ArgError::Syntax));
            prop_assert_eq!(first.err(), all.err(), "{:?}", words);
        }
    }
}

proptest! {
    #![proptest_config(cfg(2000))]

    /// `apply`'s in-place path changes a state exactly as the general one
    /// does, and refuses what it refuses: random changes (few ids, times
    /// forward and back, units up to and past MAX_ARG) applied to two
    /// copies, one through each.
    #[test]
    fn the_in_place_write_is_the_general_one(
        changes in proptest::collection::vec(
            (0u64..3_000, 0u64..4, prop_oneof![4 => 0u64..4, 1 => Just(MAX_ARG), 1 => Just(MAX_ARG + 1)], 0u64..4_000),
            1..40,
        )
    ) {
        let (mut fast, mut general) = (State::default(), State::default());
        for (now, hash, units, expiry) in changes {
            let c = Change { now_us: T0 + now * MS, hash, units, expiry_us: T0 + expiry * MS };
            let (a, b) = (fast.apply(&c), general.apply_any(&c));
            prop_assert_eq!(a, b);
            prop_assert_eq!(&fast, &general);
        }
    }
}
