//! The native data types and their callbacks: RDB load/save, AOF
//! rewrite, MEMORY USAGE, DEBUG DIGEST, COPY and free. Every callback goes
//! through the state's own versioned encoding (see `ratelimit_core::codec`), so RDB, AOF
//! rewrite, DUMP/RESTORE and effect replication share one decoder, and that
//! decoder validates every byte it is given.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::Ordering;

use ratelimit_core::catalogue::Kind;
use ratelimit_core::codec;
use ratelimit_core::{
    concurrency as cc, fixedwindow as fw, gcra, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, DecodeError,
};
use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleDigest, RedisModuleIO, RedisModuleString};

use crate::api::{Digest, Io, Str};
use crate::value::{
    Packable, Value, ValueRef, CONCURRENCY_PTR, FIXEDWINDOW_PTR, GCRA_PTR, SLIDINGCOUNTER_PTR, SLIDINGLOG_PTR,
    TOKENBUCKET_PTR,
};

/// RDB encoding version of every type (the body carries its own version
/// byte too, so a future change can be read side by side with this one).
pub const ENCVER: i32 = 1;

/// What each stored state provides to the generic callbacks. How it sits
/// behind the key's value pointer (compact or wide), and which registered
/// type holds it, is `value.rs`'s concern.
pub trait Stored: Packable {
    /// Kind byte in an RL.STATE payload.
    const KIND: u8;
    fn encode_body(&self, out: &mut Vec<u8>);
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError>;
}

impl Stored for tb::State {
    const KIND: u8 = codec::KIND_TOKENBUCKET;
    fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        tb::State::decode(bytes)
    }
}

impl Stored for sc::State {
    const KIND: u8 = codec::KIND_SLIDINGCOUNTER;
    fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        sc::State::decode(bytes)
    }
}

impl Stored for fw::State {
    const KIND: u8 = codec::KIND_FIXEDWINDOW;
    fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        fw::State::decode(bytes)
    }
}

impl Stored for sl::State {
    const KIND: u8 = codec::KIND_SLIDINGLOG;
    fn encode_body(&self, out: &mut Vec<u8>) {
        self.encode(out);
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        sl::State::decode(bytes)
    }
}

impl Stored for cc::State {
    const KIND: u8 = codec::KIND_CONCURRENCY;
    fn encode_body(&self, out: &mut Vec<u8>) {
        self.encode(out);
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        cc::State::decode(bytes)
    }
}

impl Stored for gcra::State {
    const KIND: u8 = codec::KIND_GCRA;
    fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }
    fn decode_body(bytes: &[u8]) -> Result<Self, DecodeError> {
        gcra::State::decode(bytes)
    }
}

fn body_of<T: Stored>(v: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + v.heap_bytes());
    v.encode_body(&mut out);
    out
}

// Each callback below is an entry: it wraps the pointers the server passed
// into safe handles once (`api::Io`, `api::Digest`, `api::Str`,
// `value::ValueRef`), and the body is safe code over them.

/// RDB save (and DUMP): the state's versioned body as one string buffer.
///
/// # Safety
///
/// Only the server calls this: `rdb` is the valid IO handle of this save,
/// and `value` a value pointer of this type (from `rdb_load`, `copy` or the
/// commands, all made by `Value::create`), alive for the call.
unsafe extern "C" fn rdb_save<T: Stored>(rdb: *mut RedisModuleIO, value: *mut c_void) {
    // SAFETY: the server's valid IO handle and a live value of this type
    // (it hands a key's value only to its own type's callbacks), for the call.
    let (io, v) = unsafe { (Io::from_raw(rdb), ValueRef::<T>::from_raw(value)) };
    if let Some(body) = v.with(body_of) {
        io.save_buffer(&body);
    }
}

/// Load one value. With `REDISMODULE_OPTIONS_HANDLE_IO_ERRORS` set at load,
/// a truncated payload makes the read report an error instead of aborting
/// the server; this returns NULL for it and for any body the decoder
/// refuses, and Redis answers RESTORE with an error (or refuses the RDB).
///
/// # Safety
///
/// Only the server calls this, with `rdb` the valid IO handle of this load.
unsafe extern "C" fn rdb_load<T: Stored>(rdb: *mut RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY: the server's valid IO handle of this load, for the call.
    load::<T>(unsafe { Io::from_raw(rdb) }, encver)
}

fn load<T: Stored>(io: Io, encver: c_int) -> *mut c_void {
    if encver != ENCVER {
        return ptr::null_mut();
    }
    let Some(buf) = io.load_buffer() else { return ptr::null_mut() };
    // The decoders never panic (fuzzed: fuzz/decode_*), but these bytes come
    // from outside (RESTORE, replication, RDB files): a panic unwinding out of
    // this extern "C" callback would abort the server, so refuse instead.
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| T::decode_body(buf.bytes())));
    drop(buf);
    match decoded {
        Ok(Ok(v)) => Value::create(v),
        _ => ptr::null_mut(),
    }
}

