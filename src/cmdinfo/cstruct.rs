//! The C structs `SetCommandInfo` reads, built from the table's rows: the
//! argument arrays and key specs (the server copies everything it is given).

use std::ffi::{c_int, CStr};
use std::ptr;

use redis_module::raw::{
    self, RedisModuleCommandArg, RedisModuleCommandHistoryEntry, RedisModuleCommandInfo, RedisModuleCommandInfoVersion,
    RedisModuleCommandKeySpec,
};

use super::dsl::{Arg, Ty};
use super::{Doc, Keys};

/// A command's docs and key specs as `SetCommandInfo` reads them: the info
/// and the arrays its pointers point into (argument tree, key specs,
/// history), each list terminated as the API expects. Built only by
/// [`CommandInfo::new`], so every pointer in it is valid while it lives
/// (moving it moves no array: they are on the heap).
pub struct CommandInfo {
    info: RedisModuleCommandInfo,
    _args: Vec<Vec<RedisModuleCommandArg>>,
    _specs: Vec<RedisModuleCommandKeySpec>,
    _history: Vec<RedisModuleCommandHistoryEntry>,
}

impl CommandInfo {
    pub fn new(d: &Doc) -> Self {
        let mut store = Vec::new();
        let args = c_args(d.args, &mut store);
        let mut specs = key_specs(d.keys, d.key_flags);
        let mut history: Vec<RedisModuleCommandHistoryEntry> = d
            .history
            .iter()
            .map(|(since, changes)| RedisModuleCommandHistoryEntry { since: since.as_ptr(), changes: changes.as_ptr() })
            .collect();
        history.push(RedisModuleCommandHistoryEntry { since: ptr::null(), changes: ptr::null() });
        let info = RedisModuleCommandInfo {
            version: &INFO_VERSION,
            summary: d.summary.as_ptr(),
            complexity: d.complexity.as_ptr(),
            since: d.since.as_ptr(),
            history: if d.history.is_empty() { ptr::null_mut() } else { history.as_mut_ptr() },
            tips: ptr::null(),
            // 0 keeps the arity given at creation (any); RL.MULTI's
            // shortest call is `RL.MULTI 1 key SLIDINGLOG limit window_ms`.
            arity: match d.keys {
                Keys::First => 0,
                Keys::NumKeys => -6,
            },
            key_specs: specs.as_mut_ptr(),
            args,
        };
        CommandInfo { info, _args: store, _specs: specs, _history: history }
    }

    /// The info, for `SetCommandInfo`.
    pub fn raw(&self) -> &RedisModuleCommandInfo {
        &self.info
    }
}

/// The layout this crate was compiled with; the server reads each array
/// with these element sizes, so older and newer servers both read it right.
static INFO_VERSION: RedisModuleCommandInfoVersion = RedisModuleCommandInfoVersion {
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
fn c_args(args: &[Arg], store: &mut Vec<Vec<RedisModuleCommandArg>>) -> *mut RedisModuleCommandArg {
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
    // The array terminator: an entry without a name.
    out.push(RedisModuleCommandArg {
        name: ptr::null(),
        type_: 0,
        key_spec_index: 0,
        token: ptr::null(),
        summary: ptr::null(),
        since: ptr::null(),
        flags: 0,
        deprecated_since: ptr::null(),
        subargs: ptr::null_mut(),
        display_text: ptr::null(),
    });
    let p = out.as_mut_ptr();
    store.push(out);
    p
}

fn key_specs(keys: Keys, flags: u32) -> Vec<RedisModuleCommandKeySpec> {
    let mut spec = no_key_spec();
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
    vec![spec, no_key_spec()]
}

/// A key spec of zeros: the array's terminator (BS_INVALID), and the
/// start of every spec. Each union is written through its largest member,
/// so that no byte of it but padding is left unset.
fn no_key_spec() -> RedisModuleCommandKeySpec {
    RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: 0,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INVALID,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            keyword: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_2 { keyword: ptr::null(), startfrom: 0 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_OMITTED,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 { lastkey: 0, keystep: 0, limit: 0 },
        },
    }
}
