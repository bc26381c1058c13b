//! What load-time and timer code asks of the server through a [`Ctx`]:
//! registration (commands, their docs and ACL categories, module options,
//! the INFO callback), server events, timers, logging, `INFO` fields,
//! strings the module owns, and `MEMORY USAGE` of a key. None of this runs
//! per request; where an API function is optional (`ffi::OPTIONAL`) its
//! wrapper checks for it and answers as if the server had refused.

use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;

use redis_module::raw::{self, RedisModuleCommand, RedisModuleCommandInfo, RedisModuleCtx, RedisModuleEvent};
use redis_module::raw::{RedisModuleInfoCtx, RedisModuleServerInfoData, RedisModuleString};

use super::{Ctx, Handle, Key, Str};
use crate::ffi::{api, opt, OK};

/// The INFO callback the server calls (`RedisModule_RegisterInfoFunc`).
pub type InfoFn = unsafe extern "C" fn(*mut RedisModuleInfoCtx, c_int);

/// A server-event callback: it reads none of its arguments, so it is a safe
/// function (the server calls it with the event's own data).
pub type EventFn = extern "C" fn(*mut RedisModuleCtx, RedisModuleEvent, u64, *mut c_void);

/// What a timer runs, with the timer callback's context.
pub type TimerFn = fn(Ctx);

/// The timer callback the server calls: the data pointer is the [`TimerFn`]
/// that [`Ctx::create_timer`] passed.
///
/// # Safety
///
/// Only the server calls this, from a timer `create_timer` made: `ctx` is
/// valid for the call, on the main thread, and `data` is a [`TimerFn`].
unsafe extern "C" fn run_timer(ctx: *mut RedisModuleCtx, data: *mut c_void) {
    // SAFETY: `data` is the `TimerFn` `create_timer` cast to a pointer (a
    // function pointer round-trips through a data pointer on the platforms
    // the server runs on), and `ctx` the valid context of this timer call.
    let (f, ctx) = unsafe { (std::mem::transmute::<*mut c_void, TimerFn>(data), Ctx::from_raw(ctx)) };
    f(ctx);
}

/// A command of this module, as `GetCommand` found it (load time).
pub struct Command<'a> {
    raw: *mut RedisModuleCommand,
    _load: PhantomData<&'a RedisModuleCommand>,
}

/// `INFO` data of one section, freed on drop.
pub struct ServerInfo<'a> {
    ctx: Ctx<'a>,
    data: *mut RedisModuleServerInfoData,
}

/// A string this module created, freed on drop.
pub struct OwnedString<'a> {
    ctx: Ctx<'a>,
    raw: *mut RedisModuleString,
}

/// What a command run through `RedisModule_Call` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallReply {
    /// No reply: the server refused the call (another node's slot, the
    /// cluster down), or lacks the API.
    Refused,
    Null,
    Integer(i64),
    Other,
}

impl<'a> Ctx<'a> {
    /// Log `msg` at `level` (`warning`, `notice`, ...), as text (never read
    /// as a format).
    pub fn log(self, level: &CStr, msg: &CStr) {
        if let Some(log) = opt!(RedisModule_Log) {
            // SAFETY: a live ctx; NUL-terminated texts; the format "%s"
            // takes exactly the one C string passed.
            unsafe { log(self.raw, level.as_ptr(), c"%s".as_ptr(), msg.as_ptr()) };
        }
    }

    /// The context flags (`REDISMODULE_CTX_FLAGS_*`).
    pub fn context_flags(self) -> c_int {
        // SAFETY: a live ctx; GetContextFlags is required.
        unsafe { api!(RedisModule_GetContextFlags)(self.raw) }
    }

    /// Run `f` in `ms` milliseconds, once, on the main thread, with the
    /// timer's context. False where the server offers no timers.
    pub fn create_timer(self, ms: i64, f: TimerFn) -> bool {
        let Some(create) = opt!(RedisModule_CreateTimer) else { return false };
        // SAFETY: a live ctx; `run_timer` has the timer callback's type and
        // reads its data as the `TimerFn` passed here.
        unsafe { create(self.raw, ms, Some(run_timer), f as *mut c_void) };
        true
    }

