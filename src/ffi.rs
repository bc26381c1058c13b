//! A thin layer over Redis's raw module API, used by the request path.
//!
//! The crate's convenience layer allocates (a `Vec<RedisString>` of
//! arguments, `RedisValue` replies); a rate limiter answers every request, so
//! the handlers talk to the raw API through these few wrappers instead. Each
//! API pointer is checked (`if let Some`) rather than unwrapped: a missing
//! pointer degrades to a no-op or an error reply, never a panic.

use std::ffi::{c_int, c_long, c_longlong, c_void, CStr};
use std::ptr;

use redis_module::raw::{
    self, RedisModuleCtx, RedisModuleKey, RedisModuleString, RedisModuleType,
};

pub const OK: c_int = raw::REDISMODULE_OK as c_int;
pub const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// Redis's standard WRONGTYPE error text.
pub const WRONGTYPE: &CStr = c"WRONGTYPE Operation against a key holding the wrong kind of value";

/// Largest absolute expiry we hand to Redis (ms since the epoch, ~146
/// million years): far beyond any real reset, and `mstime() + ttl` cannot
/// overflow inside Redis.
const MAX_EXPIRE_MS: u64 = 1 << 62;

/// The bytes of a Redis string argument.
///
/// # Safety
/// `s` must be a valid `RedisModuleString` that outlives the returned slice.
#[inline]
pub unsafe fn bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    let Some(f) = raw::RedisModule_StringPtrLen else { return &[] };
    let mut len = 0usize;
    let p = f(s, &mut len);
    if p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p.cast::<u8>(), len)
    }
}

#[inline]
pub unsafe fn reply_error(ctx: *mut RedisModuleCtx, msg: &CStr) -> c_int {
    if let Some(f) = raw::RedisModule_ReplyWithError {
        f(ctx, msg.as_ptr());
    }
    OK
}

#[inline]
pub unsafe fn wrong_arity(ctx: *mut RedisModuleCtx) -> c_int {
    if let Some(f) = raw::RedisModule_WrongArity {
        f(ctx);
    }
    OK
}

#[inline]
pub unsafe fn reply_simple(ctx: *mut RedisModuleCtx, msg: &CStr) -> c_int {
    if let Some(f) = raw::RedisModule_ReplyWithSimpleString {
        f(ctx, msg.as_ptr());
    }
    OK
}

/// The five-integer reply.
#[inline]
pub unsafe fn reply_ints(ctx: *mut RedisModuleCtx, vals: [i64; 5]) -> c_int {
    let (Some(arr), Some(ll)) = (raw::RedisModule_ReplyWithArray, raw::RedisModule_ReplyWithLongLong) else {
        return reply_error(ctx, c"ERR module API unavailable");
    };
    arr(ctx, vals.len() as c_long);
    for v in vals {
        ll(ctx, v as c_longlong);
    }
    OK
}

/// `Milliseconds()` of the server: the same clock as `mstime()`, which
/// Redis 7.0's `RedisModule_SetExpire` adds the relative TTL to.
#[inline]
fn server_ms() -> i64 {
    match unsafe { raw::RedisModule_Milliseconds } {
        Some(f) => unsafe { f() },
        None => 0,
    }
}

/// What an opened key holds: nothing, our type's value pointer (non-NULL;
/// its layout is the type's business, see `types::Stored`), or anything else.
pub enum Slot {
    Empty,
    Ours(*mut c_void),
    WrongType,
}

/// An open key, closed on drop.
pub struct Key {
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleKey,
    name: *mut RedisModuleString,
}

impl Key {
    /// Open `name` for reading, and for writing unless `read_only`.
    #[inline]
    pub unsafe fn open(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString, read_only: bool) -> Key {
        let mode = if read_only {
            raw::REDISMODULE_READ
        } else {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } as c_int;
        let key = match raw::RedisModule_OpenKey {
            Some(f) => f(ctx, name, mode),
            None => ptr::null_mut(),
        };
        Key { ctx, key, name }
    }

