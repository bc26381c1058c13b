//! Does anything receive this server's replication stream?
//!
//! Every grant replicates its effect, `RL.STATE key payload`, with
//! `RedisModule_Replicate`. On Redis 7.0 that call costs about a quarter of
//! a granted request (docs/PROFILE.md) even when nothing listens: it
//! resolves the command name and builds an argument vector before Redis
//! finds that there is no replica, no replication backlog and no AOF.
//!
//! Nothing lost by skipping it requires that nobody could ever read the
//! stream entries skipped. The stream has three readers:
//! - the AOF: checked by the same timer (`REDISMODULE_CTX_FLAGS_AOF`), and
//!   assumed from the fork that switching it on makes. The server appends to
//!   the AOF only while `appendonly` is on from start-up (the first check,
//!   made before it could be switched off, sees it and keeps effects on) or
//!   once the rewrite child that `CONFIG SET appendonly yes` forks exists
//!   (Redis 7.0+ and Valkey: `feedAppendOnlyFile` feeds a waiting AOF only
//!   while `child_type` is the AOF child; without that child it stays off),
//!   and that fork fires the fork event below before the next command runs.
//!   So the AOF costs no check per call (`RedisModule_GetContextFlags` was
//!   ~80-140 instructions of every standalone grant);
//! - replicas and the backlog a replica can resynchronize from: checked from
//!   `INFO replication` by a timer (`connected_slaves`, `repl_backlog_active`,
//!   `role`), and assumed from the moment any of these events fires: a fork
//!   (every full sync snapshots the dataset in a forked child, and writes
//!   before the fork are in the snapshot), a role change, a replica going
//!   online or offline, a load. They fire synchronously, before the next
//!   command runs;
//! - a slot export of Valkey 9's atomic slot migration (`CLUSTER
//!   MIGRATESLOTS`): the source forks a snapshot of the slots, then feeds the
//!   target from the same propagation stream while `INFO replication` shows
//!   no replica and no backlog. Effects stay on from the export's STARTED
//!   event to its COMPLETED or ABORTED event; otherwise the next check would
//!   switch them off mid-export, and the stream would carry the original
//!   command, which the target would then recompute with its own clock.
//!
//! The module declares that it handles atomic slot migration (without it,
//! Valkey refuses `CLUSTER MIGRATESLOTS` for the whole cluster) only where
//! it could subscribe to that event: see [`init`].
//!
//! Until the first check, and whenever in doubt, effects are replicated.
//! When nothing listens the call still counts as a change
//! (`RedisModule_ReplicateVerbatim` bumps the dirty counter that drives
//! `save` points, and with no reader it propagates nothing).

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};

use crate::api::{Ctx, Str};
use crate::ffi::{self, api};

/// False only while the last check found no replica, no backlog, and this
/// server a master, and no event has fired since.
static MAY_LISTEN: AtomicBool = AtomicBool::new(true);

/// Slot exports under way (Valkey's atomic slot migration): started and not
/// yet completed or aborted.
static EXPORTS: AtomicU64 = AtomicU64::new(0);

/// How often the timer re-reads INFO replication.
const RECHECK_MS: i64 = 1000;

/// Replicate a grant's effect, built by `payload` only when something can
/// receive it.
#[inline]
pub fn replicate<'a, P: AsRef<[u8]>>(ctx: Ctx<'a>, name: Str<'a>, payload: impl FnOnce() -> P) {
    replicate_if(ctx, must_replicate(), name, payload);
}

/// Whether a grant's effect must be built and replicated (else only counted
/// as a change); a call that writes several keys reads it once. One load:
/// every way a reader appears sets [`MAY_LISTEN`] before the next command.
#[inline]
pub fn must_replicate() -> bool {
    MAY_LISTEN.load(Relaxed)
}

/// [`replicate`] with [`must_replicate`] already read for this call.
#[inline]
pub fn replicate_if<'a, P: AsRef<[u8]>>(ctx: Ctx<'a>, listen: bool, name: Str<'a>, payload: impl FnOnce() -> P) {
    if listen {
        ctx.replicate_state(name, payload().as_ref());
    } else {
        ctx.replicate_verbatim();
    }
}

