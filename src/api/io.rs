//! The data-type callbacks' handles: RDB load/save and AOF rewrite ([`Io`]),
//! DEBUG DIGEST ([`Digest`]); and the INFO callback's ([`InfoCtx`]). Every
//! function here is required (`ffi::REQUIRED`): the module did not load
//! without it.

use std::ffi::{c_char, c_void, CStr};

use redis_module::raw::{RedisModuleDigest, RedisModuleIO, RedisModuleInfoCtx};

use super::{Handle, Str};
use crate::ffi::api;

/// The IO handle of one RDB load or save, or of one AOF rewrite.
pub type Io<'a> = Handle<'a, RedisModuleIO>;

/// The digest of one DEBUG DIGEST call.
pub type Digest<'a> = Handle<'a, RedisModuleDigest>;

/// The context of one INFO callback.
pub type InfoCtx<'a> = Handle<'a, RedisModuleInfoCtx>;

/// A buffer `RedisModule_LoadStringBuffer` returned, freed on drop.
pub struct Loaded {
    p: *mut c_char,
    len: usize,
}

impl Io<'_> {
    /// Save `bytes` as one string buffer (RDB save).
    pub fn save_buffer(self, bytes: &[u8]) {
        // SAFETY: a live IO handle; the call copies `len` bytes.
        unsafe { api!(RedisModule_SaveStringBuffer)(self.raw, bytes.as_ptr().cast::<c_char>(), bytes.len()) };
    }

    /// Load one string buffer (RDB load). None on an IO error: with
    /// `REDISMODULE_OPTIONS_HANDLE_IO_ERRORS` set at load, a truncated
    /// payload makes the read report one instead of aborting the server.
    pub fn load_buffer(self) -> Option<Loaded> {
        let mut len = 0usize;
        // SAFETY: a live IO handle; `len` a live local the call writes the
        // buffer's length to; a non-null buffer came from RedisModule_Alloc
        // and is freed once: here on an IO error, else by `Loaded`.
        unsafe {
            let p = api!(RedisModule_LoadStringBuffer)(self.raw, &mut len);
            if api!(RedisModule_IsIOError)(self.raw) != 0 || p.is_null() {
                if !p.is_null() {
                    api!(RedisModule_Free)(p.cast::<c_void>());
                }
                return None;
            }
            Some(Loaded { p, len })
        }
    }

    /// Emit `cmd key payload` (AOF rewrite).
    pub fn emit(self, cmd: &CStr, key: Str, payload: &[u8]) {
        // SAFETY: a live IO handle and key; the format "sb" matches the
        // arguments (a string, then a buffer pointer and its length), which
        // the call copies.
        unsafe {
            api!(RedisModule_EmitAOF)(
                self.raw,
                cmd.as_ptr(),
                c"sb".as_ptr(),
                key.raw,
                payload.as_ptr().cast::<c_char>(),
                payload.len(),
            )
        };
    }
}

impl Loaded {
    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the non-null buffer of `len` initialised bytes that
        // LoadStringBuffer returned, alive and unwritten until `drop`.
        unsafe { std::slice::from_raw_parts(self.p.cast::<u8>(), self.len) }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: the buffer came from RedisModule_Alloc (LoadStringBuffer)
        // and is freed once, here.
        unsafe { api!(RedisModule_Free)(self.p.cast::<c_void>()) };
    }
}

impl Digest<'_> {
    /// Add `bytes` as one element and end the sequence.
    pub fn add_sequence(self, bytes: &[u8]) {
        // SAFETY: a live digest; the call copies `len` bytes.
        unsafe {
            api!(RedisModule_DigestAddStringBuffer)(self.raw, bytes.as_ptr().cast::<c_char>(), bytes.len());
            api!(RedisModule_DigestEndSequence)(self.raw);
        }
    }
}

impl InfoCtx<'_> {
    /// Start the section `name` (shown as `<module>_<name>`).
    pub fn section(self, name: &CStr) {
        // SAFETY: a live INFO ctx and a NUL-terminated name.
        unsafe { api!(RedisModule_InfoAddSection)(self.raw, name.as_ptr()) };
    }

    /// An unsigned field of the current section.
    pub fn field_u64(self, name: &CStr, v: u64) {
        // SAFETY: as in `section`.
        unsafe { api!(RedisModule_InfoAddFieldULongLong)(self.raw, name.as_ptr(), v) };
    }

    /// A text field of the current section.
    pub fn field_text(self, name: &CStr, v: &CStr) {
        // SAFETY: as in `section`; the server only reads the value (the C
        // API takes it as `char *` but copies it).
        unsafe { api!(RedisModule_InfoAddFieldCString)(self.raw, name.as_ptr(), v.as_ptr().cast_mut()) };
    }
}
