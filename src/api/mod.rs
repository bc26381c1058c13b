//! The safe layer over the raw module API. Every pointer the server hands
//! the module is wrapped once, in its callback's entry, into a [`Handle`]
//! (or an open [`Key`]), and used through safe methods, each a thin
//! `#[inline]` wrapper over one or a few raw `RedisModule_*` calls:
//! - this file: a command call's context ([`Ctx`]), its arguments ([`Str`]),
//!   an open key ([`Key`]) and the reply writers (no allocation, no
//!   formatting: the request path); a handler is a plain safe
//!   `fn(Ctx, &[Str]) -> Replied`, turned into the `extern "C"` function
//!   Redis calls by [`entry!`], which creates the context once, slices the
//!   arguments, keeps the panic guard at the FFI boundary and turns the
//!   [`Replied`] token into the status;
//! - `host.rs`: what load-time and timer code asks of the server through a
//!   [`Ctx`] (registration, options, events, timers, logging, INFO fields,
//!   strings the module owns, `MEMORY USAGE`);
//! - `io.rs`: the data-type callbacks' handles (RDB and AOF [`Io`],
//!   [`Digest`]) and the INFO callback's [`InfoCtx`].
//!
//! The raw API is reached here and in `ffi.rs` (the presence checks) only.

mod host;
mod io;

pub use self::host::{CallReply, OwnedString};
pub use self::io::{Digest, InfoCtx, Io};

use std::ffi::{c_char, c_int, c_long, c_longlong, c_void, CStr};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString, RedisModuleType};

use crate::ffi::{api, OK};

/// Largest absolute expiry we hand to Redis (ms since the epoch, ~146
/// million years): far beyond any real reset, and `mstime() + ttl` cannot
/// overflow inside Redis.
const MAX_EXPIRE_MS: u64 = 1 << 62;

/// A pointer the server handed to the running callback (a command call,
/// OnLoad, a timer, an RDB or AOF callback, INFO), valid until it returns
/// (`'a`): made once, in the callback's entry ([`Handle::from_raw`]), and
/// used through the safe methods of its kind. `repr(transparent)`: a
/// call's `argv` is a `[Str]`.
#[repr(transparent)]
pub struct Handle<'a, T> {
    raw: *mut T,
    _call: PhantomData<&'a T>,
}

impl<T> Clone for Handle<'_, T> {
    #[inline]
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<'_, T> {}

impl<T> Handle<'_, T> {
    /// Wrap a pointer the server passed to the running callback.
    ///
    /// # Safety
    ///
    /// `raw` is the valid pointer of its kind that the server passed to the
    /// callback running now on the main thread, valid for the handle's
    /// lifetime, which does not outlive the callback.
    #[inline]
    pub unsafe fn from_raw(raw: *mut T) -> Self {
        Handle { raw, _call: PhantomData }
    }
}

/// A context the server passed to the running callback: a command call's
/// (where the reply and key methods are used), OnLoad's or a timer's.
pub type Ctx<'a> = Handle<'a, RedisModuleCtx>;

/// One argument of the call (a `RedisModuleString` Redis owns for the
/// call's duration), or a string this module owns ([`OwnedString`]).
pub type Str<'a> = Handle<'a, RedisModuleString>;

/// Proof that the call's reply was sent: only the reply methods of this
/// module make one (its field is private), so a handler, which must return
/// one, cannot return without answering. A failure before the reply is an
/// `Err(Replied)` (the error reply is sent). Zero-sized: it costs nothing.
#[must_use = "a handler returns the token of its reply"]
pub struct Replied(());

