//! Does anything receive this server's replication stream?
//!
//! Every grant replicates its effect, `RL.STATE key payload`, with
//! `RedisModule_Replicate`. That call is a large share of a granted request
//! even when nothing listens (docs/architecture.md, "Where the instructions
//! go"): it resolves the command name and builds an argument vector before
//! Redis finds that there is no replica, no replication backlog and no AOF.
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
//!   So the AOF costs no check per call (no `RedisModule_GetContextFlags`
//!   on the request path);
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

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};

use crate::api::Ctx;
use crate::ffi;

/// False only while the last check found no replica, no backlog, and this
/// server a master, and no event has fired since.
static MAY_LISTEN: AtomicBool = AtomicBool::new(true);

/// Slot exports under way (Valkey's atomic slot migration): started and not
/// yet completed or aborted.
static EXPORTS: AtomicU64 = AtomicU64::new(0);

/// How often the timer re-reads INFO replication.
const RECHECK_MS: i64 = 1000;

/// Whether a grant's effect must be built and replicated (else only counted
/// as a change); a call that writes several keys reads it once. One load:
/// every way a reader appears sets [`MAY_LISTEN`] before the next command.
#[inline]
pub fn must_replicate() -> bool {
    MAY_LISTEN.load(Relaxed)
}

/// Whether the context flags show the AOF on.
fn aof_on(ctx: Ctx) -> bool {
    ctx.context_flags() & raw::REDISMODULE_CTX_FLAGS_AOF as c_int != 0
}

/// True when INFO replication shows a replica, a backlog, or a role other
/// than master (or cannot be read).
fn listeners_possible(ctx: Ctx) -> bool {
    let Some(info) = ctx.server_info(c"replication") else { return true };
    let replicas = info.signed(c"connected_slaves");
    let backlog = info.signed(c"repl_backlog_active");
    let master = info.text(c"role") == Some(c"master");
    replicas != Some(0) || backlog != Some(0) || !master
}

/// The timer callback: re-check whether anything can read effects, and
/// re-arm the timer.
fn recheck(ctx: Ctx) {
    MAY_LISTEN.store(EXPORTS.load(Relaxed) > 0 || aof_on(ctx) || listeners_possible(ctx), Relaxed);
    arm(ctx);
}

/// Start the timer that runs `recheck` in `RECHECK_MS`.
fn arm(ctx: Ctx) -> bool {
    ctx.create_timer(RECHECK_MS, recheck)
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
/// and knows the event (Valkey 9+; older servers refuse an unknown id). The
/// id is only subscribed on Valkey, where it is the atomic-slot-migration
/// event that `on_slot_migration` expects (it reads only the sub-event
/// number).
fn subscribe_slot_migration(ctx: Ctx) -> bool {
    ffi::server_is_valkey() && ctx.subscribe(VALKEY_EVENT_ATOMIC_SLOT_MIGRATION, on_slot_migration)
}

/// At load (OnLoad's ctx): subscribe to the events and start the timer.
/// True when the module can declare that it handles atomic slot migration:
/// the server has it and the module is subscribed to its exports.
pub fn init(ctx: Ctx) -> bool {
    let events = [
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_LOADING,
    ];
    // `on_event` reads none of its arguments, so any event's data layout is
    // fine for it.
    let all = events.iter().all(|&id| ctx.subscribe(id, on_event));
    // Without every event and the timer, MAY_LISTEN stays true: effects are
    // always replicated. The first check runs from the timer.
    if all {
        arm(ctx);
    }
    subscribe_slot_migration(ctx)
}

/// For INFO: whether effects are currently replicated.
pub fn replicating() -> bool {
    MAY_LISTEN.load(Relaxed)
}