    /// Subscribe `f` to the server event `id`. True when the server
    /// accepted it.
    pub fn subscribe(self, id: u64, f: EventFn) -> bool {
        let event = RedisModuleEvent { id, dataver: 1 };
        // SAFETY: a live ctx; SubscribeToServerEvent is required; `f` reads
        // none of its arguments, so any event's data suits it.
        unsafe { api!(RedisModule_SubscribeToServerEvent)(self.raw, event, Some(f)) == OK }
    }

    /// The INFO section `section`, if the server answers it.
    pub fn server_info(self, section: &CStr) -> Option<ServerInfo<'a>> {
        // SAFETY: a live ctx, a NUL-terminated name; GetServerInfo is
        // required. A NULL answer is refused below; the data is freed once,
        // on drop.
        let data = unsafe { api!(RedisModule_GetServerInfo)(self.raw, section.as_ptr()) };
        (!data.is_null()).then_some(ServerInfo { ctx: self, data })
    }

    /// A new string holding `bytes`, or None where the server lacks the
    /// string API or refuses.
    pub fn create_string(self, bytes: &[u8]) -> Option<OwnedString<'a>> {
        let (create, _free) = (opt!(RedisModule_CreateString)?, opt!(RedisModule_FreeString)?);
        // SAFETY: a live ctx; CreateString copies the `len` bytes given.
        let raw = unsafe { create(self.raw, bytes.as_ptr().cast(), bytes.len()) };
        (!raw.is_null()).then_some(OwnedString { ctx: self, raw })
    }

    /// `MEMORY USAGE name`, run through `RedisModule_Call`.
    pub fn memory_usage(self, name: Str) -> CallReply {
        let api = (
            opt!(RedisModule_Call),
            opt!(RedisModule_CallReplyType),
            opt!(RedisModule_CallReplyInteger),
            opt!(RedisModule_FreeCallReply),
        );
        let (Some(call), Some(reply_type), Some(integer), Some(free)) = api else { return CallReply::Refused };
        // SAFETY: a live ctx; the format "cs" matches the arguments (a C
        // string, then the live string `name`); a non-null reply is read,
        // then freed once.
        unsafe {
            let reply = call(self.raw, c"MEMORY".as_ptr(), c"cs".as_ptr(), c"USAGE".as_ptr(), name.raw);
            if reply.is_null() {
                return CallReply::Refused;
            }
            let answer = match reply_type(reply) {
                t if t == raw::REDISMODULE_REPLY_NULL as c_int => CallReply::Null,
                t if t == raw::REDISMODULE_REPLY_INTEGER as c_int => CallReply::Integer(integer(reply)),
                _ => CallReply::Other,
            };
            free(reply);
            answer
        }
    }

    /// Set the module options (`REDISMODULE_OPTIONS_*`, OnLoad).
    pub fn set_module_options(self, options: c_int) {
        // SAFETY: a live ctx; SetModuleOptions is required.
        unsafe { api!(RedisModule_SetModuleOptions)(self.raw, options) };
    }

    /// Create the command `name` (OnLoad), Redis calling `handler` for it,
    /// with the `CreateCommand` flags and key range given. True when the
    /// server accepted it.
    ///
    /// # Safety
    ///
    /// `handler` is sound for any call of the command the server makes (an
    /// `api::entry!` command function).
    pub unsafe fn create_command(
        self,
        name: &CStr,
        handler: raw::RedisModuleCmdFunc,
        flags: &CStr,
        first_key: c_int,
    ) -> bool {
        let Some(create) = opt!(RedisModule_CreateCommand) else { return false };
        let k = first_key;
        // SAFETY: a live ctx; the name and flags are NUL-terminated (the
        // server copies them); the handler is sound (the caller's contract).
        (unsafe { create(self.raw, name.as_ptr(), handler, flags.as_ptr(), k, k, k) }) == OK
    }

    /// Register the INFO callback `f` (OnLoad).
    ///
    /// # Safety
    ///
    /// `f` is sound with any INFO context the server passes it.
    pub unsafe fn register_info_func(self, f: InfoFn) {
        if let Some(register) = opt!(RedisModule_RegisterInfoFunc) {
            // SAFETY: a live ctx; `f` is sound (the caller's contract).
            unsafe { register(self.raw, Some(f)) };
        }
    }

    /// Add the ACL category `name` (OnLoad). False where the server lacks
    /// ACL categories (Redis before 7.4); its answer is not read (after
    /// MODULE UNLOAD and LOAD the category already exists).
    pub fn add_acl_category(self, name: &CStr) -> bool {
        let Some(add) = opt!(RedisModule_AddACLCategory) else { return false };
        // SAFETY: a live ctx and a NUL-terminated name.
        unsafe { add(self.raw, name.as_ptr()) };
        true
    }

    /// The registered command `name`, where the server can look it up.
    pub fn get_command(self, name: &CStr) -> Option<Command<'a>> {
        let get = opt!(RedisModule_GetCommand)?;
        // SAFETY: a live ctx and a NUL-terminated name; NULL is refused.
        let raw = unsafe { get(self.raw, name.as_ptr()) };
        (!raw.is_null()).then_some(Command { raw, _load: PhantomData })
    }
}

