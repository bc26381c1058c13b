//! A thin layer over Redis's raw module API, used by the request path.
//!
//! The crate's convenience layer allocates (a `Vec<RedisString>` of
//! arguments, `RedisValue` replies); a rate limiter answers every request, so
//! the handlers talk to the raw API through these few wrappers instead.
//!
//! Every API function the module calls is either in [`REQUIRED`] (the module
//! refuses to load, naming the function, unless the server provides all of
//! them: see [`first_missing`]) or in [`OPTIONAL`] (probed where used, with a
//! fallback that keeps the same behaviour). So a required pointer is never
//! absent at run time, and `api!` reads it without a check; a test keeps the
//! lists and the code in step.

use std::ffi::{c_int, c_long, c_longlong, c_void, CStr};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString, RedisModuleType};

/// A required API function, read without a check: `lib.rs` refuses to load
/// the module unless every function in [`REQUIRED`] is present (the test
/// `every_api_use_is_listed` keeps this list and the code in step).
macro_rules! api {
    ($name:ident) => {
        match redis_module::raw::$name {
            Some(f) => f,
            // SAFETY: unreachable: the module did not load without it.
            None => std::hint::unreachable_unchecked(),
        }
    };
}
pub(crate) use api;

/// `(name, present)` for a table of API functions.
pub type ApiTable = [(&'static str, fn() -> bool)];

macro_rules! table {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), || unsafe { redis_module::raw::$name }.is_some())),*]
    };
}

/// Every API function the module calls that has no fallback. All exist in
/// Redis 7.0 (the oldest server supported) and in Valkey.
pub static REQUIRED: &ApiTable = table![
    // requests (ffi.rs, commands)
    RedisModule_StringPtrLen,
    RedisModule_ReplyWithError,
    RedisModule_WrongArity,
    RedisModule_ReplyWithSimpleString,
    RedisModule_ReplyWithArray,
    RedisModule_ReplyWithLongLong,
    RedisModule_OpenKey,
    RedisModule_CloseKey,
    RedisModule_KeyType,
    RedisModule_ModuleTypeGetType,
    RedisModule_ModuleTypeGetValue,
    RedisModule_ModuleTypeSetValue,
    RedisModule_SetAbsExpire,
    RedisModule_SetExpire,
    RedisModule_SignalModifiedKey,
    RedisModule_ReplicateVerbatim,
    RedisModule_Replicate,
    RedisModule_DeleteKey,
    RedisModule_IsKeysPositionRequest,
    RedisModule_KeyAtPos,
    // effect skipping (listeners.rs)
    RedisModule_GetContextFlags,
    RedisModule_GetServerInfo,
    RedisModule_FreeServerInfo,
    RedisModule_ServerInfoGetFieldSigned,
    RedisModule_ServerInfoGetFieldC,
    RedisModule_CreateTimer,
    RedisModule_SubscribeToServerEvent,
    // data types (types.rs), INFO (stats.rs), memory (alloc.rs)
    RedisModule_SaveStringBuffer,
    RedisModule_LoadStringBuffer,
    RedisModule_IsIOError,
    RedisModule_EmitAOF,
    RedisModule_DigestAddStringBuffer,
    RedisModule_DigestEndSequence,
    RedisModule_InfoAddSection,
    RedisModule_InfoAddFieldULongLong,
    RedisModule_InfoAddFieldCString,
    RedisModule_Alloc,
    RedisModule_Free,
    RedisModule_Realloc,
    // registration (lib.rs)
    RedisModule_CreateCommand,
    RedisModule_SetModuleOptions,
    RedisModule_RegisterInfoFunc,
    RedisModule_Log,
    // COMMAND DOCS and key specs (cmdinfo.rs)
    RedisModule_GetCommand,
    RedisModule_SetCommandInfo,
];

/// API functions used only where the server has them: the cached command
/// time (Redis 7.2+, Valkey; `clock.rs`), the name lookup that tells Valkey's
/// events apart (`listeners.rs`), ACL categories (Redis 7.4+, Valkey 8+;
/// `cmdinfo.rs`).
#[cfg_attr(not(test), allow(dead_code))] // read by the test that keeps the lists in step
pub static OPTIONAL: &ApiTable = table![
    RedisModule_CachedMicroseconds,
    RedisModule_GetApi,
    RedisModule_AddACLCategory,
    RedisModule_SetCommandACLCategories,
    // the allocator's block sizes for MEMORY USAGE (memusage.rs)
    RedisModule_MallocUsableSize,
    RedisModule_MallocSize,
    // the load-time probe of what MEMORY USAGE leaves out (memusage.rs)
    RedisModule_CreateString,
    RedisModule_FreeString,
    RedisModule_StringSet,
    RedisModule_Call,
    RedisModule_CallReplyType,
    RedisModule_CallReplyInteger,
    RedisModule_FreeCallReply,
    RedisModule_ServerInfoGetFieldUnsigned,
];