/// AOF rewrite: `RL.STATE key payload` with no expiry in the payload; Redis
/// appends the key's PEXPIREAT itself.
///
/// # Safety
///
/// Only the server calls this: `aof` is the valid IO handle of this rewrite,
/// `key` the key's valid name, `value` a live value pointer of this type.
unsafe extern "C" fn aof_rewrite<T: Stored>(aof: *mut RedisModuleIO, key: *mut RedisModuleString, value: *mut c_void) {
    // SAFETY: the server's valid IO handle and key name, and a live value of
    // this type, for the call.
    let (io, key, v) = unsafe { (Io::from_raw(aof), Str::from_raw(key), ValueRef::<T>::from_raw(value)) };
    let payload = v.with(|v| codec::full_state(T::KIND, 0, 48 + v.heap_bytes(), |out| v.encode_body(out)));
    if let Some(payload) = payload {
        io.emit(c"RL.STATE", key, &payload);
    }
}

/// MEMORY USAGE of one value.
///
/// # Safety
///
/// Only the server calls this, with `value` a live value pointer of this
/// type.
unsafe extern "C" fn mem_usage<T: Stored>(value: *const c_void) -> usize {
    // SAFETY: a live value of this type, for the call.
    unsafe { ValueRef::<T>::from_raw(value) }.size()
}

/// DEBUG DIGEST: the state's versioned body, as one sequence.
///
/// # Safety
///
/// Only the server calls this: `md` is the valid digest of this call and
/// `value` a live value pointer of this type.
unsafe extern "C" fn digest<T: Stored>(md: *mut RedisModuleDigest, value: *mut c_void) {
    // SAFETY: the server's valid digest and a live value of this type, for
    // the call.
    let (md, v) = unsafe { (Digest::from_raw(md), ValueRef::<T>::from_raw(value)) };
    if let Some(body) = v.with(body_of) {
        md.add_sequence(&body);
    }
}

/// Free one value.
///
/// # Safety
///
/// Only the server calls this, once per value, with `value` a live value
/// pointer of this type that it does not use afterwards.
unsafe extern "C" fn free<T: Stored>(value: *mut c_void) {
    // SAFETY: `value` is a live pointer of this type made by Value::create,
    // freed once (the server drops its reference with this call).
    unsafe { Value::<T>::free(value) }
}

/// COPY: a new value pointer with a clone of the state.
///
/// # Safety
///
/// Only the server calls this, with `value` a live value pointer of this
/// type.
unsafe extern "C" fn copy<T: Stored>(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: a live value of this type, only read (the clone gets its own
    // allocation).
    unsafe { ValueRef::<T>::from_raw(value) }.with(|v| Value::create(v.clone())).unwrap_or(ptr::null_mut())
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

// Module type names (exactly nine characters) are the catalogue's.
pub static TOKENBUCKET_TYPE: RedisType = RedisType::new(type_name(Kind::TokenBucket), ENCVER, methods::<tb::State>());
pub static SLIDINGLOG_TYPE: RedisType = RedisType::new(type_name(Kind::SlidingLog), ENCVER, methods::<sl::State>());
pub static SLIDINGCOUNTER_TYPE: RedisType = RedisType::new(type_name(Kind::SlidingCounter), ENCVER, methods::<sc::State>());
pub static FIXEDWINDOW_TYPE: RedisType = RedisType::new(type_name(Kind::FixedWindow), ENCVER, methods::<fw::State>());
pub static CONCURRENCY_TYPE: RedisType = RedisType::new(type_name(Kind::Concurrency), ENCVER, methods::<cc::State>());

const fn type_name(kind: Kind) -> &'static str {
    kind.spec().data_type
}
/// CL.THROTTLE's GCRA state (registered whether or not the command is
/// enabled, so that an RDB holding one always loads).
pub static GCRA_TYPE: RedisType = RedisType::new("rl-gcrate", ENCVER, methods::<gcra::State>());

/// After registration: keep the raw type pointers where the request path
/// reads them with one load.
pub fn publish_type_pointers() -> bool {
    let tbp = *TOKENBUCKET_TYPE.raw_type.borrow();
    let slp = *SLIDINGLOG_TYPE.raw_type.borrow();
    let scp = *SLIDINGCOUNTER_TYPE.raw_type.borrow();
    let fwp = *FIXEDWINDOW_TYPE.raw_type.borrow();
    TOKENBUCKET_PTR.store(tbp, Ordering::Relaxed);
    SLIDINGLOG_PTR.store(slp, Ordering::Relaxed);
    SLIDINGCOUNTER_PTR.store(scp, Ordering::Relaxed);
    FIXEDWINDOW_PTR.store(fwp, Ordering::Relaxed);
    let gcp = *GCRA_TYPE.raw_type.borrow();
    GCRA_PTR.store(gcp, Ordering::Relaxed);
    let ccp = *CONCURRENCY_TYPE.raw_type.borrow();
    CONCURRENCY_PTR.store(ccp, Ordering::Relaxed);
    !tbp.is_null() && !slp.is_null() && !scp.is_null() && !fwp.is_null() && !gcp.is_null() && !ccp.is_null()
}
