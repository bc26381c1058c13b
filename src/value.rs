//! How a limiter state sits behind a key's value pointer: the one owner of
//! the compact/wide representation. Everything that creates, reads,
//! overwrites, frees or measures a value pointer goes through [`Value`].
//!
//! A pointer is either
//! - **compact**: bit 0 set; it points to two packed `u64` words (16 bytes,
//!   the smallest allocation class that holds them), the form `pack` /
//!   `unpack` of the token bucket, sliding counter and fixed window cores
//!   produce (a fixed window always fits). A bucket or counter key thus
//!   costs 16 bytes of state instead of 24–32;
//! - **wide**: bit 0 clear; a `Box<T>` (the sliding log always, and the rare
//!   bucket or counter state outside the compact ranges).
//!
//! Redis never looks behind a module value pointer itself: it only hands it
//! to the type callbacks (active defrag, with no `defrag` callback
//! registered, moves only its own `moduleValue`), so the tag bit is ours.
//!
//! This is also the one place that claims "this key's value is a `T`": an
//! open key ([`api::Key`]) reports the module type and value pointer it
//! holds, and [`TypedKey`] checks the type against `T`'s registered one
//! and casts the pointer, together.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::Relaxed};

use ratelimit_core::{
    concurrency as cc, fixedwindow as fw, gcra, slidingcounter as sc, slidinglog as sl, tokenbucket as tb,
};
use redis_module::raw::RedisModuleType;

use crate::alloc::usable;
use crate::api::{self, Contents};

/// The registered data types (set once at load by `types.rs`, read on the
/// request path with one load).
pub static TOKENBUCKET_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());
pub static SLIDINGLOG_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());
pub static SLIDINGCOUNTER_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());
pub static FIXEDWINDOW_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());
pub static GCRA_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());
pub static CONCURRENCY_PTR: AtomicPtr<RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Bytes of a module key the server does not count in `MEMORY USAGE`,
/// added to every value's size: measured at load (`memusage.rs`); 0 where
/// no server runs (unit tests).
static WRAPPER: AtomicUsize = AtomicUsize::new(0);

/// The server's uncounted wrapper around one module value, in bytes.
#[inline]
pub fn wrapper() -> usize {
    WRAPPER.load(Relaxed)
}

/// Set [`wrapper`] (at load, or from the deferred probe's timer).
pub fn set_wrapper(bytes: usize) {
    WRAPPER.store(bytes, Relaxed);
}

/// A state that can sit behind a value pointer of its registered type. A
/// type with a two-word compact form overrides `pack` and `unpack`; the
/// defaults mean "always wide".
pub trait Packable: Sized + Clone {
    /// The registered data type whose values hold this state.
    fn redis_type() -> *mut RedisModuleType;
    /// The compact form, when this state fits it.
    fn pack(&self) -> Option<[u64; 2]> {
        None
    }
    /// [`Packable::pack`] into `out` (true when it fits; `out` is left
    /// untouched otherwise): a type with a compact form overrides it with
    /// its own, which writes the words without an `Option` in between.
    #[inline(always)]
    fn pack_to(&self, out: &mut [u64; 2]) -> bool {
        match self.pack() {
            Some(w) => {
                *out = w;
                true
            }
            None => false,
        }
    }
    /// The state behind compact words (None: this type has no compact form).
    fn unpack(_words: [u64; 2]) -> Option<Self> {
        None
    }
    /// [`Packable::unpack`] of words of this type's compact form (a fresh
    /// state for a type that has none), without the `Option`: a type with
    /// a compact form overrides it with its own (total) unpack.
    #[inline(always)]
    fn unpack_or_default(words: [u64; 2]) -> Self
    where
        Self: Default,
    {
        Self::unpack(words).unwrap_or_default()
    }
    /// Heap bytes the state owns beyond its own size (MEMORY USAGE).
    fn heap_bytes(&self) -> usize {
        0
    }
    /// The heap block the state owns, if any (MEMORY USAGE asks the
    /// allocator for its real size).
    fn heap_block(&self) -> Option<*const u8> {
        None
    }
}

impl Packable for tb::State {
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        TOKENBUCKET_PTR.load(Relaxed)
    }
    #[inline]
    fn pack(&self) -> Option<[u64; 2]> {
        tb::State::pack(self)
    }
    #[inline(always)]
    fn pack_to(&self, out: &mut [u64; 2]) -> bool {
        tb::State::pack_to(self, out)
    }
    #[inline]
    fn unpack(w: [u64; 2]) -> Option<Self> {
        Some(tb::State::unpack(w))
    }
    #[inline(always)]
    fn unpack_or_default(w: [u64; 2]) -> Self {
        tb::State::unpack(w)
    }
}

