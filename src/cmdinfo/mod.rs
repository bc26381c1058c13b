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
//!
//! # Parts
//!
//! - this file: the command table ([`COMMANDS`]: name, handler, flags, first
//!   key, docs, key specs, ACL categories; `lib.rs` registers each row) and
//!   [`register`], which describes each command to the server;
//! - `dsl.rs`: the argument-tree DSL of the docs;
//! - `cstruct.rs`: the C structs built from a row;
//! - `version.rs`: the version packing;
//! - `info.rs`: the INFO section.

mod cstruct;
mod dsl;
mod info;
mod version;

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use ratelimit_core::catalogue::Kind;
use redis_module::raw;

use crate::api::Ctx;
use crate::ffi::opt;

use self::cstruct::CommandInfo;
use self::dsl::{arg, int, key, opt_flag, opt_int, Arg, Ty};
pub use self::info::info_section;
use self::info::{ACL_SET, CATEGORY_SET, DOCS_SET};
pub use self::version::MODULE_VERSION;

const COST: Arg = opt_int(c"cost", c"COST", c"n", c"units this call asks for (default 1; 0 only reports)");
const PARTIAL: Arg = opt_flag(c"partial", c"PARTIAL", c"grant as many units as are available, up to COST");
const DRYRUN: Arg = opt_flag(c"dryrun", c"DRYRUN", c"reply as the call would, write nothing");
const FORCE: Arg = Arg {
    since: Some(c"0.3.0"),
    ..opt_flag(c"force", c"FORCE", c"a debit: take all COST units even past the limit, leaving a debt (not with PARTIAL)")
};
const REFUND: Arg =
    Arg { since: Some(c"0.2.0"), ..opt_int(c"refund", c"REFUND", c"n", c"give n units back instead of taking any") };

/// The options after a single command's numbers: a grant with its options,
/// or a refund, which takes none of them.
static GRANT: [Arg; 4] = [COST, PARTIAL, FORCE, DRYRUN];
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
const FROMFIRST: Arg = Arg {
    since: Some(c"0.3.0"),
    ..opt_flag(c"fromfirst", c"FROMFIRST", c"start each window at its first grant, not on a multiple of window_ms")
};
static FIXEDWINDOW_ARGS: [Arg; 5] = [
    key(c"key"),
    int(c"limit", c"most units granted in a window"),
    int(c"window_ms", c"the window in milliseconds, aligned on the server's clock (or from the first grant)"),
    OPTIONS,
    FROMFIRST,
];

// RL.MULTI numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL] [DRYRUN] | [REFUND n]
//   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
//          | SLIDINGLOG limit window_ms [WEIGHT w]
//          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
//          | FIXEDWINDOW limit window_ms [WEIGHT w] [FROMFIRST]
//          | CONCURRENCY limit lease_ms id [WEIGHT w]
//   each limit then [CHECK] [SHADOW] (not with REFUND)
const WEIGHT: Arg = opt_int(c"weight", c"WEIGHT", c"w", c"units one request takes from this limit (default 1)");
const CHECK: Arg = Arg {
    since: Some(c"0.3.0"),
    ..opt_flag(c"check", c"CHECK", c"take nothing from this limit; deny the call when its units do not fit")
};
const SHADOW: Arg = Arg {
    since: Some(c"0.3.0"),
    ..opt_flag(c"shadow", c"SHADOW", c"never deny the call; on a grant take this limit's units only if they fit")
};
static MULTI_TOKENBUCKET: [Arg; 6] = [
    int(c"capacity", c"most tokens the bucket holds"),
    int(c"rate", c"tokens regained every period_ms"),
    int(c"period_ms", c"the refill period in milliseconds"),
    WEIGHT,
    CHECK,
    SHADOW,
];
static MULTI_SLIDINGLOG: [Arg; 5] = [
    int(c"limit", c"most units granted in any window"),
    int(c"window_ms", c"the window in milliseconds"),
    WEIGHT,
    CHECK,
    SHADOW,
];
static MULTI_SLIDINGCOUNTER: [Arg; 5] = [
    int(c"limit", c"most units granted in a window (estimated)"),
    int(c"window_ms", c"the window in milliseconds"),
    WEIGHT,
    CHECK,
    SHADOW,
];
static MULTI_FIXEDWINDOW: [Arg; 6] = [
    int(c"limit", c"most units granted in a window"),
    int(c"window_ms", c"the window in milliseconds, aligned on the server's clock (or from the first grant)"),
    WEIGHT,
    FROMFIRST,
    CHECK,
    SHADOW,
];
static MULTI_CONCURRENCY: [Arg; 6] = [
    int(c"limit", c"most units held at once"),
    int(c"lease_ms", c"how long the lease lasts unless renewed or released, in milliseconds"),
    Arg { summary: Some(c"the holder: a grant acquires COST x WEIGHT units for it"), ..arg(c"id", Ty::Str) },
    WEIGHT,
    CHECK,
    SHADOW,
];
static MULTI_LIMIT: [Arg; 5] = [
    Arg { token: Some(c"TOKENBUCKET"), sub: &MULTI_TOKENBUCKET, ..arg(c"tokenbucket", Ty::Block) },
    Arg { token: Some(c"SLIDINGLOG"), sub: &MULTI_SLIDINGLOG, ..arg(c"slidinglog", Ty::Block) },
    Arg { token: Some(c"SLIDINGCOUNTER"), sub: &MULTI_SLIDINGCOUNTER, ..arg(c"slidingcounter", Ty::Block) },
    Arg { token: Some(c"FIXEDWINDOW"), since: Some(c"0.3.0"), sub: &MULTI_FIXEDWINDOW, ..arg(c"fixedwindow", Ty::Block) },
    Arg { token: Some(c"CONCURRENCY"), since: Some(c"0.3.0"), sub: &MULTI_CONCURRENCY, ..arg(c"concurrency", Ty::Block) },
];
static MULTI_GRANT: [Arg; 4] = [
    opt_int(c"cost", c"COST", c"n", c"requests this call asks for; each limit takes COST x WEIGHT units"),
    PARTIAL,
    Arg {
        summary: Some(
            c"a debit: every limit takes COST x WEIGHT even past its limit (not with PARTIAL, CHECK, SHADOW, CONCURRENCY)",
        ),
        ..FORCE
    },
    DRYRUN,
];
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