/// The `extern "C"` command function Redis registers for the safe handler
/// `$f: fn(Ctx, &[Str]) -> Replied`.
macro_rules! entry {
    ($f:path) => {{
        /// The command function Redis calls for this command.
        ///
        /// # Safety
        ///
        /// Only Redis calls this, as a registered command function: `ctx` is
        /// the call's context and `argv` its `argc` argument strings, all
        /// valid until it returns.
        unsafe extern "C" fn entry(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            // SAFETY: Redis calls a command function with the call's
            // context and its `argc` arguments in `argv`, all valid until it
            // returns.
            let (ctx, args) = unsafe { $crate::api::call_args(ctx, argv, argc) };
            $crate::api::run(ctx, args, $f)
        }
        Some(entry as _)
    }};
    // A command registered with `getkeys-api`: `$keys`, a safe
    // `fn(Ctx, &[Str]) -> Replied` that cannot panic (it only reads and
    // reports positions), answers the server's key-position requests before
    // the panic guard and the handler; `$f` runs every other call.
    ($f:path, keys = $keys:path) => {{
        /// The command function Redis calls for this command.
        ///
        /// # Safety
        ///
        /// As for `entry!($f)`.
        unsafe extern "C" fn entry(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            // SAFETY: as in `entry!($f)`.
            let (ctx, args) = unsafe { $crate::api::call_args(ctx, argv, argc) };
            if ctx.is_keys_position_request() {
                return $crate::api::status($keys(ctx, args));
            }
            $crate::api::run(ctx, args, $f)
        }
        Some(entry as _)
    }};
}
pub(crate) use entry;

/// A command call's context and arguments as safe types: the one place the
/// raw call becomes `Ctx` and `&[Str]` (both arms of [`entry!`]).
///
/// # Safety
/// `ctx` must be the context of a command call in progress and `argv` its
/// `argc` argument strings (none when `argc` is not positive; a positive
/// `argc` comes with the server's argument vector, never null), all valid
/// for `'a`.
#[inline(always)]
pub unsafe fn call_args<'a>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> (Ctx<'a>, &'a [Str<'a>]) {
    let args: &[Str] = if argc <= 0 {
        &[]
    } else {
        // SAFETY: `argc` live arguments at `argv`, not null (the caller's
        // contract: the server passes its argument vector with its count);
        // `Str` is a transparent `*mut RedisModuleString`.
        unsafe { std::slice::from_raw_parts(argv.cast(), argc as usize) }
    };
    // SAFETY: a live call context (the caller's contract).
    (unsafe { Ctx::from_raw(ctx) }, args)
}

/// Run the handler `f` on the call `(ctx, args)`; a panic (a bug: none is
/// reachable by design) answers an error instead of unwinding into Redis,
/// which would abort the server. The command's status: OK once replied.
#[inline(always)]
pub fn run<'a>(ctx: Ctx<'a>, args: &'a [Str<'a>], f: impl FnOnce(Ctx<'a>, &'a [Str<'a>]) -> Replied) -> c_int {
    let replied = match catch_unwind(AssertUnwindSafe(|| f(ctx, args))) {
        Ok(r) => r,
        Err(_) => ctx.reply_error(c"ERR ratelimit internal error"),
    };
    status(replied)
}

/// The status a command function returns once its reply is sent (`entry!`).
#[inline(always)]
pub fn status(_: Replied) -> c_int {
    OK
}

impl<'a> Str<'a> {
    /// The argument's bytes.
    #[inline]
    pub fn bytes(self) -> &'a [u8] {
        let mut len = std::mem::MaybeUninit::<usize>::uninit();
        // SAFETY: `self.raw` is a live string (an argument of the call,
        // `run`, or an owned one), which outlives `'a`; Redis returns its
        // buffer and writes its length to `len` (given, so always written:
        // for a null string it returns a static message and its length):
        // `len` bytes at `p`, owned by it. `p` is never null: for a null
        // string the server returns that message, else it reads the length
        // from the header before the buffer (sdslen: `p[-1]`) when `len` is
        // given, as here, so a null buffer would fault in the server before
        // returning (RM_StringPtrLen / VM_StringPtrLen on Redis 7.0 and 8.2,
        // Valkey 8.1 and 9.1). No null test per argument on the hot path,
        // and no store of a length the server overwrites.
        unsafe {
            let p = api!(RedisModule_StringPtrLen)(self.raw, len.as_mut_ptr());
            std::slice::from_raw_parts(p.cast::<u8>(), len.assume_init())
        }
    }
}

