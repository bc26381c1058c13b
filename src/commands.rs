//! The command handlers: parse, read the key once, decide with the pure
//! core, and only when units were granted (and not DRYRUN) write once, set
//! the expiry and replicate the effect. Registered with the raw API so that a
//! request costs no heap allocation for arguments or the reply.

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::args::{self, ArgError, Call};
use crate::clock;
use crate::codec::{self, Effect};
use crate::core::{slidingcounter as sc, slidinglog as sl, to_i64, tokenbucket as tb, Decision};
use crate::ffi::{self, Key, Slot};
use crate::listeners;
use crate::stats::{self, Cmd};
use crate::types::Stored;

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
    positional: &[(&str, &'static CStr)],
) -> Result<(*mut RedisModuleString, Call), c_int> {
    let (Some(&key), Some(rest)) = (argv.get(1), argv.get(2..)) else {
        return Err(ffi::wrong_arity(ctx));
    };
    match args::parse(rest.iter().map(|&s| ffi::bytes(s)), positional) {
        Ok(call) => Ok((key, call)),
        Err(ArgError::Arity) => Err(ffi::wrong_arity(ctx)),
        Err(ArgError::Number(msg)) => Err(ffi::reply_error(ctx, msg)),
        Err(ArgError::Syntax) => Err(ffi::reply_error(ctx, args::SYNTAX_ERROR)),
    }
}

#[inline]
unsafe fn reply(ctx: *mut RedisModuleCtx, cmd: Cmd, d: &Decision, call: &Call) -> c_int {
    stats::record(cmd, d.granted, call.cost);
    ffi::reply_ints(
        ctx,
        [
            to_i64(d.allowed(call.cost, call.partial)),
            to_i64(d.limit),
            to_i64(d.remaining),
            d.retry_after_ms,
            to_i64(d.reset_after_ms),
        ],
    )
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
        Slot::Ours(p) => match T::overwrite(p, new) {
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
    let p = v.into_value();
    let ok = key.set_value(T::redis_type(), p);
    if !ok {
        T::free_value(p);
    }
    ok
}

/// A limiter whose whole state is a few machine words (token bucket,
/// sliding counter): the pure `step` returns the new state by value, and the
/// effect replicated is that state.
trait WordLimiter: Stored + Copy + Default {
    type Params;
    const ARGS: &'static [(&'static str, &'static CStr)];
    const CMD: Cmd;
    fn params(nums: [u64; 3]) -> Self::Params;
    fn step(&self, p: &Self::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self);
    fn effect(&self, abs_expire_ms: u64) -> codec::Small;
}

impl WordLimiter for tb::State {
    type Params = tb::Params;
    const ARGS: &'static [(&'static str, &'static CStr)] = args::TOKENBUCKET_ARGS;
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
    fn effect(&self, abs: u64) -> codec::Small {
        codec::tokenbucket(self, abs)
    }
}

impl WordLimiter for sc::State {
    type Params = sc::Params;
    const ARGS: &'static [(&'static str, &'static CStr)] = args::WINDOW_ARGS;
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
    fn effect(&self, abs: u64) -> codec::Small {
        codec::slidingcounter(self, abs)
    }
}

/// Read the key once, decide, and on a grant write once, expire, signal and
/// replicate the new state.
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
            Slot::Ours(p) => T::with_value(p, |v| *v).unwrap_or_default(),
            Slot::Empty => T::default(),
        };
        let (d, new) = cur.step(&p, call.cost, call.partial, now);
        if d.granted > 0 && !call.dryrun && store(&key, &slot, new) {
            let abs = abs_expiry(now, d.reset_after_ms);
            key.set_abs_expire(abs);
            key.signal_modified();
            listeners::replicate(ctx, name, || new.effect(abs));
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
            Slot::Ours(p) => p.cast::<sl::State>().as_mut(),
            _ => None,
        };
        let empty = sl::State::default();
        let cur: &sl::State = match (&slot, &log) {
            (Slot::WrongType, _) => return ffi::reply_error(ctx, ffi::WRONGTYPE),
            (_, Some(s)) => s,
            _ => &empty,
        };
        let d = sl::decide(cur, &p, call.cost, call.partial, now);
        if d.granted > 0 && !call.dryrun {
            let written = match log {
                Some(s) => {
                    sl::grant(s, p.window_ms, d.granted, now);
                    true
                }
                None => {
                    let mut s = sl::State::default();
                    sl::grant(&mut s, p.window_ms, d.granted, now);
                    set_new(&key, s)
                }
            };
            if written {
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
                Slot::Ours(p) => match p.cast::<sl::State>().as_mut() {
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
        };
        match ok {
            Err(()) => ffi::reply_error(ctx, ffi::WRONGTYPE),
            Ok(false) => ffi::reply_error(ctx, c"ERR could not store the value"),
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