// RL.CONCURRENCY key limit lease_ms ACQUIRE id [COST n] [PARTIAL] [DRYRUN] | RELEASE id | RENEW id
static ACQUIRE: [Arg; 4] = [
    Arg { summary: Some(c"hold COST units for id until lease_ms from now (a retry renews)"), ..arg(c"id", Ty::Str) },
    COST,
    Arg { summary: Some(c"hold as many units as are free, up to COST"), ..PARTIAL },
    DRYRUN,
];
static CONCURRENCY_ACTION: [Arg; 3] = [
    Arg { token: Some(c"ACQUIRE"), sub: &ACQUIRE, ..arg(c"acquire", Ty::Block) },
    Arg { token: Some(c"RELEASE"), summary: Some(c"free the units id holds (idempotent)"), ..arg(c"release", Ty::Str) },
    Arg { token: Some(c"RENEW"), summary: Some(c"extend id's live lease to lease_ms from now"), ..arg(c"renew", Ty::Str) },
];
static CONCURRENCY_ARGS: [Arg; 4] = [
    key(c"key"),
    int(c"limit", c"most units held at once"),
    int(c"lease_ms", c"how long a lease lasts unless renewed or released, in milliseconds"),
    Arg { sub: &CONCURRENCY_ACTION, ..arg(c"action", Ty::OneOf) },
];

static STATE_ARGS: [Arg; 2] =
    [key(c"key"), Arg { summary: Some(c"a versioned state payload with its absolute expiry"), ..arg(c"payload", Ty::Str) }];

// CL.THROTTLE key max_burst count_per_period period [quantity] (redis-cell's)
static THROTTLE_ARGS: [Arg; 5] = [
    key(c"key"),
    int(c"max_burst", c"units allowed at once beyond the steady rate (the limit is max_burst + 1)"),
    int(c"count_per_period", c"units regained every period"),
    int(c"period", c"the period in seconds"),
    Arg { optional: true, ..int(c"quantity", c"units this call asks for (default 1; 0 only reports)") },
];

/// How a command's keys are found.
#[derive(Clone, Copy)]
enum Keys {
    /// The key is argument 1.
    First,
    /// Argument 1 is numkeys, the keys follow it (RL.MULTI, arity −6).
    NumKeys,
}