/// True on Valkey (8.0+): it answers for its own `ValkeyModule_*` API
/// names, which Redis has not. (Its version number says 8.x or 9.x, which
/// compares above Redis releases whose event ids and option bits differ.)
pub unsafe fn server_is_valkey() -> bool {
    let Some(get_api) = raw::RedisModule_GetApi else { return false };
    let mut f: *mut c_void = std::ptr::null_mut();
    get_api(c"ValkeyModule_SubscribeToServerEvent".as_ptr(), (&raw mut f).cast::<c_void>()) == OK && !f.is_null()
}

/// `VALKEYMODULE_OPTIONS_SKIP_COMMAND_VALIDATION` (Valkey; an unknown bit,
/// ignored, on Valkey releases before it): `RedisModule_Replicate` and
/// `EmitAOF` skip looking the command name up (`RL.STATE` is this module's
/// own), except during a slot export, where Valkey looks it up anyway to
/// find the slot. On Redis this bit is not set.
pub const VALKEY_OPTIONS_SKIP_COMMAND_VALIDATION: c_int = 1 << 4;

/// The first function of `table` the server does not provide, if any.
pub fn first_missing(table: &ApiTable) -> Option<&'static str> {
    table.iter().find(|(_, present)| !present()).map(|&(name, _)| name)
}

pub const OK: c_int = raw::REDISMODULE_OK as c_int;

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
    let mut len = 0usize;
    let p = api!(RedisModule_StringPtrLen)(s, &mut len);
    if p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p.cast::<u8>(), len)
    }
}

#[inline]
pub unsafe fn reply_error(ctx: *mut RedisModuleCtx, msg: &CStr) -> c_int {
    api!(RedisModule_ReplyWithError)(ctx, msg.as_ptr());
    OK
}

#[inline]
pub unsafe fn wrong_arity(ctx: *mut RedisModuleCtx) -> c_int {
    api!(RedisModule_WrongArity)(ctx);
    OK
}

#[inline]
pub unsafe fn reply_simple(ctx: *mut RedisModuleCtx, msg: &CStr) -> c_int {
    api!(RedisModule_ReplyWithSimpleString)(ctx, msg.as_ptr());
    OK
}

/// The five-integer reply.
#[inline]
pub unsafe fn reply_ints(ctx: *mut RedisModuleCtx, vals: [i64; 5]) -> c_int {
    let ll = api!(RedisModule_ReplyWithLongLong);
    api!(RedisModule_ReplyWithArray)(ctx, vals.len() as c_long);
    for v in vals {
        ll(ctx, v as c_longlong);
    }
    OK
}

/// An array reply header of `len` elements.
#[inline]
pub unsafe fn reply_array(ctx: *mut RedisModuleCtx, len: usize) {
    api!(RedisModule_ReplyWithArray)(ctx, len as c_long);
}

/// One integer reply element.
#[inline]
pub unsafe fn reply_int(ctx: *mut RedisModuleCtx, v: i64) {
    api!(RedisModule_ReplyWithLongLong)(ctx, v as c_longlong);
}

/// Is this call Redis asking for the key positions (a command registered
/// with `getkeys-api`)?
#[inline]
pub unsafe fn is_keys_position_request(ctx: *mut RedisModuleCtx) -> bool {
    api!(RedisModule_IsKeysPositionRequest)(ctx) != 0
}

/// Report argument `pos` as a key (to a key position request).
#[inline]
pub unsafe fn key_at_pos(ctx: *mut RedisModuleCtx, pos: usize) {
    if let Ok(pos) = c_int::try_from(pos) {
        api!(RedisModule_KeyAtPos)(ctx, pos);
    }
}

