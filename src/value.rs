//! How a limiter state sits behind a key's value pointer: the one owner of
//! the compact/wide representation. Everything that creates, reads,
//! overwrites, frees or measures a value pointer goes through [`Value`].
//!
//! A pointer is either
//! - **compact**: bit 0 set; it points to two packed `u64` words (16 bytes,
//!   the smallest allocation class that holds them), the form `pack` /
//!   `unpack` of the token bucket and sliding counter cores produce. A bucket
//!   or counter key thus costs 16 bytes of state instead of 24–32;
//! - **wide**: bit 0 clear; a `Box<T>` (the sliding log always, and the rare
//!   bucket or counter state outside the compact ranges).
//!
//! Redis never looks behind a module value pointer itself: it only hands it
//! to the type callbacks (active defrag, with no `defrag` callback
//! registered, moves only its own `moduleValue`), so the tag bit is ours.

use std::ffi::c_void;
use std::marker::PhantomData;

use ratelimit_core::{slidingcounter as sc, slidinglog as sl, tokenbucket as tb};

/// A state that can sit behind a value pointer. A type with a two-word
/// compact form overrides both functions; the defaults mean "always wide".
pub trait Packable: Sized + Clone {
    /// The compact form, when this state fits it.
    fn pack(&self) -> Option<[u64; 2]> {
        None
    }
    /// The state behind compact words (None: this type has no compact form).
    fn unpack(_words: [u64; 2]) -> Option<Self> {
        None
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
    fn pack(&self) -> Option<[u64; 2]> {
        tb::State::pack(self)
    }
    #[inline]
    fn unpack(w: [u64; 2]) -> Option<Self> {
        Some(tb::State::unpack(w))
    }
}

impl Packable for sc::State {
    #[inline]
    fn pack(&self) -> Option<[u64; 2]> {
        sc::State::pack(self)
    }
    #[inline]
    fn unpack(w: [u64; 2]) -> Option<Self> {
        Some(sc::State::unpack(w))
    }
}

impl Packable for sl::State {
    fn heap_bytes(&self) -> usize {
        sl::State::heap_bytes(self)
    }
    fn heap_block(&self) -> Option<*const u8> {
        sl::State::heap_block(self)
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

    /// Replace the state in place, or hand `v` back when the pointer's form
    /// cannot hold it (the caller then sets a new value).
    #[inline]
    pub fn overwrite(self, v: T) -> Result<(), T> {
        // SAFETY: a tagged live pointer from `create` is, untagged, a boxed
        // `[u64; 2]`; an untagged one a boxed, initialised T (the old state
        // is dropped by the assignment); both borrowed exclusively
        // (`from_raw`).
        unsafe {
            match (Value::<T>::form(self.p), v.pack()) {
                (Form::Compact(w), Some(new)) => {
                    *w = new;
                    Ok(())
                }
                (Form::Wide(b), None) => {
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

    /// Bytes behind the pointer, for MEMORY USAGE.
    pub fn size(self) -> usize {
        use crate::memusage::{usable, wrapper};
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
