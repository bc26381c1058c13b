//! Tests of the packed sliding-log state (packed.rs): the empty state, memory
//! per live entry, growth in powers of two, COST n as cheap as COST 1, and
//! amortized O(1) trimming and appending.

use super::super::testutil::*;
use super::super::*;
use super::*;
use crate::Decision;

#[test]
fn default_is_empty_and_unallocated() {
    let s = State::default();
    assert!(s.is_empty());
    assert_eq!(s.heap_bytes(), 0);
    assert_eq!(fresh_at_us(&s, 1000), None);
    assert_eq!(enc(&s), vec![1, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(State::decode(&enc(&s)), Ok(State::default()));
    let p = Params { limit: 5, window_ms: 1000 };
    assert_eq!(
        decide(&s, &p, 0, false, 123),
        Decision { granted: 0, limit: 5, remaining: 5, retry_after_ms: 0, reset_after_ms: 0 }
    );
}

// ---------------------------------------------------------------
// Memory.
// ---------------------------------------------------------------

#[test]
fn memory_1000_grants_in_60s() {
    let p = Params { limit: 1000, window_ms: 60_000 };
    let mut s = State::default();
    let t0 = 1_700_000_000_000_000u64;
    // Pseudo-random distinct times inside 60 s, increasing.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut t = t0;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t += 1 + x % 119_000; // ≤ 119 ms apart: 1000 of them fit in 60 s
        let d = call(&mut s, p, 1, false, t);
        assert_eq!(d.granted, 1);
    }
    assert!(t - t0 < 60_000_000);
    assert_eq!(s.len, 1000);
    assert!(s.heap_bytes() <= 7000, "heap {}", s.heap_bytes());
    assert!(s.heap_bytes() <= 8 * 1000);
    s.check_invariants();
    // After the window passes, one more grant: back to a single entry.
    call(&mut s, p, 1, false, t + 60_000_000);
    assert_eq!(s.len, 1);
    assert!(s.heap_bytes() <= 16, "heap {}", s.heap_bytes());
}

#[test]
fn a_small_growing_log_reallocates_at_powers_of_two() {
    // One entry per grant, nothing expiring (the profile's pattern): the
    // buffer is allocated for 4 entries and regrown only at 5 and 9.
    let p = Params { limit: 1_000_000, window_ms: 3_600_000 };
    let mut s = State::default();
    let mut caps = Vec::new();
    for i in 1..=16u64 {
        call(&mut s, p, 1, false, i * 1_000_000);
        if caps.last() != Some(&s.cap_entries()) {
            caps.push(s.cap_entries());
        }
        s.check_capacity();
    }
    assert_eq!(caps, vec![4, 8, 16]);
    assert_eq!(s.heap_bytes(), 64);
    // Beyond 16 entries, 25 % slack again.
    call(&mut s, p, 1, false, 17_000_000);
    assert_eq!(s.cap_entries(), 22);
    // A log back to 3 live entries shrinks to 4 (not kept at 22).
    let p = Params { limit: 1_000_000, window_ms: 1000 };
    let mut s = State::default();
    for i in 1..=20u64 {
        call(&mut s, p, 1, false, i * 1000);
    }
    for i in 0..3u64 {
        call(&mut s, p, 1, false, 2_000_000 + i * 1000);
    }
    assert_eq!((s.len, s.cap_entries()), (3, 4));
}

#[test]
fn cost_n_costs_the_same_as_cost_1() {
    let heap = |cost: u64| {
        let p = Params { limit: 1_000_000, window_ms: 60_000 };
        let mut s = State::default();
        for i in 0..1000u64 {
            assert_eq!(call(&mut s, p, cost, false, 1_000_000 + i * 59_000).granted, cost);
        }
        s.heap_bytes()
    };
    let one = heap(1);
    assert!(one <= 7000);
    assert_eq!(heap(50), one);
    assert_eq!(heap(64), one);
}

#[test]
fn memory_proportional_to_live_entries() {
    // A limit of a million per hour reserves nothing up front.
    let p = Params { limit: 1_000_000, window_ms: 3_600_000 };
    let mut s = State::default();
    for i in 0..10 {
        call(&mut s, p, 1, false, i * 1_000_000);
    }
    assert!(s.heap_bytes() <= 10 * 8, "heap {}", s.heap_bytes());
    // 1000 grants spread evenly over an hour still fit 4-byte entries.
    let mut s = State::default();
    for i in 0..1000 {
        call(&mut s, p, 1, false, i * 3_599_000);
    }
    assert_eq!(s.words, 1);
    assert!(s.heap_bytes() <= 7000, "heap {}", s.heap_bytes());
    // Grow to 20,000 live entries, then let the rate drop: the capacity
    // follows the live entries down.
    let p = Params { limit: 1_000_000, window_ms: 1000 };
    let mut s = State::default();
    let mut now = 0;
    for _ in 0..20_000 {
        now += 50;
        call(&mut s, p, 1, false, now);
    }
    assert_eq!(s.len, 20_000);
    let peak = s.heap_bytes();
    for _ in 0..200 {
        now += 50_000;
        call(&mut s, p, 1, false, now);
        s.check_capacity();
    }
    assert!(s.len <= 21);
    assert!(s.heap_bytes() * 100 < peak, "{} vs {}", s.heap_bytes(), peak);
}

#[test]
fn trimming_and_appending_are_amortized_o1() {
    // Steady state: ~1000 live entries, 200,000 grants; also a
    // bursty pattern and a limit change. Entries moved stay O(grants).
    let before = moved();
    let p = Params { limit: 1_000_000, window_ms: 60 };
    let mut s = State::default();
    let mut now = 1u64;
    let mut grants = 0u64;
    for i in 0..200_000u64 {
        now += 60 + (i % 7);
        if call(&mut s, p, 1 + i % 3, false, now).granted > 0 {
            grants += 1;
        }
        if i % 50_000 == 0 {
            s.check_invariants();
            s.check_capacity();
        }
    }
    for burst in 0..200u64 {
        for j in 0..500 {
            now += 1 + (j % 5);
            call(&mut s, p, 1, false, now);
            grants += 1;
        }
        now += 30_000 + burst * 100;
    }
    let moved = moved() - before;
    assert!(moved <= 6 * grants, "moved {moved} entries for {grants} grants");
}