impl Command<'_> {
    /// Set the command's ACL categories; None where the server lacks the
    /// API, else whether it accepted them.
    pub fn set_acl_categories(&self, categories: &CStr) -> Option<bool> {
        let set = opt!(RedisModule_SetCommandACLCategories)?;
        // SAFETY: a command GetCommand returned (load time); the text is
        // NUL-terminated and copied by the server.
        Some(unsafe { set(self.raw, categories.as_ptr()) } == OK)
    }

    /// Set the command's docs and key specs; None where the server lacks
    /// the API, else whether it accepted them.
    ///
    /// # Safety
    ///
    /// Every pointer in `info` is valid and every list in it terminated for
    /// the call (the server copies them).
    pub unsafe fn set_info(&self, info: &RedisModuleCommandInfo) -> Option<bool> {
        let set = opt!(RedisModule_SetCommandInfo)?;
        // SAFETY: a command GetCommand returned, and a valid description
        // (the caller's contract).
        Some(unsafe { set(self.raw, std::ptr::from_ref(info).cast_mut()) } == OK)
    }
}

impl ServerInfo<'_> {
    /// A signed field; None where it is missing or not a number.
    pub fn signed(&self, field: &CStr) -> Option<i64> {
        let mut err: c_int = 0;
        // SAFETY: live INFO data (freed only on drop), a NUL-terminated
        // name, a live local for the error.
        let v = unsafe { api!(RedisModule_ServerInfoGetFieldSigned)(self.data, field.as_ptr(), &mut err) };
        (err == 0).then_some(v)
    }

    /// An unsigned field; None where it is missing, not a number, or the
    /// server lacks the API.
    pub fn unsigned(&self, field: &CStr) -> Option<u64> {
        let get = opt!(RedisModule_ServerInfoGetFieldUnsigned)?;
        let mut err: c_int = 0;
        // SAFETY: as in `signed`.
        let v = unsafe { get(self.data, field.as_ptr(), &mut err) };
        (err == 0).then_some(v)
    }

    /// A text field, owned by this data; None where it is missing.
    pub fn text(&self, field: &CStr) -> Option<&CStr> {
        // SAFETY: live INFO data and a NUL-terminated name; a non-null
        // answer is a NUL-terminated string the data owns, borrowed no
        // longer than `self`.
        unsafe {
            let p = api!(RedisModule_ServerInfoGetFieldC)(self.data, field.as_ptr());
            (!p.is_null()).then(|| CStr::from_ptr(p))
        }
    }
}

impl Drop for ServerInfo<'_> {
    fn drop(&mut self) {
        // SAFETY: the data GetServerInfo returned with this ctx, freed once.
        unsafe { api!(RedisModule_FreeServerInfo)(self.ctx.raw, self.data) };
    }
}

impl OwnedString<'_> {
    /// The string, to pass where an argument would go.
    pub fn as_str(&self) -> Str<'_> {
        Handle { raw: self.raw, _call: PhantomData }
    }
}

impl Drop for OwnedString<'_> {
    fn drop(&mut self) {
        if let Some(free) = opt!(RedisModule_FreeString) {
            // SAFETY: a string CreateString made with this ctx, freed once.
            unsafe { free(self.ctx.raw, self.raw) };
        }
    }
}

impl Key<'_> {
    /// Whether the key was opened (the server answers NULL for a key it
    /// cannot open).
    pub fn is_open(&self) -> bool {
        !self.key.is_null()
    }

    /// Set the key to the string `s`. False where it is not open, the
    /// server lacks the API or refuses.
    pub fn set_string(&mut self, s: &OwnedString) -> bool {
        let Some(set) = opt!(RedisModule_StringSet) else { return false };
        // SAFETY: an open key; a live string, which StringSet copies.
        self.is_open() && unsafe { set(self.key, s.raw) } == OK
    }
}
