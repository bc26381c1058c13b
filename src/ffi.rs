//! The raw module API's presence checks and constants. The safe wrappers
//! over it are in `api/` (the request path's in `api/mod.rs`): the crate's
//! convenience layer allocates (a `Vec<RedisString>` of arguments,
//! `RedisValue` replies), and a rate limiter answers every request.
//!
//! Every API function the module calls is either in [`REQUIRED`] (the module
//! refuses to load, naming the function, unless the server provides all of
//! them: see [`first_missing`]) or in [`OPTIONAL`] (probed where used, with a
//! fallback that keeps the same behaviour). So a required pointer is never
//! absent at run time, and `api!` reads it without a check; a test keeps the
//! lists and the code in step.

use std::ffi::{c_int, c_void, CStr};

use redis_module::raw;

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

/// An API function pointer, read where it may be absent (`None`): the
/// optional ones ([`OPTIONAL`]), or a required one read with a check.
macro_rules! opt {
    ($name:ident) => {
        // SAFETY: the API pointers are written once, by RedisModule_Init in
        // OnLoad before any other module code runs, and never again; the
        // server calls the module on its main thread (the module starts no
        // thread), so this read races with no write.
        unsafe { redis_module::raw::$name }
    };
}
pub(crate) use opt;

/// `(name, present)` for a table of API functions.
pub type ApiTable = [(&'static str, fn() -> bool)];

macro_rules! table {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), || opt!($name).is_some())),*]
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
    RedisModule_StringDMA,
    RedisModule_ModuleTypeGetType,
    RedisModule_ModuleTypeGetValue,
    RedisModule_ModuleTypeSetValue,
    RedisModule_SetAbsExpire,
    RedisModule_SetExpire,
    RedisModule_SignalModifiedKey,
    RedisModule_NotifyKeyspaceEvent,
    RedisModule_ReplicateVerbatim,
    RedisModule_Replicate,
    RedisModule_DeleteKey,
    RedisModule_IsKeysPositionRequest,
    RedisModule_KeyAtPosWithFlags,
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
    // COMMAND DOCS and key specs (cmdinfo/)
    RedisModule_GetCommand,
    RedisModule_SetCommandInfo,
];

/// API functions used only where the server has them: the cached command
/// time (Redis 7.2+, Valkey; `clock.rs`), the name lookup that tells Valkey's
/// events apart (`listeners.rs`), ACL categories (Redis 7.4+, Valkey 8+;
/// `cmdinfo/`).
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
pub fn server_is_valkey() -> bool {
    let Some(get_api) = opt!(RedisModule_GetApi) else { return false };
    let mut f: *mut c_void = std::ptr::null_mut();
    // SAFETY: GetApi reads a NUL-terminated name and writes one pointer to
    // `f`, a live local of the type it expects.
    (unsafe { get_api(c"ValkeyModule_SubscribeToServerEvent".as_ptr(), (&raw mut f).cast::<c_void>()) }) == OK
        && !f.is_null()
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

    /// Every API function the module's sources read (through `raw::`,
    /// `opt!` or `api!`) is in REQUIRED or OPTIONAL, and no OPTIONAL one is read with
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
                let via_opt = before.ends_with("opt!(");
                if !(via_api || via_raw || via_opt) {
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
