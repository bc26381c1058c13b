//! redis-ratelimit: native rate-limit commands for Redis and Valkey.
//!
//! The map of this crate (its layers, which point one way, and the path of
//! one request) is docs/architecture.md; `make lint` checks the layers
//! (tools/layers.py). This file is the top layer: OnLoad's registration and
//! the INFO callback.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]

mod alloc;
mod api;
mod clock;
mod cmdinfo;
mod commands;
mod ffi;
mod listeners;
mod memusage;
mod stats;
mod types;
mod value;

use std::ffi::c_int;

use redis_module::{raw, redis_module, Context, RedisString, Status};

use crate::api::Ctx;
use crate::types::{CONCURRENCY_TYPE, FIXEDWINDOW_TYPE, GCRA_TYPE, SLIDINGCOUNTER_TYPE, SLIDINGLOG_TYPE, TOKENBUCKET_TYPE};

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    // Refuse to load, naming it, if the server lacks an API function the
    // module calls without a fallback.
    if let Some(name) = ffi::first_missing(ffi::REQUIRED) {
        if ffi::opt!(RedisModule_Log).is_some() {
            ctx.log_warning(&format!("ratelimit: not loading: the server lacks {name}, which the module requires"));
        }
        return Status::Err;
    }
    // SAFETY: the valid ctx the server passed to this OnLoad, used only
    // while it runs (and by the timers it starts, each with its own ctx).
    let ctx = unsafe { Ctx::from_raw(ctx.ctx) };
    if !types::publish_type_pointers() {
        return Status::Err;
    }
    // Load arguments: `CL.THROTTLE` (any case) registers redis-cell's
    // command too; anything else refuses the load, naming it.
    for a in args {
        if a.as_slice().eq_ignore_ascii_case(b"CL.THROTTLE") {
            cmdinfo::enable_throttle();
        } else {
            ctx.log(c"warning", c"ratelimit: not loading: unknown module argument (the only one is CL.THROTTLE)");
            return Status::Err;
        }
    }
    if !cmdinfo::create(ctx) {
        if cmdinfo::throttle_enabled() {
            // The one name another module registers: redis-cell's.
            ctx.log(c"warning", c"ratelimit: not loading: a command could not be created; CL.THROTTLE exists already if redis-cell is loaded (unload it first)");
        }
        return Status::Err;
    }
    // COMMAND DOCS, key specs, ACL categories (each where the server has it).
    if !cmdinfo::register(ctx) {
        return Status::Err;
    }
    // HANDLE_IO_ERRORS: a truncated RESTORE payload makes rdb_load see an
    // error instead of aborting the server. NO_IMPLICIT_SIGNAL_MODIFIED: only
    // calls that really write signal the key as modified. Valkey 9's atomic
    // slot migration: only where listeners.rs keeps effects on during exports.
    // On Valkey, replicating an effect skips the command-name lookup.
    let mut options =
        (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as c_int;
    if listeners::init(ctx) {
        options |= listeners::OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    if ffi::server_is_valkey() {
        options |= ffi::VALKEY_OPTIONS_SKIP_COMMAND_VALIDATION;
    }
    ctx.set_module_options(options);
    // MEMORY USAGE's share of a key the server does not count: measured with
    // probe keys of the registered types (after the options, so that closing
    // them signals no modified key to WATCH or client tracking).
    memusage::init(ctx);
    // SAFETY: `info` is sound with any INFO context.
    unsafe { ctx.register_info_func(info) };
    Status::Ok
}

/// The INFO callback: `INFO ratelimit` (the `ratelimit_module` and
/// `ratelimit_stats` sections).
///
/// # Safety
///
/// `ctx` is the valid INFO context the server passes for this call (only
/// the server calls this, from INFO or a crash report).
unsafe extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    // SAFETY: the server passed a valid INFO ctx for this call.
    let ctx = unsafe { api::InfoCtx::from_raw(ctx) };
    cmdinfo::info_section(ctx);
    stats::info_section(ctx);
}

redis_module! {
    name: "ratelimit",
    version: cmdinfo::MODULE_VERSION,
    allocator: (crate::alloc::ModuleAlloc, crate::alloc::ModuleAlloc),
    data_types: [TOKENBUCKET_TYPE, SLIDINGLOG_TYPE, SLIDINGCOUNTER_TYPE, FIXEDWINDOW_TYPE, GCRA_TYPE, CONCURRENCY_TYPE],
    init: init,
}
