//! The Rust reference models against the Python ones (integration/models.py):
//! the calls of `corpus.txt` replayed through these models give the replies
//! written there, which the Python models gave when the corpus was generated
//! (integration/model_corpus.py, which documents the format) and which
//! integration/test_model_agreement.py checks them against. A change of
//! either side's models fails one of the two tests. (One known difference is
//! left out of the corpus, as model_corpus.py says: a clock behind a token
//! bucket's or a sliding log's state, whose gap these models count into the
//! waits, as the module does, and models.py, as the Lua twins, does not.)

use super::concurrency::Leases;
use super::fixedwindow as fwm;
use super::multi::{self as mm, Limit};
use super::slidingcounter::{self as scm, Search};
use super::slidinglog::Log;
use super::tokenbucket::Bucket;
use crate::multi::{Op, Params};
use crate::{concurrency as cc, fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision};

const CORPUS: &str = include_str!("corpus.txt");

fn params(spec: &str) -> Params {
    let mut it = spec.split(':');
    let kind = it.next().unwrap();
    let n: Vec<u64> = it.map(|x| x.parse().unwrap()).collect();
    match kind {
        "tb" => Params::TokenBucket(tb::Params { capacity: n[0], rate: n[1], period_ms: n[2] }),
        "sl" => Params::SlidingLog(sl::Params { limit: n[0], window_ms: n[1] }),
        "sc" => Params::SlidingCounter(sc::Params { limit: n[0], window_ms: n[1] }),
        "fw" => Params::FixedWindow(fw::Params { limit: n[0], window_ms: n[1], from_first: n[2] == 1 }),
        // a single key's calls name their ids; RL.MULTI's limit has one
        "cc" => Params::Concurrency(cc::Params { limit: n[0], lease_ms: n[1], id_hash: n.get(2).copied().unwrap_or(0) }),
        _ => panic!("{spec}"),
    }
}

#[derive(Clone, Copy, Debug)]
enum Call {
    Take {
        cost: u64,
        partial: bool,
        dryrun: bool,
    },
    Refund(u64),
    /// RL.CONCURRENCY's actions, each naming its id.
    Acquire {
        id: u64,
        cost: u64,
        partial: bool,
        dryrun: bool,
    },
    Release(u64),
    Renew(u64),
}

/// A `u64` as the commands reply it (saturated at `i64::MAX`).
fn sat(v: u64) -> i128 {
    i128::from(i64::try_from(v).unwrap_or(i64::MAX))
}

fn five(d: &Decision) -> Vec<i128> {
    vec![sat(d.granted), sat(d.limit), sat(d.remaining), d.retry_after_ms.into(), sat(d.reset_after_ms)]
}

/// One single command's model state (a missing key: the default).
enum Single {
    Tb(tb::Params, Bucket),
    Sl(sl::Params, Log),
    Sc(sc::Params, sc::State),
    Fw(fw::Params, fw::State),
    Cc(cc::Params, Leases),
}

impl Single {
    fn fresh(p: Params) -> Single {
        match p {
            Params::TokenBucket(p) => Single::Tb(p, Bucket::default()),
            Params::SlidingLog(p) => Single::Sl(p, Log::default()),
            Params::SlidingCounter(p) => Single::Sc(p, sc::State::default()),
            Params::FixedWindow(p) => Single::Fw(p, fw::State::default()),
            Params::Concurrency(p) => Single::Cc(p, Leases::default()),
        }
    }

    /// One command at `now` (µs) by each model's own single-call functions:
    /// the five integers of its reply, element 1 as the command answers it
    /// (the units with PARTIAL, else 1/0; a refund's units given back, its
    /// reply for one more unit).
    fn call(&mut self, now: u64, c: Call) -> Vec<i128> {
        if let Single::Cc(p, m) = self {
            let d = match c {
                Call::Acquire { id, cost, partial, dryrun } => {
                    let mut d = m.acquire(&cc::Params { id_hash: id, ..*p }, cost, partial, now, !dryrun);
                    d.granted = d.allowed(cost, partial);
                    d
                }
                Call::Release(id) => m.give_back(&cc::Params { id_hash: id, ..*p }, u64::MAX, 1, now),
                Call::Renew(id) => m.renew(&cc::Params { id_hash: id, ..*p }, now),
                other => panic!("{other:?} on a concurrency key"),
            };
            return five(&d);
        }
        let d = match c {
            Call::Take { cost, partial, dryrun } => {
                let mut d = match self {
                    Single::Tb(p, b) => b.call(p, cost, partial, now, !dryrun),
                    Single::Sl(p, log) => {
                        let d = log.decide(p, cost, partial, now);
                        if d.granted > 0 && !dryrun {
                            log.grant(p.window_ms, d.granted, now);
                        }
                        d
                    }
                    Single::Sc(p, s) => {
                        let (d, after) = scm::decide(s, p, cost, partial, now, Search::Bisect);
                        if d.granted > 0 && !dryrun {
                            *s = after;
                        }
                        d
                    }
                    Single::Fw(p, s) => {
                        let (d, after) = fwm::decide(s, p, cost, partial, now, Search::Bisect);
                        if d.granted > 0 && !dryrun {
                            *s = after;
                        }
                        d
                    }
                    Single::Cc(..) => unreachable!("answered above"),
                };
                if !partial {
                    d.granted = u64::from(d.granted == cost);
                }
                d
            }
            Call::Refund(n) => {
                let d = match self {
                    Single::Tb(p, b) => b.refund(p, now, n, 1),
                    Single::Sl(p, log) => log.refund(p, now, n, 1),
                    Single::Sc(p, s) => {
                        let (d, after) = scm::refund(s, p, now, n, 1, Search::Bisect);
                        *s = after;
                        d
                    }
                    Single::Fw(p, s) => {
                        let (d, after) = fwm::refund(s, p, n, 1, now, Search::Bisect);
                        *s = after;
                        d
                    }
                    Single::Cc(..) => unreachable!("answered above"),
                };
                // a refund that leaves the limit fresh deletes the key
                if d.granted > 0 && d.reset_after_ms == 0 {
                    *self = Single::fresh(match self {
                        Single::Tb(p, _) => Params::TokenBucket(*p),
                        Single::Sl(p, _) => Params::SlidingLog(*p),
                        Single::Sc(p, _) => Params::SlidingCounter(*p),
                        Single::Fw(p, _) => Params::FixedWindow(*p),
                        Single::Cc(p, _) => Params::Concurrency(*p),
                    });
                }
                d
            }
            other => panic!("{other:?} on a rate limit"),
        };
        five(&d)
    }
}

