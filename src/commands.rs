//! The command handlers: parse, read the key once, decide with the pure
//! core, and only when units were granted (and not DRYRUN) write once, set
//! the expiry and replicate the effect. Registered with the raw API so that a
//! request costs no heap allocation for arguments or the reply.

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ratelimit_core::args::{self, Arg, ArgError, Call};
use ratelimit_core::codec::{self, Effect};
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
        Err(ArgError::Arity) => Err(ffi::wrong_arity(ctx)),
        Err(ArgError::Number(a)) => Err(ffi::reply_error(ctx, arg_error(a))),
        Err(ArgError::Syntax) => Err(ffi::reply_error(ctx, SYNTAX_ERROR)),
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
        let all = [Arg::Capacity, Arg::Rate, Arg::PeriodMs, Arg::Limit, Arg::WindowMs, Arg::Cost];
        for a in all {
            let e = arg_error(a).to_str().unwrap();
            assert_eq!(e, format!("ERR {} must be an integer between {} and 9007199254740991", a.name(), a.min()));
        }
        assert!(args::TOKENBUCKET_ARGS.iter().chain(args::WINDOW_ARGS).all(|a| all.contains(a)));
    }
}
