//! RL.MULTI: several limits decided at one clock reading, all or nothing.

use ratelimit_core::args::{self, ArgError, Call, LimitSpec, MultiCall, MAX_LIMITS};
use ratelimit_core::codec;
use ratelimit_core::multi::{self, LimitMut, Op, Params, Slot};
use ratelimit_core::{
    concurrency as cc, fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision,
};

use super::reply::{reply_arg_error, reply_multi, STORE_FAILED};
use super::single::{word_apply_with, WordLimiter};
use super::{commit, delete, Effects};
use crate::api::{Ctx, Key, Replied, Str};
use crate::clock;
use crate::ffi;
use crate::stats::Cmd;
use crate::value::{Holds, Packable, TypedKey};

const NO_DECISION: Decision = Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 };

/// `RL.MULTI numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL]
/// [DRYRUN] [REFUND n]`: every limit decided at one clock reading, all or
/// nothing. Parsed once ([`args::parse_multi_n`]); every key is opened and
/// type-checked before anything is decided (an error changes nothing); each
/// is read once; when the call writes, each written key gets its TTL and
/// its own effect (Redis wraps the command's effects in MULTI/EXEC).
/// Fixed-size arrays on the stack: no allocation per call.
/// (The server's key-position requests are answered by [`multi_keys`],
/// before this runs: `api::entry!`.)
pub fn multi(ctx: Ctx, argv: &[Str]) -> Replied {
    // Size the per-limit stack arrays for the call: a limit takes at least
    // four arguments (key, algorithm, two numbers), so argc bounds numkeys;
    // one or two limits (the common calls) build no sixteen.
    match argv.len().saturating_sub(2) / 4 {
        0 | 1 => multi_n::<1>(ctx, argv),
        2 => multi_n::<2>(ctx, argv),
        3 | 4 => multi_n::<4>(ctx, argv),
        _ => multi_n::<MAX_LIMITS>(ctx, argv),
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

/// RL.MULTI with room for `N` limits: one parse, then a fast path for the
/// commonest calls (one plain limit: [`multi_one`]; several:
/// [`multi_words`]) or the general one.
#[inline(never)]
fn multi_n<'a, const N: usize>(ctx: Ctx<'a>, argv: &[Str<'a>]) -> Replied {
    let Some(rest) = argv.get(1..) else {
        return ctx.wrong_arity();
    };
    let mut call = MultiCall::<N>::new();
    if let Err(e) = call.parse(rest, Str::bytes) {
        return reply_arg_error(ctx, e);
    }
    // A numkeys above N cannot parse without error: N is sized by argc.
    let (Some(names), Some(limits)) = (argv.get(2..2 + call.n), call.limits.get(..call.n)) else {
        return ctx.wrong_arity();
    };
    if call.plain {
        if let ([name], [limit]) = (names, limits) {
            if let Some(r) = multi_one(ctx, *name, limit) {
                return r;
            }
        }
        if let Some(r) = multi_words::<N>(ctx, names, limits) {
            return r;
        }
    }
    multi_general::<N>(ctx, &call, names, limits)
}

/// RL.MULTI of one plain limit of a word state (the parser's `plain`: no
/// WEIGHT, no option, so COST 1): the single command's work
/// (`single::word_apply_with`: open, read, decide, store, expire, signal,
/// the `rl.multi` event, replicate), answered in RL.MULTI's shape. With
/// one limit of weight 1 the call's grant is that limit's, and the whole
/// reply is its reply (`multi::combine_unweighted`), as `multi_words`
/// answers it (the integration suite compares both with the general
/// path). None for a sliding log, which `plain` rules out.
#[inline(never)]
fn multi_one<'a>(ctx: Ctx<'a>, name: Str<'a>, limit: &LimitSpec) -> Option<Replied> {
    let call = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false, refund: 0, force: false };
    let d = match limit.params {
        Params::TokenBucket(p) => word_apply_with::<tb::State, true>(ctx, name, &call, Cmd::MULTI, p),
        Params::SlidingCounter(p) => word_apply_with::<sc::State, true>(ctx, name, &call, Cmd::MULTI, p),
        Params::FixedWindow(p) => word_apply_with::<fw::State, true>(ctx, name, &call, Cmd::MULTI, p),
        Params::SlidingLog(_) | Params::Concurrency(_) => return None,
    };
    Some(match d {
        Ok(d) => {
            let per = [d];
            let whole = multi::combine_unweighted(&per, d.granted, 1, false);
            reply_multi(ctx, 0, false, 1, &whole, &per, 1)
        }
        Err(r) => r,
    })
}

