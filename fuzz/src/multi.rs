//! RL.MULTI: the parser against an independent oracle, then the call over
//! states synthesized from the input, with the composition's invariants.

use crate::args::{Kind, MAX_LIMITS};
use crate::concurrency::synth_cc;
use crate::core::concurrency as cc;
use crate::core::multi;
use crate::core::reference::multi::{self as multi_model, Limit};
use crate::core::reference::slidinglog::Log;
use crate::core::reference::tokenbucket::Bucket;
use crate::core::{Decision, MAX_ARG};
use crate::fixedwindow::synth_fw;
use crate::input::Input;
use crate::log::{log_entries, sl_encode};
use crate::oracle::oracle_multi;
use crate::slidingcounter::synth_sc;
use crate::slidinglog::synth_sl;
use crate::tokenbucket::synth_tb;
use crate::{fw, sc, sl, tb};

enum Owned {
    Tb(tb::State),
    Log(sl::State),
    Sc(sc::State),
    Fw(fw::State),
    Cc(cc::State),
}

impl Owned {
    fn digest(&self) -> Vec<u8> {
        match self {
            Owned::Cc(s) => {
                let mut b = Vec::new();
                s.encode(&mut b);
                b
            }
            Owned::Tb(s) => s.encode().to_vec(),
            Owned::Sc(s) => s.encode().to_vec(),
            Owned::Fw(s) => s.encode().to_vec(),
            Owned::Log(s) => sl_encode(s),
        }
    }

    /// A written state decodes back to itself (what RDB and RESTORE load).
    fn check_round_trip(&self) {
        match self {
            Owned::Tb(s) => assert_eq!(tb::State::decode(&s.encode()), Ok(*s)),
            Owned::Sc(s) => assert_eq!(sc::State::decode(&s.encode()), Ok(*s)),
            Owned::Fw(s) => assert_eq!(fw::State::decode(&s.encode()), Ok(*s)),
            Owned::Log(s) => {
                let enc = sl_encode(s);
                assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc));
            }
            Owned::Cc(s) => assert_eq!(cc::State::decode(&self.digest()).as_ref(), Ok(s)),
        }
    }
}

