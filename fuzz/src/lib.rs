//! Shared pieces of the fuzz targets: the input layout, an independent
//! argument-parser oracle, reply invariants, and the comparison of every
//! call with the core crate's reference models (`ratelimit_core::reference`,
//! the same models its own tests use; a sliding log is read back from its
//! canonical encoding).
//!
//! Input layout of the `args_*` targets (short inputs read as zero-padded):
//!
//! ```text
//! [0..8)    now_us, u64 LE: the clock of the call
//! [8..16)   now2_us, u64 LE: the clock of a follow-up call (may step back)
//! [16]      state mode: 0 fresh, 1 decode the state bytes, 2 synthesize
//!           a valid state from them, 3 = 1 falling back to 2
//! [17..19)  state_len, u16 LE
//! [19..19+state_len)  state bytes
//! rest      the arguments after the key, separated by NUL bytes
//! ```
//!
//! Nothing here panics on any input: the only panics are the assertions,
//! which are the findings.

// The code under test is the pure core crate (linking the cdylib would also
// build redis-module and bindgen with coverage flags: minutes of compilation
// on a fresh machine for no extra fuzzed code).
pub use ratelimit_core as core;
pub use ratelimit_core::{args, codec};

use crate::args::{Arg, ArgError, Call};
use crate::core::{Decision, MAX_ARG};

/// The parts of an `args_*` input.
pub struct Input<'a> {
    pub now: u64,
    pub now2: u64,
    pub mode: u8,
    pub state: &'a [u8],
    pub args: Vec<&'a [u8]>,
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    for (d, s) in a.iter_mut().zip(b) {
        *d = *s;
    }
    u64::from_le_bytes(a)
}

impl<'a> Input<'a> {
    pub fn parse(data: &'a [u8]) -> Input<'a> {
        let get = |from: usize, to: usize| data.get(from.min(data.len())..to.min(data.len())).unwrap_or(&[]);
        let now = le_u64(get(0, 8));
        let now2 = le_u64(get(8, 16));
        let mode = get(16, 17).first().copied().unwrap_or(0) & 3;
        let sl = get(17, 19);
        let state_len = usize::from(sl.first().copied().unwrap_or(0)) | usize::from(sl.get(1).copied().unwrap_or(0)) << 8;
        let state = get(19, 19 + state_len);
        let rest = get(19 + state_len, data.len());
        let args = if rest.is_empty() { Vec::new() } else { rest.split(|&b| b == 0).collect() };
        Input { now, now2, mode, state, args }
    }
}

/// Little-endian u64 words of `b` (the last one zero-padded).
pub fn words(b: &[u8]) -> impl Iterator<Item = u64> + '_ {
    b.chunks(8).map(le_u64)
}

/// An independent statement of the argument grammar (SPEC.md "Ranges",
/// "Bad input", and args.rs's documented "ASCII digits, at most 16").
///
/// Leading zeros ("01"): Redis's own integer arguments refuse them; whether
/// this module does is args.rs's documented choice (its unit tests pin it),
/// so the oracle follows it and checks everything else independently.
fn oracle_num(s: &[u8], min: u64) -> Option<u64> {
    let leading_zeros_ok = crate::args::parse_num(b"01", 0).is_some();
    if s.is_empty() || s.len() > 16 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if s.len() > 1 && s[0] == b'0' && !leading_zeros_ok {
        return None;
    }
    let v: u128 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (u128::from(min)..=u128::from(MAX_ARG)).contains(&v).then_some(v as u64)
}

/// What the parser must answer: `Err(None)` arity, `Err(Some(i))` the i-th
/// positional number (i = positional count: COST, + 1: REFUND),
/// `Err(Some(usize::MAX))` syntax. REFUND n (1 or more) excludes COST,
/// PARTIAL and DRYRUN.
pub fn oracle_parse(args: &[&[u8]], npos: usize) -> Result<Call, Option<usize>> {
    if args.len() < npos {
        return Err(None);
    }
    let mut nums = [0u64; 3];
    for i in 0..npos {
        nums[i] = oracle_num(args[i], 1).ok_or(Some(i))?;
    }
    let (mut cost, mut partial, mut dryrun, mut refund) = (None, false, false, None);
    let mut i = npos;
    while i < args.len() {
        let up = args[i].to_ascii_uppercase();
        match &up[..] {
            b"REFUND" if refund.is_none() && cost.is_none() && !partial && !dryrun => {
                let v = args.get(i + 1).ok_or(Some(usize::MAX))?;
                refund = Some(oracle_num(v, 1).ok_or(Some(npos + 1))?);
                i += 2;
            }
            _ if refund.is_some() => return Err(Some(usize::MAX)),
            b"COST" if cost.is_none() => {
                let v = args.get(i + 1).ok_or(Some(usize::MAX))?;
                cost = Some(oracle_num(v, 0).ok_or(Some(npos))?);
                i += 2;
            }
            b"PARTIAL" if !partial => {
                partial = true;
                i += 1;
            }
            b"DRYRUN" if !dryrun => {
                dryrun = true;
                i += 1;
            }
            _ => return Err(Some(usize::MAX)),
        }
    }
    Ok(Call { nums, cost: cost.unwrap_or(1), partial, dryrun, refund: refund.unwrap_or(0) })
}