/// The general path: any limits, weights and options.
#[inline(never)]
fn multi_general<'a, const N: usize>(ctx: Ctx<'a>, call: &MultiCall<N>, names: &[Str<'a>], limits: &[LimitSpec]) -> Replied {
    if let Err(e) = call.check(names, Str::bytes) {
        return reply_arg_error(ctx, e);
    }
    let now = clock::now_us();

    // Open every key and check its type before deciding anything; read
    // each once: word states by value, logs in place (a missing log is a
    // fresh local one, stored only if written).
    let mut open: [Option<Opened>; N] = std::array::from_fn(|_| None);
    for ((o, &name), spec) in open.iter_mut().zip(names).zip(limits) {
        match Opened::open(ctx, name, spec, call.dryrun) {
            Some(opened) => *o = Some(opened),
            None => return ctx.reply_error(ffi::WRONGTYPE),
        }
    }
    let op = if call.refund > 0 {
        Op::Refund(call.refund)
    } else if call.force {
        Op::Force { cost: call.cost, dryrun: call.dryrun }
    } else {
        Op::Take { cost: call.cost, partial: call.partial, dryrun: call.dryrun }
    };
    let mut per = [NO_DECISION; N];
    let n = names.len().min(N);
    let Some(slots) = open.get_mut(..n) else {
        return ctx.wrong_arity();
    };
    let whole = if call.flagged {
        multi::run_flagged(slots, &call.flags, op, now, &mut per[..n])
    } else {
        multi::run(slots, op, now, &mut per[..n])
    };

    // Write what changed: every limit when a grant was made, each limit
    // that gave units back on a refund.
    let mut failed = false;
    let mut effects = Effects::new(Cmd::MULTI, call.refund > 0);
    if !call.dryrun {
        for (o, d) in open.iter_mut().zip(&per) {
            if let Some(o) = o {
                if d.granted > 0 && !o.write(ctx, d, now, call.refund > 0, &mut effects) {
                    failed = true;
                }
            }
        }
    }
    drop(open);
    if failed {
        // The server refused a value (it cannot, for an open key of ours):
        // never a silent "granted".
        return ctx.reply_error(STORE_FAILED);
    }
    reply_multi(ctx, call.refund, call.partial, call.cost, &whole, &per, n)
}

/// One limit's state as read, paired with its parameters: a word state by
/// value, a sliding log fresh here unless its key holds one (then it is
/// read and changed in place).
enum Held {
    TokenBucket(tb::State, tb::Params),
    SlidingCounter(sc::State, sc::Params),
    FixedWindow(fw::State, fw::Params),
    SlidingLog(sl::State, sl::Params),
    /// Like the log: fresh here unless the key holds leases (then changed
    /// in place).
    Concurrency(cc::State, cc::Params),
}

/// One limit of the general path: its open key and its held state.
struct Opened<'a> {
    key: Key<'a>,
    name: Str<'a>,
    holds: Holds,
    weight: u64,
    held: Held,
}

