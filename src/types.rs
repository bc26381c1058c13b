//! The three native data types and their callbacks: RDB load/save, AOF
//! rewrite, MEMORY USAGE, DEBUG DIGEST, COPY and free. Every callback goes
//! through the state's own versioned encoding (see `codec.rs`), so RDB, AOF
//! rewrite, DUMP/RESTORE and effect replication share one decoder, and that
//! decoder validates every byte it is given.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleDigest, RedisModuleIO, RedisModuleString, RedisModuleType};

use crate::codec;
use crate::core::{slidingcounter as sc, slidinglog as sl, tokenbucket as tb, DecodeError};

/// RDB encoding version of every type (the body carries its own version
/// byte too, so a future change can be read side by side with this one).
pub const ENCVER: i32 = 1;

/// What each stored state provides to the generic callbacks, and how it sits
/// behind the key's value pointer. By default the pointer is a `Box<Self>`;
/// the word-sized states override the four value functions with the compact
/// form below.
pub trait Stored: Sized + Clone {
    /// Kind byte in an RL.STATE payload.
    const KIND: u8;
    fn encode_body(&self, out: &mut Vec<u8>);
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError>;
    fn heap_bytes(&self) -> usize {
        0
    }
    /// The registered type.
    fn redis_type() -> *mut RedisModuleType;

    /// A new value pointer owning `self`.
    fn into_value(self) -> *mut c_void {
        Box::into_raw(Box::new(self)).cast::<c_void>()
    }
    /// Run `f` on the state behind a value pointer (None for NULL).
    unsafe fn with_value<R>(p: *const c_void, f: impl FnOnce(&Self) -> R) -> Option<R> {
        p.cast::<Self>().as_ref().map(f)
    }
    /// Replace the state behind `p` in place, or hand `v` back when the
    /// pointer's form cannot hold it (the caller then sets a new value).
    unsafe fn overwrite(p: *mut c_void, v: Self) -> Result<(), Self> {
        match p.cast::<Self>().as_mut() {
            Some(slot) => {
                *slot = v;
                Ok(())
            }
            None => Err(v),
        }
    }
    /// Free a value pointer made by `into_value`.
    unsafe fn free_value(p: *mut c_void) {
        if !p.is_null() {
            drop(Box::from_raw(p.cast::<Self>()));
        }
    }
    /// Bytes behind a value pointer, for MEMORY USAGE.
    unsafe fn value_size(p: *const c_void) -> usize {
        Self::with_value(p, |v| std::mem::size_of::<Self>() + v.heap_bytes()).unwrap_or(0)
    }
}

/// Word-sized states (token bucket, sliding counter) with a two-word compact
/// form (`pack`/`unpack` in the cores). Their value pointer is tagged: bit 0
/// set means it points to the two packed words (16 bytes, the smallest
/// allocation class that holds them), clear means a `Box<Self>` (the wide
/// form, for the rare state outside the compact ranges). A bucket or counter
/// key thus costs 16 bytes of state instead of 24–32. Redis never looks
/// behind a module value pointer itself: it only hands it to the callbacks
/// below (active defrag, with no `defrag` callback registered, moves only its
/// own `moduleValue`).
const COMPACT_TAG: usize = 1;
const _: () = assert!(std::mem::align_of::<[u64; 2]>() > COMPACT_TAG);

/// The packed words behind a tagged pointer; None for the wide form.
#[inline]
fn compact_words(p: *const c_void) -> Option<*mut [u64; 2]> {
    (p.addr() & COMPACT_TAG != 0).then(|| p.map_addr(|a| a & !COMPACT_TAG).cast::<[u64; 2]>().cast_mut())
}

/// The value functions of `Stored` for a state with inherent `pack` and
/// `unpack`.
macro_rules! compact_value_fns {
    () => {
        #[inline]
        fn into_value(self) -> *mut c_void {
            match self.pack() {
                Some(w) => Box::into_raw(Box::new(w)).map_addr(|a| a | COMPACT_TAG).cast::<c_void>(),
                None => Box::into_raw(Box::new(self)).cast::<c_void>(),
            }
        }
        #[inline]
        unsafe fn with_value<R>(p: *const c_void, f: impl FnOnce(&Self) -> R) -> Option<R> {
            let v = match compact_words(p) {
                Some(w) => w.as_ref().map(|w| Self::unpack(*w)),
                None => p.cast::<Self>().as_ref().copied(),
            };
            v.map(|v| f(&v))
        }
        #[inline]
        unsafe fn overwrite(p: *mut c_void, v: Self) -> Result<(), Self> {
            match (compact_words(p), v.pack()) {
                (Some(w), Some(new)) if !w.is_null() => {
                    *w = new;
                    Ok(())
                }
                (None, None) if !p.is_null() => {
                    *p.cast::<Self>() = v;
                    Ok(())
                }
                _ => Err(v),
            }
        }
        unsafe fn free_value(p: *mut c_void) {
            match compact_words(p) {
                Some(w) => drop(Box::from_raw(w)),
                None if !p.is_null() => drop(Box::from_raw(p.cast::<Self>())),
                None => {}
            }
        }
        unsafe fn value_size(p: *const c_void) -> usize {
            match compact_words(p) {
                Some(_) => std::mem::size_of::<[u64; 2]>(),
                None if !p.is_null() => std::mem::size_of::<Self>(),
                None => 0,
            }
        }
    };
}

pub static TOKENBUCKET_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());
pub static SLIDINGLOG_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());
pub static SLIDINGCOUNTER_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());

impl Stored for tb::State {
    const KIND: u8 = codec::KIND_TOKENBUCKET;
    fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        tb::State::decode(bytes)
    }
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        TOKENBUCKET_PTR.load(Ordering::Relaxed)
    }
    compact_value_fns!();
}

