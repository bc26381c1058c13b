//! What the server tells users about the commands: `COMMAND DOCS` (summary,
//! since, complexity, group, the argument tree that `redis-cli` turns into
//! hints), key specs (`COMMAND GETKEYS`, cluster routing, ACL key patterns),
//! ACL categories, and the module version.
//!
//! Everything here runs once, at load. Each API is used only when the
//! server offers its function pointer (never decided from the version
//! number: Valkey answers 9.x to `GetServerVersion`):
//! - `SetCommandInfo` (Redis 7.0+, Valkey): docs and key specs;
//! - `SetCommandACLCategories` (Redis 7.2+, Valkey 8+): the standard
//!   categories `write`/`fast`/`slow`/`dangerous`;
//! - `AddACLCategory` (Redis 7.4+, Valkey 8+): the `ratelimit` category with
//!   the user-facing commands in it, so `ACL SETUSER app +@ratelimit` grants
//!   them and nothing else. `RL.STATE` (which sets any limiter's state) stays
//!   out of it.
//!
//! What was available is shown in `INFO ratelimit` (section
//! `ratelimit_module`).

use std::ffi::{c_int, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_module::raw::{
    self, RedisModuleCommandArg, RedisModuleCommandHistoryEntry, RedisModuleCommandInfo, RedisModuleCommandInfoVersion,
    RedisModuleCommandKeySpec, RedisModuleCtx, RedisModuleInfoCtx,
};

/// `major * 10000 + minor * 100 + patch` of the crate version, as
/// `MODULE LIST` shows it (0.2.0 → 200).
pub const MODULE_VERSION: c_int = {
    let v = parse_u32(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
        + parse_u32(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + parse_u32(env!("CARGO_PKG_VERSION_PATCH"));
    assert!(v <= i32::MAX as u32);
    v as c_int
};

/// The crate version as text, for INFO.
pub const VERSION_TEXT: &CStr = {
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("crate version contains a NUL"),
    }
};

/// A decimal number at compile time; each version part is below 100 so the
/// packed number stays unambiguous.
const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    assert!(!b.is_empty());
    let mut v = 0u32;
    let mut i = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit());
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    assert!(v < 100);
    v
}

// ---------------------------------------------------------------------------
// The command descriptions.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Ty {
    Key,
    Int,
    Str,
    Token,
    /// Exactly one of the sub-arguments.
    OneOf,
    /// The sub-arguments together (after the token, if any).
    Block,
}

/// One argument of a command's tree (`RedisModuleCommandArg` without the
/// pointers, so it can be a `static`).
#[derive(Clone, Copy)]
struct Arg {
    name: &'static CStr,
    ty: Ty,
    /// The keyword before the value (`COST n`), or the whole pure token.
    token: Option<&'static CStr>,
    summary: Option<&'static CStr>,
    since: Option<&'static CStr>,
    /// What `redis-cli` shows for the value (`n` in `[COST n]`).
    display: Option<&'static CStr>,
    optional: bool,
    multiple: bool,
    sub: &'static [Arg],
}

const fn arg(name: &'static CStr, ty: Ty) -> Arg {
    Arg { name, ty, token: None, summary: None, since: None, display: None, optional: false, multiple: false, sub: &[] }
}
const fn key(name: &'static CStr) -> Arg {
    arg(name, Ty::Key)
}
const fn int(name: &'static CStr, summary: &'static CStr) -> Arg {
    Arg { summary: Some(summary), ..arg(name, Ty::Int) }
}
/// `[TOKEN display]`: an optional keyword with an integer.
const fn opt_int(name: &'static CStr, token: &'static CStr, display: &'static CStr, summary: &'static CStr) -> Arg {
    Arg { token: Some(token), summary: Some(summary), display: Some(display), optional: true, ..arg(name, Ty::Int) }
}
/// `[TOKEN]`: an optional flag.
const fn opt_flag(name: &'static CStr, token: &'static CStr, summary: &'static CStr) -> Arg {
    Arg { token: Some(token), summary: Some(summary), optional: true, ..arg(name, Ty::Token) }
}

