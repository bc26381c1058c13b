//! The C structs `SetCommandInfo` reads, built from the table's rows: the
//! argument arrays and key specs (the server copies everything it is given).

use std::ffi::{c_int, CStr};
use std::ptr;

use redis_module::raw::{
    self, RedisModuleCommandArg, RedisModuleCommandHistoryEntry, RedisModuleCommandInfoVersion, RedisModuleCommandKeySpec,
};

use super::dsl::{Arg, Ty};
use super::Keys;

/// The layout this crate was compiled with; the server reads each array
/// with these element sizes, so older and newer servers both read it right.
pub(super) static INFO_VERSION: RedisModuleCommandInfoVersion = RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<RedisModuleCommandArg>(),
};

fn opt(s: Option<&'static CStr>) -> *const std::ffi::c_char {
    s.map_or(ptr::null(), CStr::as_ptr)
}

/// The C array for `args` (terminated by a zeroed entry), its sub-arrays
/// kept alive in `store` (the server copies everything it is given).
pub(super) fn c_args(args: &[Arg], store: &mut Vec<Vec<RedisModuleCommandArg>>) -> *mut RedisModuleCommandArg {
    let mut out: Vec<RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
    let mut key_index = 0;
    for a in args {
        let subargs = if a.sub.is_empty() { ptr::null_mut() } else { c_args(a.sub, store) };
        let (type_, key_spec_index) = match a.ty {
            Ty::Key => {
                key_index += 1;
                (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY, key_index - 1)
            }
            Ty::Int => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER, -1),
            Ty::Str => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING, -1),
            Ty::Token => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN, -1),
            Ty::OneOf => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF, -1),
            Ty::Block => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK, -1),
        };
        let mut flags = raw::REDISMODULE_CMD_ARG_NONE;
        if a.optional {
            flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
        }
        if a.multiple {
            flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
        }
        out.push(RedisModuleCommandArg {
            name: a.name.as_ptr(),
            type_,
            key_spec_index,
            token: opt(a.token),
            summary: opt(a.summary),
            since: opt(a.since),
            flags: flags as c_int,
            deprecated_since: ptr::null(),
            subargs,
            display_text: opt(a.display),
        });
    }
    // SAFETY: all-zero is the array terminator (name NULL) and a valid value
    // of this plain C struct.
    out.push(unsafe { std::mem::zeroed() });
    let p = out.as_mut_ptr();
    store.push(out);
    p
}

pub(super) fn key_specs(keys: Keys, flags: u32) -> Vec<RedisModuleCommandKeySpec> {
    // SAFETY: zeroed is a valid key spec (and the terminator: BS_INVALID).
    let mut spec: RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    spec.flags = u64::from(flags);
    match keys {
        Keys::First => {
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            spec.bs.index.pos = 1;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            spec.fk.range.lastkey = 0;
            spec.fk.range.keystep = 1;
            spec.fk.range.limit = 0;
        }
        Keys::NumKeys => {
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            spec.bs.index.pos = 1;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            spec.fk.keynum.keynumidx = 0;
            spec.fk.keynum.firstkey = 1;
            spec.fk.keynum.keystep = 1;
        }
    }
    vec![spec, unsafe { std::mem::zeroed() }]
}