/// The arguments follow `RL.MULTI`; the state bytes, cut in `n` pieces,
/// seed each limit's state (fresh when mode 0).
pub fn args_multi(data: &[u8]) {
    let inp = Input::parse(data);
    let got = crate::args::parse_multi(&inp.args);
    // The module's parse, in the room its argument count gives (a call of
    // n limits has at least 1 + 4n arguments), checked as it checks it:
    // the same call; `plain` (its fast path) exactly for word-state limits
    // without WEIGHT or option.
    let room = inp.args.len().saturating_sub(1) / 4;
    if room <= 2 {
        let two = crate::args::parse_multi_n::<&[u8], 2>(&inp.args, |a| a)
            .and_then(|c| c.check(&inp.args[1..=c.n], |a| a).map(|()| c));
        assert_eq!(
            two.map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund, c.plain)),
            got.as_ref()
                .map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund, c.plain))
                .map_err(|e| *e),
            "parse_multi_n::<2>, args {:?}",
            inp.args
        );
    }
    if let Ok(c) = &got {
        let words = c.limits[..c.n].iter().all(|l| l.kind() != Kind::SlidingLog && l.kind() != Kind::Concurrency);
        // options, WEIGHT and a limit's CHECK / SHADOW follow the keys: a
        // key may be named `cost`
        let opts = !inp.args[(1 + c.n).min(inp.args.len())..].iter().any(|w| {
            [&b"WEIGHT"[..], b"COST", b"PARTIAL", b"DRYRUN", b"REFUND", b"FORCE", b"CHECK", b"SHADOW"]
                .iter()
                .any(|o| w.eq_ignore_ascii_case(o))
        });
        assert_eq!(c.plain, words && opts, "plain, args {:?}", inp.args);
    }
    let want = oracle_multi(&inp.args);
    assert_eq!(got, want, "args {:?}", inp.args);
    let Ok(call) = got else { return };
    let n = call.n;
    let piece = inp.state.len() / n.max(1);
    let mut states: Vec<Owned> = call.limits[..n]
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let b = inp.state.get(i * piece..(i + 1) * piece).unwrap_or(&[]);
            let fresh = inp.mode == 0 || b.is_empty();
            match l.kind() {
                Kind::TokenBucket => Owned::Tb(if fresh { tb::State::default() } else { synth_tb(b) }),
                Kind::SlidingLog => Owned::Log(if fresh { sl::State::default() } else { synth_sl(b) }),
                Kind::SlidingCounter => Owned::Sc(if fresh { sc::State::default() } else { synth_sc(b) }),
                Kind::FixedWindow => Owned::Fw(if fresh { fw::State::default() } else { synth_fw(b) }),
                Kind::Concurrency => Owned::Cc(if fresh { cc::State::default() } else { synth_cc(b, inp.now) }),
            }
        })
        .collect();
    let params: Vec<multi::Params> = call.limits[..n].iter().map(|l| l.params).collect();
    let weights: Vec<u64> = call.limits[..n].iter().map(|l| l.weight).collect();
    let before: Vec<Vec<u8>> = states.iter().map(Owned::digest).collect();
    // The reference: each limit on its own model, then all or nothing.
    let mut models: Vec<Limit> = states
        .iter()
        .zip(&params)
        .map(|(s, p)| match (s, p) {
            (Owned::Tb(s), multi::Params::TokenBucket(p)) => Limit::TokenBucket(*p, Bucket::from_state(s)),
            (Owned::Log(s), multi::Params::SlidingLog(p)) => {
                Limit::SlidingLog(*p, Log::from_entries(&log_entries(&sl_encode(s))))
            }
            (Owned::Sc(s), multi::Params::SlidingCounter(p)) => Limit::SlidingCounter(*p, *s),
            (Owned::Fw(s), multi::Params::FixedWindow(p)) => Limit::FixedWindow(*p, *s),
            (Owned::Cc(s), multi::Params::Concurrency(p)) => Limit::Concurrency(*p, crate::concurrency::model_of(s)),
            _ => unreachable!("a limit's state has its algorithm"),
        })
        .collect();
    let op = if call.refund > 0 {
        multi::Op::Refund(call.refund)
    } else if call.force {
        multi::Op::Force { cost: call.cost, dryrun: call.dryrun }
    } else {
        multi::Op::Take { cost: call.cost, partial: call.partial, dryrun: call.dryrun }
    };
    let zero = Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 };
    let mut per = [zero; MAX_LIMITS];
    let whole = {
        let mut refs: Vec<Option<multi::Entry>> = states
            .iter_mut()
            .zip(&params)
            .zip(&weights)
            .map(|((s, p), &weight)| {
                let limit = match (s, *p) {
                    (Owned::Tb(s), multi::Params::TokenBucket(p)) => multi::LimitMut::TokenBucket(s, p),
                    (Owned::Log(s), multi::Params::SlidingLog(p)) => multi::LimitMut::SlidingLog(s, p),
                    (Owned::Sc(s), multi::Params::SlidingCounter(p)) => multi::LimitMut::SlidingCounter(s, p),
                    (Owned::Fw(s), multi::Params::FixedWindow(p)) => multi::LimitMut::FixedWindow(s, p),
                    (Owned::Cc(s), multi::Params::Concurrency(p)) => multi::LimitMut::Concurrency(s, p),
                    _ => unreachable!("a limit's state has its algorithm"),
                };
                Some(multi::Entry { limit, weight })
            })
            .collect();
        if call.flagged {
            multi::run_flagged(&mut refs, &call.flags[..n], op, inp.now, &mut per)
        } else {
            multi::run(&mut refs, op, inp.now, &mut per)
        }
    };
    let per = &per[..n];
    // The model counts the common grant down from COST: only small COSTs;
    // and its fixed windows run unsaturated: only those whose times the
    // implementation holds in u64 ms (as args_fixedwindow).
    let fw_exact = states.iter().zip(&params).all(|(s, p)| match (s, p) {
        (Owned::Fw(s), multi::Params::FixedWindow(p)) => crate::fixedwindow::in_range(s, p, inp.now),
        // the model's lease ends are unsaturated sums
        (Owned::Cc(s), multi::Params::Concurrency(p)) => {
            inp.now.max(s.last_us()).checked_add(p.lease_ms.saturating_mul(1000)).is_some() && p.limit <= MAX_ARG
        }
        _ => true,
    });
    if call.flagged {
        // CHECK / SHADOW (never with FORCE or REFUND: the parser refuses them)
        let multi::Op::Take { cost, partial, dryrun } = op else { unreachable!("flags with {op:?}") };
        check_flagged(
            &states,
            &mut models,
            (&weights, &call.flags[..n]),
            (cost, partial, dryrun),
            fw_exact,
            inp.now,
            (per, whole),
        );
        check_flagged_writes(&states, per, &call.flags[..n], dryrun, (&before, whole));
        return;
    }
    if fw_exact && (call.refund > 0 || call.cost <= 4096) {
        let (mwhole, mper) = multi_model::call(&mut models, &weights, op, inp.now);
        assert_eq!(per, &mper[..], "per-limit replies differ from the model");
        assert_eq!(whole, mwhole, "whole reply differs from the model");
        for ((s, m), d) in states.iter().zip(&models).zip(per) {
            let written = d.granted > 0 && !call.dryrun && !(call.refund > 0 && d.reset_after_ms == 0);
            if !written {
                continue;
            }
            assert_state_matches(s, m, inp.now);
        }
    }
    // The whole reply is the binding limit's, by the rules of docs/contract.md, "RL.MULTI".
    assert!(whole.binding < n);
    let b = per[whole.binding];
    assert_eq!((whole.limit, whole.remaining, whole.reset_after_ms), (b.limit, b.remaining, b.reset_after_ms));
    for ((d, l), &w) in per.iter().zip(&call.limits[..n]).zip(&weights) {
        let limit = match l.params {
            multi::Params::TokenBucket(p) => p.capacity,
            multi::Params::SlidingLog(p) => p.limit,
            multi::Params::SlidingCounter(p) => p.limit,
            multi::Params::FixedWindow(p) => p.limit,
            multi::Params::Concurrency(p) => p.limit,
        };
        assert_eq!(d.limit, limit);
        assert!(d.remaining <= d.limit && d.retry_after_ms >= -1, "{d:?}");
        if call.refund > 0 {
            assert!(d.granted <= call.refund * w, "{d:?}");
        }
    }
    let after: Vec<Vec<u8>> = states.iter().map(Owned::digest).collect();
    match op {
        multi::Op::Take { cost, partial, dryrun } => {
            let g = per[0].granted / weights[0];
            assert!(per.iter().zip(&weights).all(|(d, &w)| d.granted == g * w), "{per:?}");
            assert!(g <= cost && (partial || g == 0 || g == cost));
            assert_eq!(whole.allowed, if partial { g } else { u64::from(g == cost) });
            if g == cost {
                assert_eq!(whole.retry_after_ms, 0);
            } else {
                let never = per.iter().any(|d| d.retry_after_ms == -1);
                let longest = per.iter().map(|d| d.retry_after_ms).max().unwrap_or(0);
                assert_eq!(whole.retry_after_ms, if never { -1 } else { longest });
                assert_eq!(b.retry_after_ms, whole.retry_after_ms);
            }
            if g == 0 || dryrun {
                assert_eq!(after, before, "a call that writes nothing changed a state");
            }
            if g > 0 && !dryrun {
                for (s, d) in states.iter().zip(per) {
                    // A lease taken at the last µs of u64 time ends at once
                    // (its end saturates at now): the one state a grant
                    // leaves fresh.
                    let end_of_time = matches!(s, Owned::Cc(_)) && inp.now == u64::MAX;
                    assert!(d.reset_after_ms > 0 || end_of_time, "{d:?}");
                    if d.reset_after_ms > 0 {
                        s.check_round_trip()
                    }
                }
            }
        }
        multi::Op::Force { cost, dryrun } => {
            // Every limit took COST x WEIGHT (or, past a debt's range, the
            // call was decided as without FORCE: all or nothing).
            let all = per.iter().zip(&weights).all(|(d, &w)| d.granted == cost * w);
            assert!(all || per.iter().all(|d| d.granted == 0), "{per:?}");
            assert_eq!(whole.allowed, u64::from(all), "{whole:?}");
            if dryrun || cost == 0 || !all {
                assert_eq!(after, before, "a call that writes nothing changed a state");
            } else {
                for (s, d) in states.iter().zip(per) {
                    assert!(d.reset_after_ms > 0, "{d:?}");
                    s.check_round_trip()
                }
            }
        }
        multi::Op::Refund(units) => {
            assert_eq!(whole.allowed, if per.iter().any(|d| d.granted > 0) { units } else { 0 });
            for ((s, d), (a, bf)) in states.iter().zip(per).zip(after.iter().zip(&before)) {
                if d.granted == 0 {
                    assert_eq!(a, bf, "a limit that gave nothing back changed");
                } else if d.reset_after_ms > 0 {
                    s.check_round_trip()
                }
            }
        }
    }
}