impl Packable for sc::State {
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        SLIDINGCOUNTER_PTR.load(Relaxed)
    }
    #[inline]
    fn pack(&self) -> Option<[u64; 2]> {
        sc::State::pack(self)
    }
    #[inline]
    fn unpack(w: [u64; 2]) -> Option<Self> {
        Some(sc::State::unpack(w))
    }
    #[inline(always)]
    fn unpack_or_default(w: [u64; 2]) -> Self {
        sc::State::unpack(w)
    }
}

/// A fixed window is always compact: its two words are the state.
impl Packable for fw::State {
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        FIXEDWINDOW_PTR.load(Relaxed)
    }
    #[inline]
    fn pack(&self) -> Option<[u64; 2]> {
        fw::State::pack(self)
    }
    #[inline]
    fn unpack(w: [u64; 2]) -> Option<Self> {
        Some(fw::State::unpack(w))
    }
    #[inline(always)]
    fn unpack_or_default(w: [u64; 2]) -> Self {
        fw::State::unpack(w)
    }
}

impl Packable for sl::State {
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        SLIDINGLOG_PTR.load(Relaxed)
    }
    fn heap_bytes(&self) -> usize {
        sl::State::heap_bytes(self)
    }
    fn heap_block(&self) -> Option<*const u8> {
        sl::State::heap_block(self)
    }
}

/// RL.CONCURRENCY's leases: always wide (a box holding the lease buffer).
impl Packable for cc::State {
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        CONCURRENCY_PTR.load(Relaxed)
    }
    fn heap_bytes(&self) -> usize {
        cc::State::heap_bytes(self)
    }
    fn heap_block(&self) -> Option<*const u8> {
        cc::State::heap_block(self)
    }
}

impl Packable for gcra::State {
    #[inline]
    fn redis_type() -> *mut RedisModuleType {
        GCRA_PTR.load(Relaxed)
    }
    #[inline]
    fn pack(&self) -> Option<[u64; 2]> {
        gcra::State::pack(self)
    }
    #[inline]
    fn unpack(w: [u64; 2]) -> Option<Self> {
        Some(gcra::State::unpack(w))
    }
    #[inline(always)]
    fn unpack_or_default(w: [u64; 2]) -> Self {
        gcra::State::unpack(w)
    }
}

const COMPACT_TAG: usize = 1;
const _: () = assert!(std::mem::align_of::<[u64; 2]>() > COMPACT_TAG);

/// What a value pointer is, decoded once.
enum Form<T> {
    Null,
    Compact(*mut [u64; 2]),
    Wide(*mut T),
}

/// The value-pointer operations for states of type `T` (no instance: every
/// function takes the raw pointer Redis stores).
pub struct Value<T>(PhantomData<T>);

impl<T: Packable> Value<T> {
    #[inline]
    fn form(p: *const c_void) -> Form<T> {
        if p.is_null() {
            Form::Null
        } else if p.addr() & COMPACT_TAG != 0 {
            Form::Compact(p.map_addr(|a| a & !COMPACT_TAG).cast::<[u64; 2]>().cast_mut())
        } else {
            Form::Wide(p.cast::<T>().cast_mut())
        }
    }

    /// A new value pointer owning `v`, compact when `v` fits.
    #[inline]
    pub fn create(v: T) -> *mut c_void {
        match v.pack() {
            Some(w) => Box::into_raw(Box::new(w)).map_addr(|a| a | COMPACT_TAG).cast::<c_void>(),
            None => Box::into_raw(Box::new(v)).cast::<c_void>(),
        }
    }

    /// Free a value pointer made by [`Value::create`].
    ///
    /// # Safety
    /// `p` is NULL or a pointer made by [`Value::create`] for this `T`, not
    /// freed, not borrowed, and not used afterwards.
    pub unsafe fn free(p: *mut c_void) {
        // SAFETY: `create` made these with Box::into_raw of exactly these
        // types (the tag removed by `form`); the caller frees each once and
        // does not use it afterwards.
        unsafe {
            match Self::form(p) {
                Form::Null => {}
                Form::Compact(w) => drop(Box::from_raw(w)),
                Form::Wide(b) => drop(Box::from_raw(b)),
            }
        }
    }
}

