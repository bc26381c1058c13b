//! redis-ratelimit: native rate-limit commands for Redis.
//!
//! Layout (see docs/architecture.md):
//! - `crates/ratelimit-core` (`ratelimit_core`): the pure algorithms (token
//!   bucket, sliding log, sliding counter) with their state types and
//!   versioned encodings, argument parsing and the RL.STATE effect payload;
//!   no Redis, no unsafe.
//! - this crate, the glue: `clock.rs` (server clock), `ffi.rs` (raw API:
//!   API presence checks), `api.rs` (the safe call context: arguments,
//!   keys, expiry, replies), `listeners.rs` (effect replication, skipped
//!   when nothing can read it), `value.rs` (a state behind a key's value
//!   pointer: compact or wide), `types.rs` (module data types),
//!   `commands/` (handlers: the shared path in `mod.rs`, `single.rs`,
//!   `multi.rs`, `state.rs` for RL.STATE, `reply.rs`), `stats.rs` (INFO),
//!   and registration here.

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

use crate::types::{SLIDINGCOUNTER_TYPE, SLIDINGLOG_TYPE, TOKENBUCKET_TYPE};

/// Create the command `d` of the table (`cmdinfo::COMMANDS`).
///
/// # Safety
///
/// `ctx` is the valid context of the running OnLoad.
unsafe fn create_command(ctx: *mut raw::RedisModuleCtx, d: &cmdinfo::Doc) -> bool {
    let k = d.first_key();
    // SAFETY: the API pointers are set by RedisModule_Init, before OnLoad's
    // body runs, and never changed.
    match unsafe { raw::RedisModule_CreateCommand } {
        // SAFETY: `ctx` is OnLoad's valid ctx (the caller's guarantee); the
        // name and flags are NUL-terminated statics; `d.handler` is an
        // `api::entry!` command function.
        Some(create) => (unsafe { create(ctx, d.name.as_ptr(), d.handler, d.flags.as_ptr(), k, k, k) }) == ffi::OK,
        None => false,
    }
}

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    // Refuse to load, naming it, if the server lacks an API function the
    // module calls without a fallback.
    if let Some(name) = ffi::first_missing(ffi::REQUIRED) {
        // SAFETY: the pointer is set by RedisModule_Init and never changed.
        if unsafe { raw::RedisModule_Log }.is_some() {
            ctx.log_warning(&format!("ratelimit: not loading: the server lacks {name}, which the module requires"));
        }
        return Status::Err;
    }
    if !types::publish_type_pointers() {
        return Status::Err;
    }
    // SAFETY: `raw_ctx` is the valid ctx the server passed to this OnLoad.
    let ok = cmdinfo::COMMANDS.iter().all(|d| unsafe { create_command(raw_ctx, d) });
    if !ok {
        return Status::Err;
    }
    // COMMAND DOCS, key specs, ACL categories (each where the server has it).
    // SAFETY: OnLoad's valid ctx, single-threaded, after the commands are
    // created.
    if !unsafe { cmdinfo::register(raw_ctx) } {
        return Status::Err;
    }
    // HANDLE_IO_ERRORS: a truncated RESTORE payload makes rdb_load see an
    // error instead of aborting the server. NO_IMPLICIT_SIGNAL_MODIFIED: only
    // calls that really write signal the key as modified. Valkey 9's atomic
    // slot migration: only where listeners.rs keeps effects on during exports.
    // On Valkey, replicating an effect skips the command-name lookup.
    let mut options =
        (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as c_int;
    // SAFETY: OnLoad's valid ctx, on the main thread, at load (once).
    if unsafe { listeners::init(raw_ctx) } {
        options |= listeners::OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    // SAFETY: in OnLoad, after RedisModule_Init set the API pointers.
    if unsafe { ffi::server_is_valkey() } {
        options |= ffi::VALKEY_OPTIONS_SKIP_COMMAND_VALIDATION;
    }
    // SAFETY: SetModuleOptions is required (checked above); OnLoad's valid ctx.
    unsafe { ffi::api!(RedisModule_SetModuleOptions)(raw_ctx, options) };
    // MEMORY USAGE's share of a key the server does not count: measured with
    // probe keys of the registered types (after the options, so that closing
    // them signals no modified key to WATCH or client tracking).
    // SAFETY: OnLoad's valid ctx, at load, after the data types are registered.
    unsafe { memusage::init(raw_ctx) };
    // SAFETY: the pointer is set by RedisModule_Init and never changed;
    // OnLoad's valid ctx; `stats::info` has the INFO callback's signature.
    if let Some(register_info) = unsafe { raw::RedisModule_RegisterInfoFunc } {
        unsafe { register_info(raw_ctx, Some(stats::info)) };
    }
    Status::Ok
}

redis_module! {
    name: "ratelimit",
    version: cmdinfo::MODULE_VERSION,
    allocator: (crate::alloc::ModuleAlloc, crate::alloc::ModuleAlloc),
    data_types: [TOKENBUCKET_TYPE, SLIDINGLOG_TYPE, SLIDINGCOUNTER_TYPE],
    init: init,
}
