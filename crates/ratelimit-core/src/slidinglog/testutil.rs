//! Shared by the sliding log's tests: the reference model (a plain list,
//! `reference::slidinglog`), the invariant checks and small helpers.

use super::packed::{dbits_of, unpack, MOVED};
use super::{decide, grant, Params, State};
pub(super) use crate::reference::slidinglog::Log;
use crate::Decision;

// ---------------------------------------------------------------
// Invariants (what `decode` enforces, plus the memory bounds).
// ---------------------------------------------------------------

impl State {
    pub(super) fn check_invariants(&self) {
        if self.len == 0 {
            assert_eq!(self.total, 0);
            assert_eq!(self.buf.len(), self.head * self.wn());
            return;
        }
        assert!(matches!(self.words, 1 | 2 | 4), "words {}", self.words);
        if self.words == 4 {
            assert_eq!(self.cbits, 64);
        } else {
            assert!(u32::from(self.cbits) <= 32 * u32::from(self.words));
            assert!(dbits_of(self.words, self.cbits) <= 64);
        }
        assert_eq!(self.buf.len(), (self.head + self.len) * self.wn());
        let es: Vec<(u64, u64)> = self.entries().collect();
        assert_eq!(es.len(), self.len);
        assert_eq!(es[0].0, self.head_time);
        assert_eq!(es[es.len() - 1].0, self.tail_time);
        let mut sum = 0u128;
        for (i, &(t, c)) in es.iter().enumerate() {
            assert!(c >= 1);
            if i > 0 {
                assert!(t > es[i - 1].0, "times strictly increasing");
                assert_eq!(self.raw(self.head + i).0, t - es[i - 1].0, "delta exact");
            }
            sum += u128::from(c);
        }
        assert_eq!(sum, u128::from(self.total));
        // Raw count field never holds u64::MAX (count would be 2^64).
        for idx in self.head..self.head + self.len {
            assert_ne!(unpack(self.cbits, self.load(idx)).1, u64::MAX);
        }
    }

    /// The bound every grant leaves: capacity ≤ 2 × (len + 1) entries.
    pub(super) fn check_capacity(&self) {
        if self.len > 0 {
            assert!(
                self.cap_entries() <= 2 * (self.len + 1),
                "capacity {} entries for {} live",
                self.cap_entries(),
                self.len
            );
        }
    }

    pub(super) fn entry_vec(&self) -> Vec<(u64, u64)> {
        self.entries().collect()
    }
}

pub(super) fn enc(s: &State) -> Vec<u8> {
    let mut v = Vec::new();
    s.encode(&mut v);
    v
}

/// Proptest case counts are sized for optimized builds (`cargo test
/// --release`, ~30 s on one core); unoptimized builds run a tenth.
pub(super) const fn scaled(cases: u32) -> u32 {
    if cfg!(debug_assertions) {
        cases / 10
    } else {
        cases
    }
}

pub(super) fn moved() -> u64 {
    MOVED.with(|m| m.get())
}

pub(super) const MS: u64 = 1000;

// ---------------------------------------------------------------
// Unit tests with hand-computed answers.
// ---------------------------------------------------------------

pub(super) fn call(s: &mut State, p: Params, cost: u64, partial: bool, now: u64) -> Decision {
    let d = decide(s, &p, cost, partial, now);
    if d.granted > 0 {
        grant(s, p.window_ms, d.granted, now);
    }
    d
}
