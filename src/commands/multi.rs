//! RL.MULTI: several limits decided at one clock reading, all or nothing.

use ratelimit_core::args::{self, Arg, ArgError, Call, Kind, LimitSpec, WordLimit, MAX_LIMITS};
use ratelimit_core::codec;
use ratelimit_core::multi::{self, Op, StateMut};
use ratelimit_core::{fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision};

use super::reply::{reply_arg_error, reply_multi, STORE_FAILED};
use super::single::{log_apply, word_apply, WordLimiter};
use super::{commit, delete, Effects};
use crate::api::{Ctx, Key, Replied, Str};
use crate::clock;
use crate::ffi;
use crate::stats::Cmd;
use crate::value::{Holds, Packable, TypedKey};

/// The registered type of a limit's algorithm.
#[inline]
fn kind_type(kind: Kind) -> *mut redis_module::raw::RedisModuleType {
    match kind {
        Kind::TokenBucket => tb::State::redis_type(),
        Kind::SlidingLog => sl::State::redis_type(),
        Kind::SlidingCounter => sc::State::redis_type(),
        Kind::FixedWindow => fw::State::redis_type(),
    }
}

const NO_DECISION: Decision = Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 };

/// `RL.MULTI numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL]
/// [DRYRUN] [REFUND n]`: every limit decided at one clock reading, all or
/// nothing. Every key is opened and type-checked before anything is
/// decided (an error changes nothing); each is read once; when the call
/// writes, each written key gets its TTL and its own effect (Redis wraps
/// the command's effects in MULTI/EXEC). Fixed-size arrays on the stack:
/// no allocation per call.
/// (The server's key-position requests are answered by [`multi_keys`],
/// before this runs: `api::entry!`.)
pub fn multi(ctx: Ctx, argv: &[Str]) -> Replied {
    {
        // Size the per-limit stack arrays for the call: a limit takes at
        // least four arguments (key, algorithm, two numbers), so argc bounds
        // numkeys; one or two limits (the common calls) build no sixteen.
        match argv.len().saturating_sub(2) / 4 {
            0 | 1 => multi_n::<1>(ctx, argv),
            2 => multi_n::<2>(ctx, argv),
            3 | 4 => multi_n::<4>(ctx, argv),
            _ => multi_n::<MAX_LIMITS>(ctx, argv),
        }
    }
}

/// RL.MULTI's answer to a key-position request (`getkeys-api`): cluster
/// routing asks the command itself on every server, and Valkey 9.1 on
/// every request, to prefetch the keys (cmdinfo/, MULTI_FLAGS): the keys
/// are arguments 2 .. 2 + numkeys, as far as they exist. It runs outside
/// the panic guard (`api::entry!`), so nothing here can panic: checked
/// reads, `parse_num` (total), a range bounded by MAX_LIMITS + 2.
pub fn multi_keys(ctx: Ctx, argv: &[Str]) -> Replied {
    // One digit (the common call) read at once, else by `parse_num`.
    let n = match argv.get(1).map(|&a| a.bytes()) {
        Some(&[d @ b'1'..=b'9']) => usize::from(d - b'0'),
        Some(s) => args::parse_num(s, 1).map_or(0, |n| usize::try_from(n).unwrap_or(0)),
        None => 0,
    };
    let n = n.min(MAX_LIMITS).min(argv.len().saturating_sub(2));
    ctx.reply_keys_at(2..2 + n)
}

/// RL.MULTI of one limit of weight 1: the single command's decision and
/// write, the reply in RL.MULTI's shape.
#[inline(always)]
fn multi_one<'a>(
    ctx: Ctx<'a>,
    name: Str<'a>,
    spec: &LimitSpec,
    cost: u64,
    partial: bool,
    dryrun: bool,
    refund: u64,
) -> Replied {
    let single = Call { nums: spec.nums, cost, partial, dryrun, refund };
    let d = match spec.kind {
        Kind::TokenBucket => word_apply::<tb::State>(ctx, name, &single, Cmd::Multi),
        Kind::SlidingCounter => word_apply::<sc::State>(ctx, name, &single, Cmd::Multi),
        Kind::FixedWindow => word_apply::<fw::State>(ctx, name, &single, Cmd::Multi),
        Kind::SlidingLog => log_apply(ctx, name, &single, Cmd::Multi),
    };
    let d = match d {
        Ok(d) => d,
        Err(rc) => return rc,
    };
    let whole = if refund > 0 {
        multi::combine_refund(&[d], &[1], refund)
    } else {
        multi::combine_unweighted(&[d], d.granted, cost, partial)
    };
    reply_multi(ctx, refund, partial, cost, &whole, &[d], 1)
}