const COST: Arg = opt_int(c"cost", c"COST", c"n", c"units this call asks for (default 1; 0 only reports)");
const PARTIAL: Arg = opt_flag(c"partial", c"PARTIAL", c"grant as many units as are available, up to COST");
const DRYRUN: Arg = opt_flag(c"dryrun", c"DRYRUN", c"reply as the call would, write nothing");
const REFUND: Arg =
    Arg { since: Some(c"0.2.0"), ..opt_int(c"refund", c"REFUND", c"n", c"give n units back instead of taking any") };

/// The options after a single command's numbers: a grant with its options,
/// or a refund, which takes none of them.
static GRANT: [Arg; 3] = [COST, PARTIAL, DRYRUN];
static MODE: [Arg; 2] = [Arg { sub: &GRANT, ..arg(c"grant", Ty::Block) }, Arg { optional: false, ..REFUND }];
const OPTIONS: Arg = Arg { optional: true, sub: &MODE, ..arg(c"mode", Ty::OneOf) };

static TOKENBUCKET_ARGS: [Arg; 5] = [
    key(c"key"),
    int(c"capacity", c"most tokens the bucket holds (it starts full)"),
    int(c"rate", c"tokens regained every period_ms"),
    int(c"period_ms", c"the refill period in milliseconds"),
    OPTIONS,
];
static SLIDINGLOG_ARGS: [Arg; 4] = [
    key(c"key"),
    int(c"limit", c"most units granted in any window"),
    int(c"window_ms", c"the window in milliseconds"),
    OPTIONS,
];
static SLIDINGCOUNTER_ARGS: [Arg; 4] = [
    key(c"key"),
    int(c"limit", c"most units granted in a window (estimated)"),
    int(c"window_ms", c"the window in milliseconds, aligned on the server's clock"),
    OPTIONS,
];

// RL.MULTI numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL] [DRYRUN] | [REFUND n]
//   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
//          | SLIDINGLOG limit window_ms [WEIGHT w]
//          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
const WEIGHT: Arg = opt_int(c"weight", c"WEIGHT", c"w", c"units one request takes from this limit (default 1)");
static MULTI_TOKENBUCKET: [Arg; 4] = [
    int(c"capacity", c"most tokens the bucket holds"),
    int(c"rate", c"tokens regained every period_ms"),
    int(c"period_ms", c"the refill period in milliseconds"),
    WEIGHT,
];
static MULTI_SLIDINGLOG: [Arg; 3] =
    [int(c"limit", c"most units granted in any window"), int(c"window_ms", c"the window in milliseconds"), WEIGHT];
static MULTI_SLIDINGCOUNTER: [Arg; 3] =
    [int(c"limit", c"most units granted in a window (estimated)"), int(c"window_ms", c"the window in milliseconds"), WEIGHT];
static MULTI_LIMIT: [Arg; 3] = [
    Arg { token: Some(c"TOKENBUCKET"), sub: &MULTI_TOKENBUCKET, ..arg(c"tokenbucket", Ty::Block) },
    Arg { token: Some(c"SLIDINGLOG"), sub: &MULTI_SLIDINGLOG, ..arg(c"slidinglog", Ty::Block) },
    Arg { token: Some(c"SLIDINGCOUNTER"), sub: &MULTI_SLIDINGCOUNTER, ..arg(c"slidingcounter", Ty::Block) },
];
static MULTI_GRANT: [Arg; 3] =
    [opt_int(c"cost", c"COST", c"n", c"requests this call asks for; each limit takes COST x WEIGHT units"), PARTIAL, DRYRUN];
static MULTI_MODE: [Arg; 2] = [
    Arg { sub: &MULTI_GRANT, ..arg(c"grant", Ty::Block) },
    Arg {
        optional: false,
        ..opt_int(c"refund", c"REFUND", c"n", c"give n requests back to every limit (n x WEIGHT units)")
    },
];
static MULTI_ARGS: [Arg; 4] = [
    int(c"numkeys", c"the number of keys and of limits, 1 to 16"),
    Arg { multiple: true, ..key(c"key") },
    Arg { multiple: true, summary: Some(c"one per key, in the same order"), sub: &MULTI_LIMIT, ..arg(c"limit", Ty::OneOf) },
    Arg { optional: true, sub: &MULTI_MODE, ..arg(c"mode", Ty::OneOf) },
];

static STATE_ARGS: [Arg; 2] =
    [key(c"key"), Arg { summary: Some(c"a versioned state payload with its absolute expiry"), ..arg(c"payload", Ty::Str) }];

