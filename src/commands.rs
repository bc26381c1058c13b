//! The command handlers: parse, read the key once, decide with the pure
//! core, and only when units were granted (and not DRYRUN) write once, set
//! the expiry and replicate the effect. Registered with the raw API so that a
//! request costs no heap allocation for arguments or the reply.

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ratelimit_core::args::{self, Arg, ArgError, Call, Kind, LimitSpec, MAX_LIMITS};
use ratelimit_core::codec::{self, Effect};
use ratelimit_core::multi::{self, Op, StateMut};
use ratelimit_core::{slidingcounter as sc, slidinglog as sl, to_i64, tokenbucket as tb, Decision};
use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::clock;
use crate::ffi::{self, Key, Slot};
use crate::listeners;
use crate::stats::{self, Cmd};
use crate::types::Stored;
use crate::value::Value;

const SYNTAX_ERROR: &CStr = c"ERR syntax error";
/// The key could not be set (the server refused the value): nothing was
/// granted or counted.
const STORE_FAILED: &CStr = c"ERR could not store the value";

/// The reply text of a numeric argument out of range (static: an error
/// costs no formatting).
fn arg_error(a: Arg) -> &'static CStr {
    match a {
        Arg::Capacity => c"ERR capacity must be an integer between 1 and 9007199254740991",
        Arg::Rate => c"ERR rate must be an integer between 1 and 9007199254740991",
        Arg::PeriodMs => c"ERR period_ms must be an integer between 1 and 9007199254740991",
        Arg::Limit => c"ERR limit must be an integer between 1 and 9007199254740991",
        Arg::WindowMs => c"ERR window_ms must be an integer between 1 and 9007199254740991",
        Arg::Cost => c"ERR COST must be an integer between 0 and 9007199254740991",
        Arg::Refund => c"ERR REFUND must be an integer between 1 and 9007199254740991",
        Arg::Weight => c"ERR WEIGHT must be an integer between 1 and 9007199254740991",
        Arg::NumKeys => c"ERR numkeys must be an integer between 1 and 16",
    }
}

/// Answer an argument error (the reply is sent; returns the handler's code).
unsafe fn reply_arg_error(ctx: *mut RedisModuleCtx, e: ArgError) -> c_int {
    match e {
        ArgError::Arity => ffi::wrong_arity(ctx),
        ArgError::Number(a) => ffi::reply_error(ctx, arg_error(a)),
        ArgError::Syntax => ffi::reply_error(ctx, SYNTAX_ERROR),
        ArgError::LimitCount => ffi::reply_error(ctx, c"ERR the number of limits must equal numkeys"),
        ArgError::DuplicateKey => ffi::reply_error(ctx, c"ERR every key must be distinct"),
        ArgError::Product(Arg::Refund) => ffi::reply_error(ctx, c"ERR REFUND * WEIGHT must not exceed 9007199254740991"),
        ArgError::Product(_) => ffi::reply_error(ctx, c"ERR COST * WEIGHT must not exceed 9007199254740991"),
    }
}

/// Run a handler; a panic (a bug: none is reachable by design) answers an
/// error instead of unwinding into Redis, which would abort the server.
#[inline]
unsafe fn guarded(ctx: *mut RedisModuleCtx, f: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(rc) => rc,
        Err(_) => ffi::reply_error(ctx, c"ERR ratelimit internal error"),
    }
}

#[inline]
unsafe fn argv_slice<'a>(argv: *mut *mut RedisModuleString, argc: c_int) -> &'a [*mut RedisModuleString] {
    if argv.is_null() || argc <= 0 {
        &[]
    } else {
        std::slice::from_raw_parts(argv, argc as usize)
    }
}