/// Most arguments (after `RL.MULTI`) of a call the exact parser reads:
/// numkeys, two keys and two token buckets.
const EXACT_ARGS: usize = 11;

/// RL.MULTI with room for `N` limits.
#[inline(never)]
fn multi_n<'a, const N: usize>(ctx: Ctx<'a>, argv: &[Str<'a>]) -> Replied {
    {
        let Some(rest) = argv.get(1..) else {
            return ctx.wrong_arity();
        };
        // The commonest call (token buckets and sliding counters, no
        // WEIGHT, no options) takes the fast path, parsed once.
        // (A repeated key takes the generic path, which answers the error.)
        if let Some((n, limits)) = args::parse_multi_words_unchecked::<Str, N>(rest, Str::bytes) {
            if let (Some(names), Some(limits)) = (argv.get(2..2 + n), limits.get(..n)) {
                if let Some(rc) = multi_words::<N>(ctx, names, limits) {
                    return rc;
                }
            }
        }
        // The common call (no WEIGHT, no options) is parsed from its byte
        // slices read once; anything else, errors included, by the full
        // parser.
        let mut words: [&[u8]; EXACT_ARGS] = [&[]; EXACT_ARGS];
        let exact = if rest.len() <= EXACT_ARGS {
            for (w, &s) in words.iter_mut().zip(rest) {
                *w = s.bytes();
            }
            args::parse_multi_exact::<N>(&words[..rest.len()])
        } else {
            None
        };
        let parsed = match exact {
            Some(c) => Ok(c),
            None => args::parse_multi_n::<N>(rest.iter().map(|&s| s.bytes())),
        };
        let call = match parsed {
            Ok(c) => c,
            // A numkeys above N is an error the full parser names exactly.
            Err(ArgError::Number(Arg::NumKeys)) if N < MAX_LIMITS => {
                let e = args::parse_multi(rest.iter().map(|&s| s.bytes())).err().unwrap_or(ArgError::Arity);
                return reply_arg_error(ctx, e);
            }
            Err(e) => return reply_arg_error(ctx, e),
        };
        let n = call.n.min(N);
        let (Some(names), Some(specs)) = (argv.get(2..2 + n), call.limits.get(..n)) else {
            return ctx.wrong_arity();
        };
        // One limit of weight 1 answers exactly what its single command
        // does (the core's property test `one_limit_is_the_single_command`):
        // decide and write it as that command does, reply in RL.MULTI's shape.
        if let ([name], [spec]) = (names, specs) {
            if spec.weight == 1 {
                return multi_one(ctx, *name, spec, call.cost, call.partial, call.dryrun, call.refund);
            }
        }
        let read_only = call.dryrun;
        let now = clock::now_us();

        // Open every key and check its type before deciding anything.
        let mut keys: [Option<Key>; N] = std::array::from_fn(|_| None);
        let mut slots = [Holds::Empty; N];
        for (((k, slot), &name), spec) in keys.iter_mut().zip(slots.iter_mut()).zip(names).zip(specs) {
            let mut key = ctx.open_key(name, read_only);
            *slot = key.holds(kind_type(spec.kind));
            *k = Some(key);
            if let Holds::WrongType = slot {
                return ctx.reply_error(ffi::WRONGTYPE);
            }
        }

        // Read each key once: word states by value, logs in place (a
        // missing log is a fresh local one, stored only if written).
        let mut tbs = [tb::State::default(); N];
        let mut scs = [sc::State::default(); N];
        let mut fws = [fw::State::default(); N];
        let mut fresh_logs: [sl::State; N] = std::array::from_fn(|_| sl::State::default());
        let mut params = [multi::Params::TokenBucket(tb::Params { capacity: 1, rate: 1, period_ms: 1 }); N];
        let mut weights = [1u64; N];
        let mut per = [NO_DECISION; N];
        let whole = {
            let mut states: [Option<StateMut>; N] = std::array::from_fn(|_| None);
            for (i, (((((((st, key), slot), spec), t), c), f), l)) in states
                .iter_mut()
                .zip(keys.iter_mut())
                .zip(&slots)
                .zip(specs)
                .zip(tbs.iter_mut())
                .zip(scs.iter_mut())
                .zip(fws.iter_mut())
                .zip(fresh_logs.iter_mut())
                .enumerate()
            {
                if let (Some(p), Some(w)) = (params.get_mut(i), weights.get_mut(i)) {
                    *p = spec.params();
                    *w = spec.weight;
                }
                *st = Some(match (spec.kind, *slot, key) {
                    (Kind::TokenBucket, Holds::Ours, Some(key)) => {
                        *t = key.read::<tb::State>().unwrap_or_default();
                        StateMut::TokenBucket(t)
                    }
                    (Kind::TokenBucket, _, _) => StateMut::TokenBucket(t),
                    (Kind::SlidingCounter, Holds::Ours, Some(key)) => {
                        *c = key.read::<sc::State>().unwrap_or_default();
                        StateMut::SlidingCounter(c)
                    }
                    (Kind::SlidingCounter, _, _) => StateMut::SlidingCounter(c),
                    (Kind::FixedWindow, Holds::Ours, Some(key)) => {
                        *f = key.read::<fw::State>().unwrap_or_default();
                        StateMut::FixedWindow(f)
                    }
                    (Kind::FixedWindow, _, _) => StateMut::FixedWindow(f),
                    (Kind::SlidingLog, Holds::Ours, Some(key)) => match key.wide_mut::<sl::State>() {
                        Some(s) => StateMut::SlidingLog(s),
                        None => StateMut::SlidingLog(l),
                    },
                    (Kind::SlidingLog, _, _) => StateMut::SlidingLog(l),
                });
            }
            let op = if call.refund > 0 {
                Op::Refund(call.refund)
            } else {
                Op::Take { cost: call.cost, partial: call.partial, dryrun: call.dryrun }
            };
            multi::run(&mut states[..n], &params[..n], &weights[..n], op, now, &mut per[..n])
        };

        // Write what changed: every limit when a grant was made, each limit
        // that gave units back on a refund.
        let writes = !call.dryrun;
        let mut failed = false;
        let mut effects = Effects::new(Cmd::Multi, call.refund > 0);
        for i in 0..n {
            let (Some(Some(key)), Some(&slot), Some(d), Some(&name), Some(spec)) =
                (keys.get_mut(i), slots.get(i), per.get(i), names.get(i), specs.get(i))
            else {
                continue;
            };
            if d.granted == 0 || !writes {
                continue;
            }
            if d.reset_after_ms == 0 {
                delete(ctx, key, name);
                continue;
            }
            let stored = match spec.kind {
                Kind::TokenBucket => tbs.get(i).is_some_and(|&s| key.store(s)),
                Kind::SlidingCounter => scs.get(i).is_some_and(|&s| key.store(s)),
                Kind::FixedWindow => fws.get(i).is_some_and(|&s| key.store(s)),
                Kind::SlidingLog => match slot {
                    Holds::Ours => true,
                    _ => fresh_logs.get_mut(i).is_some_and(|l| key.set_new(std::mem::take(l))),
                },
            };
            if !stored {
                failed = true;
                continue;
            }
            let (reset, e) = (d.reset_after_ms, &mut effects);
            match spec.kind {
                Kind::TokenBucket => {
                    commit(ctx, key, name, now, reset, e, |abs| tbs.get(i).copied().unwrap_or_default().effect(abs));
                }
                Kind::SlidingCounter => {
                    commit(ctx, key, name, now, reset, e, |abs| scs.get(i).copied().unwrap_or_default().effect(abs));
                }
                Kind::FixedWindow => {
                    commit(ctx, key, name, now, reset, e, |abs| fws.get(i).copied().unwrap_or_default().effect(abs));
                }
                Kind::SlidingLog => {
                    let g = || codec::LogGrant { now_us: now, window_ms: spec.nums[1], units: d.granted };
                    if call.refund > 0 {
                        commit(ctx, key, name, now, reset, e, |abs| codec::log_refund(&g(), abs));
                    } else {
                        commit(ctx, key, name, now, reset, e, |abs| codec::log_grant(&g(), abs));
                    }
                }
            }
        }
        drop(keys);
        if failed {
            // The server refused a value (it cannot, for an open key of ours):
            // never a silent "granted".
            return ctx.reply_error(STORE_FAILED);
        }

        reply_multi(ctx, call.refund, call.partial, call.cost, &whole, &per, n)
    }
}

