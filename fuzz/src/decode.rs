//! The decoder targets: what RDB load, RESTORE and RL.STATE run on bytes
//! from outside. Anything accepted re-encodes to the same bytes and is a
//! state the commands handle (each one's call checks, at several times and
//! under several rules).

use crate::args::Call;
use crate::core::MAX_ARG;
use crate::fixedwindow::fw_call;
use crate::log::{log_entries, sl_encode};
use crate::slidingcounter::sc_call;
use crate::slidinglog::sl_call;
use crate::tokenbucket::{tb_call, tb_force};
use crate::{codec, fw, sc, sl, tb};

fn calls(cost_max: u64) -> impl Iterator<Item = Call> {
    [0, 1, cost_max, cost_max + 1].into_iter().flat_map(|cost| {
        [false, true].into_iter().map(move |partial| Call {
            nums: [0; 3],
            cost,
            partial,
            dryrun: false,
            refund: 0,
            force: false,
        })
    })
}

pub fn decode_tokenbucket(data: &[u8]) {
    let Ok(s) = tb::State::decode(data) else { return };
    assert_eq!(&s.encode()[..], data, "accepted bytes do not re-encode");
    let period_ms = s.den / 1000;
    for p in [
        // (a bucket in debt has negative whole tokens)
        tb::Params { capacity: s.whole().max(0) as u64 + 1, rate: 1, period_ms },
        tb::Params { capacity: 1, rate: 1, period_ms: 1 },
        tb::Params { capacity: MAX_ARG, rate: MAX_ARG, period_ms: MAX_ARG },
    ] {
        for now in [s.last_us, s.last_us.saturating_add(s.den), 0, u64::MAX] {
            for call in calls(p.capacity) {
                tb_call(&s, &p, &call, now, now.wrapping_add(999_999));
                tb_force(&s, &p, call.cost, now);
            }
        }
    }
}

pub fn decode_slidingcounter(data: &[u8]) {
    let Ok(s) = sc::State::decode(data) else { return };
    assert_eq!(&s.encode()[..], data, "accepted bytes do not re-encode");
    assert!(!s.is_fresh(), "a fresh state is never stored, so never accepted");
    for p in [
        sc::Params { limit: s.cur.max(s.prev).saturating_add(1).min(MAX_ARG), window_ms: 1000 },
        sc::Params { limit: 1, window_ms: 1 },
        sc::Params { limit: MAX_ARG, window_ms: MAX_ARG },
    ] {
        for now in [s.start_us, s.start_us.saturating_add(1_500_000), 0, u64::MAX] {
            for call in calls(p.limit) {
                sc_call(&s, &p, &call, now, now.wrapping_add(999_999));
            }
        }
    }
}

pub fn decode_fixedwindow(data: &[u8]) {
    let Ok(s) = fw::State::decode(data) else { return };
    assert_eq!(&s.encode()[..], data, "accepted bytes do not re-encode");
    assert!(!s.is_fresh(), "a fresh state is never stored, so never accepted");
    assert_eq!(fw::State::unpack(s.pack().expect("always compact")), s);
    let now0 = s.start_ms.saturating_mul(1000);
    for p in [
        fw::Params { limit: s.count.saturating_add(1).min(MAX_ARG), window_ms: 1000, from_first: false },
        fw::Params { limit: s.count, window_ms: 1000, from_first: true },
        fw::Params { limit: 1, window_ms: 1, from_first: false },
        fw::Params { limit: MAX_ARG, window_ms: MAX_ARG, from_first: true },
    ] {
        for now in [now0, now0.saturating_add(999_999), now0.saturating_sub(1), 0, u64::MAX] {
            for call in calls(p.limit) {
                fw_call(&s, &p, &call, now, now.wrapping_add(999_999));
            }
        }
    }
}

pub fn decode_slidinglog(data: &[u8]) {
    let Ok(s) = sl::State::decode(data) else { return };
    assert_eq!(sl_encode(&s), data, "accepted bytes do not re-encode");
    // The decoder allocates only what the input holds.
    assert!(s.heap_bytes() <= data.len() + 16, "heap {} for {} input bytes", s.heap_bytes(), data.len());
    let entries = log_entries(data);
    let (first, last) = (entries.first().map_or(0, |e| e.0), entries.last().map_or(0, |e| e.0));
    for p in [
        sl::Params { limit: 10, window_ms: 1000 },
        sl::Params { limit: 1, window_ms: 1 },
        sl::Params { limit: MAX_ARG, window_ms: MAX_ARG },
    ] {
        for now in [first, last, last.saturating_add(500_000), 0, u64::MAX] {
            for call in calls(p.limit) {
                sl_call(&s, &p, &call, now, now.wrapping_add(999_999));
            }
        }
    }
}