/// Parse `key <positional> [options]`; on error the reply is already sent.
#[inline]
unsafe fn parse(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
    positional: &[Arg],
) -> Result<(*mut RedisModuleString, Call), c_int> {
    let (Some(&key), Some(rest)) = (argv.get(1), argv.get(2..)) else {
        return Err(ffi::wrong_arity(ctx));
    };
    match args::parse(rest.iter().map(|&s| ffi::bytes(s)), positional) {
        Ok(call) => Ok((key, call)),
        Err(e) => Err(reply_arg_error(ctx, e)),
    }
}

#[inline]
unsafe fn reply(ctx: *mut RedisModuleCtx, cmd: Cmd, d: &Decision, call: &Call) -> c_int {
    // A refund's element 1 is the units it gave back.
    let first = if call.refund > 0 {
        stats::record_refund(cmd);
        d.granted
    } else {
        stats::record(cmd, d.granted, call.cost);
        d.allowed(call.cost, call.partial)
    };
    ffi::reply_ints(ctx, [to_i64(first), to_i64(d.limit), to_i64(d.remaining), d.retry_after_ms, to_i64(d.reset_after_ms)])
}

/// Absolute expiry (Unix ms) for a state written at `now_us` whose reset is
/// `reset_ms` away (the cores measure waits from the real clock, also when
/// it stepped back): the key then lives exactly until it would be
/// indistinguishable from a fresh one, and its TTL equals reset_after_ms.
/// Redis deletes a key once `mstime() > expiry`, so it survives the whole
/// millisecond `now_ms + reset_ms`, which ends after the exact µs reset.
#[inline]
fn abs_expiry(now_us: u64, reset_ms: u64) -> u64 {
    (now_us / 1000).saturating_add(reset_ms)
}

/// Store `new` in the key: in place when it already holds our type in a
/// form that can hold `new`, else as a new value.
#[inline]
unsafe fn store<T: Stored>(key: &Key, slot: &Slot, new: T) -> bool {
    let new = match *slot {
        Slot::Ours(p) => match Value::overwrite(p, new) {
            Ok(()) => return true,
            Err(v) => v,
        },
        _ => new,
    };
    set_new(key, new)
}

/// Set the key to a new value holding `v`.
#[inline]
unsafe fn set_new<T: Stored>(key: &Key, v: T) -> bool {
    let p = Value::create(v);
    let ok = key.set_value(T::redis_type(), p);
    if !ok {
        Value::<T>::free(p);
    }
    ok
}

/// The write a decided call makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    /// Nothing to write: denied, COST 0 or DRYRUN.
    None,
    /// The grant was stored: expire, signal and replicate it.
    Done,
    /// The grant could not be stored: answer an error, count nothing.
    Failed,
}

/// Store a grant (with `store`) when the decision made one and the call is
/// not a dry run.
#[inline]
fn write_grant(d: &Decision, dryrun: bool, store: impl FnOnce() -> bool) -> Write {
    if d.granted == 0 || dryrun {
        Write::None
    } else if store() {
        Write::Done
    } else {
        Write::Failed
    }
}

/// A limiter whose whole state is a few machine words (token bucket,
/// sliding counter): the pure `step` returns the new state by value, and the
/// effect replicated is that state.
trait WordLimiter: Stored + Copy + Default {
    type Params;
    const ARGS: &'static [Arg];
    const CMD: Cmd;
    fn params(nums: [u64; 3]) -> Self::Params;
    fn step(&self, p: &Self::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self);
    /// `REFUND n`, replying for a following request of `want` units.
    fn refund(&self, p: &Self::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self);
    fn effect(&self, abs_expire_ms: u64) -> codec::Small;
}

impl WordLimiter for tb::State {
    type Params = tb::Params;
    const ARGS: &'static [Arg] = args::TOKENBUCKET_ARGS;
    const CMD: Cmd = Cmd::TokenBucket;
    #[inline]
    fn params([capacity, rate, period_ms]: [u64; 3]) -> tb::Params {
        tb::Params { capacity, rate, period_ms }
    }
    #[inline]
    fn step(&self, p: &tb::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self) {
        tb::step(self, p, cost, partial, now_us)
    }
    #[inline]
    fn refund(&self, p: &tb::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self) {
        tb::refund(self, p, n, want, now_us)
    }
    #[inline]
    fn effect(&self, abs: u64) -> codec::Small {
        codec::tokenbucket(self, abs)
    }
}

