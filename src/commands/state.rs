//! RL.STATE: the effect command. Replicas and AOF replay apply what the
//! master decided (a whole state, a sliding-log grant or refund, or the
//! lease a concurrency call changed)
//! instead of re-running the decision on their own clock.

use ratelimit_core::codec::{self, Effect};
use ratelimit_core::{concurrency as cc, gcra, slidinglog as sl};

use std::ffi::CStr;

use super::reply::STORE_FAILED;
use super::REFUND_EVENT;
use crate::api::{Ctx, Key, Replied, Str};
use crate::ffi;
use crate::stats::Cmd;
use crate::value::{Holds, Packable, TypedKey};
use ratelimit_core::catalogue::Kind;

/// `RL.STATE key payload`: set a limiter key to a replicated state, or apply
/// a replicated sliding-log grant. This is what replicas and AOF replay run
/// instead of the original command, so they never read their own clock for
/// limiter state. Any client may call it (like RESTORE); the payload is
/// validated as strictly as an RDB load, and it is replicated verbatim.
pub fn state(ctx: Ctx, argv: &[Str]) -> Replied {
    let (Some(&name), Some(&payload), 3) = (argv.get(1), argv.get(2), argv.len()) else {
        return ctx.wrong_arity();
    };
    let Ok((effect, abs)) = codec::decode(payload.bytes()) else {
        return ctx.reply_error(c"ERR invalid RL.STATE payload");
    };
    let mut key = ctx.open_key(name, false);
    let event = effect_event(&effect);
    // A concurrency lease change applies to the key's leases (or a new
    // key's); one the leases cannot take (more than 2^53 - 1 units held:
    // a master never sends it) is refused like a bad payload, and one
    // that leaves no live lease deletes the key.
    if let Effect::Lease(c) = &effect {
        if key.holds(cc::State::redis_type()) == Holds::WrongType {
            return ctx.reply_error(ffi::WRONGTYPE);
        }
        let mut fresh_key = cc::State::default();
        let (s, new) = match key.wide_mut::<cc::State>() {
            Some(s) => (s, false),
            None => (&mut fresh_key, true),
        };
        if s.apply(c).is_err() {
            return ctx.reply_error(c"ERR invalid RL.STATE payload");
        }
        if s.is_fresh_at(c.now_us) {
            key.delete();
            key.modified(ctx, event);
            drop(key);
            ctx.replicate_verbatim();
            return ctx.reply_simple(c"OK");
        }
        if new && !key.set_new(fresh_key) {
            return ctx.reply_error(STORE_FAILED);
        }
    }
    let ok = match effect {
        Effect::TokenBucket(s) => put(&mut key, s),
        Effect::SlidingCounter(s) => put(&mut key, s),
        Effect::FixedWindow(s) => put(&mut key, s),
        Effect::SlidingLog(s) => put(&mut key, s),
        Effect::Concurrency(s) => put(&mut key, s),
        Effect::Lease(_) => Ok(true),
        // CL.THROTTLE's state replaces redis-cell's string form, as on the
        // master that converted it.
        Effect::Gcra(s) => match key.holds(gcra::State::redis_type()) {
            Holds::WrongType if key.string_bytes().and_then(gcra::parse_cell_string).is_none() => Err(()),
            _ => Ok(key.store(s)),
        },
        Effect::LogGrant(g) => match key.holds(sl::State::redis_type()) {
            Holds::WrongType => Err(()),
            Holds::Ours => match key.wide_mut::<sl::State>() {
                Some(s) => {
                    sl::grant(s, g.window_ms, g.units, g.now_us);
                    Ok(true)
                }
                None => Err(()),
            },
            Holds::Empty => {
                let mut s = sl::State::default();
                sl::grant(&mut s, g.window_ms, g.units, g.now_us);
                Ok(key.set_new(s))
            }
        },
        // A refund on a log, applied as the master applied it; on a
        // missing key there is nothing to give back.
        Effect::LogRefund(g) => match key.holds(sl::State::redis_type()) {
            Holds::WrongType => Err(()),
            Holds::Ours => match key.wide_mut::<sl::State>() {
                Some(s) => {
                    sl::refund(s, g.window_ms, g.units, g.now_us);
                    if s.is_empty() {
                        key.delete();
                    }
                    Ok(true)
                }
                None => Err(()),
            },
            Holds::Empty => Ok(true),
        },
    };
    match ok {
        Err(()) => ctx.reply_error(ffi::WRONGTYPE),
        Ok(false) => ctx.reply_error(STORE_FAILED),
        Ok(true) => {
            if abs == 0 {
                key.persist();
            } else {
                key.set_abs_expire(abs);
            }
            key.modified(ctx, event);
            drop(key);
            ctx.replicate_verbatim();
            ctx.reply_simple(c"OK")
        }
    }
}

/// The keyspace event a replica (or AOF replay) emits for an effect: the
/// event of the command that made it, as far as the payload tells: the
/// limiter's kind for a whole state (whether the master ran the single
/// command, RL.MULTI or a REFUND), `rl.slidinglog` for a log grant,
/// `rl.refund` for a log refund.
fn effect_event(effect: &Effect) -> &'static CStr {
    match effect {
        Effect::TokenBucket(_) => Cmd::of(Kind::TokenBucket).event(),
        Effect::SlidingCounter(_) => Cmd::of(Kind::SlidingCounter).event(),
        Effect::FixedWindow(_) => Cmd::of(Kind::FixedWindow).event(),
        Effect::SlidingLog(_) | Effect::LogGrant(_) => Cmd::of(Kind::SlidingLog).event(),
        Effect::LogRefund(_) => REFUND_EVENT,
        Effect::Gcra(_) => Cmd::THROTTLE.event(),
        Effect::Concurrency(_) => Cmd::of(Kind::Concurrency).event(),
        // A lease that ended (released, or given back to 0) is a refund's.
        Effect::Lease(c) if c.units == 0 => REFUND_EVENT,
        Effect::Lease(_) => Cmd::of(Kind::Concurrency).event(),
    }
}

/// Replace the key's value with `s` if the key is empty or of `T`'s type.
fn put<T: Packable>(key: &mut Key, s: T) -> Result<bool, ()> {
    match key.holds(T::redis_type()) {
        Holds::WrongType => Err(()),
        _ => Ok(key.store(s)),
    }
}