impl<'a> Opened<'a> {
    /// Open `name` for `spec` and read it: None when it holds another type.
    #[inline]
    fn open(ctx: Ctx<'a>, name: Str<'a>, spec: &LimitSpec, read_only: bool) -> Option<Opened<'a>> {
        let mut key = ctx.open_key(name, read_only);
        let ty = match spec.params {
            Params::TokenBucket(_) => tb::State::redis_type(),
            Params::SlidingCounter(_) => sc::State::redis_type(),
            Params::FixedWindow(_) => fw::State::redis_type(),
            Params::SlidingLog(_) => sl::State::redis_type(),
            Params::Concurrency(_) => cc::State::redis_type(),
        };
        let holds = key.holds(ty);
        fn read<T: Packable + Copy + Default>(key: &Key, holds: Holds) -> T {
            match holds {
                Holds::Ours => key.read::<T>().unwrap_or_default(),
                _ => T::default(),
            }
        }
        let held = match spec.params {
            _ if holds == Holds::WrongType => return None,
            Params::TokenBucket(p) => Held::TokenBucket(read(&key, holds), p),
            Params::SlidingCounter(p) => Held::SlidingCounter(read(&key, holds), p),
            Params::FixedWindow(p) => Held::FixedWindow(read(&key, holds), p),
            Params::SlidingLog(p) => Held::SlidingLog(sl::State::default(), p),
            Params::Concurrency(p) => Held::Concurrency(cc::State::default(), p),
        };
        Some(Opened { key, name, holds, weight: spec.weight, held })
    }

    /// Store what the call changed (`d.granted > 0`): the new state, its
    /// expiry, signal, event and effect; a refund that left it fresh
    /// deletes the key. False when the server refused the value.
    #[inline]
    fn write(&mut self, ctx: Ctx<'a>, d: &Decision, now: u64, refund: bool, e: &mut Effects) -> bool {
        let (key, name, reset) = (&mut self.key, self.name, d.reset_after_ms);
        if reset == 0 {
            delete(ctx, key, name);
            return true;
        }
        /// A word state: stored in place, then its expiry, event and effect.
        #[inline(always)]
        fn store_word<'a, T: WordLimiter + Packable + Copy>(
            ctx: Ctx<'a>,
            key: &mut Key<'a>,
            name: Str<'a>,
            (now, reset): (u64, u64),
            e: &mut Effects,
            s: T,
        ) -> bool {
            key.store(s) && {
                commit(ctx, key, name, now, reset, e, |abs| s.effect(abs));
                true
            }
        }
        match &mut self.held {
            Held::TokenBucket(s, _) => store_word(ctx, key, name, (now, reset), e, *s),
            Held::SlidingCounter(s, _) => store_word(ctx, key, name, (now, reset), e, *s),
            Held::FixedWindow(s, _) => store_word(ctx, key, name, (now, reset), e, *s),
            Held::SlidingLog(fresh, p) => {
                let stored = self.holds == Holds::Ours || key.set_new(std::mem::take(fresh));
                let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: d.granted };
                stored && {
                    if refund {
                        commit(ctx, key, name, now, reset, e, |abs| codec::log_refund(&g, abs));
                    } else {
                        commit(ctx, key, name, now, reset, e, |abs| codec::log_grant(&g, abs));
                    }
                    true
                }
            }
            Held::Concurrency(fresh, p) => {
                let stored = self.holds == Holds::Ours || key.set_new(std::mem::take(fresh));
                // The id's lease as the call left it (taken, or what a
                // refund left of it): the change the replica applies.
                let lease =
                    key.wide_mut::<cc::State>().and_then(|s| s.leases().iter().find(|l| l.hash == p.id_hash).copied());
                let change = cc::Change {
                    now_us: now,
                    hash: p.id_hash,
                    units: lease.map_or(0, |l| l.units),
                    expiry_us: lease.map_or(0, |l| l.expiry_us),
                };
                stored && {
                    commit(ctx, key, name, now, reset, e, |abs| codec::lease(&change, abs));
                    true
                }
            }
        }
    }
}

impl Slot for Opened<'_> {
    #[inline]
    fn limit(&mut self) -> LimitMut<'_> {
        let Opened { key, holds, held, .. } = self;
        match held {
            Held::TokenBucket(s, p) => LimitMut::TokenBucket(s, *p),
            Held::SlidingCounter(s, p) => LimitMut::SlidingCounter(s, *p),
            Held::FixedWindow(s, p) => LimitMut::FixedWindow(s, *p),
            Held::SlidingLog(fresh, p) => match (*holds, key.wide_mut::<sl::State>()) {
                (Holds::Ours, Some(s)) => LimitMut::SlidingLog(s, *p),
                _ => LimitMut::SlidingLog(fresh, *p),
            },
            Held::Concurrency(fresh, p) => match (*holds, key.wide_mut::<cc::State>()) {
                (Holds::Ours, Some(s)) => LimitMut::Concurrency(s, *p),
                _ => LimitMut::Concurrency(fresh, *p),
            },
        }
    }
    #[inline]
    fn weight(&self) -> u64 {
        self.weight
    }
}