impl WordLimiter for sc::State {
    type Params = sc::Params;
    const ARGS: &'static [Arg] = args::WINDOW_ARGS;
    const CMD: Cmd = Cmd::SlidingCounter;
    #[inline]
    fn params([limit, window_ms, _]: [u64; 3]) -> sc::Params {
        sc::Params { limit, window_ms }
    }
    #[inline]
    fn step(&self, p: &sc::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self) {
        sc::step(self, p, cost, partial, now_us)
    }
    #[inline]
    fn refund(&self, p: &sc::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self) {
        sc::refund(self, p, n, want, now_us)
    }
    #[inline]
    fn effect(&self, abs: u64) -> codec::Small {
        codec::slidingcounter(self, abs)
    }
}

/// Read the key once, decide, and on a grant write once, expire, signal and
/// replicate the new state (a grant that cannot be stored answers an error).
#[inline]
unsafe fn word_limiter<T: WordLimiter>(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || {
        let argv = argv_slice(argv, argc);
        let (name, call) = match parse(ctx, argv, T::ARGS) {
            Ok(v) => v,
            Err(rc) => return rc,
        };
        let p = T::params(call.nums);
        let now = clock::now_us();
        let key = Key::open(ctx, name, call.dryrun);
        let slot = key.slot(T::redis_type());
        let cur = match slot {
            Slot::WrongType => return ffi::reply_error(ctx, ffi::WRONGTYPE),
            Slot::Ours(p) => Value::<T>::with(p, |v| *v).unwrap_or_default(),
            Slot::Empty => T::default(),
        };
        if call.refund > 0 {
            // A refund that gives nothing back writes nothing; one that
            // leaves the limiter fresh deletes the key.
            let (d, new) = cur.refund(&p, call.refund, 1, now);
            if d.granted > 0 {
                if d.reset_after_ms == 0 {
                    delete(ctx, &key, name);
                } else if store(&key, &slot, new) {
                    let abs = abs_expiry(now, d.reset_after_ms);
                    key.set_abs_expire(abs);
                    key.signal_modified();
                    listeners::replicate(ctx, name, || new.effect(abs));
                } else {
                    return ffi::reply_error(ctx, STORE_FAILED);
                }
            }
            drop(key);
            return reply(ctx, T::CMD, &d, &call);
        }
        let (d, new) = cur.step(&p, call.cost, call.partial, now);
        match write_grant(&d, call.dryrun, || store(&key, &slot, new)) {
            Write::None => {}
            Write::Failed => return ffi::reply_error(ctx, STORE_FAILED),
            Write::Done => {
                let abs = abs_expiry(now, d.reset_after_ms);
                key.set_abs_expire(abs);
                key.signal_modified();
                listeners::replicate(ctx, name, || new.effect(abs));
            }
        }
        drop(key);
        reply(ctx, T::CMD, &d, &call)
    })
}

pub unsafe extern "C" fn tokenbucket(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    word_limiter::<tb::State>(ctx, argv, argc)
}

pub unsafe extern "C" fn slidingcounter(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    word_limiter::<sc::State>(ctx, argv, argc)
}

