//! RL.CONCURRENCY's decoder target: the state a RESTORE or RDB load would
//! make from outside bytes, then every action on it compared with the
//! reference model (`reference::concurrency`), each write's state valid.

use crate::core::concurrency::{self as cc, Action, Call, Change, State};
use crate::core::reference::concurrency::Leases;
use crate::core::MAX_ARG;

/// A valid state from any bytes (RL.MULTI's target seeds its limits so):
/// up to 16 leases of 1 to 8 units, ending up to about 4 s around `now`,
/// ids 0 to 7, the last write a little before `now`.
pub fn synth_cc(b: &[u8], now: u64) -> State {
    let mut s = State::default();
    let start = now.saturating_sub(2_000_000);
    for c in b.chunks(3).take(16) {
        let (e, h, u) = (c.first().copied().unwrap_or(0), c.get(1).copied().unwrap_or(0), c.get(2).copied().unwrap_or(0));
        let end = start.saturating_add(u64::from(e) * 16_000 + 1);
        let change = Change { now_us: start, hash: u64::from(h % 8), units: u64::from(u % 8) + 1, expiry_us: end };
        let _ = s.apply(&change);
    }
    if s.is_fresh_at(start) {
        State::default()
    } else {
        s
    }
}

/// The model holding the same leases as `s`.
pub fn model_of(s: &State) -> Leases {
    let mut m = Leases { last: s.last_us(), ..Leases::default() };
    for l in s.leases() {
        m.by_hash.insert(l.hash, (l.units, l.expiry_us));
    }
    m
}

fn encode(s: &State) -> Vec<u8> {
    let mut out = Vec::new();
    s.encode(&mut out);
    out
}

/// Live units at `now` (read as the commands read it).
fn held(s: &State, now: u64) -> u64 {
    let t = now.max(s.last_us());
    s.leases().iter().filter(|l| t < l.expiry_us).map(|l| l.units).sum()
}

/// Apply a call's change as the module does (a state left with no live
/// lease is the key deleted), checking the state stays valid and the held
/// units within the larger of the limit and what was held.
fn store(s: &State, change: Option<Change>, now: u64, limit: u64) -> State {
    let mut after = s.clone();
    let Some(c) = change else { return after };
    let before = held(s, now);
    after.apply(&c).expect("a change made by a view of this state fits it");
    if after.is_fresh_at(now) {
        return State::default();
    }
    assert_eq!(State::decode(&encode(&after)).as_ref(), Ok(&after), "a stored state is valid");
    assert!(held(&after, now) <= limit.max(before), "held above the limit");
    after
}

pub fn decode_concurrency(data: &[u8]) {
    let Ok(s) = State::decode(data) else { return };
    assert_eq!(encode(&s), data, "accepted bytes do not re-encode");
    assert!(s.heap_bytes() <= data.len(), "heap {} for {} input bytes", s.heap_bytes(), data.len());
    let (first, last) = (s.leases().first().map_or(0, |l| l.expiry_us), s.leases().last().map_or(0, |l| l.expiry_us));
    let total: u64 = s.leases().iter().map(|l| l.units).sum();
    let ids = [s.leases().first().map_or(0, |l| l.hash), s.leases().last().map_or(0, |l| l.hash), 0x5eed];
    for (limit, lease_ms) in [(1, 1), (total, 1000), (total.saturating_add(1).min(MAX_ARG), 60_000), (MAX_ARG, MAX_ARG)] {
        for now in [s.last_us(), first.saturating_sub(1), first, last, 0, u64::MAX] {
            for id_hash in ids {
                let p = cc::Params { limit, lease_ms, id_hash };
                // The model's arithmetic is exact only where the new
                // lease's expiry fits the clock.
                let modelled = now.max(s.last_us()).checked_add(lease_ms * 1000).is_some();
                for cost in [0, 1, limit] {
                    for partial in [false, true] {
                        let call = Call { params: p, action: Action::Acquire { cost, partial, dryrun: false } };
                        let (d, change) = cc::step(&s, &call, now);
                        if modelled {
                            assert_eq!(d, model_of(&s).acquire(&p, cost, partial, now, false), "acquire {cost} {partial}");
                        }
                        store(&s, change, now, limit);
                    }
                }
                let v = cc::View::at(&s, &p, now);
                let (d, change) = v.release();
                if modelled {
                    assert_eq!(d, model_of(&s).give_back(&p, u64::MAX, 1, now), "release");
                }
                store(&s, change, now, limit);
                let (d, change) = v.renew();
                if modelled {
                    assert_eq!(d, model_of(&s).renew(&p, now), "renew");
                }
                store(&s, change, now, limit);
            }
        }
    }
}
