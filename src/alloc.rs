//! Global allocator: Redis's allocator inside the server (so MEMORY USAGE,
//! `used_memory` and maxmemory see every byte), the system allocator where
//! Redis is absent (unit tests, fuzzing, benchmarks of the pure cores).
//!
//! The choice is made per call from whether the API pointers are set. They
//! are set by `RedisModule_Init` before the module allocates anything, and
//! never unset, so a block is always freed by the allocator that made it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;

use redis_module::raw;

use crate::ffi::opt;

pub struct ModuleAlloc;

/// Redis's allocator (jemalloc) aligns to 16 bytes; larger alignments go to
/// a size rounded up to a multiple of the alignment, as redis-module does.
#[inline]
fn size_for(layout: Layout) -> usize {
    (layout.size() + layout.align() - 1) & !(layout.align() - 1)
}

// SAFETY: each method keeps GlobalAlloc's contract: a block is freed or
// resized by the allocator that made it (see each method's SAFETY comment).
unsafe impl GlobalAlloc for ModuleAlloc {
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the API pointer is set once by RedisModule_Init, before the
        // module allocates, and never changed afterwards, so reading it races
        // with no write; the caller upholds GlobalAlloc::alloc's contract
        // (non-zero size), which is all RedisModule_Alloc and System need.
        unsafe {
            match raw::RedisModule_Alloc {
                Some(f) => f(size_for(layout)).cast(),
                None => System.alloc(layout),
            }
        }
    }
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`]: `ptr` came from this allocator's
    /// `alloc` / `realloc` with `layout`, and is not used afterwards.
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the pointer is read as in `alloc` (set before the first
        // allocation, never unset), so `ptr` was made by the same allocator
        // that frees it here: RedisModule_Alloc for RedisModule_Free, System
        // for System; the caller guarantees `ptr` is live with `layout`.
        unsafe {
            match raw::RedisModule_Free {
                Some(f) => f(ptr.cast::<c_void>()),
                None => System.dealloc(ptr, layout),
            }
        }
    }
    /// # Safety
    ///
    /// As for [`GlobalAlloc::realloc`]: `ptr` came from this allocator with
    /// `layout`, `new_size` is non-zero and, rounded up to `layout.align()`,
    /// does not overflow `isize`.
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the API pointer is read as in `alloc`, so `ptr` belongs to
        // the allocator used here. For alignments above 16 the caller's
        // contract makes (new_size, align) a valid layout (align is a power
        // of two from `layout`, and new_size rounded to it fits isize); the
        // new block holds at least min(old, new) bytes, it cannot overlap the
        // live old block, and the old block is freed with its own layout.
        unsafe {
            match raw::RedisModule_Realloc {
                Some(f) if layout.align() <= 16 => f(ptr.cast::<c_void>(), new_size).cast(),
                Some(_) => {
                    let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                }
                None => System.realloc(ptr, layout, new_size),
            }
        }
    }
}

/// The allocator's size for the block at `p` (allocated through Redis's
/// allocator); 0 for NULL. Falls back to `fallback` where the server offers
/// neither size function.
///
/// # Safety
///
/// `p` is NULL or a live block of the global allocator (Redis's allocator
/// wherever the size functions are set: see above), not yet freed.
#[inline]
pub unsafe fn usable(p: *const c_void, fallback: usize) -> usize {
    if p.is_null() {
        return 0;
    }
    match (opt!(RedisModule_MallocUsableSize), opt!(RedisModule_MallocSize)) {
        // SAFETY: where the size functions are set, the global allocator is
        // Redis's (the API pointers are set before the module allocates), so
        // `p` is a live block of the allocator they ask (the caller's
        // guarantee); they only read its size.
        (Some(f), _) | (None, Some(f)) => unsafe { f(p.cast_mut()) },
        (None, None) => fallback,
    }
}