/// Runs `args::parse` and checks it against the oracle, the argument an
/// error names included.
pub fn parse_checked(args: &[&[u8]], positional: &[Arg]) -> Option<Call> {
    let got = crate::args::parse(args.iter().copied(), positional);
    // The module's path for a call of numbers only must answer the same.
    assert_eq!(crate::args::parse_exact(args, positional), got, "parse_exact, args {args:?}");
    let want = oracle_parse(args, positional.len());
    match (&got, &want) {
        (Ok(g), Ok(w)) => assert_eq!(g, w, "args {args:?}"),
        (Err(ArgError::Arity), Err(None)) => {}
        (Err(ArgError::Syntax), Err(Some(usize::MAX))) => {}
        (Err(ArgError::Number(a)), Err(Some(i))) if *i < positional.len() => {
            assert_eq!(*a, positional[*i], "args {args:?}");
        }
        (Err(ArgError::Number(a)), Err(Some(i))) if *i == positional.len() => {
            assert_eq!(*a, Arg::Cost, "args {args:?}");
        }
        (Err(ArgError::Number(a)), Err(Some(i))) if *i == positional.len() + 1 => {
            assert_eq!(*a, Arg::Refund, "args {args:?}");
        }
        _ => panic!("args {args:?}: parser {got:?}, oracle {want:?}"),
    }
    got.ok()
}

/// The reply invariants every command keeps (SPEC.md "Reply").
pub fn check_decision(d: &Decision, limit: u64, cost: u64, partial: bool) {
    assert!(d.granted <= cost, "{d:?}");
    if !partial {
        assert!(d.granted == 0 || d.granted == cost, "{d:?}");
    }
    assert_eq!(d.limit, limit, "{d:?}");
    assert!(d.remaining <= limit, "{d:?}");
    assert!(d.granted.saturating_add(d.remaining) <= limit, "{d:?}");
    assert!(d.retry_after_ms >= -1, "{d:?}");
    assert_eq!(d.retry_after_ms == 0, d.granted == cost, "{d:?} cost {cost}");
    assert_eq!(d.retry_after_ms == -1, d.granted < cost && cost > limit, "{d:?} cost {cost}");
    if d.granted > 0 {
        assert!(d.reset_after_ms > 0, "{d:?}");
    }
    if cost == 0 {
        assert_eq!(d.allowed(cost, partial), if partial { 0 } else { 1 });
    }
    let allowed = d.allowed(cost, partial);
    assert!(allowed <= cost.max(1));
}

/// `remaining` is exact: right after the call, at the same instant, exactly
/// `remaining` more units fit, and no more. `probe(cost, partial)` asks the
/// stored state.
pub fn check_remaining_exact(remaining: u64, limit: u64, mut probe: impl FnMut(u64, bool) -> Decision) {
    let d0 = probe(0, false);
    assert_eq!(d0.remaining, remaining, "cost 0 after the call");
    if remaining > 0 {
        assert_eq!(probe(remaining, false).granted, remaining, "remaining units must fit");
    }
    if remaining < limit {
        assert_eq!(probe(remaining + 1, false).granted, 0, "one more than remaining must not fit");
    }
}

/// `retry_after_ms` is exact: `probe(t)` asks the state the call left
/// behind for the same call (without PARTIAL) at time `t`. It is fully
/// granted exactly `retry_after_ms` after the real clock reading `now` and
/// not one millisecond earlier (availability only grows while nothing is
/// granted, so two probes decide it).
pub fn check_retry_exact(d: &Decision, cost: u64, now: u64, mut probe: impl FnMut(u64) -> Decision) {
    if d.retry_after_ms <= 0 {
        return;
    }
    let r = d.retry_after_ms as u64;
    let Some(at) = r.checked_mul(1000).and_then(|x| now.checked_add(x)) else { return };
    assert_eq!(probe(at).granted, cost, "the call is not granted retry_after_ms ({r}) later");
    assert_eq!(probe(at - 1000).granted, 0, "the call is granted before retry_after_ms ({r})");
}

/// The sliding log's logical content, `(time µs, units)` oldest first, read
/// back from its canonical encoding (format in core/slidinglog.rs).
pub fn log_entries(enc: &[u8]) -> Vec<(u64, u64)> {
    assert!(enc.len() >= 9 && enc[0] == 1, "{enc:?}");
    let n = le_u64(&enc[1..9]) as usize;
    if n == 0 {
        assert_eq!(enc.len(), 9);
        return Vec::new();
    }
    let mut t = le_u64(&enc[9..17]);
    let words = usize::from(enc[17]);
    let cbits = u32::from(enc[18]);
    let body = &enc[19..];
    assert_eq!(body.len(), n * 4 * words);
    let mut out = Vec::with_capacity(n);
    for (i, chunk) in body.chunks(4 * words).enumerate() {
        let mut v = [0u8; 16];
        v[..chunk.len()].copy_from_slice(chunk);
        let v = u128::from_le_bytes(v);
        let mask = if cbits >= 128 { u128::MAX } else { (1u128 << cbits) - 1 };
        let delta = (v >> cbits) as u64;
        let count = (v & mask) as u64 + 1;
        if i > 0 {
            t += delta;
        }
        out.push((t, count));
    }
    out
}

// ---------------------------------------------------------------------
// The three argument targets: parse, then run the pure core on the parsed
// call against an arbitrary stored state, at arbitrary times.
// ---------------------------------------------------------------------

use crate::args::{TOKENBUCKET_ARGS, WINDOW_ARGS};
use crate::core::reference::slidingcounter::{self as scm, Search};
use crate::core::reference::slidinglog::Log;
use crate::core::reference::tokenbucket::Bucket;
pub use crate::core::{slidingcounter as sc, slidinglog as sl, tokenbucket as tb};

/// A valid token-bucket state built from arbitrary words.
pub fn synth_tb(b: &[u8]) -> tb::State {
    let mut w = words(b);
    let mut next = || w.next().unwrap_or(0);
    let tokens = next() % MAX_ARG;
    let den = (next() % MAX_ARG + 1) * 1000;
    let frac = next() % den;
    tb::State { tokens, frac, den, last_us: next() }
}

