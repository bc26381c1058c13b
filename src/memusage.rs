//! What a limiter key really costs, for `MEMORY USAGE`: every block the
//! value holds at the size the allocator gave it (its size class under
//! jemalloc, the usable chunk size under libc malloc), plus the part of the
//! key's cost that the server leaves out of a module key's `MEMORY USAGE`
//! but counts for a string key.
//!
//! That part differs by server layout: every server allocates a `moduleValue`
//! (type and value pointers) for a module key and never counts it; Redis 7.x
//! (and Valkey before 8.1) also keep a separate object header (`robj`) that a
//! string key's MEMORY USAGE counts but a module key's does not, while Redis
//! 8 and Valkey 8.1+ embed the key name in that header and count it for
//! every type. The module API does not say which layout a server has, so it
//! is measured at load, from what the server does ([`probe`]): a module key
//! and a string key of the same name length are written, and for each the
//! growth of `used_memory` (which counts every allocation at its usable size)
//! is compared with what `MEMORY USAGE` reports for it. The module key's
//! uncounted bytes less the string key's are what this module adds.
//!
//! Where the probe cannot run or gives an implausible answer, the
//! allocator's size of a 16-byte block (the `moduleValue`) stands in.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use ratelimit_core::{tokenbucket as tb, PACK_EPOCH_US};
use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::types::TOKENBUCKET_PTR;
use crate::value::Value;

/// Bytes of a module key the server does not count: set at load;
/// 0 where no server runs (unit tests), where the blocks' requested sizes
/// stand in for their allocated ones as well.
static WRAPPER: AtomicUsize = AtomicUsize::new(0);

/// The allocator's size for the block at `p` (allocated through Redis's
/// allocator); 0 for NULL. Falls back to `fallback` where the server offers
/// neither size function.
///
/// # Safety
///
/// `p` is NULL or a live block of the global allocator (Redis's allocator
/// wherever the size functions are set: see `alloc.rs`), not yet freed.
#[inline]
pub unsafe fn usable(p: *const c_void, fallback: usize) -> usize {
    if p.is_null() {
        return 0;
    }
    // SAFETY: the API pointers are set at load (before the module allocates)
    // and never changed; where they are set, the global allocator is Redis's,
    // so `p` is a live block of the allocator they ask (the caller's
    // guarantee); they only read its size.
    unsafe {
        if let Some(f) = raw::RedisModule_MallocUsableSize {
            return f(p.cast_mut());
        }
        if let Some(f) = raw::RedisModule_MallocSize {
            return f(p.cast_mut());
        }
    }
    fallback
}

/// The server's uncounted wrapper around one module value, in bytes.
#[inline]
pub fn wrapper() -> usize {
    WRAPPER.load(Relaxed)
}