pub fn decode_codec(data: &[u8]) {
    let Ok((effect, abs)) = codec::decode(data) else { return };
    let again: Vec<u8> = match &effect {
        codec::Effect::TokenBucket(s) => codec::tokenbucket(s, abs).as_bytes().to_vec(),
        codec::Effect::SlidingCounter(s) => codec::slidingcounter(s, abs).as_bytes().to_vec(),
        codec::Effect::SlidingLog(s) => codec::slidinglog(s, abs),
        codec::Effect::LogGrant(g) => codec::log_grant(g, abs).as_bytes().to_vec(),
        codec::Effect::LogRefund(g) => codec::log_refund(g, abs).as_bytes().to_vec(),
        codec::Effect::FixedWindow(s) => codec::fixedwindow(s, abs).as_bytes().to_vec(),
        codec::Effect::Gcra(s) => codec::gcra(s, abs).as_bytes().to_vec(),
        codec::Effect::Concurrency(s) => codec::concurrency(s, abs),
        codec::Effect::Lease(c) => codec::lease(c, abs).as_bytes().to_vec(),
    };
    assert_eq!(again, data, "accepted payload does not re-encode");
    // Apply it the way RL.STATE does, then use the key.
    let call = Call { nums: [0; 3], cost: 1, partial: true, dryrun: false, refund: 0, force: false };
    match effect {
        codec::Effect::TokenBucket(s) => {
            tb_call(&s, &tb::Params { capacity: 5, rate: 1, period_ms: 1000 }, &call, s.last_us, 0)
        }
        codec::Effect::SlidingCounter(s) => sc_call(&s, &sc::Params { limit: 5, window_ms: 1000 }, &call, s.start_us, 0),
        codec::Effect::FixedWindow(s) => {
            let p = fw::Params { limit: 5, window_ms: 1000, from_first: abs % 2 == 1 };
            fw_call(&s, &p, &call, s.start_ms.saturating_mul(1000), 0)
        }
        codec::Effect::SlidingLog(s) => sl_call(&s, &sl::Params { limit: 5, window_ms: 1000 }, &call, abs, 0),
        codec::Effect::Gcra(s) => {
            // CL.THROTTLE on the replicated TAT, at its instant and at the
            // ends of time: an answer or OutOfRange, never a panic; a
            // state it writes round-trips.
            use crate::core::gcra;
            let p = gcra::Params::new(5, 1, 1, 1).expect("valid CL.THROTTLE parameters");
            for now in [s.tat_ns, 0, u64::MAX] {
                if let Ok(o) = gcra::step(Some(s), &p, now) {
                    if let Some(w) = o.write {
                        assert_eq!(gcra::State::decode(&w.encode()), Ok(w));
                    }
                }
            }
        }
        codec::Effect::LogGrant(g) => {
            let mut s = sl::State::default();
            sl::grant(&mut s, g.window_ms, g.units, g.now_us);
            // Applied twice (a replayed AOF): still a valid log.
            sl::grant(&mut s, g.window_ms, g.units, g.now_us);
            let enc = sl_encode(&s);
            assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc.clone()));
            let entries = log_entries(&enc);
            assert_eq!(entries.len(), 1);
            assert_eq!(entries[0], (g.now_us, g.units * 2));
        }
        codec::Effect::Concurrency(s) => {
            // As RESTORE would hold it: its own decoder's checks.
            let mut body = Vec::new();
            s.encode(&mut body);
            crate::concurrency::decode_concurrency(&body);
        }
        codec::Effect::Lease(c) => {
            // Applied as a replica applies it, on a fresh key and on one
            // holding leases of other ids and of its own: the state stays
            // valid (or the change is refused, changing nothing), and applied
            // twice (an AOF replayed) it is the same state.
            for seed in [&[][..], &[9, 1, 3, 200, 2, 1][..], &[5, (c.hash % 8) as u8, 2][..]] {
                let mut s = crate::concurrency::synth_cc(seed, c.now_us);
                let before = s.clone();
                if s.apply(&c).is_err() {
                    assert_eq!(s, before, "a refused change changed the state");
                    continue;
                }
                if !s.leases().is_empty() {
                    let mut b = Vec::new();
                    s.encode(&mut b);
                    assert_eq!(crate::core::concurrency::State::decode(&b).as_ref(), Ok(&s));
                }
                let once = s.clone();
                s.apply(&c).expect("the same change again fits");
                assert_eq!(s, once, "a change applied twice differs");
            }
        }
        codec::Effect::LogRefund(g) => {
            // On a log holding one grant at the same instant: the refund
            // takes back at most what it holds, and what is left is valid.
            let mut s = sl::State::default();
            sl::grant(&mut s, g.window_ms, 5, g.now_us);
            let removed = sl::refund(&mut s, g.window_ms, g.units, g.now_us);
            assert_eq!(removed, g.units.min(5));
            let enc = sl_encode(&s);
            assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc.clone()));
            assert_eq!(log_entries(&enc).iter().map(|e| e.1).sum::<u64>(), 5 - removed);
        }
    }
}