/// A valid sliding-counter state built from arbitrary words.
pub fn synth_sc(b: &[u8]) -> sc::State {
    let mut w = words(b);
    let mut next = || w.next().unwrap_or(0);
    let s = next();
    sc::State { start_us: s - s % 1000, cur: next() % MAX_ARG + 1, prev: next() % (MAX_ARG + 1) }
}

/// A sliding log built by grants read from arbitrary words (window, start
/// time, then `(dt, units)` pairs), mirrored in the model, which must agree
/// with what the state encodes.
pub fn synth_sl(b: &[u8]) -> sl::State {
    let mut w = words(b);
    let window_ms = w.next().unwrap_or(0) % MAX_ARG + 1;
    let mut t = w.next().unwrap_or(0);
    let mut s = sl::State::default();
    let mut m = Log::default();
    let unlimited = sl::Params { limit: MAX_ARG, window_ms };
    for _ in 0..64 {
        let (Some(dt), Some(u)) = (w.next(), w.next()) else { break };
        // Mostly small steps and counts, sometimes anything.
        let dt = if dt >> 63 == 1 { dt & !(1 << 63) } else { dt % 100_000 };
        let units = if u >> 63 == 1 { u % MAX_ARG + 1 } else { u % 1000 + 1 };
        // A master never grants past the limit: keep the log's sum ≤ MAX_ARG.
        let used = m.decide(&unlimited, 0, false, t).remaining;
        let units = units.min(used);
        t = t.saturating_add(dt);
        if units > 0 {
            sl::grant(&mut s, window_ms, units, t);
            m.grant(window_ms, units, t);
        }
    }
    let mut enc = Vec::new();
    s.encode(&mut enc);
    assert_eq!(log_entries(&enc), m.entries(), "synthesized log differs from the model");
    s
}

fn state_of<S>(
    inp: &Input,
    decode: impl Fn(&[u8]) -> Result<S, crate::core::DecodeError>,
    synth: impl Fn(&[u8]) -> S,
    fresh: S,
) -> S {
    match inp.mode {
        0 => fresh,
        1 => decode(inp.state).unwrap_or(fresh),
        2 => synth(inp.state),
        _ => decode(inp.state).unwrap_or_else(|_| synth(inp.state)),
    }
}

pub fn args_tokenbucket(data: &[u8]) {
    let inp = Input::parse(data);
    let Some(call) = parse_checked(&inp.args, TOKENBUCKET_ARGS) else { return };
    let cur = state_of(&inp, tb::State::decode, synth_tb, tb::State::default());
    let p = tb::Params { capacity: call.nums[0], rate: call.nums[1], period_ms: call.nums[2] };
    if call.refund > 0 {
        return tb_refund(&cur, &p, call.refund, inp.now);
    }
    tb_call(&cur, &p, &call, inp.now, inp.now2);
}

/// `REFUND n` on a bucket: tokens become min(capacity, tokens + n) in whole
/// tokens, element 1 says how many came back, a full bucket is fresh.
pub fn tb_refund(cur: &tb::State, p: &tb::Params, n: u64, now: u64) {
    let before = tb::step(cur, p, 0, false, now).0.remaining;
    let (d, new) = tb::refund(cur, p, n, 1, now);
    assert_eq!(d.remaining, p.capacity.min(before.saturating_add(n)), "{d:?}");
    assert_eq!(d.granted, d.remaining - before, "{d:?}");
    assert_eq!(d.reset_after_ms == 0, d.remaining == p.capacity && tb::step(&new, p, 0, false, now).0.reset_after_ms == 0);
    assert_eq!(d.retry_after_ms, 0, "one token is there after a refund of one or more");
    let mut m = Bucket::from_state(cur);
    assert_eq!(d, m.refund(p, now, n, 1), "refund differs from the model");
    if d.granted > 0 && d.reset_after_ms > 0 {
        assert_eq!(Bucket::from_state(&new).level(p, now), m.level(p, now), "stored level differs from the model");
        assert_eq!(tb::State::decode(&new.encode()), Ok(new));
        assert_eq!(tb::step(&new, p, 0, false, now).0, tb::View::at(&new, p, now).answer(0, 0));
    }
}

/// One token-bucket call and everything that must hold after it.
pub fn tb_call(cur: &tb::State, p: &tb::Params, call: &Call, now: u64, now2: u64) {
    let (d, new) = tb::step(cur, p, call.cost, call.partial, now);
    check_decision(&d, p.capacity, call.cost, call.partial);
    // The reference model: the level as an exact rational (refill `rate`
    // units of 1/P token per µs up to `capacity × P`; a fraction written
    // under another period rescaled rounding down).
    let mut m = Bucket::from_state(cur);
    assert_eq!(d, m.call(p, call.cost, call.partial, now, true), "bucket differs from the model");
    if d.granted > 0 {
        let stored = Bucket::from_state(&new);
        assert_eq!((stored.num, stored.d, stored.last), (m.num, m.d, m.last), "stored level differs from the model");
    }
    let after = if d.granted > 0 { new } else { *cur };
    check_retry_exact(&d, call.cost, now, |t| tb::step(&after, p, call.cost, false, t).0);
    if d.granted == 0 {
        return;
    }
    // What the key would hold: a valid, non-fresh state that round-trips
    // through RDB/RESTORE and the RL.STATE payload.
    assert!(!new.is_fresh());
    assert_eq!(tb::State::decode(&new.encode()), Ok(new));
    let abs = now / 1000;
    let payload = codec::tokenbucket(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::TokenBucket(new), abs)));
    let t = new.last_us;
    assert_eq!(t, now.max(if cur.is_fresh() { 0 } else { cur.last_us }));
    check_remaining_exact(d.remaining, p.capacity, |c, part| tb::step(&new, p, c, part, t).0);
    // Fresh exactly when reset_after_ms says (the key's TTL).
    // Waits are measured from the real clock reading `now`.
    let fresh = tb::State::default();
    if let Some(at) = d.reset_after_ms.checked_mul(1000).and_then(|r| now.checked_add(r)) {
        assert_eq!(
            tb::step(&new, p, call.cost, call.partial, at).0,
            tb::step(&fresh, p, call.cost, call.partial, at).0,
            "not fresh at reset"
        );
        let before = at - 1000;
        assert!(tb::step(&new, p, 0, false, before).0.reset_after_ms > 0, "fresh before reset");
    }
    // A follow-up at another time (the clock may step back).
    let (d2, new2) = tb::step(&new, p, call.cost, call.partial, now2);
    check_decision(&d2, p.capacity, call.cost, call.partial);
    if d2.granted > 0 {
        assert_eq!(tb::State::decode(&new2.encode()), Ok(new2));
        assert!(new2.last_us >= new.last_us, "time went backwards");
    }
}

