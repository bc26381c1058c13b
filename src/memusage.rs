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

use std::ffi::{c_int, CString};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use ratelimit_core::{tokenbucket as tb, PACK_EPOCH_US};
use redis_module::raw;

use crate::alloc::usable;
use crate::api::{CallReply, Contents, Ctx, OwnedString, Str};
use crate::ffi::opt;
use crate::value::{set_wrapper, wrapper, TypedKey};

/// Measure the wrapper once, at load, after the data types are registered.
/// In cluster mode the probe needs a key in a slot this node serves (the
/// server refuses `MEMORY USAGE` of any other key from a module), which a
/// node that has just started may not have yet: there it is retried once a
/// second until it runs (the cluster may also be down until every slot is
/// served), for up to [`RETRIES`] seconds. `ctx` is OnLoad's (called once,
/// on the main thread).
pub fn init(ctx: Ctx) {
    // The allocator's block for 16 bytes: the global allocator is Redis's
    // inside the server (`alloc.rs`).
    let block = Box::new([0u64; 2]);
    // SAFETY: a live block of the global allocator, freed after its size is
    // read.
    let size = unsafe { usable((&raw const *block).cast(), 16) };
    drop(block);
    set_wrapper(size.max(16));
    if !measure(ctx) {
        let cluster = ctx.context_flags() & raw::REDISMODULE_CTX_FLAGS_CLUSTER as c_int != 0;
        if cluster && ctx.create_timer(1000, retry) {
            return;
        }
        log(ctx, "(the probe could not run: the moduleValue block)");
    }
}

/// How many times a deferred probe is retried (once a second).
const RETRIES: usize = 600;
static TRIES: AtomicUsize = AtomicUsize::new(0);

/// The timer callback of a deferred probe.
fn retry(ctx: Ctx) {
    if measure(ctx) {
        return;
    }
    if TRIES.fetch_add(1, Relaxed) >= RETRIES || !ctx.create_timer(1000, retry) {
        log(ctx, "(the probe could not run: the moduleValue block)");
    }
}

/// Run the probe; on success store and log its answer. `ctx` is OnLoad's or
/// a timer's, on the main thread (the probe writes and deletes keys
/// through it).
fn measure(ctx: Ctx) -> bool {
    let Some(w) = probe(ctx) else { return false };
    set_wrapper(w);
    log(ctx, "that the server does not count (measured)");
    true
}

/// Log the current [`wrapper`], followed by `tail`.
fn log(ctx: Ctx, tail: &str) {
    let msg = format!("ratelimit: MEMORY USAGE adds {} bytes per key {tail}", wrapper());
    if let Ok(msg) = CString::new(msg) {
        ctx.log(c"notice", &msg);
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
fn probe(ctx: Ctx) -> Option<usize> {
    // Every API function the probe uses (the optional ones: ffi::OPTIONAL).
    let api = [
        opt!(RedisModule_CreateString).is_some(),
        opt!(RedisModule_FreeString).is_some(),
        opt!(RedisModule_StringSet).is_some(),
        opt!(RedisModule_Call).is_some(),
        opt!(RedisModule_CallReplyType).is_some(),
        opt!(RedisModule_CallReplyInteger).is_some(),
        opt!(RedisModule_FreeCallReply).is_some(),
        opt!(RedisModule_ServerInfoGetFieldUnsigned).is_some(),
    ];
    if api.contains(&false) {
        return None;
    }
    let mut answer: Option<i64> = None;
    let mut agree = true;
    let mut tag = 0;
    for _ in 0..PROBE_KEYS {
        let name = free_name(ctx, &mut tag)?;
        let w = uncounted(ctx, name.as_str());
        drop(name);
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
/// for which `MEMORY USAGE` answers nil; `*tag` moves past it.
fn free_name<'a>(ctx: Ctx<'a>, tag: &mut u8) -> Option<OwnedString<'a>> {
    let mut buf = *b"{ratelimit-memusage-probe:00}";
    let n = buf.len();
    while *tag < 100 {
        buf[n - 3] = b'0' + *tag / 10;
        buf[n - 2] = b'0' + *tag % 10;
        *tag += 1;
        let name = ctx.create_string(&buf)?;
        // Refused: another node's slot, or the cluster is down.
        if ctx.memory_usage(name.as_str()) == CallReply::Null {
            return Some(name);
        }
    }
    None
}

/// `used_memory`, from INFO memory.
fn used_memory(ctx: Ctx) -> Option<i64> {
    let v = ctx.server_info(c"memory")?.unsigned(c"used_memory")?;
    i64::try_from(v).ok()
}

/// `MEMORY USAGE name`.
fn memory_usage(ctx: Ctx, name: Str) -> Option<i64> {
    match ctx.memory_usage(name) {
        CallReply::Integer(v) => Some(v),
        _ => None,
    }
}

/// One probe key, written where no key is and deleted again: (used_memory
/// growth) less (MEMORY USAGE growth) when its string value is replaced by a
/// module value. None where the name exists (left alone) or a call fails.
/// `ctx` as in [`measure`].
fn uncounted(ctx: Ctx, name: Str) -> Option<i64> {
    let written = {
        let mut key = ctx.open_key(name, false);
        if !key.is_open() {
            return None;
        }
        if key.contents() != Contents::Empty {
            return None;
        }
        let s = ctx.create_string(b"x");
        s.is_some_and(|s| key.set_string(&s))
    };
    // The key is closed, so these reopen it on their own.
    let result = if written { overwrite(ctx, name) } else { None };
    let mut key = ctx.open_key(name, false);
    key.delete();
    result
}

/// The measured step of [`uncounted`]: the key holds a string now. After
/// the data types are registered (so that the token bucket's type is set).
fn overwrite(ctx: Ctx, name: Str) -> Option<i64> {
    let (as_string, before) = (memory_usage(ctx, name)?, used_memory(ctx)?);
    let state = tb::State { tokens: 1, frac: 0, den: 1000, last_us: PACK_EPOCH_US + 1 };
    // On failure the value is freed (`TypedKey::set_new`), and the key closed.
    if !ctx.open_key(name, false).set_new(state) {
        return None;
    }
    let (after, usage) = (used_memory(ctx)?, memory_usage(ctx, name)?);
    // The module key's MEMORY USAGE already holds this module's current
    // answer for the wrapper (the stand-in, or 0 where none is set).
    let as_module = usage.checked_sub(i64::try_from(wrapper()).ok()?)?;
    after.checked_sub(before)?.checked_sub(as_module.checked_sub(as_string)?)
}