impl<'a> Ctx<'a> {
    /// Answer the error `msg`.
    #[inline]
    pub fn reply_error(self, msg: &CStr) -> Replied {
        // SAFETY: a live call context (`run`) and a NUL-terminated text.
        unsafe { api!(RedisModule_ReplyWithError)(self.raw, msg.as_ptr()) };
        Replied(())
    }

    /// Answer Redis's wrong-number-of-arguments error.
    #[inline]
    pub fn wrong_arity(self) -> Replied {
        // SAFETY: a live call context.
        unsafe { api!(RedisModule_WrongArity)(self.raw) };
        Replied(())
    }

    /// Answer the simple string `msg`.
    #[inline]
    pub fn reply_simple(self, msg: &CStr) -> Replied {
        // SAFETY: a live call context and a NUL-terminated text.
        unsafe { api!(RedisModule_ReplyWithSimpleString)(self.raw, msg.as_ptr()) };
        Replied(())
    }

    /// The five-integer reply.
    #[inline]
    pub fn reply_ints(self, vals: [i64; 5]) -> Replied {
        Elements { ctx: self }.ints(vals);
        Replied(())
    }

    /// An array reply of `len` elements, which `elems` writes.
    #[inline(always)]
    pub fn reply_array(self, len: usize, elems: impl FnOnce(Elements<'a>)) -> Replied {
        let e = Elements { ctx: self };
        e.array_header(len);
        elems(e);
        Replied(())
    }

    /// Is this call Redis asking for the key positions (a command registered
    /// with `getkeys-api`)?
    #[inline]
    pub fn is_keys_position_request(self) -> bool {
        // SAFETY: a live call context.
        unsafe { api!(RedisModule_IsKeysPositionRequest)(self.raw) != 0 }
    }

    /// Answer a key position request: the arguments at `positions` are
    /// keys, with the flags `RedisModule_KeyAtPos` gives (read-write,
    /// access, update: the flags of RL.MULTI's key spec). Valkey 9.1, which
    /// asks on every request to prefetch the keys, stores these flags as
    /// given, where `KeyAtPos` converts its default; Redis converts them
    /// once here, twice in `KeyAtPos`.
    #[inline]
    pub fn reply_keys_at(self, positions: std::ops::Range<usize>) -> Replied {
        const FULL_ACCESS: c_int =
            (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE) as c_int;
        for pos in positions {
            if let Ok(pos) = c_int::try_from(pos) {
                // SAFETY: a live call context.
                unsafe { api!(RedisModule_KeyAtPosWithFlags)(self.raw, pos, FULL_ACCESS) };
            }
        }
        Replied(())
    }

    /// Open `name` for reading, and for writing unless `read_only`.
    #[inline]
    pub fn open_key(self, name: Str<'a>, read_only: bool) -> Key<'a> {
        let mode = if read_only { raw::REDISMODULE_READ } else { raw::REDISMODULE_READ | raw::REDISMODULE_WRITE } as c_int;
        // SAFETY: a live call context and argument; the key is closed on
        // drop, within the call.
        let key = unsafe { api!(RedisModule_OpenKey)(self.raw, name.raw, mode) };
        Key { key, name, ty: std::ptr::null_mut(), val: std::ptr::null_mut() }
    }

    /// Replicate the deletion of `name` (`DEL name`): a refund made the
    /// limiter fresh, and a fresh limiter is not stored.
    #[inline]
    pub fn replicate_del(self, name: Str<'a>) {
        // SAFETY: a live call context; the format "s" takes one string.
        unsafe { api!(RedisModule_Replicate)(self.raw, c"DEL".as_ptr(), c"s".as_ptr(), name.raw) };
    }

    /// Replicate the effect `RL.STATE name payload`.
    #[inline]
    pub fn replicate_state(self, name: Str<'a>, payload: &[u8]) {
        // SAFETY: a live call context; the format "sb" takes one string and
        // a buffer with its length.
        unsafe {
            api!(RedisModule_Replicate)(
                self.raw,
                c"RL.STATE".as_ptr(),
                c"sb".as_ptr(),
                name.raw,
                payload.as_ptr().cast::<c_char>(),
                payload.len(),
            )
        };
    }

    /// Replicate the command as it was received (RL.STATE itself is
    /// deterministic: it carries an absolute expiry and no clock reads).
    #[inline]
    pub fn replicate_verbatim(self) {
        // SAFETY: a live call context.
        unsafe { api!(RedisModule_ReplicateVerbatim)(self.raw) };
    }
}

/// The elements of an array reply being written ([`Ctx::reply_array`]).
#[derive(Clone, Copy)]
pub struct Elements<'a> {
    ctx: Ctx<'a>,
}

impl Elements<'_> {
    #[inline(always)]
    fn array_header(self, len: usize) {
        // SAFETY: a live call context.
        unsafe { api!(RedisModule_ReplyWithArray)(self.ctx.raw, len as c_long) };
    }