pub fn args_slidingcounter(data: &[u8]) {
    let inp = Input::parse(data);
    let Some(call) = parse_checked(&inp.args, WINDOW_ARGS) else { return };
    let cur = state_of(&inp, sc::State::decode, synth_sc, sc::State::default());
    let p = sc::Params { limit: call.nums[0], window_ms: call.nums[1] };
    if call.refund > 0 {
        return sc_refund(&cur, &p, call.refund, inp.now);
    }
    sc_call(&cur, &p, &call, inp.now, inp.now2);
}

/// `REFUND n` on a counter: never below zero, never more than n, the
/// estimate only goes down, what is stored decodes.
pub fn sc_refund(cur: &sc::State, p: &sc::Params, n: u64, now: u64) {
    let before = sc::step(cur, p, 0, false, now).0;
    let (d, new) = sc::refund(cur, p, n, 1, now);
    assert!(
        d.granted <= n && d.remaining >= before.remaining && d.reset_after_ms <= before.reset_after_ms,
        "{d:?} {before:?}"
    );
    assert_eq!(d.granted == 0, before.reset_after_ms == 0, "only a fresh counter gives nothing back: {d:?} {before:?}");
    let (md, ms) = scm::refund(cur, p, now, n, 1, Search::Bisect);
    assert_eq!(d, md, "refund differs from the model");
    if d.granted > 0 && d.reset_after_ms > 0 {
        assert_eq!(new, ms, "refunded state differs from the model");
    }
    if d.granted > 0 {
        assert!(new.cur <= cur.cur.max(cur.prev) && new.prev <= cur.prev.max(cur.cur), "{new:?} {cur:?}");
        if d.reset_after_ms > 0 {
            assert_eq!(sc::State::decode(&new.encode()), Ok(new));
            assert_eq!(sc::step(&new, p, 0, false, now).0.remaining, d.remaining);
        } else {
            assert!(new.is_fresh(), "{new:?}");
        }
    }
}

pub fn sc_call(cur: &sc::State, p: &sc::Params, call: &Call, now: u64, now2: u64) {
    let (d, new) = sc::step(cur, p, call.cost, call.partial, now);
    check_decision(&d, p.limit, call.cost, call.partial);
    let (md, ms) = scm::decide(cur, p, call.cost, call.partial, now, Search::Bisect);
    assert_eq!(d, md, "counter differs from the model");
    if d.granted > 0 {
        assert_eq!(new, ms, "counter state differs from the model");
    }
    let after = if d.granted > 0 { new } else { *cur };
    check_retry_exact(&d, call.cost, now, |t| sc::step(&after, p, call.cost, false, t).0);
    if d.granted == 0 {
        assert_eq!(new, *cur, "a call that grants nothing must not change the state");
        return;
    }
    assert!(!new.is_fresh());
    assert_eq!(sc::State::decode(&new.encode()), Ok(new));
    let abs = now / 1000;
    let payload = codec::slidingcounter(&new, abs);
    assert_eq!(codec::decode(payload.as_bytes()), Ok((codec::Effect::SlidingCounter(new), abs)));
    assert!(new.start_us >= cur.start_us, "window start moved backwards");
    // The instant the call was evaluated at (the clock may be behind).
    let t = now.max(cur.start_us);
    check_remaining_exact(d.remaining, p.limit, |c, part| sc::step(&new, p, c, part, t).0);
    // The reply's reset is measured from the real clock reading `now`.
    let fresh_at = sc::fresh_at_us(&new, p.window_ms).expect("a written state is not fresh");
    let fresh = sc::State::default();
    if let Some(at) = d.reset_after_ms.checked_mul(1000).and_then(|r| now.checked_add(r)) {
        assert!(fresh_at <= at, "reset {} ms but fresh only at {fresh_at} (now {now})", d.reset_after_ms);
        assert!(fresh_at > at - 1000, "reset {} ms overstates (fresh at {fresh_at}, now {now})", d.reset_after_ms);
        assert_eq!(
            sc::step(&new, p, call.cost, call.partial, at).0,
            sc::step(&fresh, p, call.cost, call.partial, at).0,
            "not fresh at reset"
        );
    }
    let (d2, new2) = sc::step(&new, p, call.cost, call.partial, now2);
    check_decision(&d2, p.limit, call.cost, call.partial);
    if d2.granted > 0 {
        assert_eq!(sc::State::decode(&new2.encode()), Ok(new2));
    }
}