/// A word-state limit's state after the call's take.
#[derive(Clone, Copy)]
enum Word {
    TokenBucket(tb::State),
    SlidingCounter(sc::State),
}

/// A word-state limit read at the call's instant.
#[derive(Clone, Copy)]
enum WordView {
    /// Not read yet (never left so: every opened limit is read or the call
    /// answers an error).
    Unread,
    TokenBucket(tb::View),
    SlidingCounter(sc::View),
}

/// RL.MULTI of word-state limits only (token buckets and sliding
/// counters), weight 1, COST 1, no options: the common call. What the
/// generic path (`multi::run`) does for it, in one pass per limit without
/// its per-limit state arrays: open the key and check its type (every key
/// before anything is written: an error changes nothing), read the state by
/// value and view it at the call's instant; then every limit answers for
/// the call's grant (all or nothing), and on a grant each state is stored
/// once, expired, signalled and replicated (the command once for the call
/// when nothing listens for effects). The same replies and states as the
/// generic path (the integration suite's differential tests compare both).
#[inline(always)]
fn multi_words<'a, const N: usize>(ctx: Ctx<'a>, names: &[Str<'a>], limits: &[WordLimit]) -> Option<Replied> {
    let n = names.len().min(limits.len()).min(N);
    let now = clock::now_us();
    // Each limit's open key and its view, side by side.
    let mut open: [Option<(Key<'a>, WordView)>; N] = std::array::from_fn(|_| None);
    // COST 1, no PARTIAL: one request when every limit has a unit, else none.
    let mut g = 1u64;
    for ((o, &name), p) in open.iter_mut().zip(names).zip(limits) {
        // Into its slot at once, the view written in place (closed on
        // every return from here on).
        let (key, view) = o.insert((ctx.open_key(name, false), WordView::Unread));
        match *p {
            WordLimit::TokenBucket(p) => {
                let s = match key.holds(tb::State::redis_type()) {
                    Holds::WrongType => return wrong_type(ctx, names),
                    Holds::Ours => key.read::<tb::State>().unwrap_or_default(),
                    Holds::Empty => tb::State::default(),
                };
                *view = WordView::TokenBucket(tb::View::at(&s, &p, now));
            }
            WordLimit::SlidingCounter(p) => {
                let s = match key.holds(sc::State::redis_type()) {
                    Holds::WrongType => return wrong_type(ctx, names),
                    Holds::Ours => key.read::<sc::State>().unwrap_or_default(),
                    Holds::Empty => sc::State::default(),
                };
                *view = WordView::SlidingCounter(sc::View::at(&s, &p, now));
            }
        }
        let avail = match view {
            WordView::TokenBucket(v) => v.available(),
            WordView::SlidingCounter(v) => v.available(),
            WordView::Unread => 0,
        };
        g = g.min(avail);
    }
    // Distinct keys: told by their values' addresses when every key holds
    // one of ours (the common call), else by their names. A repeated key
    // takes the generic path (nothing was written; the keys close here).
    if n > 1 && !open.get(..n).is_some_and(distinct_values) && !args::distinct_keys(names, Str::bytes) {
        return None;
    }

    let mut per = [NO_DECISION; N];
    let mut failed = false;
    let mut effects = Effects::new(Cmd::Multi, false);
    for ((d, o), &name) in per.iter_mut().zip(open.iter_mut()).zip(names) {
        let Some((key, v)) = o else { continue };
        let new = match v {
            WordView::TokenBucket(v) => {
                let (a, s) = v.take(g, 1);
                *d = a;
                Word::TokenBucket(s)
            }
            WordView::SlidingCounter(v) => {
                *d = v.answer(g, 1);
                Word::SlidingCounter(v.state_after(g))
            }
            WordView::Unread => continue,
        };
        if g == 0 {
            continue;
        }
        if d.reset_after_ms == 0 {
            delete(ctx, key, name);
            continue;
        }
        let stored = match new {
            Word::TokenBucket(s) => key.store(s),
            Word::SlidingCounter(s) => key.store(s),
        };
        if !stored {
            failed = true;
            continue;
        }
        let (reset, e) = (d.reset_after_ms, &mut effects);
        match new {
            Word::TokenBucket(s) => commit(ctx, key, name, now, reset, e, |abs| s.effect(abs)),
            Word::SlidingCounter(s) => commit(ctx, key, name, now, reset, e, |abs| s.effect(abs)),
        }
    }
    drop(open);
    if failed {
        return Some(ctx.reply_error(STORE_FAILED));
    }
    let whole = multi::combine_unweighted(&per[..n], g, 1, false);
    Some(reply_multi(ctx, 0, false, 1, &whole, &per, n))
}

/// A key of the fast path holds another type: WRONGTYPE, unless a key is
/// repeated (then the generic path answers that error, as it comes first).
#[inline(never)]
fn wrong_type(ctx: Ctx, names: &[Str]) -> Option<Replied> {
    if args::distinct_keys(names, Str::bytes) {
        Some(ctx.reply_error(ffi::WRONGTYPE))
    } else {
        None
    }
}

/// Every open key holds a value of ours, each at its own address: the keys
/// are distinct.
#[inline]
fn distinct_values(open: &[Option<(Key, WordView)>]) -> bool {
    let addr = |o: &Option<(Key, WordView)>| o.as_ref().map_or(0, |(k, _)| k.value_addr());
    open.iter().enumerate().all(|(i, o)| {
        let a = addr(o);
        a != 0 && open.iter().take(i).all(|p| addr(p) != a)
    })
}