    /// One integer element.
    #[inline(always)]
    pub fn int(self, v: i64) {
        // SAFETY: a live call context.
        unsafe { api!(RedisModule_ReplyWithLongLong)(self.ctx.raw, v as c_longlong) };
    }

    /// An element that is an array of five integers.
    #[inline(always)]
    pub fn ints(self, vals: [i64; 5]) {
        self.array_header(vals.len());
        for v in vals {
            self.int(v);
        }
    }

    /// An element that is an array of `len` elements, which `elems` writes.
    #[inline(always)]
    pub fn array(self, len: usize, elems: impl FnOnce(Self)) {
        self.array_header(len);
        elems(self);
    }
}

/// What an open key holds, as the server reports it ([`Key::contents`]);
/// whether a module value is a limiter state of some type, and which,
/// `value.rs` decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contents {
    /// No value (or the key could not be opened).
    Empty,
    /// A value of a module data type: its type and its value pointer.
    Module(*mut RedisModuleType, *mut c_void),
    /// A value of another kind (a string, a list, ...).
    Other,
}

/// An open key, closed on drop. It remembers the module value it was last
/// seen holding ([`Key::contents`]) or was given ([`Key::set_module_value`]),
/// so that the value is read from the server once.
pub struct Key<'a> {
    key: *mut RedisModuleKey,
    name: Str<'a>,
    /// The module type and value the key holds, NULL when none is known.
    ty: *mut RedisModuleType,
    val: *mut c_void,
}

impl<'a> Key<'a> {
    /// What the key holds (remembered for [`Key::module_value`]).
    #[inline]
    pub fn contents(&mut self) -> Contents {
        self.ty = std::ptr::null_mut();
        self.val = std::ptr::null_mut();
        if self.key.is_null() {
            return Contents::Empty;
        }
        // SAFETY: an open key of a live call (the calls below). The module
        // type is asked first: the server answers NULL for a key that holds
        // no module value (empty, or a value of another kind: it checks the
        // key's type itself, in RM_ModuleTypeGetType / VM_ModuleTypeGetType
        // of Redis 7.0 and 8.2, Valkey 8.1 and 9.1), so the common key, a
        // module value, costs no separate KeyType call.
        unsafe {
            let ty = api!(RedisModule_ModuleTypeGetType)(self.key);
            if ty.is_null() {
                let kt = api!(RedisModule_KeyType)(self.key);
                return if kt as isize == raw::REDISMODULE_KEYTYPE_EMPTY { Contents::Empty } else { Contents::Other };
            }
            self.ty = ty;
            self.val = api!(RedisModule_ModuleTypeGetValue)(self.key);
        }
        Contents::Module(self.ty, self.val)
    }