pub fn args_slidinglog(data: &[u8]) {
    let inp = Input::parse(data);
    let Some(call) = parse_checked(&inp.args, WINDOW_ARGS) else { return };
    let cur = state_of(&inp, sl::State::decode, synth_sl, sl::State::default());
    let p = sl::Params { limit: call.nums[0], window_ms: call.nums[1] };
    if call.refund > 0 {
        return sl_refund(&cur, &p, call.refund, inp.now);
    }
    sl_call(&cur, &p, &call, inp.now, inp.now2);
}

/// `REFUND n` on a log: the newest units in the window go, at most n of
/// them; nothing changes when the window holds none.
pub fn sl_refund(cur: &sl::State, p: &sl::Params, n: u64, now: u64) {
    let before = sl::decide(cur, p, 0, false, now);
    let mut model = Log::from_entries(&log_entries(&sl_encode(cur)));
    let in_window = u64::try_from(model.used(p.window_ms, now)).expect("a stored log holds at most u64::MAX units");
    let mut s = cur.clone();
    let removed = sl::refund(&mut s, p.window_ms, n, now);
    assert_eq!(removed, n.min(in_window));
    // The reply of RL.SLIDINGLOG ... REFUND n.
    let mut d = sl::View::at(&s, p, now).answer(0, 1);
    d.granted = removed;
    assert_eq!(d, model.refund(p, now, n, 1), "refund differs from the model");
    if removed == 0 {
        assert_eq!(sl_encode(&s), sl_encode(cur), "a refund of nothing changed the log");
        return;
    }
    // The newest entries lost `removed` units; older ones are untouched.
    let enc = sl_encode(&s);
    assert_eq!(log_entries(&enc), model.entries(), "refund removed the wrong units");
    assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc.clone()));
    let after = sl::decide(&s, p, 0, false, now);
    assert!(after.remaining >= before.remaining && after.remaining <= p.limit);
}

fn sl_encode(s: &sl::State) -> Vec<u8> {
    let mut v = Vec::new();
    s.encode(&mut v);
    v
}

pub fn sl_call(cur: &sl::State, p: &sl::Params, call: &Call, now: u64, now2: u64) {
    let enc_before = sl_encode(cur);
    let mut model = Log::from_entries(&log_entries(&enc_before));
    let t = model.now_eff(now);
    let d = sl::decide(cur, p, call.cost, call.partial, now);
    check_decision(&d, p.limit, call.cost, call.partial);
    let md = model.decide(p, call.cost, call.partial, now);
    assert_eq!(d, md, "sliding log differs from the model: {:?}", model.log);
    if d.granted == 0 {
        check_retry_exact(&d, call.cost, now, |t| sl::decide(cur, p, call.cost, false, t));
        return;
    }
    // Master: grant in place. Replica: decode the same state and apply the
    // replicated grant. Both must encode (and so DEBUG DIGEST) equally.
    let mut new = cur.clone();
    sl::grant(&mut new, p.window_ms, d.granted, now);
    let enc = sl_encode(&new);
    let mut replica = sl::State::decode(&enc_before).expect("a stored log decodes");
    let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: d.granted };
    let payload = codec::log_grant(&g, 0);
    match codec::decode(payload.as_bytes()) {
        Ok((codec::Effect::LogGrant(g2), 0)) => {
            assert_eq!(g2, g);
            sl::grant(&mut replica, g2.window_ms, g2.units, g2.now_us);
        }
        other => panic!("grant payload does not decode: {other:?}"),
    }
    assert_eq!(sl_encode(&replica), enc, "replica diverges");
    check_retry_exact(&d, call.cost, now, |t| sl::decide(&new, p, call.cost, false, t));
    let decoded = sl::State::decode(&enc).expect("a written log decodes");
    assert_eq!(decoded, new);
    assert_eq!(sl_encode(&decoded), enc);
    // Memory bound (SPEC: at most 8 bytes per distinct grant time).
    let n = log_entries(&enc).len();
    assert!(new.heap_bytes() <= 16 * (n + 1) * 2, "heap {} bytes for {n} entries", new.heap_bytes());
    model.grant(p.window_ms, d.granted, now);
    assert_eq!(log_entries(&enc), model.entries(), "log after grant differs from the model");
    // Evaluated at max(now, newest entry), where the grant now is.
    let fresh_at = sl::fresh_at_us(&new, p.window_ms).expect("a written log is not empty");
    assert_eq!(fresh_at, t.saturating_add(p.window_ms * 1000));
    check_remaining_exact(d.remaining, p.limit, |c, part| sl::decide(&new, p, c, part, t));
    // Waits are measured from the real clock reading `now`.
    let fresh = sl::State::default();
    if let Some(at) = d.reset_after_ms.checked_mul(1000).and_then(|r| now.checked_add(r)) {
        assert!(fresh_at <= at, "reset {} ms but fresh only at {fresh_at} (now {now})", d.reset_after_ms);
        assert!(fresh_at > at - 1000, "reset {} ms overstates (fresh at {fresh_at}, now {now})", d.reset_after_ms);
        assert_eq!(
            sl::decide(&new, p, call.cost, call.partial, at),
            sl::decide(&fresh, p, call.cost, call.partial, at),
            "not fresh at reset"
        );
    }
    let d2 = sl::decide(&new, p, call.cost, call.partial, now2);
    check_decision(&d2, p.limit, call.cost, call.partial);
    if d2.granted > 0 {
        sl::grant(&mut new, p.window_ms, d2.granted, now2);
        let enc2 = sl_encode(&new);
        assert_eq!(sl::State::decode(&enc2).map(|s| sl_encode(&s)), Ok(enc2));
    }
}

// ---------------------------------------------------------------------
// The decoder targets: what RDB load, RESTORE and RL.STATE run on bytes
// from outside. Anything accepted re-encodes to the same bytes and is a
// state the commands handle.
// ---------------------------------------------------------------------