/// A live value pointer of `T`'s type, borrowed exclusively for `'a`:
/// written in place through safe methods.
pub struct ValueMut<'a, T> {
    p: *mut c_void,
    _v: PhantomData<&'a mut T>,
}

impl<'a, T: Packable> ValueMut<'a, T> {
    /// Borrow the value behind `p` exclusively; None for NULL.
    ///
    /// # Safety
    ///
    /// `p` is NULL or a pointer made by [`Value::create`] for this `T`, not
    /// freed, and no other reference to its state is alive, for `'a`.
    #[inline]
    pub unsafe fn from_raw(p: *mut c_void) -> Option<Self> {
        (!p.is_null()).then_some(ValueMut { p, _v: PhantomData })
    }

    /// The state in place, if the pointer is wide (None for a compact one).
    #[inline]
    pub fn wide(self) -> Option<&'a mut T> {
        match Value::<T>::form(self.p) {
            // SAFETY: an untagged live pointer from `create` is a boxed T,
            // borrowed exclusively for `'a` (`from_raw`).
            Form::Wide(b) => Some(unsafe { &mut *b }),
            _ => None,
        }
    }

    /// [`ValueMut::overwrite`] with a state read where it lies: false
    /// (nothing written) when the pointer's form cannot hold it.
    #[inline(always)]
    pub fn overwrite_copy(self, v: &T) -> bool
    where
        T: Copy,
    {
        // SAFETY: as in `overwrite`.
        unsafe {
            match Value::<T>::form(self.p) {
                Form::Compact(w) => v.pack_to(&mut *w),
                Form::Wide(b) if v.pack().is_none() => {
                    *b = *v;
                    true
                }
                _ => false,
            }
        }
    }

    /// Replace the state in place, or hand `v` back when the pointer's form
    /// cannot hold it (the caller then sets a new value).
    #[inline(always)]
    pub fn overwrite(self, v: T) -> Result<(), T> {
        // SAFETY: a tagged live pointer from `create` is, untagged, a boxed
        // `[u64; 2]`; an untagged one a boxed, initialised T (the old state
        // is dropped by the assignment); both borrowed exclusively
        // (`from_raw`).
        unsafe {
            match Value::<T>::form(self.p) {
                Form::Compact(w) if v.pack_to(&mut *w) => Ok(()),
                Form::Wide(b) if v.pack().is_none() => {
                    *b = v;
                    Ok(())
                }
                _ => Err(v),
            }
        }
    }
}

/// A live value pointer of `T`'s type (or NULL), borrowed for `'a`: read
/// through safe methods.
#[derive(Clone, Copy)]
pub struct ValueRef<'a, T> {
    p: *const c_void,
    _v: PhantomData<&'a T>,
}

impl<T: Packable> ValueRef<'_, T> {
    /// Borrow the value behind `p`.
    ///
    /// # Safety
    ///
    /// `p` is NULL or a pointer made by [`Value::create`] for this `T`, not
    /// freed, nor written through another pointer, while the borrow lasts.
    #[inline]
    pub unsafe fn from_raw(p: *const c_void) -> Self {
        ValueRef { p, _v: PhantomData }
    }

    /// Run `f` on the state (None for NULL).
    #[inline]
    pub fn with<R>(self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let form = Value::<T>::form(self.p);
        // SAFETY: a live pointer from `create` for this T (`from_raw`): a
        // tagged one points, untagged, to a boxed `[u64; 2]`, an untagged one
        // to a boxed T; both aligned and initialised, and only read here.
        let state = unsafe {
            match form {
                Form::Null => return None,
                Form::Compact(w) => Err(*w),
                Form::Wide(b) => Ok(&*b),
            }
        };
        match state {
            Ok(v) => Some(f(v)),
            Err(w) => T::unpack(w).map(|v| f(&v)),
        }
    }

    /// A copy of the state, a fresh one for NULL: [`ValueRef::with`] without
    /// the closure and the `Option`s (the compact form read by
    /// [`Packable::unpack_or_default`]).
    #[inline(always)]
    pub fn get_or_default(self) -> T
    where
        T: Copy + Default,
    {
        // SAFETY: as in `with`.
        unsafe {
            match Value::<T>::form(self.p) {
                Form::Null => T::default(),
                Form::Compact(w) => T::unpack_or_default(*w),
                Form::Wide(b) => *b,
            }
        }
    }

    /// Bytes behind the pointer, for MEMORY USAGE.
    pub fn size(self) -> usize {
        // SAFETY: `w` is the live block `create` allocated for the words,
        // `b` a live boxed T from `create` (`from_raw`), only read here; it
        // and the heap block it owns (if any) are live allocations of the
        // global allocator, as `usable` requires.
        unsafe {
            match Value::<T>::form(self.p) {
                Form::Null => 0,
                Form::Compact(w) => wrapper() + usable(w.cast(), std::mem::size_of::<[u64; 2]>()),
                Form::Wide(b) => {
                    let heap = (*b).heap_block().map_or(0, |h| usable(h.cast(), (*b).heap_bytes()));
                    wrapper() + usable(b.cast(), std::mem::size_of::<T>()) + heap
                }
            }
        }
    }
}