pub unsafe extern "C" fn slidinglog(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || {
        let argv = argv_slice(argv, argc);
        let (name, call) = match parse(ctx, argv, args::WINDOW_ARGS) {
            Ok(v) => v,
            Err(rc) => return rc,
        };
        let p = sl::Params { limit: call.nums[0], window_ms: call.nums[1] };
        let now = clock::now_us();
        let key = Key::open(ctx, name, call.dryrun);
        let slot = key.slot(sl::State::redis_type());
        let log = match slot {
            Slot::Ours(p) => Value::<sl::State>::wide_mut(p),
            _ => None,
        };
        let empty = sl::State::default();
        let cur: &sl::State = match (&slot, &log) {
            (Slot::WrongType, _) => return ffi::reply_error(ctx, ffi::WRONGTYPE),
            (_, Some(s)) => s,
            _ => &empty,
        };
        if call.refund > 0 {
            let (given, mut d) = match log {
                Some(s) => {
                    let given = sl::refund(s, p.window_ms, call.refund, now);
                    (given, sl::View::at(s, &p, now).answer(0, 1))
                }
                None => (0, sl::View::at(&empty, &p, now).answer(0, 1)),
            };
            d.granted = given;
            if given > 0 {
                if d.reset_after_ms == 0 {
                    delete(ctx, &key, name);
                } else {
                    let abs = abs_expiry(now, d.reset_after_ms);
                    key.set_abs_expire(abs);
                    key.signal_modified();
                    let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: given };
                    listeners::replicate(ctx, name, || codec::log_refund(&g, abs));
                }
            }
            drop(key);
            return reply(ctx, Cmd::SlidingLog, &d, &call);
        }
        let d = sl::decide(cur, &p, call.cost, call.partial, now);
        // sl::grant decides everything before it mutates the log: a panic
        // cannot leave it half-updated.
        let write = write_grant(&d, call.dryrun, || match log {
            Some(s) => {
                sl::grant(s, p.window_ms, d.granted, now);
                true
            }
            None => {
                let mut s = sl::State::default();
                sl::grant(&mut s, p.window_ms, d.granted, now);
                set_new(&key, s)
            }
        });
        match write {
            Write::None => {}
            Write::Failed => return ffi::reply_error(ctx, STORE_FAILED),
            Write::Done => {
                let abs = abs_expiry(now, d.reset_after_ms);
                key.set_abs_expire(abs);
                key.signal_modified();
                let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: d.granted };
                listeners::replicate(ctx, name, || codec::log_grant(&g, abs));
            }
        }
        drop(key);
        reply(ctx, Cmd::SlidingLog, &d, &call)
    })
}

/// Delete a limiter's key that a refund made fresh, and replicate the
/// deletion.
#[inline]
unsafe fn delete(ctx: *mut RedisModuleCtx, key: &Key, name: *mut RedisModuleString) {
    if key.delete() {
        key.signal_modified();
        ffi::replicate_del(ctx, name);
    }
}

/// `RL.STATE key payload`: set a limiter key to a replicated state, or apply
/// a replicated sliding-log grant. This is what replicas and AOF replay run
/// instead of the original command, so they never read their own clock for
/// limiter state. Any client may call it (like RESTORE); the payload is
/// validated as strictly as an RDB load, and it is replicated verbatim.
pub unsafe extern "C" fn state(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || {
        let argv = argv_slice(argv, argc);
        let (Some(&name), Some(&payload), 3) = (argv.get(1), argv.get(2), argv.len()) else {
            return ffi::wrong_arity(ctx);
        };
        let Ok((effect, abs)) = codec::decode(ffi::bytes(payload)) else {
            return ffi::reply_error(ctx, c"ERR invalid RL.STATE payload");
        };
        let key = Key::open(ctx, name, false);
        let ok = match effect {
            Effect::TokenBucket(s) => put(&key, s),
            Effect::SlidingCounter(s) => put(&key, s),
            Effect::SlidingLog(s) => put(&key, s),
            Effect::LogGrant(g) => match key.slot(sl::State::redis_type()) {
                Slot::WrongType => Err(()),
                Slot::Ours(p) => match Value::<sl::State>::wide_mut(p) {
                    Some(s) => {
                        sl::grant(s, g.window_ms, g.units, g.now_us);
                        Ok(true)
                    }
                    None => Err(()),
                },
                Slot::Empty => {
                    let mut s = sl::State::default();
                    sl::grant(&mut s, g.window_ms, g.units, g.now_us);
                    Ok(set_new(&key, s))
                }
            },
            // A refund on a log, applied as the master applied it; on a
            // missing key there is nothing to give back.
            Effect::LogRefund(g) => match key.slot(sl::State::redis_type()) {
                Slot::WrongType => Err(()),
                Slot::Ours(p) => match Value::<sl::State>::wide_mut(p) {
                    Some(s) => {
                        sl::refund(s, g.window_ms, g.units, g.now_us);
                        if s.is_empty() {
                            key.delete();
                        }
                        Ok(true)
                    }
                    None => Err(()),
                },
                Slot::Empty => Ok(true),
            },
        };
        match ok {
            Err(()) => ffi::reply_error(ctx, ffi::WRONGTYPE),
            Ok(false) => ffi::reply_error(ctx, STORE_FAILED),
            Ok(true) => {
                if abs == 0 {
                    key.persist();
                } else {
                    key.set_abs_expire(abs);
                }
                key.signal_modified();
                drop(key);
                ffi::replicate_verbatim(ctx);
                ffi::reply_simple(ctx, c"OK")
            }
        }
    })
}