/// # Safety
///
/// `ctx` is a valid context the server passed to the running callback.
#[inline]
unsafe fn aof_on(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: GetContextFlags is required (the module did not load without
    // it) and `ctx` is valid (the caller's guarantee).
    unsafe { api!(RedisModule_GetContextFlags)(ctx) & raw::REDISMODULE_CTX_FLAGS_AOF as c_int != 0 }
}

/// True when INFO replication shows a replica, a backlog, or a role other
/// than master (or cannot be read).
///
/// # Safety
///
/// `ctx` is a valid context the server passed to the running callback.
unsafe fn listeners_possible(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: all four are required API functions (the module did not load
    // without them).
    let (get, free, signed, text) = unsafe {
        (
            api!(RedisModule_GetServerInfo),
            api!(RedisModule_FreeServerInfo),
            api!(RedisModule_ServerInfoGetFieldSigned),
            api!(RedisModule_ServerInfoGetFieldC),
        )
    };
    // SAFETY: `ctx` is valid (the caller's guarantee); the section name is a
    // NUL-terminated literal. A null answer is handled below.
    let info = unsafe { get(ctx, c"replication".as_ptr()) };
    if info.is_null() {
        return true;
    }
    // SAFETY: `info` is the non-null server-info data GetServerInfo returned,
    // read before it is freed, and freed once with the same ctx; the field
    // names are NUL-terminated literals, the error outputs live locals; a
    // non-null `role` is a NUL-terminated C string owned by `info`, compared
    // before `info` is freed.
    unsafe {
        let mut err: c_int = 0;
        let replicas = signed(info, c"connected_slaves".as_ptr(), &mut err);
        let mut err2: c_int = 0;
        let backlog = signed(info, c"repl_backlog_active".as_ptr(), &mut err2);
        let role = text(info, c"role".as_ptr());
        let master = !role.is_null() && CStr::from_ptr(role) == c"master";
        free(ctx, info);
        err != 0 || err2 != 0 || replicas != 0 || backlog != 0 || !master
    }
}

/// The timer callback: re-check whether anything can read effects, and
/// re-arm the timer.
///
/// # Safety
///
/// Only the server calls this, from the timer `arm` created, with a valid
/// ctx for the call, on the main thread.
unsafe extern "C" fn recheck(ctx: *mut RedisModuleCtx, _data: *mut c_void) {
    // SAFETY: the server passed a valid ctx for this timer call.
    unsafe {
        MAY_LISTEN.store(EXPORTS.load(Relaxed) > 0 || aof_on(ctx) || listeners_possible(ctx), Relaxed);
        arm(ctx);
    }
}

/// Start the timer that runs `recheck` in `RECHECK_MS`.
///
/// # Safety
///
/// `ctx` is a valid context of the running OnLoad or timer callback.
unsafe fn arm(ctx: *mut RedisModuleCtx) {
    // SAFETY: CreateTimer is required (the module did not load without it);
    // `ctx` is valid (the caller's guarantee); `recheck` matches the timer
    // callback type and takes no data, so the null data pointer is never read.
    unsafe { api!(RedisModule_CreateTimer)(ctx, RECHECK_MS, Some(recheck), std::ptr::null_mut()) };
}

extern "C" fn on_event(_ctx: *mut RedisModuleCtx, _eid: RedisModuleEvent, _sub: u64, _data: *mut c_void) {
    MAY_LISTEN.store(true, Relaxed);
}

/// Valkey's atomic-slot-migration event and the sub-events used
/// (valkeymodule.h, Valkey 9.0+). On Redis 8.4+ ids 18 and 19 are other
/// events, and on Valkey 18 is authentication: this id is only subscribed
/// on a server that exports Valkey's API names.
const VALKEY_EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;
const EXPORT_STARTED: u64 = 1;
const EXPORT_ABORTED: u64 = 3;
const EXPORT_COMPLETED: u64 = 5;

/// `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION`.
pub const OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

extern "C" fn on_slot_migration(_ctx: *mut RedisModuleCtx, _eid: RedisModuleEvent, sub: u64, _data: *mut c_void) {
    match sub {
        EXPORT_STARTED => {
            EXPORTS.store(EXPORTS.load(Relaxed).saturating_add(1), Relaxed);
            MAY_LISTEN.store(true, Relaxed);
        }
        // The next check switches effects off if nothing else listens.
        EXPORT_COMPLETED | EXPORT_ABORTED => EXPORTS.store(EXPORTS.load(Relaxed).saturating_sub(1), Relaxed),
        _ => {}
    }
}

/// Subscribe to Valkey's atomic-slot-migration event, where the server is
/// Valkey (it answers for `ValkeyModule_*` API names, which Redis has not)
/// and knows the event (Valkey 9+; older servers refuse an unknown id).
///
/// # Safety
///
/// `ctx` is the valid context of the running OnLoad.
unsafe fn subscribe_slot_migration(ctx: *mut RedisModuleCtx) -> bool {
    let event = RedisModuleEvent { id: VALKEY_EVENT_ATOMIC_SLOT_MIGRATION, dataver: 1 };
    // SAFETY: called from OnLoad after RedisModule_Init; SubscribeToServerEvent
    // is required; `ctx` is OnLoad's valid ctx; the id is only subscribed on
    // Valkey, where it is the atomic-slot-migration event that
    // `on_slot_migration` expects (it reads only the sub-event number).
    unsafe {
        ffi::server_is_valkey() && api!(RedisModule_SubscribeToServerEvent)(ctx, event, Some(on_slot_migration)) == ffi::OK
    }
}

/// At load: subscribe to the events and start the timer. True when the
/// module can declare that it handles atomic slot migration: the server
/// has it and the module is subscribed to its exports.
///
/// # Safety
///
/// `ctx` is the valid context of the running OnLoad (called once, at load,
/// on the main thread).
pub unsafe fn init(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: SubscribeToServerEvent is required (the module did not load
    // without it).
    let subscribe = unsafe { api!(RedisModule_SubscribeToServerEvent) };
    let events = [
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_LOADING,
    ];
    // SAFETY: `ctx` is OnLoad's valid ctx; `on_event` reads none of its
    // arguments, so any event's data layout is fine for it.
    let all = events.iter().all(|&id| {
        (unsafe { subscribe(ctx, RedisModuleEvent { id, dataver: 1 }, Some(on_event)) }) == raw::REDISMODULE_OK as c_int
    });
    // Without every event and the timer, MAY_LISTEN stays true: effects are
    // always replicated. The first check runs from the timer.
    // SAFETY: OnLoad's valid ctx (the caller's guarantee), for both calls.
    unsafe {
        if all {
            arm(ctx);
        }
        subscribe_slot_migration(ctx)
    }
}

/// For INFO: whether effects are currently replicated.
pub fn replicating() -> bool {
    MAY_LISTEN.load(Relaxed)
}