/// A flagged take against the reference (`reference::multi::call_flagged`,
/// where the model is exact: small COST, times in range): the per-limit
/// replies, the whole reply and every written state.
fn check_flagged(
    states: &[Owned],
    models: &mut [Limit],
    (weights, flags): (&[u64], &[u8]),
    (cost, partial, dryrun): (u64, bool, bool),
    exact: bool,
    now: u64,
    (per, whole): (&[Decision], multi::Whole),
) {
    if !exact || cost > 4096 {
        return;
    }
    let (mwhole, mper) = multi_model::call_flagged(models, weights, flags, (cost, partial, dryrun), now);
    assert_eq!(per, &mper[..], "flagged: per-limit replies differ from the model");
    assert_eq!(whole, mwhole, "flagged: whole reply differs from the model");
    for ((s, m), d) in states.iter().zip(models.iter()).zip(per) {
        if d.granted == 0 || dryrun {
            continue;
        }
        assert_state_matches(s, m, now);
    }
}

/// Always, for a flagged take: a CHECK limit, and any limit under DRYRUN
/// or that took nothing, is left bit for bit; a written state round-trips;
/// no limit takes more than `COST × WEIGHT`; the binding limit is one of
/// the call's.
fn check_flagged_writes(
    states: &[Owned],
    per: &[Decision],
    flags: &[u8],
    dryrun: bool,
    (before, whole): (&[Vec<u8>], multi::Whole),
) {
    assert!(whole.binding < per.len());
    for (((s, d), &f), b) in states.iter().zip(per).zip(flags).zip(before) {
        if f & crate::core::multi::CHECK != 0 {
            assert_eq!(d.granted, 0, "a CHECK limit took units: {d:?}");
        }
        if d.granted == 0 || dryrun {
            assert_eq!(&s.digest(), b, "a limit that took nothing changed: {d:?}");
        } else if d.reset_after_ms > 0 {
            s.check_round_trip()
        }
    }
}

/// A written state equals its limit's model (at `now`, for leases).
fn assert_state_matches(s: &Owned, m: &Limit, now: u64) {
    match (s, m) {
        (Owned::Tb(s), Limit::TokenBucket(_, m)) => {
            let b = Bucket::from_state(s);
            assert_eq!((b.num, b.d, b.last), (m.num, m.d, m.last), "bucket differs from the model");
        }
        (Owned::Log(s), Limit::SlidingLog(_, m)) => {
            assert_eq!(log_entries(&sl_encode(s)), m.entries(), "log differs from the model")
        }
        (Owned::Sc(s), Limit::SlidingCounter(_, m)) => assert_eq!(s, m, "counter differs from the model"),
        (Owned::Fw(s), Limit::FixedWindow(_, m)) => assert_eq!(s, m, "fixed window differs from the model"),
        (Owned::Cc(s), Limit::Concurrency(_, m)) => {
            assert_eq!(crate::concurrency::model_of(s).live(now), m.live(now), "leases differ from the model")
        }
        _ => unreachable!("a limit's state has its algorithm"),
    }
}