/// A word-state limit's state after the call's take of one request (its
/// first pass takes one from every limit that has one: the commonest call
/// is granted).
#[derive(Clone, Copy)]
enum Taken {
    TokenBucket(tb::State),
    SlidingCounter(sc::State),
    FixedWindow(fw::State),
}

/// A word state of the fast path: one take's answer, for a call that did
/// not get its request, viewed at the call's instant.
trait FastWord: WordLimiter {
    /// The answer for taking none of one unit from `self` under `p` at
    /// `now_us`.
    fn answer_none(&self, p: &Self::Params, now_us: u64) -> Decision;
}

impl FastWord for tb::State {
    #[inline(always)]
    fn answer_none(&self, p: &tb::Params, now_us: u64) -> Decision {
        tb::View::at(self, p, now_us).answer(0, 1)
    }
}

impl FastWord for sc::State {
    #[inline(always)]
    fn answer_none(&self, p: &sc::Params, now_us: u64) -> Decision {
        sc::View::at(self, p, now_us).answer(0, 1)
    }
}

impl FastWord for fw::State {
    #[inline(always)]
    fn answer_none(&self, p: &fw::Params, now_us: u64) -> Decision {
        fw::View::at(self, p, now_us).answer(0, 1)
    }
}

/// Read the state `key` holds as a `T` (a fresh one when it holds none),
/// view it at `now` and take one request when it has one (the single
/// command's step of COST 1): its answer into `d`, whether it had one, and
/// the state after the take (through `wrap`); None when the key holds
/// another type.
#[inline(always)]
fn first_take<T: WordLimiter>(
    key: &mut Key,
    p: &T::Params,
    now: u64,
    d: &mut Decision,
    wrap: fn(T) -> Taken,
) -> Option<(bool, Taken)> {
    let (a, s) = key.state::<T>()?.step(p, 1, false, now);
    *d = a;
    Some((a.granted > 0, wrap(s)))
}

/// Store a limit's state after the call's grant: expired, signalled and
/// replicated (a limit left fresh deletes its key). False when the server
/// refused the value.
#[inline(always)]
fn store_taken<'a, T: WordLimiter>(
    ctx: Ctx<'a>,
    key: &mut Key<'a>,
    name: Str<'a>,
    now: u64,
    reset: u64,
    s: &T,
    e: &mut Effects,
) -> bool {
    if reset == 0 {
        delete(ctx, key, name);
        return true;
    }
    if !key.store_copy(s) {
        return false;
    }
    commit(ctx, key, name, now, reset, e, move |abs| s.effect(abs));
    true
}

/// The call is denied: each limit that gave a request in the first pass
/// answers again for taking none (nothing was written; each key still
/// holds what the first pass read).
#[inline(never)]
fn answer_denied(open: &mut [Option<(Key, Taken)>], limits: &[LimitSpec], per: &mut [Decision], now: u64) {
    for ((o, spec), d) in open.iter_mut().zip(limits).zip(per.iter_mut()) {
        let Some((key, _)) = o else { continue };
        if d.granted == 0 {
            continue;
        }
        let again = match spec.params {
            Params::TokenBucket(p) => key.state::<tb::State>().map(|s| s.answer_none(&p, now)),
            Params::SlidingCounter(p) => key.state::<sc::State>().map(|s| s.answer_none(&p, now)),
            Params::FixedWindow(p) => key.state::<fw::State>().map(|s| s.answer_none(&p, now)),
            Params::SlidingLog(_) | Params::Concurrency(_) => None,
        };
        if let Some(a) = again {
            *d = a;
        }
    }
}