/// What an opened key holds: nothing, our type's value pointer (non-NULL;
/// its layout is the type's business, see `types::Stored`), or anything else.
#[derive(Clone, Copy)]
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
        let mode = if read_only { raw::REDISMODULE_READ } else { raw::REDISMODULE_READ | raw::REDISMODULE_WRITE } as c_int;
        let key = api!(RedisModule_OpenKey)(ctx, name, mode);
        Key { ctx, key, name }
    }

    /// The value if the key is empty or holds our type `ty`.
    #[inline]
    pub unsafe fn slot(&self, ty: *mut RedisModuleType) -> Slot {
        if self.key.is_null() {
            return Slot::Empty;
        }
        let kt = api!(RedisModule_KeyType)(self.key);
        if kt as isize == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Slot::Empty;
        }
        if kt as isize != raw::REDISMODULE_KEYTYPE_MODULE {
            return Slot::WrongType;
        }
        if api!(RedisModule_ModuleTypeGetType)(self.key) != ty || ty.is_null() {
            return Slot::WrongType;
        }
        let v = api!(RedisModule_ModuleTypeGetValue)(self.key);
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
        !self.key.is_null() && api!(RedisModule_ModuleTypeSetValue)(self.key, ty, value) == OK
    }

    /// Set the key's absolute expiry (Unix ms) exactly: the same value on
    /// the master, its replicas and AOF replay, since the effect carries it.
    #[inline]
    pub unsafe fn set_abs_expire(&self, abs_ms: u64) {
        api!(RedisModule_SetAbsExpire)(self.key, abs_ms.min(MAX_EXPIRE_MS) as i64);
    }

    /// Remove any expiry (an AOF-rewrite payload carries none: Redis
    /// appends its own PEXPIREAT after it).
    pub unsafe fn persist(&self) {
        api!(RedisModule_SetExpire)(self.key, raw::REDISMODULE_NO_EXPIRE as i64);
    }

    /// Delete the key (a limiter that a refund made fresh). True when
    /// deleted.
    #[inline]
    pub unsafe fn delete(&self) -> bool {
        !self.key.is_null() && api!(RedisModule_DeleteKey)(self.key) == OK
    }

    /// Tell Redis the key changed (WATCH, client-side caching). The module
    /// sets NO_IMPLICIT_SIGNAL_MODIFIED so that a denied call, which opens
    /// the key for writing but changes nothing, does not signal.
    #[inline]
    pub unsafe fn signal_modified(&self) {
        api!(RedisModule_SignalModifiedKey)(self.ctx, self.name);
    }
}

impl Drop for Key {
    #[inline]
    fn drop(&mut self) {
        if !self.key.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.key) };
        }
    }
}

/// Replicate the deletion of `name` (`DEL name`): a refund made the
/// limiter fresh, and a fresh limiter is not stored.
pub unsafe fn replicate_del(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) {
    api!(RedisModule_Replicate)(ctx, c"DEL".as_ptr(), c"s".as_ptr(), name);
}

/// Replicate the command as it was received (RL.STATE itself is
/// deterministic: it carries an absolute expiry and no clock reads).
pub unsafe fn replicate_verbatim(ctx: *mut RedisModuleCtx) {
    api!(RedisModule_ReplicateVerbatim)(ctx);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_required_function_is_named() {
        // A fake pointer table: the second and third functions are absent.
        let table: &ApiTable = &[("RedisModule_A", || true), ("RedisModule_B", || false), ("RedisModule_C", || false)];
        assert_eq!(first_missing(table), Some("RedisModule_B"));
        let complete: &ApiTable = &[("RedisModule_A", || true), ("RedisModule_B", || true)];
        assert_eq!(first_missing(complete), None);
    }

    #[test]
    fn the_real_tables_read_the_real_pointers() {
        // Outside a server no pointer is set: the check names the first one.
        assert_eq!(first_missing(REQUIRED), Some("RedisModule_StringPtrLen"));
        assert_eq!(first_missing(OPTIONAL), Some("RedisModule_CachedMicroseconds"));
    }

    /// Every API function the module's sources read (through `raw::` or
    /// `api!`) is in REQUIRED or OPTIONAL, and no OPTIONAL one is read with
    /// `api!`, which does not check.
    #[test]
    fn every_api_use_is_listed() {
        let listed = |t: &ApiTable, n: &str| t.iter().any(|&(name, _)| name == n);
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut files = vec![];
        let mut dirs = vec![std::path::PathBuf::from(dir)];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    files.push(p);
                }
            }
        }
        let mut seen = 0;
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, _) in text.match_indices("RedisModule_") {
                let before = &text[..i];
                let name: String = text[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                let via_api = before.ends_with("api!(");
                let via_raw = before.ends_with("raw::");
                if !(via_api || via_raw) {
                    continue;
                }
                seen += 1;
                assert!(
                    listed(REQUIRED, &name) || listed(OPTIONAL, &name),
                    "{} uses {name}, which is in neither ffi::REQUIRED nor ffi::OPTIONAL",
                    f.display()
                );
                assert!(!(via_api && listed(OPTIONAL, &name)), "{} reads the optional {name} with api!", f.display());
            }
        }
        assert!(seen > 30, "the scan found only {seen} uses");
    }
}