/// How a command's keys are found.
#[derive(Clone, Copy)]
enum Keys {
    /// The key is argument 1.
    First,
    /// Argument 1 is numkeys, the keys follow it (RL.MULTI, arity −6).
    NumKeys,
}

struct Doc {
    name: &'static CStr,
    summary: &'static CStr,
    complexity: &'static CStr,
    since: &'static CStr,
    args: &'static [Arg],
    keys: Keys,
    key_flags: u32,
    /// Standard ACL categories (all servers with `SetCommandACLCategories`).
    acl: &'static CStr,
    /// In the `ratelimit` category where the server can add it.
    user_facing: bool,
    /// (since, what changed), oldest first.
    history: &'static [(&'static CStr, &'static CStr)],
}

static REFUND_ADDED: [(&CStr, &CStr); 1] = [(c"0.2.0", c"Added the `REFUND n` option.")];

/// Like INCR: reads the state (ACCESS: the reply shows it) and updates it
/// in place, creating it when absent.
const LIMITER_KEY: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
/// Like RESTORE: replaces the whole value without reading it.
const STATE_KEY: u32 = raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// The single-limit commands are O(1); the sliding log amortized O(1).
const LIMITER_ACL: &CStr = c"write fast";

static DOCS: [Doc; 5] = [
    Doc {
        name: c"RL.TOKENBUCKET",
        summary: c"Takes COST tokens from a token bucket that refills continuously; replies allowed, limit, remaining, retry_after_ms, reset_after_ms.",
        complexity: c"O(1)",
        since: c"0.1.0",
        args: &TOKENBUCKET_ARGS,
        keys: Keys::First,
        key_flags: LIMITER_KEY,
        acl: LIMITER_ACL,
        user_facing: true,
        history: &REFUND_ADDED,
    },
    Doc {
        name: c"RL.SLIDINGLOG",
        summary: c"Grants COST units when the units granted in the last window_ms plus COST stay within limit (exact log); replies allowed, limit, remaining, retry_after_ms, reset_after_ms.",
        complexity: c"O(1) amortized: each grant is appended once and dropped once",
        since: c"0.1.0",
        args: &SLIDINGLOG_ARGS,
        keys: Keys::First,
        key_flags: LIMITER_KEY,
        acl: LIMITER_ACL,
        user_facing: true,
        history: &REFUND_ADDED,
    },
    Doc {
        name: c"RL.SLIDINGCOUNTER",
        summary: c"Grants COST units when the sliding-window estimate from the current and previous fixed windows plus COST stays within limit; replies allowed, limit, remaining, retry_after_ms, reset_after_ms.",
        complexity: c"O(1)",
        since: c"0.1.0",
        args: &SLIDINGCOUNTER_ARGS,
        keys: Keys::First,
        key_flags: LIMITER_KEY,
        acl: LIMITER_ACL,
        user_facing: true,
        history: &REFUND_ADDED,
    },
    Doc {
        name: c"RL.MULTI",
        summary: c"Decides several limits (TOKENBUCKET capacity rate period_ms | SLIDINGLOG limit window_ms | SLIDINGCOUNTER limit window_ms, each [WEIGHT w], one per key) in one atomic step: all or nothing; replies the five fields of the binding limit, its index, and each limit's reply.",
        complexity: c"O(N) where N is the number of limits (each as its single command)",
        since: c"0.2.0",
        args: &MULTI_ARGS,
        keys: Keys::NumKeys,
        key_flags: LIMITER_KEY,
        acl: LIMITER_ACL,
        user_facing: true,
        history: &[],
    },
    Doc {
        name: c"RL.STATE",
        summary: c"Sets a limiter key to a given state and absolute expiry: the effect a grant replicates, and the AOF rewrite. Not for applications: it can set any limiter to any state.",
        complexity: c"O(N) where N is the size of the payload",
        since: c"0.1.0",
        args: &STATE_ARGS,
        keys: Keys::First,
        key_flags: STATE_KEY,
        // Like RESTORE.
        acl: c"write slow dangerous",
        user_facing: false,
        history: &[],
    },
];

/// The ACL category of the user-facing commands.
pub const CATEGORY: &CStr = c"ratelimit";

