//! Shared by the sliding log's tests: the reference model, the invariant
//! checks and small helpers.

use super::packed::{dbits_of, unpack, MOVED};
use super::{decide, grant, Params, State};
use crate::Decision;

// ---------------------------------------------------------------
// Reference model: a plain list of (time, units), exact arithmetic.
// ---------------------------------------------------------------

#[derive(Clone, Debug, Default)]
pub(super) struct Model {
    pub(super) log: Vec<(u64, u128)>,
}

fn ceil_ms(us: i128) -> i128 {
    (us + 999).div_euclid(1000)
}

impl Model {
    pub(super) fn now_eff(&self, now: u64) -> u64 {
        self.log.last().map_or(now, |&(t, _)| now.max(t))
    }

    pub(super) fn in_window(t: u64, now: u64, window_ms: u64) -> bool {
        // now − W < t, in signed 128-bit arithmetic.
        i128::from(now) - i128::from(window_ms) * 1000 < i128::from(t)
    }

    pub(super) fn decide(&self, p: &Params, cost: u64, partial: bool, now_real: u64) -> Decision {
        let now = self.now_eff(now_real);
        let live: Vec<(u64, u128)> =
            self.log.iter().copied().filter(|&(t, _)| Self::in_window(t, now, p.window_ms)).collect();
        let used: i128 = live.iter().map(|&(_, u)| u as i128).sum();
        let (limit, cost_i) = (i128::from(p.limit), i128::from(cost));
        let granted: i128 = if partial {
            cost_i.min((limit - used).max(0))
        } else if used + cost_i <= limit {
            cost_i
        } else {
            0
        };
        let remaining = (limit - used - granted).max(0);
        let mut after = live.clone();
        if granted > 0 {
            after.push((now, granted as u128));
        }
        let w = i128::from(p.window_ms) * 1000;
        let retry = if granted == cost_i {
            0
        } else if cost_i > limit {
            -1
        } else {
            let excess = used + granted + cost_i - limit;
            assert!(excess > 0);
            let mut acc = 0i128;
            let mut found = None;
            for &(t, u) in &after {
                acc += u as i128;
                if acc >= excess {
                    found = Some(t);
                    break;
                }
            }
            let t = found.expect("model: the walk must reach the excess");
            ceil_ms(i128::from(t) + w - i128::from(now_real))
        };
        let reset = match after.last() {
            Some(&(t, _)) => ceil_ms(i128::from(t) + w - i128::from(now_real)),
            None => 0,
        };
        Decision {
            granted: granted as u64,
            limit: p.limit,
            remaining: remaining as u64,
            retry_after_ms: retry as i64,
            reset_after_ms: reset as u64,
        }
    }

    pub(super) fn grant(&mut self, window_ms: u64, units: u64, now: u64) {
        let now = self.now_eff(now);
        match self.log.last_mut() {
            Some((t, u)) if *t == now => *u += u128::from(units),
            _ => self.log.push((now, u128::from(units))),
        }
        self.log.retain(|&(t, _)| Self::in_window(t, now, window_ms));
    }

    pub(super) fn entries(&self) -> Vec<(u64, u64)> {
        self.log.iter().map(|&(t, u)| (t, u as u64)).collect()
    }
}

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