    /// The value if the key is empty or holds our type `ty`.
    #[inline]
    pub unsafe fn slot(&self, ty: *mut RedisModuleType) -> Slot {
        if self.key.is_null() {
            return Slot::Empty;
        }
        let kt = match raw::RedisModule_KeyType {
            Some(f) => f(self.key),
            None => return Slot::WrongType,
        };
        if kt as isize == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Slot::Empty;
        }
        if kt as isize != raw::REDISMODULE_KEYTYPE_MODULE {
            return Slot::WrongType;
        }
        let (Some(get_type), Some(get_value)) = (raw::RedisModule_ModuleTypeGetType, raw::RedisModule_ModuleTypeGetValue) else {
            return Slot::WrongType;
        };
        if get_type(self.key) != ty || ty.is_null() {
            return Slot::WrongType;
        }
        let v = get_value(self.key);
        if v.is_null() {
            Slot::WrongType
        } else {
            Slot::Ours(v)
        }
    }

    /// Store a new value; on success the key owns `value`, on failure the
    /// caller still does.
    #[inline]
    pub unsafe fn set_value(&self, ty: *mut RedisModuleType, value: *mut c_void) -> bool {
        match raw::RedisModule_ModuleTypeSetValue {
            Some(f) if !self.key.is_null() => f(self.key, ty, value) == OK,
            _ => false,
        }
    }

    /// Set the key's absolute expiry (Unix ms) exactly.
    ///
    /// Redis 7.2+ has `SetAbsExpire`. Redis 7.0 only has the relative
    /// `SetExpire`, which adds `mstime()` read inside the call; reading the
    /// same clock just before and after brackets that read, and when both
    /// agree the stored expiry is exactly `abs_ms`. That is what makes a
    /// replica's expiry (set from the absolute time in the effect) equal the
    /// master's to the millisecond. A tick between the two reads (rare)
    /// just repeats the call.
    ///
    /// `now_ms` is a reading of the same clock taken earlier in the call; it
    /// serves as the first "before" (if the clock ticked since, the check
    /// after the call fails and the loop retries with fresh readings), which
    /// saves one clock read per write.
    #[inline]
    pub unsafe fn set_abs_expire(&self, abs_ms: u64, now_ms: u64) {
        let abs = abs_ms.min(MAX_EXPIRE_MS) as i64;
        if let Some(f) = raw::RedisModule_SetAbsExpire {
            f(self.key, abs);
            return;
        }
        let Some(set) = raw::RedisModule_SetExpire else { return };
        let mut before = now_ms.min(MAX_EXPIRE_MS) as i64;
        for _ in 0..8 {
            set(self.key, (abs - before).max(0));
            let after = server_ms();
            if after == before {
                return;
            }
            before = server_ms();
        }
    }

    /// Remove any expiry (an AOF-rewrite payload carries none: Redis
    /// appends its own PEXPIREAT after it).
    pub unsafe fn persist(&self) {
        if let Some(set) = raw::RedisModule_SetExpire {
            set(self.key, raw::REDISMODULE_NO_EXPIRE as i64);
        }
    }

    /// Tell Redis the key changed (WATCH, client-side caching). The module
    /// sets NO_IMPLICIT_SIGNAL_MODIFIED so that a denied call, which opens
    /// the key for writing but changes nothing, does not signal.
    #[inline]
    pub unsafe fn signal_modified(&self) {
        if let Some(f) = raw::RedisModule_SignalModifiedKey {
            f(self.ctx, self.name);
        }
    }
}

impl Drop for Key {
    #[inline]
    fn drop(&mut self) {
        if !self.key.is_null() {
            if let Some(f) = unsafe { raw::RedisModule_CloseKey } {
                unsafe { f(self.key) };
            }
        }
    }
}

/// Replicate the command as it was received (RL.STATE itself is
/// deterministic: it carries an absolute expiry and no clock reads).
pub unsafe fn replicate_verbatim(ctx: *mut RedisModuleCtx) {
    if let Some(f) = raw::RedisModule_ReplicateVerbatim {
        f(ctx);
    }
}