/// RL.MULTI's fast path: word-state limits only (token buckets, sliding
/// counters, fixed windows), no WEIGHT, no option (the parser's `plain`).
/// What the general path (`multi::run`) does for it, in one pass per limit:
/// open the key and check its type (every key before anything is written:
/// an error changes nothing), read the state by value, view it at the
/// call's instant and take one request from it if it has one; then, when
/// every limit had one (all or nothing), each state is stored once,
/// expired, signalled and replicated (the command once for the call when
/// nothing listens for effects), else each limit answers for taking none
/// and nothing is written. The same replies and states as the general path
/// (the integration suite's differential test compares both). None
/// (nothing written) for a limit it does not take, which `plain` rules
/// out.
#[inline(never)]
fn multi_words<'a, const N: usize>(ctx: Ctx<'a>, names: &[Str<'a>], limits: &[LimitSpec]) -> Option<Replied> {
    let n = names.len().min(limits.len()).min(N);
    let now = clock::now_us();
    // Each limit's open key and its state after the take, side by side
    // (closed on every return from here on); each limit's answer.
    let mut open: [Option<(Key<'a>, Taken)>; N] = std::array::from_fn(|_| None);
    let mut per = [NO_DECISION; N];
    // COST 1, no PARTIAL: one request when every limit has a unit, else none.
    let mut granted = true;
    for (((o, d), &name), p) in open.iter_mut().zip(per.iter_mut()).zip(names).zip(limits) {
        let mut key = ctx.open_key(name, false);
        // The parameters read where the parser left them.
        let taken = match &p.params {
            Params::TokenBucket(p) => first_take::<tb::State>(&mut key, p, now, d, Taken::TokenBucket),
            Params::SlidingCounter(p) => first_take::<sc::State>(&mut key, p, now, d, Taken::SlidingCounter),
            Params::FixedWindow(p) => first_take::<fw::State>(&mut key, p, now, d, Taken::FixedWindow),
            // Not a word state: the general path (nothing written yet).
            Params::SlidingLog(_) | Params::Concurrency(_) => return None,
        };
        let Some((has, taken)) = taken else {
            return wrong_type(ctx, names);
        };
        granted &= has;
        *o = Some((key, taken));
    }
    // Distinct keys: told by their values' addresses when every key holds
    // one of ours (the common call), else by their names (nothing was
    // written; the keys close on return).
    if n > 1 && !open.get(..n).is_some_and(distinct_values) && !args::distinct_keys(names, Str::bytes) {
        return Some(reply_arg_error(ctx, ArgError::DuplicateKey));
    }

    let mut stored = true;
    if granted {
        let mut effects = Effects::new(Cmd::MULTI, false);
        let e = &mut effects;
        for ((o, d), &name) in open.iter_mut().zip(&per).zip(names) {
            let Some((key, taken)) = o else { continue };
            let r = d.reset_after_ms;
            stored &= match taken {
                Taken::TokenBucket(s) => store_taken(ctx, key, name, now, r, s, e),
                Taken::SlidingCounter(s) => store_taken(ctx, key, name, now, r, s, e),
                Taken::FixedWindow(s) => store_taken(ctx, key, name, now, r, s, e),
            };
        }
    } else {
        answer_denied(&mut open, limits, &mut per, now);
    }
    drop(open);
    if !stored {
        return Some(ctx.reply_error(STORE_FAILED));
    }
    let g = u64::from(granted);
    let whole = multi::combine_unweighted(&per[..n], g, 1, false);
    Some(reply_multi(ctx, 0, false, 1, &whole, &per, n))
}

/// A key of the fast path holds another type: WRONGTYPE, unless a key is
/// repeated (that error comes first, as a parse error).
#[inline(never)]
fn wrong_type(ctx: Ctx, names: &[Str]) -> Option<Replied> {
    if args::distinct_keys(names, Str::bytes) {
        Some(ctx.reply_error(ffi::WRONGTYPE))
    } else {
        Some(reply_arg_error(ctx, ArgError::DuplicateKey))
    }
}

/// Every open key holds a value of ours, each at its own address: the keys
/// are distinct.
#[inline]
fn distinct_values(open: &[Option<(Key, Taken)>]) -> bool {
    let addr = |o: &Option<(Key, Taken)>| o.as_ref().map_or(0, |(k, _)| k.value_addr());
    open.iter().enumerate().all(|(i, o)| {
        let a = addr(o);
        a != 0 && open.iter().take(i).all(|p| addr(p) != a)
    })
}