/// Measure the wrapper once, at load, after the data types are registered.
/// In cluster mode the probe needs a key in a slot this node serves (the
/// server refuses `MEMORY USAGE` of any other key from a module), which a
/// node that has just started may not have yet: there it is retried once a
/// second until it runs (the cluster may also be down until every slot is
/// served), for up to [`RETRIES`] seconds.
///
/// # Safety
///
/// `ctx` is the valid context of the running OnLoad (called once, at load,
/// on the main thread), after the data types are registered.
pub unsafe fn init(ctx: *mut RedisModuleCtx) {
    // SAFETY: the API pointers are set at load and never changed afterwards.
    let api = unsafe { (raw::RedisModule_Alloc, raw::RedisModule_Free) };
    let (Some(alloc), Some(free)) = api else { return };
    // SAFETY: `p` comes from RedisModule_Alloc (or is NULL, which `usable`
    // and RedisModule_Free accept) and is freed once, after its size is read.
    unsafe {
        let p = alloc(16);
        let block = usable(p, 16).max(16);
        free(p);
        WRAPPER.store(block, Relaxed);
    }
    // SAFETY: `ctx` is OnLoad's valid ctx (the caller's guarantee) for every
    // call below; the API pointers are read as above; `retry` matches the
    // timer callback type and reads no data, so the null data is never read.
    unsafe {
        if !measure(ctx) {
            let cluster =
                raw::RedisModule_GetContextFlags.is_some_and(|f| f(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER as c_int != 0);
            if cluster {
                if let Some(timer) = raw::RedisModule_CreateTimer {
                    timer(ctx, 1000, Some(retry), std::ptr::null_mut());
                    return;
                }
            }
            log(ctx, c"ratelimit: MEMORY USAGE adds %zu bytes per key (the probe could not run: the moduleValue block)");
        }
    }
}

/// How many times a deferred probe is retried (once a second).
const RETRIES: usize = 600;
static TRIES: AtomicUsize = AtomicUsize::new(0);

/// The timer callback of a deferred probe.
///
/// # Safety
///
/// Only the server calls this, from the timer `init` or `retry` created,
/// with a valid ctx for the call, on the main thread.
unsafe extern "C" fn retry(ctx: *mut RedisModuleCtx, _data: *mut c_void) {
    // SAFETY: the server passed a valid ctx for this timer call.
    if unsafe { measure(ctx) } {
        return;
    }
    // SAFETY: as above for `ctx`; the API pointer is set at load and never
    // changed; `retry` matches the timer callback type and reads no data.
    unsafe {
        if TRIES.fetch_add(1, Relaxed) < RETRIES {
            if let Some(timer) = raw::RedisModule_CreateTimer {
                timer(ctx, 1000, Some(retry), std::ptr::null_mut());
            }
        } else {
            log(ctx, c"ratelimit: MEMORY USAGE adds %zu bytes per key (the probe could not run: the moduleValue block)");
        }
    }
}

/// Run the probe; on success store and log its answer.
///
/// # Safety
///
/// `ctx` is a valid context of the running OnLoad or timer callback, on the
/// main thread (the probe writes and deletes keys through it).
unsafe fn measure(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: `ctx` is valid (the caller's guarantee).
    let Some(w) = (unsafe { probe(ctx) }) else { return false };
    WRAPPER.store(w, Relaxed);
    // SAFETY: as above.
    unsafe { log(ctx, c"ratelimit: MEMORY USAGE adds %zu bytes per key that the server does not count (measured)") };
    true
}

/// Log `msg`, a format with one `%zu`, filled with the current [`wrapper`].
///
/// # Safety
///
/// `ctx` is a valid context of the running callback, and `msg` holds exactly
/// one conversion, `%zu`, and no other `%`.
unsafe fn log(ctx: *mut RedisModuleCtx, msg: &CStr) {
    // SAFETY: the API pointer is set at load and never changed; `ctx` is
    // valid and `msg` takes exactly the one usize argument passed (the
    // caller's guarantees).
    unsafe {
        if let Some(log) = raw::RedisModule_Log {
            log(ctx, c"notice".as_ptr(), msg.as_ptr(), wrapper());
        }
    }
}

/// Probe keys: three, each measured on its own; they must agree.
const PROBE_KEYS: usize = 3;

/// The bytes of a module key's real cost that `MEMORY USAGE` leaves out,
/// beyond what it leaves out for a string key. Each probe key is first
/// written as the string "x" and then overwritten with a compact token
/// bucket: the growth of `used_memory` across the overwrite is what the
/// module key really costs more than the string key, and the change of
/// `MEMORY USAGE` is what the server counts of that. Overwriting the key
/// leaves the keyspace table as it was (same key, same slot), so nothing
/// else moves `used_memory` meanwhile; three keys must give the same answer.
/// The probe keys are written in the load context's database without
/// replication, AOF or notifications, and deleted before the module finishes
/// loading; a name that already exists stops the probe (None), leaving that
/// key alone.
///
/// # Safety
///
/// As [`measure`].
unsafe fn probe(ctx: *mut RedisModuleCtx) -> Option<usize> {
    // SAFETY: the API pointer is set at load and never changed.
    let free_string = unsafe { raw::RedisModule_FreeString }?;
    let mut answer: Option<i64> = None;
    let mut agree = true;
    let mut tag = 0;
    for _ in 0..PROBE_KEYS {
        // SAFETY: `ctx` is valid (the caller's guarantee); `name` is the
        // string free_name created with it, used by `uncounted` and then
        // freed once.
        let w = unsafe {
            let name = free_name(ctx, &mut tag)?;
            let w = uncounted(ctx, name);
            free_string(ctx, name);
            w
        };
        match (w, answer) {
            (None, _) => return None,
            (Some(w), None) => answer = Some(w),
            (Some(w), Some(a)) => agree &= w == a,
        }
    }
    // A key's uncounted wrapper is tens of bytes; anything else means the
    // probe measured something else.
    let w = answer.filter(|w| agree && (8..=256).contains(w))?;
    usize::try_from(w).ok()
}

/// A probe key name that no key has, in a slot this node serves (cluster
/// mode): the first of `{ratelimit-memusage-probe:NN}` from tag `*tag` on
/// for which `MEMORY USAGE` answers nil; `*tag` moves past it. The caller
/// frees the returned string (with `ctx`).
///
/// # Safety
///
/// As [`measure`].
unsafe fn free_name(ctx: *mut RedisModuleCtx, tag: &mut u8) -> Option<*mut RedisModuleString> {
    // SAFETY: the API pointers are set at load and never changed.
    let (create, free_string, call, reply_type, free_reply) = unsafe {
        (
            raw::RedisModule_CreateString?,
            raw::RedisModule_FreeString?,
            raw::RedisModule_Call?,
            raw::RedisModule_CallReplyType?,
            raw::RedisModule_FreeCallReply?,
        )
    };
    let mut buf = *b"{ratelimit-memusage-probe:00}";
    let n = buf.len();
    while *tag < 100 {
        buf[n - 3] = b'0' + *tag / 10;
        buf[n - 2] = b'0' + *tag % 10;
        *tag += 1;
        // SAFETY: `ctx` is valid (the caller's guarantee); CreateString
        // copies the `n` bytes of `buf`.
        let name = unsafe { create(ctx, buf.as_ptr().cast(), n) };
        if name.is_null() {
            return None;
        }
        // SAFETY: `ctx` is valid; the format "cs" matches the arguments (a C
        // string, then the non-null RedisModuleString `name`); a non-null
        // reply is read and then freed once; `name` is freed once unless
        // returned to the caller, who frees it.
        unsafe {
            // NULL: refused (another node's slot, or the cluster is down).
            let reply = call(ctx, c"MEMORY".as_ptr(), c"cs".as_ptr(), c"USAGE".as_ptr(), name);
            let free = !reply.is_null() && reply_type(reply) == raw::REDISMODULE_REPLY_NULL as c_int;
            if !reply.is_null() {
                free_reply(reply);
            }
            if free {
                return Some(name);
            }
            free_string(ctx, name);
        }
    }
    None
}

/// `used_memory`, from INFO memory.
///
/// # Safety
///
/// `ctx` is a valid context of the running callback.
unsafe fn used_memory(ctx: *mut RedisModuleCtx) -> Option<i64> {
    // SAFETY: the API pointers are set at load and never changed.
    let (get, free, field) = unsafe {
        (raw::RedisModule_GetServerInfo?, raw::RedisModule_FreeServerInfo?, raw::RedisModule_ServerInfoGetFieldUnsigned?)
    };
    // SAFETY: `ctx` is valid (the caller's guarantee); the section name is a
    // NUL-terminated literal. A null answer is handled below.
    let info = unsafe { get(ctx, c"memory".as_ptr()) };
    if info.is_null() {
        return None;
    }
    let mut err: c_int = 0;
    // SAFETY: `info` is the non-null data GetServerInfo returned, read once
    // and then freed once with the same ctx; `err` is a live local.
    let v = unsafe {
        let v = field(info, c"used_memory".as_ptr(), &mut err);
        free(ctx, info);
        v
    };
    if err != 0 {
        return None;
    }
    i64::try_from(v).ok()
}

/// `MEMORY USAGE name`.
///
/// # Safety
///
/// `ctx` is a valid context of the running callback and `name` a live
/// RedisModuleString.
unsafe fn memory_usage(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) -> Option<i64> {
    // SAFETY: the API pointers are set at load and never changed.
    let (call, reply_type, reply_int, free_reply) = unsafe {
        (
            raw::RedisModule_Call?,
            raw::RedisModule_CallReplyType?,
            raw::RedisModule_CallReplyInteger?,
            raw::RedisModule_FreeCallReply?,
        )
    };
    // SAFETY: `ctx` and `name` are valid (the caller's guarantee); the format
    // "cs" matches the arguments (a C string, then a RedisModuleString).
    let reply = unsafe { call(ctx, c"MEMORY".as_ptr(), c"cs".as_ptr(), c"USAGE".as_ptr(), name) };
    if reply.is_null() {
        return None;
    }
    // SAFETY: `reply` is the non-null reply of the call above, read and then
    // freed once.
    unsafe {
        let v = (reply_type(reply) == raw::REDISMODULE_REPLY_INTEGER as c_int).then(|| reply_int(reply));
        free_reply(reply);
        v
    }
}

/// One probe key, written where no key is and deleted again: (used_memory
/// growth) less (MEMORY USAGE growth) when its string value is replaced by a
/// module value. None where the name exists (left alone) or a call fails.
///
/// # Safety
///
/// As [`memory_usage`], on the main thread of a callback that may write keys.
unsafe fn uncounted(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) -> Option<i64> {
    // SAFETY: the API pointers are set at load and never changed.
    let (open, close, key_type, set_string, create, free_string) = unsafe {
        (
            raw::RedisModule_OpenKey?,
            raw::RedisModule_CloseKey?,
            raw::RedisModule_KeyType?,
            raw::RedisModule_StringSet?,
            raw::RedisModule_CreateString?,
            raw::RedisModule_FreeString?,
        )
    };
    let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
    // SAFETY: `ctx` and `name` are valid (the caller's guarantee).
    let key = unsafe { open(ctx, name, mode) };
    if key.is_null() {
        return None;
    }
    // SAFETY: `key` is the non-null key just opened for writing, closed once
    // on every path and not used afterwards; `s`, when non-null, is a string
    // created with `ctx`, which StringSet copies, freed once.
    let written = unsafe {
        if key_type(key) != raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            close(key);
            return None;
        }
        let s = create(ctx, c"x".as_ptr(), 1);
        let written = !s.is_null() && set_string(key, s) == raw::REDISMODULE_OK as c_int;
        if !s.is_null() {
            free_string(ctx, s);
        }
        close(key);
        written
    };
    // SAFETY: `ctx` and `name` are valid (the caller's guarantee); the key is
    // closed, so these reopen it on their own.
    unsafe {
        let result = if written { overwrite(ctx, name) } else { None };
        delete(ctx, name);
        result
    }
}

/// The measured step of [`uncounted`]: the key holds a string now.
///
/// # Safety
///
/// As [`uncounted`], after the data types are registered (so that
/// `TOKENBUCKET_PTR` is the token bucket's type).
unsafe fn overwrite(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) -> Option<i64> {
    // SAFETY: the API pointers are set at load and never changed.
    let (open, close, set_value) =
        unsafe { (raw::RedisModule_OpenKey?, raw::RedisModule_CloseKey?, raw::RedisModule_ModuleTypeSetValue?) };
    // SAFETY: `ctx` and `name` are valid (the caller's guarantee).
    let (as_string, before) = unsafe { (memory_usage(ctx, name)?, used_memory(ctx)?) };
    // SAFETY: as above.
    let key = unsafe { open(ctx, name, raw::REDISMODULE_WRITE as c_int) };
    if key.is_null() {
        return None;
    }
    let state = tb::State { tokens: 1, frac: 0, den: 1000, last_us: PACK_EPOCH_US + 1 };
    let v = Value::create(state);
    // SAFETY: `key` is the non-null key just opened for writing, closed once;
    // TOKENBUCKET_PTR is the registered token-bucket type, whose callbacks
    // expect exactly a `Value::<tb::State>` pointer such as `v`. On success
    // the key owns `v`; on failure nothing does, and it is freed once here.
    let ok = unsafe {
        let ok = set_value(key, TOKENBUCKET_PTR.load(Relaxed), v) == raw::REDISMODULE_OK as c_int;
        if !ok {
            Value::<tb::State>::free(v);
        }
        close(key);
        ok
    };
    if !ok {
        return None;
    }
    // SAFETY: `ctx` and `name` are valid (the caller's guarantee).
    let (after, usage) = unsafe { (used_memory(ctx)?, memory_usage(ctx, name)?) };
    // The module key's MEMORY USAGE already holds this module's current
    // answer for the wrapper (the stand-in, or 0 where none is set).
    let as_module = usage.checked_sub(i64::try_from(wrapper()).ok()?)?;
    after.checked_sub(before)?.checked_sub(as_module.checked_sub(as_string)?)
}

/// Delete a probe key.
///
/// # Safety
///
/// As [`uncounted`].
unsafe fn delete(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) {
    // SAFETY: the API pointers are set at load and never changed.
    let api = unsafe { (raw::RedisModule_OpenKey, raw::RedisModule_CloseKey, raw::RedisModule_DeleteKey) };
    let (Some(open), Some(close), Some(del)) = api else {
        return;
    };
    // SAFETY: `ctx` and `name` are valid (the caller's guarantee); a non-null
    // key is opened for writing, deleted, then closed once.
    unsafe {
        let key = open(ctx, name, raw::REDISMODULE_WRITE as c_int);
        if !key.is_null() {
            del(key);
            close(key);
        }
    }
}
