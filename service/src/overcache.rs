//! `LOCAL_CACHE_SIZE_IN_BYTES`: the keys known to be over their limit,
//! kept in memory until the time they could take one unit again, so that
//! an abusive client's requests are denied without a Redis call.
//!
//! A key is marked when a decision leaves it with nothing: a fixed window
//! with 0 remaining (granted or denied) until its window's end; another
//! algorithm when it denied one unit (a part of weight 1), until its
//! `retry_after_ms`. A denial for more hits than remain marks nothing
//! (one unit may still fit). The times are on the monotonic clock, from
//! the durations Redis (or the window's end) gave. A request with a
//! marked key among its parts that are not in shadow mode is denied from
//! here and takes nothing anywhere, as a denial by Redis would (the rule
//! of docs/envoy.md); its other descriptors are not read.
//!
//! The memory: each entry counts its key's bytes and [`ENTRY_BYTES`];
//! when the next entry does not fit, expired entries are dropped, and if
//! it still does not fit it is not kept (the decisions are the same
//! without it, only Redis sees the call).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// What an entry costs beyond its key: the map's slot, the key's box, the time.
pub const ENTRY_BYTES: usize = 64;

/// The cache (absent when `LOCAL_CACHE_SIZE_IN_BYTES` is 0).
pub struct OverCache {
    budget: usize,
    start: Instant,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Key → the monotonic ms until which it is over.
    until: HashMap<Box<str>, u64>,
    bytes: usize,
}

impl OverCache {
    /// A cache of at most `bytes`, or none for 0.
    pub fn new(bytes: u64) -> Option<OverCache> {
        (bytes > 0).then(|| OverCache {
            budget: usize::try_from(bytes).unwrap_or(usize::MAX),
            start: Instant::now(),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Monotonic milliseconds since the cache was made.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The milliseconds `key` stays over its limit from `now_ms`, if marked.
    pub fn over_for(&self, key: &str, now_ms: u64) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.until.get(key).and_then(|&u| u.checked_sub(now_ms)).filter(|&ms| ms > 0)
    }

    /// Marks `key` over its limit for `ms` from `now_ms`; whether it was kept.
    pub fn mark(&self, key: &str, ms: u64, now_ms: u64) -> bool {
        if ms == 0 {
            return false;
        }
        let until = now_ms.saturating_add(ms);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = inner.until.get_mut(key) {
            *u = until;
            return true;
        }
        let cost = key.len() + ENTRY_BYTES;
        if inner.bytes + cost > self.budget {
            let Inner { until: map, bytes } = &mut *inner;
            map.retain(|k, u| {
                let keep = *u > now_ms;
                if !keep {
                    *bytes -= k.len() + ENTRY_BYTES;
                }
                keep
            });
            if inner.bytes + cost > self.budget {
                return false;
            }
        }
        inner.until.insert(key.into(), until);
        inner.bytes += cost;
        true
    }

    /// Drops `key`'s mark (units were given back to it: `is_negative_hits`).
    pub fn unmark(&self, key: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.until.remove(key).is_some() {
            inner.bytes -= key.len() + ENTRY_BYTES;
        }
    }

    /// The entries held and their bytes (expired ones included until swept).
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (inner.until.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_expire_and_the_budget_holds() {
        let c = OverCache::new(3 * (ENTRY_BYTES + 2) as u64).unwrap();
        assert!(OverCache::new(0).is_none());
        assert!(c.mark("k1", 100, 0) && c.mark("k2", 50, 0) && c.mark("k3", 10, 0));
        assert_eq!((c.over_for("k1", 40), c.over_for("k2", 50), c.over_for("zz", 0)), (Some(60), None, None));
        // full: a fourth fits only once an expired one is swept
        assert!(!c.mark("k4", 10, 5));
        assert!(c.mark("k4", 10, 20));
        assert_eq!(c.usage(), (3, 3 * (ENTRY_BYTES + 2)));
        // marking again moves the time, costs nothing more
        assert!(c.mark("k1", 500, 20));
        assert_eq!(c.over_for("k1", 20), Some(500));
    }
}
