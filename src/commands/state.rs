//! RL.STATE: the effect command. Replicas and AOF replay apply what the
//! master decided (a whole state, or a sliding-log grant or refund)
//! instead of re-running the decision on their own clock.

use std::ffi::c_int;

use ratelimit_core::codec::{self, Effect};
use ratelimit_core::slidinglog as sl;
use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::reply::STORE_FAILED;
use super::{argv_slice, guarded, set_new, store};
use crate::ffi::{self, Key, Slot};
use crate::types::Stored;
use crate::value::Value;

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
