//! What a limiter key really costs, for `MEMORY USAGE`: every block the
//! value holds at the size the allocator gave it (its size class under
//! jemalloc, the usable chunk size under libc malloc), plus the server's own
//! wrapper around a module value that the server leaves out of a module
//! key's `MEMORY USAGE`.
//!
//! The wrapper: every server allocates a 16-byte `moduleValue` (type and
//! value pointers) for a module key and never counts it. Redis 7.x (and
//! Valkey before 8.1) also keep a separate 16-byte object header (`robj`)
//! that a string key's MEMORY USAGE counts but a module key's does not;
//! Valkey 8.1+ embeds the key name in that header and counts it for every
//! type. Which layout the server has is not visible through the module API,
//! so it is read from whether the server exports Valkey's API names (the
//! only servers this module is tested on with the embedded layout); on
//! Valkey 8.0 (untested) that leaves the header's 16 bytes out.
//!
//! Measured at load: the allocator's usable size of a 16-byte block.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use redis_module::raw;

/// Bytes of the server's wrapper not counted by the server: set at load;
/// 0 where no server runs (unit tests), where the blocks' requested sizes
/// stand in for their allocated ones as well.
static WRAPPER: AtomicUsize = AtomicUsize::new(0);

/// The allocator's size for the block at `p` (allocated through Redis's
/// allocator); 0 for NULL. Falls back to `fallback` where the server offers
/// neither size function.
#[inline]
pub unsafe fn usable(p: *const c_void, fallback: usize) -> usize {
    if p.is_null() {
        return 0;
    }
    if let Some(f) = raw::RedisModule_MallocUsableSize {
        return f(p.cast_mut());
    }
    if let Some(f) = raw::RedisModule_MallocSize {
        return f(p.cast_mut());
    }
    fallback
}

/// The server's uncounted wrapper around one module value, in bytes.
#[inline]
pub fn wrapper() -> usize {
    WRAPPER.load(Relaxed)
}

/// Measure the wrapper once, at load.
pub unsafe fn init() {
    let (Some(alloc), Some(free)) = (raw::RedisModule_Alloc, raw::RedisModule_Free) else { return };
    let p = alloc(16);
    let block = usable(p, 16).max(16);
    free(p);
    let header = if crate::ffi::server_is_valkey() { 0 } else { block };
    WRAPPER.store(block + header, Relaxed);
}