impl Stored for sc::State {
    const KIND: u8 = codec::KIND_SLIDINGCOUNTER;
    fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        sc::State::decode(bytes)
    }
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        SLIDINGCOUNTER_PTR.load(Ordering::Relaxed)
    }
    compact_value_fns!();
}

impl Stored for sl::State {
    const KIND: u8 = codec::KIND_SLIDINGLOG;
    fn encode_body(&self, out: &mut Vec<u8>) {
        self.encode(out);
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        sl::State::decode(bytes)
    }
    fn heap_bytes(&self) -> usize {
        sl::State::heap_bytes(self)
    }
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        SLIDINGLOG_PTR.load(Ordering::Relaxed)
    }
}

fn body_of<T: Stored>(v: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + v.heap_bytes());
    v.encode_body(&mut out);
    out
}

unsafe extern "C" fn rdb_save<T: Stored>(rdb: *mut RedisModuleIO, value: *mut c_void) {
    let Some(body) = T::with_value(value, body_of) else { return };
    if let Some(save) = raw::RedisModule_SaveStringBuffer {
        save(rdb, body.as_ptr().cast::<c_char>(), body.len());
    }
}

/// Load one value. With `REDISMODULE_OPTIONS_HANDLE_IO_ERRORS` set at load,
/// a truncated payload makes the read report an error instead of aborting
/// the server; this returns NULL for it and for any body the decoder
/// refuses, and Redis answers RESTORE with an error (or refuses the RDB).
unsafe extern "C" fn rdb_load<T: Stored>(rdb: *mut RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver != ENCVER {
        return ptr::null_mut();
    }
    let (Some(load), Some(is_err), Some(free)) =
        (raw::RedisModule_LoadStringBuffer, raw::RedisModule_IsIOError, raw::RedisModule_Free)
    else {
        return ptr::null_mut();
    };
    let mut len = 0usize;
    let p = load(rdb, &mut len);
    if is_err(rdb) != 0 || p.is_null() {
        if !p.is_null() {
            free(p.cast::<c_void>());
        }
        return ptr::null_mut();
    }
    // The decoders never panic (fuzzed: fuzz/decode_*), but these bytes come
    // from outside (RESTORE, replication, RDB files): a panic unwinding out of
    // this extern "C" callback would abort the server, so refuse instead.
    let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len);
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| T::decode_body(bytes)));
    free(p.cast::<c_void>());
    match decoded {
        Ok(Ok(v)) => v.into_value(),
        _ => ptr::null_mut(),
    }
}

/// AOF rewrite: `RL.STATE key payload` with no expiry in the payload; Redis
/// appends the key's PEXPIREAT itself.
unsafe extern "C" fn aof_rewrite<T: Stored>(aof: *mut RedisModuleIO, key: *mut RedisModuleString, value: *mut c_void) {
    let Some(payload) =
        T::with_value(value, |v| codec::full_state(T::KIND, 0, 48 + v.heap_bytes(), |out| v.encode_body(out)))
    else {
        return;
    };
    if let Some(emit) = raw::RedisModule_EmitAOF {
        emit(aof, c"RL.STATE".as_ptr(), c"sb".as_ptr(), key, payload.as_ptr().cast::<c_char>(), payload.len());
    }
}

unsafe extern "C" fn mem_usage<T: Stored>(value: *const c_void) -> usize {
    T::value_size(value)
}

unsafe extern "C" fn digest<T: Stored>(md: *mut RedisModuleDigest, value: *mut c_void) {
    let Some(body) = T::with_value(value, body_of) else { return };
    if let (Some(add), Some(end)) = (raw::RedisModule_DigestAddStringBuffer, raw::RedisModule_DigestEndSequence) {
        add(md, body.as_ptr().cast::<c_char>(), body.len());
        end(md);
    }
}

unsafe extern "C" fn free<T: Stored>(value: *mut c_void) {
    T::free_value(value)
}

unsafe extern "C" fn copy<T: Stored>(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    T::with_value(value, |v| v.clone().into_value()).unwrap_or(ptr::null_mut())
}

const fn methods<T: Stored>() -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: 4, // the callbacks below exist since Redis 7.0's version 4
        rdb_load: Some(rdb_load::<T>),
        rdb_save: Some(rdb_save::<T>),
        aof_rewrite: Some(aof_rewrite::<T>),
        mem_usage: Some(mem_usage::<T>),
        digest: Some(digest::<T>),
        free: Some(free::<T>),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy::<T>),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    }
}

// Module type names are exactly nine characters.
pub static TOKENBUCKET_TYPE: RedisType = RedisType::new("rl-tokbkt", ENCVER, methods::<tb::State>());
pub static SLIDINGLOG_TYPE: RedisType = RedisType::new("rl-slilog", ENCVER, methods::<sl::State>());
pub static SLIDINGCOUNTER_TYPE: RedisType = RedisType::new("rl-slicnt", ENCVER, methods::<sc::State>());

/// After registration: keep the raw type pointers where the request path
/// reads them with one load.
pub fn publish_type_pointers() -> bool {
    let tbp = *TOKENBUCKET_TYPE.raw_type.borrow();
    let slp = *SLIDINGLOG_TYPE.raw_type.borrow();
    let scp = *SLIDINGCOUNTER_TYPE.raw_type.borrow();
    TOKENBUCKET_PTR.store(tbp, Ordering::Relaxed);
    SLIDINGLOG_PTR.store(slp, Ordering::Relaxed);
    SLIDINGCOUNTER_PTR.store(scp, Ordering::Relaxed);
    !tbp.is_null() && !slp.is_null() && !scp.is_null()
}