/// What an open key holds, checked for a limiter type ([`TypedKey::holds`]):
/// nothing, a value of that type, or anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    Empty,
    Ours,
    WrongType,
}

/// An open key's value as a limiter state: the type check and the pointer
/// cast, in one place. The value is reached only through the key, so a
/// borrow of it ends before the key is written, deleted or closed.
pub trait TypedKey {
    /// What the key holds, checked for the registered type `ty`.
    fn holds(&mut self, ty: *mut RedisModuleType) -> Holds;
    /// The address of the module value the key holds, 0 when it holds none:
    /// two open keys whose values are at distinct nonzero addresses are
    /// distinct keys (a key owns its value).
    fn value_addr(&self) -> usize;
    /// A copy of the state the key holds, if it holds a `T`.
    fn read<T: Packable + Copy>(&self) -> Option<T>;
    /// What the key holds as a `T`, read once: None when it holds another
    /// type, a fresh (default) state when it holds nothing, else a copy of
    /// its state ([`TypedKey::holds`] and [`TypedKey::read`] in one check).
    fn state<T: Packable + Copy + Default>(&mut self) -> Option<T>;
    /// The state the key holds in place, if it holds a wide `T`.
    fn wide_mut<T: Packable>(&mut self) -> Option<&mut T>;
    /// Store `new` in the key: in place when it already holds `T` in a form
    /// that can hold `new`, else as a new value.
    fn store<T: Packable>(&mut self, new: T) -> bool;
    /// [`TypedKey::store`] of a state read where it lies (copied only when
    /// it becomes a new value).
    fn store_copy<T: Packable + Copy>(&mut self, new: &T) -> bool;
    /// Set the key to a new value holding `v`.
    fn set_new<T: Packable>(&mut self, v: T) -> bool;
}

/// The value pointer if the key holds one of `T`'s registered type.
#[inline]
fn ours<T: Packable>(key: &api::Key) -> *mut c_void {
    let (ty, val) = key.module_value();
    if !val.is_null() && !ty.is_null() && ty == T::redis_type() {
        val
    } else {
        ptr::null_mut()
    }
}