// ---------------------------------------------------------------------------
// What the server offered, for INFO.
// ---------------------------------------------------------------------------

static DOCS_SET: AtomicBool = AtomicBool::new(false);
static ACL_SET: AtomicBool = AtomicBool::new(false);
static CATEGORY_SET: AtomicBool = AtomicBool::new(false);

/// The `ratelimit_module` INFO section: version and which of the optional
/// APIs the server offered at load.
pub unsafe fn info_section(ctx: *mut RedisModuleInfoCtx) {
    let (Some(section), Some(num), Some(text)) =
        (raw::RedisModule_InfoAddSection, raw::RedisModule_InfoAddFieldULongLong, raw::RedisModule_InfoAddFieldCString)
    else {
        return;
    };
    section(ctx, c"module".as_ptr());
    text(ctx, c"version".as_ptr(), VERSION_TEXT.as_ptr().cast_mut());
    num(ctx, c"version_num".as_ptr(), MODULE_VERSION as u64);
    num(ctx, c"command_docs".as_ptr(), u64::from(DOCS_SET.load(Relaxed)));
    num(ctx, c"acl_categories".as_ptr(), u64::from(ACL_SET.load(Relaxed)));
    num(ctx, c"acl_category_ratelimit".as_ptr(), u64::from(CATEGORY_SET.load(Relaxed)));
}

// ---------------------------------------------------------------------------
// Registration.
// ---------------------------------------------------------------------------

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
    // SAFETY: all-zero is the array terminator (name NULL) and a valid value
    // of this plain C struct.
    out.push(unsafe { std::mem::zeroed() });
    let p = out.as_mut_ptr();
    store.push(out);
    p
}

fn key_specs(keys: Keys, flags: u32) -> Vec<RedisModuleCommandKeySpec> {
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

unsafe fn log_warning(ctx: *mut RedisModuleCtx, msg: &CStr) {
    if let Some(log) = raw::RedisModule_Log {
        log(ctx, c"warning".as_ptr(), c"%s".as_ptr(), msg.as_ptr());
    }
}

/// Docs, key specs and ACL categories for every registered command. Call
/// from OnLoad after the commands are created. Returns false (the module
/// then refuses to load) only when the server offers an API and refuses a
/// description this module got wrong.
pub unsafe fn register(ctx: *mut RedisModuleCtx) -> bool {
    let Some(get_command) = raw::RedisModule_GetCommand else {
        return true;
    };
    // The category; after MODULE UNLOAD and LOAD it already exists (the
    // server cannot remove it), which the command flags below then use.
    let category = match raw::RedisModule_AddACLCategory {
        Some(add) => {
            add(ctx, CATEGORY.as_ptr());
            true
        }
        None => false,
    };
    let mut docs_ok = true;
    let mut acl_ok = true;
    let mut category_ok = category;
    for d in &DOCS {
        let cmd = get_command(ctx, d.name.as_ptr());
        if cmd.is_null() {
            log_warning(ctx, c"ratelimit: a command to describe is not registered");
            return false;
        }
        if let Some(set_info) = raw::RedisModule_SetCommandInfo {
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
            if set_info(cmd, &info) != crate::ffi::OK {
                log_warning(ctx, c"ratelimit: the server refused a command's COMMAND DOCS / key specs");
                return false;
            }
        } else {
            docs_ok = false;
        }
        if let Some(set_acl) = raw::RedisModule_SetCommandACLCategories {
            let mut ok = false;
            if category && d.user_facing {
                let with_category = format!("{} {}", CATEGORY.to_string_lossy(), d.acl.to_string_lossy());
                let with_category = std::ffi::CString::new(with_category).unwrap_or_default();
                ok = set_acl(cmd, with_category.as_ptr()) == crate::ffi::OK;
                category_ok &= ok;
            }
            if !ok && set_acl(cmd, d.acl.as_ptr()) != crate::ffi::OK {
                log_warning(ctx, c"ratelimit: the server refused a command's ACL categories");
                return false;
            }
        } else {
            acl_ok = false;
        }
    }
    DOCS_SET.store(docs_ok, Relaxed);
    ACL_SET.store(acl_ok, Relaxed);
    CATEGORY_SET.store(category_ok && acl_ok, Relaxed);
    true
}