fn calls(cost_max: u64) -> impl Iterator<Item = Call> {
    [0, 1, cost_max, cost_max + 1].into_iter().flat_map(|cost| {
        [false, true].into_iter().map(move |partial| Call { nums: [0; 3], cost, partial, dryrun: false, refund: 0 })
    })
}

pub fn decode_tokenbucket(data: &[u8]) {
    let Ok(s) = tb::State::decode(data) else { return };
    assert_eq!(&s.encode()[..], data, "accepted bytes do not re-encode");
    let period_ms = s.den / 1000;
    for p in [
        tb::Params { capacity: s.tokens + 1, rate: 1, period_ms },
        tb::Params { capacity: 1, rate: 1, period_ms: 1 },
        tb::Params { capacity: MAX_ARG, rate: MAX_ARG, period_ms: MAX_ARG },
    ] {
        for now in [s.last_us, s.last_us.saturating_add(s.den), 0, u64::MAX] {
            for call in calls(p.capacity) {
                tb_call(&s, &p, &call, now, now.wrapping_add(999_999));
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
    };
    assert_eq!(again, data, "accepted payload does not re-encode");
    // Apply it the way RL.STATE does, then use the key.
    let call = Call { nums: [0; 3], cost: 1, partial: true, dryrun: false, refund: 0 };
    match effect {
        codec::Effect::TokenBucket(s) => {
            tb_call(&s, &tb::Params { capacity: 5, rate: 1, period_ms: 1000 }, &call, s.last_us, 0)
        }
        codec::Effect::SlidingCounter(s) => sc_call(&s, &sc::Params { limit: 5, window_ms: 1000 }, &call, s.start_us, 0),
        codec::Effect::SlidingLog(s) => sl_call(&s, &sl::Params { limit: 5, window_ms: 1000 }, &call, abs, 0),
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

// ---------------------------------------------------------------------
// Coverage report support (feature "coverage", used by coverage.sh).
// ---------------------------------------------------------------------

/// Describes `pc` in the format language libFuzzer's coverage printer asks
/// for: `%s` file, `%l` line, `%F` "in function", `%L` file:line, `%p` pc.
#[cfg(feature = "coverage")]
pub fn describe_pc(pc: usize, fmt: &str) -> String {
    let (mut name, mut file, mut line) = (String::new(), String::new(), 0u32);
    backtrace::resolve(pc as *mut std::ffi::c_void, |sym| {
        if name.is_empty() {
            if let Some(n) = sym.name() {
                name = format!("{n:#}");
            }
        }
        if file.is_empty() {
            if let Some(f) = sym.filename() {
                file = f.display().to_string();
                line = sym.lineno().unwrap_or(0);
            }
        }
    });
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('s') => out.push_str(if file.is_empty() { "<null>" } else { &file }),
            Some('l') => out.push_str(&line.to_string()),
            Some('F') => out.push_str(&format!("in {name}")),
            Some('L') => out.push_str(&format!("{file}:{line}")),
            Some('p') => out.push_str(&format!("{pc:#x}")),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// Defines the two sanitizer-runtime entry points libFuzzer looks up
/// (weakly) to print coverage. Expanded in each target binary, so the
/// linker keeps them.
#[macro_export]
macro_rules! coverage_hooks {
    () => {
        #[cfg(feature = "coverage")]
        #[no_mangle]
        pub unsafe extern "C" fn __sanitizer_symbolize_pc(
            pc: *mut std::ffi::c_void,
            fmt: *const std::ffi::c_char,
            out: *mut std::ffi::c_char,
            out_size: usize,
        ) {
            if fmt.is_null() || out.is_null() || out_size == 0 {
                return;
            }
            let fmt = std::ffi::CStr::from_ptr(fmt).to_string_lossy();
            let s = $crate::describe_pc(pc as usize, &fmt);
            let n = s.len().min(out_size - 1);
            std::ptr::copy_nonoverlapping(s.as_ptr(), out.cast::<u8>(), n);
            *out.add(n) = 0;
        }

        #[cfg(feature = "coverage")]
        #[no_mangle]
        pub unsafe extern "C" fn __sanitizer_get_module_and_offset_for_pc(
            pc: *mut std::ffi::c_void,
            module: *mut std::ffi::c_char,
            module_len: usize,
            offset: *mut *mut std::ffi::c_void,
        ) -> std::ffi::c_int {
            if !module.is_null() && module_len > 1 {
                *module = b'?' as std::ffi::c_char;
                *module.add(1) = 0;
            }
            if !offset.is_null() {
                *offset = pc;
            }
            1
        }
    };
}

// ---------------------------------------------------------------------
// RL.MULTI: the parser against an independent oracle, then the call
// over states synthesized from the input, with the composition's
// invariants.
// ---------------------------------------------------------------------

use crate::args::{Kind, LimitSpec, MultiCall, MAX_LIMITS};
use crate::core::multi;
use crate::core::reference::multi::{self as multi_model, Limit};

/// The RL.MULTI grammar (SPEC.md "Composition"), stated by index.
pub fn oracle_multi(a: &[&[u8]]) -> Result<MultiCall, ArgError> {
    use ArgError::*;
    if a.len() < 5 {
        return Err(Arity);
    }
    let up = |i: usize| a.get(i).map(|s| s.to_ascii_uppercase());
    let n = oracle_num(a[0], 1).filter(|&n| n <= 16).ok_or(Number(Arg::NumKeys))? as usize;
    if a.len() < 1 + n {
        return Err(LimitCount);
    }
    let keys = &a[1..1 + n];
    let blank = LimitSpec { kind: Kind::TokenBucket, nums: [0; 3], weight: 1 };
    let mut call = MultiCall { n, limits: [blank; MAX_LIMITS], cost: 1, partial: false, dryrun: false, refund: 0 };
    let is_opt = |w: &[u8]| matches!(w, b"COST" | b"PARTIAL" | b"DRYRUN" | b"REFUND");
    let mut i = 1 + n;
    for j in 0..n {
        let Some(w) = up(i) else { return Err(LimitCount) };
        let (kind, args): (Kind, &[Arg]) = match &w[..] {
            b"TOKENBUCKET" => (Kind::TokenBucket, &[Arg::Capacity, Arg::Rate, Arg::PeriodMs]),
            b"SLIDINGLOG" => (Kind::SlidingLog, &[Arg::Limit, Arg::WindowMs]),
            b"SLIDINGCOUNTER" => (Kind::SlidingCounter, &[Arg::Limit, Arg::WindowMs]),
            w if is_opt(w) => return Err(LimitCount),
            _ => return Err(Syntax),
        };
        call.limits[j].kind = kind;
        for (k, &arg) in args.iter().enumerate() {
            let v = a.get(i + 1 + k).ok_or(Syntax)?;
            call.limits[j].nums[k] = oracle_num(v, 1).ok_or(Number(arg))?;
        }
        i += 1 + args.len();
        if up(i).as_deref() == Some(b"WEIGHT") {
            let v = a.get(i + 1).ok_or(Syntax)?;
            call.limits[j].weight = oracle_num(v, 1).ok_or(Number(Arg::Weight))?;
            i += 2;
        }
    }
    let (mut cost, mut refund) = (None, None);
    while let Some(w) = up(i) {
        let opts_taken = cost.is_some() || call.partial || call.dryrun;
        match &w[..] {
            b"COST" if cost.is_none() && refund.is_none() => {
                cost = Some(oracle_num(a.get(i + 1).ok_or(Syntax)?, 0).ok_or(Number(Arg::Cost))?);
                i += 2;
            }
            b"PARTIAL" if !call.partial && refund.is_none() => {
                call.partial = true;
                i += 1;
            }
            b"DRYRUN" if !call.dryrun && refund.is_none() => {
                call.dryrun = true;
                i += 1;
            }
            b"REFUND" if refund.is_none() && !opts_taken => {
                refund = Some(oracle_num(a.get(i + 1).ok_or(Syntax)?, 1).ok_or(Number(Arg::Refund))?);
                i += 2;
            }
            b"TOKENBUCKET" | b"SLIDINGLOG" | b"SLIDINGCOUNTER" => return Err(LimitCount),
            _ => return Err(Syntax),
        }
    }
    call.cost = cost.unwrap_or(1);
    call.refund = refund.unwrap_or(0);
    for x in 0..n {
        for y in 0..x {
            if keys[x] == keys[y] {
                return Err(DuplicateKey);
            }
        }
    }
    let (units, which) = if call.refund > 0 { (call.refund, Arg::Refund) } else { (call.cost, Arg::Cost) };
    if call.limits[..n].iter().any(|l| u128::from(units) * u128::from(l.weight) > u128::from(MAX_ARG)) {
        return Err(Product(which));
    }
    Ok(call)
}

enum Owned {
    Tb(tb::State),
    Log(sl::State),
    Sc(sc::State),
}

impl Owned {
    fn digest(&self) -> Vec<u8> {
        match self {
            Owned::Tb(s) => s.encode().to_vec(),
            Owned::Sc(s) => s.encode().to_vec(),
            Owned::Log(s) => sl_encode(s),
        }
    }
}

/// The arguments follow `RL.MULTI`; the state bytes, cut in `n` pieces,
/// seed each limit's state (fresh when mode 0).
pub fn args_multi(data: &[u8]) {
    let inp = Input::parse(data);
    let got = crate::args::parse_multi(inp.args.iter().copied());
    // The module's path for calls without WEIGHT or options: declines, or
    // answers the same.
    if let Some(c) = crate::args::parse_multi_exact::<{ crate::args::MAX_LIMITS }>(&inp.args) {
        assert_eq!(Ok(c), got, "parse_multi_exact, args {:?}", inp.args);
    }
    let want = oracle_multi(&inp.args);
    assert_eq!(got, want, "args {:?}", inp.args);
    let Ok(call) = got else { return };
    let n = call.n;
    let piece = inp.state.len() / n.max(1);
    let mut states: Vec<Owned> = call.limits[..n]
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let b = inp.state.get(i * piece..(i + 1) * piece).unwrap_or(&[]);
            let fresh = inp.mode == 0 || b.is_empty();
            match l.kind {
                Kind::TokenBucket => Owned::Tb(if fresh { tb::State::default() } else { synth_tb(b) }),
                Kind::SlidingLog => Owned::Log(if fresh { sl::State::default() } else { synth_sl(b) }),
                Kind::SlidingCounter => Owned::Sc(if fresh { sc::State::default() } else { synth_sc(b) }),
            }
        })
        .collect();
    let params: Vec<multi::Params> = call.limits[..n]
        .iter()
        .map(|l| match l.kind {
            Kind::TokenBucket => {
                multi::Params::TokenBucket(tb::Params { capacity: l.nums[0], rate: l.nums[1], period_ms: l.nums[2] })
            }
            Kind::SlidingLog => multi::Params::SlidingLog(sl::Params { limit: l.nums[0], window_ms: l.nums[1] }),
            Kind::SlidingCounter => multi::Params::SlidingCounter(sc::Params { limit: l.nums[0], window_ms: l.nums[1] }),
        })
        .collect();
    let weights: Vec<u64> = call.limits[..n].iter().map(|l| l.weight).collect();
    let before: Vec<Vec<u8>> = states.iter().map(Owned::digest).collect();
    // The reference: each limit on its own model, then all or nothing.
    let mut models: Vec<Limit> = states
        .iter()
        .zip(&params)
        .map(|(s, p)| match (s, p) {
            (Owned::Tb(s), multi::Params::TokenBucket(p)) => Limit::TokenBucket(*p, Bucket::from_state(s)),
            (Owned::Log(s), multi::Params::SlidingLog(p)) => {
                Limit::SlidingLog(*p, Log::from_entries(&log_entries(&sl_encode(s))))
            }
            (Owned::Sc(s), multi::Params::SlidingCounter(p)) => Limit::SlidingCounter(*p, *s),
            _ => unreachable!("a limit's state has its algorithm"),
        })
        .collect();
    let op = if call.refund > 0 {
        multi::Op::Refund(call.refund)
    } else {
        multi::Op::Take { cost: call.cost, partial: call.partial, dryrun: call.dryrun }
    };
    let zero = Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 };
    let mut per = [zero; MAX_LIMITS];
    let whole = {
        let mut refs: Vec<Option<multi::StateMut>> = states
            .iter_mut()
            .map(|s| {
                Some(match s {
                    Owned::Tb(s) => multi::StateMut::TokenBucket(s),
                    Owned::Log(s) => multi::StateMut::SlidingLog(s),
                    Owned::Sc(s) => multi::StateMut::SlidingCounter(s),
                })
            })
            .collect();
        multi::run(&mut refs, &params, &weights, op, inp.now, &mut per)
    };
    let per = &per[..n];
    // The model counts the common grant down from COST: only small COSTs.
    if call.refund > 0 || call.cost <= 4096 {
        let (mwhole, mper) = multi_model::call(&mut models, &weights, op, inp.now);
        assert_eq!(per, &mper[..], "per-limit replies differ from the model");
        assert_eq!(whole, mwhole, "whole reply differs from the model");
        for ((s, m), d) in states.iter().zip(&models).zip(per) {
            let written = d.granted > 0 && !call.dryrun && !(call.refund > 0 && d.reset_after_ms == 0);
            if !written {
                continue;
            }
            match (s, m) {
                (Owned::Tb(s), Limit::TokenBucket(_, m)) => {
                    let b = Bucket::from_state(s);
                    assert_eq!((b.num, b.d, b.last), (m.num, m.d, m.last), "bucket differs from the model");
                }
                (Owned::Log(s), Limit::SlidingLog(_, m)) => {
                    assert_eq!(log_entries(&sl_encode(s)), m.entries(), "log differs from the model")
                }
                (Owned::Sc(s), Limit::SlidingCounter(_, m)) => assert_eq!(s, m, "counter differs from the model"),
                _ => unreachable!(),
            }
        }
    }
    // The whole reply is the binding limit's, by the rules of SPEC.md.
    assert!(whole.binding < n);
    let b = per[whole.binding];
    assert_eq!((whole.limit, whole.remaining, whole.reset_after_ms), (b.limit, b.remaining, b.reset_after_ms));
    for ((d, l), &w) in per.iter().zip(&call.limits[..n]).zip(&weights) {
        assert_eq!(d.limit, l.nums[0]);
        assert!(d.remaining <= d.limit && d.retry_after_ms >= -1, "{d:?}");
        if call.refund > 0 {
            assert!(d.granted <= call.refund * w, "{d:?}");
        }
    }
    let after: Vec<Vec<u8>> = states.iter().map(Owned::digest).collect();
    match op {
        multi::Op::Take { cost, partial, dryrun } => {
            let g = per[0].granted / weights[0];
            assert!(per.iter().zip(&weights).all(|(d, &w)| d.granted == g * w), "{per:?}");
            assert!(g <= cost && (partial || g == 0 || g == cost));
            assert_eq!(whole.allowed, if partial { g } else { u64::from(g == cost) });
            if g == cost {
                assert_eq!(whole.retry_after_ms, 0);
            } else {
                let never = per.iter().any(|d| d.retry_after_ms == -1);
                let longest = per.iter().map(|d| d.retry_after_ms).max().unwrap_or(0);
                assert_eq!(whole.retry_after_ms, if never { -1 } else { longest });
                assert_eq!(b.retry_after_ms, whole.retry_after_ms);
            }
            if g == 0 || dryrun {
                assert_eq!(after, before, "a call that writes nothing changed a state");
            }
            if g > 0 && !dryrun {
                for (s, d) in states.iter().zip(per) {
                    assert!(d.reset_after_ms > 0);
                    match s {
                        Owned::Tb(s) => assert_eq!(tb::State::decode(&s.encode()), Ok(*s)),
                        Owned::Sc(s) => assert_eq!(sc::State::decode(&s.encode()), Ok(*s)),
                        Owned::Log(s) => {
                            let enc = sl_encode(s);
                            assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc));
                        }
                    }
                }
            }
        }
        multi::Op::Refund(units) => {
            assert_eq!(whole.allowed, if per.iter().any(|d| d.granted > 0) { units } else { 0 });
            for ((s, d), (a, bf)) in states.iter().zip(per).zip(after.iter().zip(&before)) {
                if d.granted == 0 {
                    assert_eq!(a, bf, "a limit that gave nothing back changed");
                } else if d.reset_after_ms > 0 {
                    match s {
                        Owned::Tb(s) => assert_eq!(tb::State::decode(&s.encode()), Ok(*s)),
                        Owned::Sc(s) => assert_eq!(sc::State::decode(&s.encode()), Ok(*s)),
                        Owned::Log(s) => {
                            let enc = sl_encode(s);
                            assert_eq!(sl::State::decode(&enc).map(|x| sl_encode(&x)), Ok(enc));
                        }
                    }
                }
            }
        }
    }
}