    /// The bytes of the string the key holds, if it holds a string (read in
    /// place; the borrow ends before the key is written or closed).
    #[inline]
    pub fn string_bytes(&self) -> Option<&[u8]> {
        if self.key.is_null() {
            return None;
        }
        // SAFETY: an open key of a live call; StringDMA in read mode on a
        // string key returns its buffer and length, valid until the key is
        // changed or closed, which the borrow of `self` prevents.
        unsafe {
            if api!(RedisModule_KeyType)(self.key) as isize != raw::REDISMODULE_KEYTYPE_STRING {
                return None;
            }
            let mut len: usize = 0;
            let p = api!(RedisModule_StringDMA)(self.key, &mut len, raw::REDISMODULE_READ as c_int);
            if p.is_null() {
                return Some(&[]);
            }
            Some(std::slice::from_raw_parts(p.cast::<u8>(), len))
        }
    }

    /// The module type and value pointer the key holds, as last seen by
    /// [`Key::contents`] or set by [`Key::set_module_value`]; NULL pointers
    /// when it holds none, or is deleted.
    #[inline]
    pub fn module_value(&self) -> (*mut RedisModuleType, *mut c_void) {
        (self.ty, self.val)
    }

    /// Set the key's value to `p`, a value of the module type `ty`. True
    /// when the key took it.
    ///
    /// # Safety
    ///
    /// `p` is a value pointer the callbacks of `ty` accept; on success the
    /// key owns it, else the caller still does.
    #[inline]
    pub unsafe fn set_module_value(&mut self, ty: *mut RedisModuleType, p: *mut c_void) -> bool {
        // SAFETY: an open key; `p` a value of `ty` (the caller's contract).
        let ok = !self.key.is_null() && unsafe { api!(RedisModule_ModuleTypeSetValue)(self.key, ty, p) } == OK;
        if ok {
            self.ty = ty;
            self.val = p;
        }
        ok
    }

    /// Set the key's absolute expiry (Unix ms) exactly: the same value on
    /// the master, its replicas and AOF replay, since the effect carries it.
    #[inline]
    pub fn set_abs_expire(&self, abs_ms: u64) {
        // SAFETY: an open key of a live call.
        unsafe { api!(RedisModule_SetAbsExpire)(self.key, abs_ms.min(MAX_EXPIRE_MS) as i64) };
    }

    /// Remove any expiry (an AOF-rewrite payload carries none: Redis
    /// appends its own PEXPIREAT after it).
    #[inline]
    pub fn persist(&self) {
        // SAFETY: an open key of a live call.
        unsafe { api!(RedisModule_SetExpire)(self.key, raw::REDISMODULE_NO_EXPIRE as i64) };
    }

    /// Delete the key (a limiter that a refund made fresh). True when
    /// deleted.
    #[inline]
    pub fn delete(&mut self) -> bool {
        self.ty = std::ptr::null_mut();
        self.val = std::ptr::null_mut();
        // SAFETY: an open key of a live call.
        !self.key.is_null() && unsafe { api!(RedisModule_DeleteKey)(self.key) } == OK
    }

    /// The key was written: tell Redis it changed (WATCH, client-side
    /// caching), then emit the keyspace event `event` of the module class
    /// (`d` in `notify-keyspace-events`; the server drops it at once when
    /// nothing listens), both in the call `ctx` that opened it. Every write
    /// does both, and only a write: the module sets
    /// NO_IMPLICIT_SIGNAL_MODIFIED so that a denied call, which opens the
    /// key for writing but changes nothing, neither signals nor notifies.
    #[inline]
    pub fn modified(&self, ctx: Ctx<'a>, event: &'static CStr) {
        // SAFETY: a live call context and argument; a NUL-terminated static
        // name, which the server only reads.
        unsafe {
            api!(RedisModule_SignalModifiedKey)(ctx.raw, self.name.raw);
            api!(RedisModule_NotifyKeyspaceEvent)(
                ctx.raw,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                self.name.raw,
            )
        };
    }
}

impl Drop for Key<'_> {
    #[inline]
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: the key is open (opened once, closed once, here).
            unsafe { api!(RedisModule_CloseKey)(self.key) };
        }
    }
}