#[test]
fn the_rust_and_python_models_agree_on_the_corpus() {
    let mut single: Option<Single> = None;
    let mut multi: Option<(Vec<Limit>, Vec<u64>)> = None;
    let (mut cases, mut calls, mut kinds) = (0, 0, [0usize; 6]);
    let mut wrong: Vec<String> = Vec::new();
    let mut case_line = "";
    // the latest instant of the case so far: a call behind it is a clock step back
    let mut latest = 0;
    for line in CORPUS.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words[0] == "case" {
            case_line = line;
            cases += 1;
            latest = 0;
            if words[1] == "single" {
                let p = params(words[2]);
                kinds[["tb", "sl", "sc", "fw", "multi", "cc"].iter().position(|k| words[2].starts_with(k)).unwrap()] += 1;
                (single, multi) = (Some(Single::fresh(p)), None);
            } else {
                kinds[4] += 1;
                let (specs, weights): (Vec<Params>, Vec<u64>) = words[2..]
                    .iter()
                    .map(|w| w.split_once('*').unwrap())
                    .map(|(s, w)| (params(s), w.parse::<u64>().unwrap()))
                    .unzip();
                (single, multi) = (None, Some((specs.iter().map(Limit::fresh).collect(), weights)));
            }
            continue;
        }
        calls += 1;
        let (left, right) = line.split_once(" = ").unwrap();
        let w: Vec<&str> = left.split_whitespace().collect();
        let now: u64 = w[1].parse().unwrap();
        let back = if now < latest { " (the clock stepped back)" } else { "" };
        latest = latest.max(now);
        let n: Vec<u64> = w[3..].iter().map(|x| x.parse().unwrap()).collect();
        let call = match w[2] {
            "take" => Call::Take { cost: n[0], partial: n[1] == 1, dryrun: n[2] == 1 },
            "refund" => Call::Refund(n[0]),
            "acquire" => Call::Acquire { id: n[0], cost: n[1], partial: n[2] == 1, dryrun: n[3] == 1 },
            "release" => Call::Release(n[0]),
            "renew" => Call::Renew(n[0]),
            other => panic!("{other}"),
        };
        let want: Vec<Vec<i128>> =
            right.split(';').map(|part| part.split_whitespace().map(|x| x.parse().unwrap()).collect()).collect();
        let got: Vec<Vec<i128>> = if let Some(s) = single.as_mut() {
            vec![s.call(now, call)]
        } else {
            let (limits, weights) = multi.as_mut().unwrap();
            let op = match call {
                Call::Take { cost, partial, dryrun } => Op::Take { cost, partial, dryrun },
                Call::Refund(n) => Op::Refund(n),
                other => panic!("{other:?} in RL.MULTI"),
            };
            let (whole, per) = mm::call(limits, weights, op, now);
            let head = vec![
                sat(whole.allowed),
                sat(whole.limit),
                sat(whole.remaining),
                whole.retry_after_ms.into(),
                sat(whole.reset_after_ms),
                i128::try_from(whole.binding).unwrap(),
            ];
            std::iter::once(head).chain(per.iter().map(five)).collect()
        };
        if got != want {
            wrong.push(format!("{case_line}\n  {left}{back}\n  corpus (Python): {want:?}\n  Rust:            {got:?}"));
        }
    }
    // RL_AGREEMENT_ALL=1: every differing call, not only the first five
    if std::env::var_os("RL_AGREEMENT_ALL").is_some() {
        println!("{}", wrong.join("\n"));
    }
    println!("{cases} cases (tb, sl, sc, fw, multi, cc: {kinds:?}), {calls} calls");
    assert!(cases >= 300 && calls >= 3000 && kinds.iter().all(|&k| k >= 50), "the corpus is short: {kinds:?}");
    assert!(
        wrong.is_empty(),
        "{} of {calls} calls differ; the first:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(5)].join("\n")
    );
}