/// Replace the key's value with `s` if the key is empty or of `T`'s type.
unsafe fn put<T: Stored>(key: &Key, s: T) -> Result<bool, ()> {
    match key.slot(T::redis_type()) {
        Slot::WrongType => Err(()),
        slot => Ok(store(key, &slot, s)),
    }
}

/// The registered type of a limit's algorithm.
#[inline]
fn kind_type(kind: Kind) -> *mut redis_module::raw::RedisModuleType {
    match kind {
        Kind::TokenBucket => tb::State::redis_type(),
        Kind::SlidingLog => sl::State::redis_type(),
        Kind::SlidingCounter => sc::State::redis_type(),
    }
}

#[inline]
fn multi_params(l: &LimitSpec) -> multi::Params {
    let [a, b, c] = l.nums;
    match l.kind {
        Kind::TokenBucket => multi::Params::TokenBucket(tb::Params { capacity: a, rate: b, period_ms: c }),
        Kind::SlidingLog => multi::Params::SlidingLog(sl::Params { limit: a, window_ms: b }),
        Kind::SlidingCounter => multi::Params::SlidingCounter(sc::Params { limit: a, window_ms: b }),
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
pub unsafe extern "C" fn multi(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || {
        let argv = argv_slice(argv, argc);
        if ffi::is_keys_position_request(ctx) {
            // Redis 7.0's cluster routing asks the command itself (later
            // servers read the key spec): the keys are arguments 2 ..
            // 2 + numkeys, as far as they exist.
            let n = argv.get(1).and_then(|&a| args::parse_num(ffi::bytes(a), 1)).unwrap_or(0);
            let n = usize::try_from(n).unwrap_or(0).min(MAX_LIMITS).min(argv.len().saturating_sub(2));
            for pos in 2..2 + n {
                ffi::key_at_pos(ctx, pos);
            }
            return ffi::OK;
        }
        // Size the per-limit stack arrays for the call: a limit takes at
        // least four arguments (key, algorithm, two numbers), so argc bounds
        // numkeys; one or two limits (the common calls) build no sixteen.
        match argv.len().saturating_sub(2) / 4 {
            0 | 1 => multi_n::<1>(ctx, argv),
            2 => multi_n::<2>(ctx, argv),
            3 | 4 => multi_n::<4>(ctx, argv),
            _ => multi_n::<MAX_LIMITS>(ctx, argv),
        }
    })
}

/// RL.MULTI with room for `N` limits.
#[inline(never)]
unsafe fn multi_n<const N: usize>(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> c_int {
    {
        let Some(rest) = argv.get(1..) else {
            return ffi::wrong_arity(ctx);
        };
        let call = match args::parse_multi_n::<N>(rest.iter().map(|&s| ffi::bytes(s))) {
            Ok(c) => c,
            // A numkeys above N is an error the full parser names exactly.
            Err(ArgError::Number(Arg::NumKeys)) if N < MAX_LIMITS => {
                let e = args::parse_multi(rest.iter().map(|&s| ffi::bytes(s))).err().unwrap_or(ArgError::Arity);
                return reply_arg_error(ctx, e);
            }
            Err(e) => return reply_arg_error(ctx, e),
        };
        let n = call.n.min(N);
        let (Some(names), Some(specs)) = (argv.get(2..2 + n), call.limits.get(..n)) else {
            return ffi::wrong_arity(ctx);
        };
        let read_only = call.dryrun;
        let now = clock::now_us();

        // Open every key and check its type before deciding anything.
        let mut keys: [Option<Key>; N] = std::array::from_fn(|_| None);
        let mut slots = [Slot::Empty; N];
        for (((k, slot), &name), spec) in keys.iter_mut().zip(slots.iter_mut()).zip(names).zip(specs) {
            let key = Key::open(ctx, name, read_only);
            *slot = key.slot(kind_type(spec.kind));
            *k = Some(key);
            if let Slot::WrongType = slot {
                return ffi::reply_error(ctx, ffi::WRONGTYPE);
            }
        }

        // Read each key once: word states by value, logs in place (a
        // missing log is a fresh local one, stored only if written).
        let mut tbs = [tb::State::default(); N];
        let mut scs = [sc::State::default(); N];
        let mut fresh_logs: [sl::State; N] = std::array::from_fn(|_| sl::State::default());
        let mut params = [multi::Params::TokenBucket(tb::Params { capacity: 1, rate: 1, period_ms: 1 }); N];
        let mut weights = [1u64; N];
        let mut per = [NO_DECISION; N];
        let whole = {
            let mut states: [Option<StateMut>; N] = std::array::from_fn(|_| None);
            for (i, (((((st, slot), spec), t), c), l)) in states
                .iter_mut()
                .zip(&slots)
                .zip(specs)
                .zip(tbs.iter_mut())
                .zip(scs.iter_mut())
                .zip(fresh_logs.iter_mut())
                .enumerate()
            {
                if let (Some(p), Some(w)) = (params.get_mut(i), weights.get_mut(i)) {
                    *p = multi_params(spec);
                    *w = spec.weight;
                }
                *st = Some(match (spec.kind, *slot) {
                    (Kind::TokenBucket, Slot::Ours(p)) => {
                        *t = Value::<tb::State>::with(p, |v| *v).unwrap_or_default();
                        StateMut::TokenBucket(t)
                    }
                    (Kind::TokenBucket, _) => StateMut::TokenBucket(t),
                    (Kind::SlidingCounter, Slot::Ours(p)) => {
                        *c = Value::<sc::State>::with(p, |v| *v).unwrap_or_default();
                        StateMut::SlidingCounter(c)
                    }
                    (Kind::SlidingCounter, _) => StateMut::SlidingCounter(c),
                    (Kind::SlidingLog, Slot::Ours(p)) => match Value::<sl::State>::wide_mut(p) {
                        Some(s) => StateMut::SlidingLog(s),
                        None => StateMut::SlidingLog(l),
                    },
                    (Kind::SlidingLog, _) => StateMut::SlidingLog(l),
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
        // Read once for the call, at its first written key.
        let mut listen: Option<bool> = None;
        for i in 0..n {
            let (Some(Some(key)), Some(&slot), Some(d), Some(&name), Some(spec)) =
                (keys.get(i), slots.get(i), per.get(i), names.get(i), specs.get(i))
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
            let abs = abs_expiry(now, d.reset_after_ms);
            let stored = match spec.kind {
                Kind::TokenBucket => tbs.get(i).is_some_and(|&s| store(key, &slot, s)),
                Kind::SlidingCounter => scs.get(i).is_some_and(|&s| store(key, &slot, s)),
                Kind::SlidingLog => match slot {
                    Slot::Ours(_) => true,
                    _ => fresh_logs.get_mut(i).is_some_and(|l| set_new(key, std::mem::take(l))),
                },
            };
            if !stored {
                failed = true;
                continue;
            }
            key.set_abs_expire(abs);
            key.signal_modified();
            let listen = *listen.get_or_insert_with(|| listeners::must_replicate(ctx));
            match spec.kind {
                Kind::TokenBucket => {
                    let s = tbs.get(i).copied().unwrap_or_default();
                    listeners::replicate_if(ctx, listen, name, || s.effect(abs));
                }
                Kind::SlidingCounter => {
                    let s = scs.get(i).copied().unwrap_or_default();
                    listeners::replicate_if(ctx, listen, name, || s.effect(abs));
                }
                Kind::SlidingLog => {
                    let window_ms = spec.nums[1];
                    let g = codec::LogGrant { now_us: now, window_ms, units: d.granted };
                    if call.refund > 0 {
                        listeners::replicate_if(ctx, listen, name, || codec::log_refund(&g, abs));
                    } else {
                        listeners::replicate_if(ctx, listen, name, || codec::log_grant(&g, abs));
                    }
                }
            }
        }
        drop(keys);
        if failed {
            // The server refused a value (it cannot, for an open key of ours):
            // never a silent "granted".
            return ffi::reply_error(ctx, STORE_FAILED);
        }

        if call.refund > 0 {
            stats::record_refund(Cmd::Multi);
        } else {
            // Requests granted: with PARTIAL element 1 says, else all or none.
            let g = if call.partial {
                whole.allowed
            } else if whole.allowed == 1 {
                call.cost
            } else {
                0
            };
            stats::record(Cmd::Multi, g, call.cost);
        }
        ffi::reply_array(ctx, 7);
        for v in [
            to_i64(whole.allowed),
            to_i64(whole.limit),
            to_i64(whole.remaining),
            whole.retry_after_ms,
            to_i64(whole.reset_after_ms),
        ] {
            ffi::reply_int(ctx, v);
        }
        ffi::reply_int(ctx, i64::try_from(whole.binding).unwrap_or(0));
        ffi::reply_array(ctx, n);
        for d in per.iter().take(n) {
            ffi::reply_ints(
                ctx,
                [to_i64(d.granted), to_i64(d.limit), to_i64(d.remaining), d.retry_after_ms, to_i64(d.reset_after_ms)],
            );
        }
        ffi::OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(n: u64) -> Decision {
        Decision { granted: n, limit: 5, remaining: 0, retry_after_ms: 0, reset_after_ms: 1 }
    }

    /// A grant whose store fails is a failure (answered with an error, not
    /// counted), never a silent "granted".
    #[test]
    fn a_failed_store_is_not_a_grant() {
        assert_eq!(write_grant(&granted(1), false, || false), Write::Failed);
        assert_eq!(write_grant(&granted(1), false, || true), Write::Done);
    }

    #[test]
    fn nothing_is_written_without_a_grant_or_on_dryrun() {
        let never = || -> bool { panic!("no write expected") };
        assert_eq!(write_grant(&granted(0), false, never), Write::None);
        assert_eq!(write_grant(&granted(3), true, never), Write::None);
    }

    #[test]
    fn error_texts_name_the_argument_and_its_range() {
        let all = [Arg::Capacity, Arg::Rate, Arg::PeriodMs, Arg::Limit, Arg::WindowMs, Arg::Cost, Arg::Refund, Arg::Weight];
        for a in all {
            let e = arg_error(a).to_str().unwrap();
            assert_eq!(e, format!("ERR {} must be an integer between {} and 9007199254740991", a.name(), a.min()));
        }
        let e = arg_error(Arg::NumKeys).to_str().unwrap();
        assert_eq!(e, format!("ERR numkeys must be an integer between 1 and {MAX_LIMITS}"));
        assert!(args::TOKENBUCKET_ARGS.iter().chain(args::WINDOW_ARGS).all(|a| all.contains(a)));
    }
}