impl TypedKey for api::Key<'_> {
    #[inline]
    fn holds(&mut self, ty: *mut RedisModuleType) -> Holds {
        match self.contents() {
            Contents::Empty => Holds::Empty,
            Contents::Module(t, v) if t == ty && !ty.is_null() && !v.is_null() => Holds::Ours,
            Contents::Module(..) | Contents::Other => Holds::WrongType,
        }
    }

    #[inline]
    fn value_addr(&self) -> usize {
        self.module_value().1.addr()
    }

    #[inline]
    fn read<T: Packable + Copy>(&self) -> Option<T> {
        // SAFETY: `ours` is NULL or the key's value of `T`'s registered
        // type, which every value of that type is laid out as (made by
        // `Value::create` for `T`), alive while the key is open.
        unsafe { ValueRef::<T>::from_raw(ours::<T>(self)) }.with(|v| *v)
    }

    #[inline(always)]
    fn state<T: Packable + Copy + Default>(&mut self) -> Option<T> {
        // One read for both: no value (NULL) reads as a fresh state.
        let v = match self.contents() {
            Contents::Empty => ptr::null_mut(),
            Contents::Module(t, v) if t == T::redis_type() && !t.is_null() && !v.is_null() => v,
            Contents::Module(..) | Contents::Other => return None,
        };
        // SAFETY: `v` is NULL or the key's value of `T`'s registered type
        // (checked here), laid out as `Value::create` made it for `T`,
        // alive while the key is open.
        Some(unsafe { ValueRef::<T>::from_raw(v) }.get_or_default())
    }

    #[inline]
    fn wide_mut<T: Packable>(&mut self) -> Option<&mut T> {
        // SAFETY: as in `read`; the borrow of the key keeps the value alive
        // and unaliased while the reference is used (the value is reached
        // only through the key).
        unsafe { ValueMut::<T>::from_raw(ours::<T>(self)) }?.wide()
    }

    #[inline(always)]
    fn store<T: Packable>(&mut self, new: T) -> bool {
        // SAFETY: as in `wide_mut`.
        let new = match unsafe { ValueMut::<T>::from_raw(ours::<T>(self)) } {
            None => new,
            Some(v) => match v.overwrite(new) {
                Ok(()) => return true,
                Err(v) => v,
            },
        };
        self.set_new(new)
    }

    #[inline(always)]
    fn store_copy<T: Packable + Copy>(&mut self, new: &T) -> bool {
        // SAFETY: as in `wide_mut`.
        if let Some(v) = unsafe { ValueMut::<T>::from_raw(ours::<T>(self)) } {
            if v.overwrite_copy(new) {
                return true;
            }
        }
        self.set_new(*new)
    }

    #[inline]
    fn set_new<T: Packable>(&mut self, v: T) -> bool {
        let p = Value::create(v);
        // SAFETY: `p`, made by `Value::create` for `T`, is what the
        // callbacks of `T`'s registered type take; on failure nobody owns
        // it, and it is freed once here.
        unsafe {
            let ok = self.set_module_value(T::redis_type(), p);
            if !ok {
                Value::<T>::free(p);
            }
            ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::PACK_EPOCH_US;

    /// A state in its compact range round-trips through a tagged pointer, a
    /// state outside it through a box; overwrite switches forms only by
    /// handing the value back; size and free agree with the form.
    #[test]
    fn compact_and_wide_forms_agree() {
        let small = tb::State { tokens: 3, frac: 0, den: 1000, last_us: PACK_EPOCH_US + 5 };
        let wide = tb::State { tokens: 3, frac: 0, den: 1000, last_us: 1 };
        assert!(small.pack().is_some() && wide.pack().is_none());
        // SAFETY: every pointer is made by Value::create, used while live,
        // borrowed by one handle at a time and freed once.
        unsafe {
            let p = Value::create(small);
            assert_eq!(p.addr() & COMPACT_TAG, 1);
            assert_eq!(ValueRef::<tb::State>::from_raw(p).with(|s| *s), Some(small));
            assert_eq!(ValueRef::<tb::State>::from_raw(p).size(), 16);
            assert!(ValueMut::<tb::State>::from_raw(p).and_then(ValueMut::wide).is_none());
            assert_eq!(ValueMut::from_raw(p).map(|h| h.overwrite(wide)), Some(Err(wide)));
            let small2 = tb::State { tokens: 4, ..small };
            assert_eq!(ValueMut::from_raw(p).map(|h| h.overwrite(small2)), Some(Ok(())));
            assert_eq!(ValueRef::<tb::State>::from_raw(p).with(|s| *s), Some(small2));
            Value::<tb::State>::free(p);

            let q = Value::create(wide);
            assert_eq!(q.addr() & COMPACT_TAG, 0);
            assert_eq!(ValueRef::<tb::State>::from_raw(q).with(|s| *s), Some(wide));
            assert_eq!(ValueRef::<tb::State>::from_raw(q).size(), std::mem::size_of::<tb::State>());
            assert_eq!(ValueMut::from_raw(q).map(|h| h.overwrite(small)), Some(Err(small)));
            Value::<tb::State>::free(q);

            assert_eq!(ValueRef::<tb::State>::from_raw(std::ptr::null()).with(|s| *s), None);
            assert_eq!(ValueRef::<tb::State>::from_raw(std::ptr::null()).size(), 0);
            Value::<tb::State>::free(std::ptr::null_mut());
        }
    }

    #[test]
    fn a_sliding_log_is_always_wide() {
        let mut log = sl::State::default();
        sl::grant(&mut log, 1000, 1, PACK_EPOCH_US);
        // SAFETY: as in the test above.
        unsafe {
            let p = Value::create(log.clone());
            assert_eq!(p.addr() & COMPACT_TAG, 0);
            assert_eq!(ValueRef::<sl::State>::from_raw(p).with(Clone::clone), Some(log.clone()));
            assert!(ValueMut::<sl::State>::from_raw(p).and_then(ValueMut::wide).is_some());
            let heap = ValueRef::<sl::State>::from_raw(p).with(|s| s.heap_bytes()).unwrap();
            assert!(heap >= 4);
            assert_eq!(ValueRef::<sl::State>::from_raw(p).size(), std::mem::size_of::<sl::State>() + heap);
            Value::<sl::State>::free(p);
        }
    }
}