/// One row of the command table: what `lib.rs` registers (name, handler,
/// flags, first key) and what the server tells users about it.
pub struct Doc {
    pub name: &'static CStr,
    /// The `extern "C"` function Redis calls (`api::entry!` of a handler).
    pub handler: raw::RedisModuleCmdFunc,
    /// `CreateCommand` flags.
    pub flags: &'static CStr,
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

impl Doc {
    /// `CreateCommand`'s first, last key and step: 1 when the key is the
    /// first argument (Redis Cluster routes on it); 0 when the keys are
    /// declared by a key spec (RL.MULTI).
    pub const fn first_key(&self) -> c_int {
        match self.keys {
            Keys::First => 1,
            Keys::NumKeys => 0,
        }
    }
}

/// Flags of the rate-limit commands: they write, are refused when Redis is
/// out of memory, and are O(1) (amortized for the sliding log).
const RL_FLAGS: &CStr = c"write deny-oom fast";

/// RL.MULTI's: the same, and `getkeys-api`: its keys follow `numkeys`, and
/// the servers' cluster routing (`getNodeByQuery`), client tracking and
/// Valkey's slot precomputation find keys through `getKeysFromCommand`,
/// which reads only a getkeys callback or the legacy (first, last, step)
/// range, never a keynum key spec. Without the flag a cross-slot RL.MULTI
/// runs (seen on Redis 7.0.15, Valkey 8.1.8 and 9.1.2, Redis 8.2.3, where
/// `COMMAND GETKEYS`, which reads the key spec declared here, still finds
/// the keys); test_multi_replication.py's cross-slot test holds this.
const MULTI_FLAGS: &CStr = c"write deny-oom fast getkeys-api";

static REFUND_ADDED: [(&CStr, &CStr); 2] =
    [(c"0.2.0", c"Added the `REFUND n` option."), (c"0.3.0", c"Added the `FORCE` option.")];
static FORCE_ADDED: [(&CStr, &CStr); 1] = [(c"0.3.0", c"Added the `FORCE` option.")];

/// Like INCR: reads the state (ACCESS: the reply shows it) and updates it
/// in place, creating it when absent.
const LIMITER_KEY: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
/// Like RESTORE: replaces the whole value without reading it.
const STATE_KEY: u32 = raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// The single-limit commands are O(1); the sliding log amortized O(1).
const LIMITER_ACL: &CStr = c"write fast";

/// The command table: one row per command.
pub static COMMANDS: [Doc; 7] = [
    Doc {
        name: Kind::TokenBucket.spec().command,
        handler: crate::api::entry!(crate::commands::tokenbucket),
        flags: RL_FLAGS,
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
        name: Kind::SlidingLog.spec().command,
        handler: crate::api::entry!(crate::commands::slidinglog),
        flags: RL_FLAGS,
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
        name: Kind::SlidingCounter.spec().command,
        handler: crate::api::entry!(crate::commands::slidingcounter),
        flags: RL_FLAGS,
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
        name: Kind::FixedWindow.spec().command,
        handler: crate::api::entry!(crate::commands::fixedwindow),
        flags: RL_FLAGS,
        summary: c"Grants COST units when the units granted in the current fixed window (aligned on multiples of window_ms, or from the first grant with FROMFIRST) plus COST stay within limit; replies allowed, limit, remaining, retry_after_ms, reset_after_ms.",
        complexity: c"O(1)",
        since: c"0.3.0",
        args: &FIXEDWINDOW_ARGS,
        keys: Keys::First,
        key_flags: LIMITER_KEY,
        acl: LIMITER_ACL,
        user_facing: true,
        history: &[],
    },
    Doc {
        name: Kind::Concurrency.spec().command,
        handler: crate::api::entry!(crate::commands::concurrency),
        flags: RL_FLAGS,
        summary: c"An in-flight limit with leases: ACQUIRE holds COST units for id (a retry renews), RELEASE frees them, RENEW extends the lease; a lease that lapses frees its units by itself. Replies allowed (units freed for RELEASE), limit, remaining, retry_after_ms, reset_after_ms.",
        complexity: c"O(N) where N is the number of leases held on the key",
        since: c"0.3.0",
        args: &CONCURRENCY_ARGS,
        keys: Keys::First,
        key_flags: LIMITER_KEY,
        acl: LIMITER_ACL,
        user_facing: true,
        history: &[],
    },
    Doc {
        name: c"RL.MULTI",
        handler: crate::api::entry!(crate::commands::multi, keys = crate::commands::multi_keys),
        flags: MULTI_FLAGS,
        summary: c"Decides several limits (TOKENBUCKET capacity rate period_ms | SLIDINGLOG limit window_ms | SLIDINGCOUNTER limit window_ms | FIXEDWINDOW limit window_ms [FROMFIRST] | CONCURRENCY limit lease_ms id, each [WEIGHT w], one per key) in one atomic step: all or nothing; replies the five fields of the binding limit, its index, and each limit's reply.",
        complexity: c"O(N) where N is the number of limits (each as its single command)",
        since: c"0.2.0",
        args: &MULTI_ARGS,
        keys: Keys::NumKeys,
        key_flags: LIMITER_KEY,
        acl: LIMITER_ACL,
        user_facing: true,
        history: &FORCE_ADDED,
    },
    Doc {
        name: c"RL.STATE",
        handler: crate::api::entry!(crate::commands::state),
        flags: c"write deny-oom",
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

/// CL.THROTTLE, redis-cell's command: registered only when the module is
/// loaded with the argument `CL.THROTTLE` ([`enable_throttle`]), since
/// redis-cell registers the same name.
pub static CL_THROTTLE: Doc = Doc {
    name: c"CL.THROTTLE",
    handler: crate::api::entry!(crate::commands::throttle),
    flags: RL_FLAGS,
    summary: c"redis-cell 0.5's GCRA limiter, answered the same way: takes quantity units (default 1); replies limited (0/1), limit (max_burst + 1), remaining, retry_after and reset_after in seconds (retry_after -1 when allowed).",
    complexity: c"O(1)",
    since: c"0.3.0",
    args: &THROTTLE_ARGS,
    keys: Keys::First,
    key_flags: LIMITER_KEY,
    acl: LIMITER_ACL,
    user_facing: true,
    history: &[],
};

static THROTTLE_ENABLED: AtomicBool = AtomicBool::new(false);

/// Register CL.THROTTLE too (the load argument asked for it).
pub fn enable_throttle() {
    THROTTLE_ENABLED.store(true, Relaxed);
}

/// Whether CL.THROTTLE is registered.
pub fn throttle_enabled() -> bool {
    THROTTLE_ENABLED.load(Relaxed)
}

/// Every command this load registers: the table, and CL.THROTTLE when
/// enabled.
fn registered() -> impl Iterator<Item = &'static Doc> {
    COMMANDS.iter().chain(throttle_enabled().then_some(&CL_THROTTLE))
}

/// Create every command of the table (OnLoad). True when the server
/// accepted them all.
pub fn create(ctx: Ctx) -> bool {
    // SAFETY: every handler of the table is an `api::entry!` command
    // function, sound for any call of its command.
    registered().all(|d| unsafe { ctx.create_command(d.name, d.handler, d.flags, d.first_key()) })
}

/// The ACL category of the user-facing commands.
pub const CATEGORY: &CStr = c"ratelimit";

/// Docs, key specs and ACL categories for every registered command. Call
/// from OnLoad (`ctx`) after the commands are created. Returns false (the
/// module then refuses to load) only when the server offers an API and
/// refuses a description this module got wrong.
pub fn register(ctx: Ctx) -> bool {
    if opt!(RedisModule_GetCommand).is_none() {
        return true;
    }
    // The category; after MODULE UNLOAD and LOAD it already exists (the
    // server cannot remove it), which the command flags below then use.
    let category = ctx.add_acl_category(CATEGORY);
    let mut docs_ok = true;
    let mut acl_ok = true;
    let mut category_ok = category;
    for d in registered() {
        let Some(cmd) = ctx.get_command(d.name) else {
            ctx.log(c"warning", c"ratelimit: a command to describe is not registered");
            return false;
        };
        if opt!(RedisModule_SetCommandInfo).is_some() {
            let info = CommandInfo::new(d);
            // SAFETY: every pointer in a `CommandInfo` is valid and every
            // list in it terminated while it lives (cstruct.rs builds it so).
            if unsafe { cmd.set_info(info.raw()) } != Some(true) {
                ctx.log(c"warning", c"ratelimit: the server refused a command's COMMAND DOCS / key specs");
                return false;
            }
        } else {
            docs_ok = false;
        }
        if opt!(RedisModule_SetCommandACLCategories).is_some() {
            let mut ok = false;
            if category && d.user_facing {
                let with_category = format!("{} {}", CATEGORY.to_string_lossy(), d.acl.to_string_lossy());
                let with_category = std::ffi::CString::new(with_category).unwrap_or_default();
                ok = cmd.set_acl_categories(&with_category) == Some(true);
                category_ok &= ok;
            }
            if !ok && cmd.set_acl_categories(d.acl) != Some(true) {
                ctx.log(c"warning", c"ratelimit: the server refused a command's ACL categories");
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

#[cfg(test)]
mod tests {
    use ratelimit_core::catalogue::KINDS;

    use super::COMMANDS;

    /// Every kind of the catalogue has its command in the table: a kind
    /// added to the catalogue fails here until its command is registered.
    #[test]
    fn every_kind_has_its_command() {
        for k in KINDS {
            let name = k.spec().command;
            assert!(COMMANDS.iter().any(|d| d.name == name), "{k:?}: no row for {name:?} in cmdinfo::COMMANDS");
        }
    }
}
