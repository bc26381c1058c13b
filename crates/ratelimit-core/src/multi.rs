//! RL.MULTI: several limits decided in one step, all or nothing. Pure.
//!
//! Each limit is read once ([`Limit`]: a token bucket, sliding log,
//! sliding counter or fixed window view at the call's one clock reading) and answers two
//! questions through the same functions the single commands use: how many
//! units it could take now ([`Limit::available`]) and what it replies after
//! taking some for a call that asked for more ([`Limit::answer`]). A limit
//! takes `COST × WEIGHT` of its own units, so the call can take `g`
//! requests when every limit has `g × WEIGHT` available:
//!
//! - without PARTIAL, `g = COST` when every limit can take its units, else 0;
//! - with PARTIAL, `g` is the largest value `≤ COST` every limit can take
//!   (`min(COST, ⌊available_i / WEIGHT_i⌋)`), possibly 0.
//!
//! Every limit then answers for taking `g × WEIGHT_i` of the `COST ×
//! WEIGHT_i` it asked for; with one limit of weight 1 that is exactly the
//! single command's reply. [`combine`] folds the per-limit replies into the
//! whole reply (docs/contract.md, "RL.MULTI").

use crate::{
    concurrency as cc, fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision, MAX_ARG,
};

/// Most limits one call may name.
pub const MAX_LIMITS: usize = 16;

/// A limit's `CHECK`: it takes nothing, and the call is denied when its
/// `COST × WEIGHT` units do not fit.
pub const CHECK: u8 = 1;
/// A limit's `SHADOW`: it never denies the call; when the call is granted
/// it takes its units if they fit (each shadow limit on its own), else
/// nothing. With `CHECK` too it takes nothing and denies nothing.
pub const SHADOW: u8 = 2;

/// One limit of a call, read at the call's instant.
#[derive(Clone, Copy, Debug)]
pub enum Limit<'a> {
    TokenBucket(tb::View),
    SlidingLog(sl::View<'a>),
    SlidingCounter(sc::View),
    FixedWindow(fw::View),
    Concurrency(cc::View<'a>),
}

impl Limit<'_> {
    /// Units this limit could take now.
    #[inline]
    pub fn available(&self) -> u64 {
        match self {
            Limit::TokenBucket(v) => v.available(),
            Limit::SlidingLog(v) => v.available(),
            Limit::SlidingCounter(v) => v.available(),
            Limit::FixedWindow(v) => v.available(),
            Limit::Concurrency(v) => v.available(),
        }
    }

    /// Its reply after taking `taken` of the `want` units asked for.
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        match self {
            Limit::TokenBucket(v) => v.answer(taken, want),
            Limit::SlidingLog(v) => v.answer(taken, want),
            Limit::SlidingCounter(v) => v.answer(taken, want),
            Limit::FixedWindow(v) => v.answer(taken, want),
            Limit::Concurrency(v) => v.answer(taken, want),
        }
    }
}

impl Limit<'_> {
    /// A FORCE call can take `units` from it (its range allows the debt;
    /// never a concurrency limit, which the parser refuses with FORCE).
    #[inline]
    pub fn can_force(&self, units: u64) -> bool {
        match self {
            Limit::TokenBucket(v) => v.can_force(units),
            Limit::SlidingLog(v) => v.can_force(units),
            Limit::SlidingCounter(v) => v.can_force(units),
            Limit::FixedWindow(v) => v.can_force(units),
            Limit::Concurrency(_) => false,
        }
    }

    /// Its reply after a FORCE call took `taken` units (past its limit when
    /// need be), for a following call of `want`.
    #[inline]
    pub fn answer_forced(&self, taken: u64, want: u64) -> Decision {
        match self {
            Limit::TokenBucket(v) => v.answer_forced(taken, want),
            Limit::SlidingLog(v) => v.answer_forced(taken, want),
            Limit::SlidingCounter(v) => v.answer_forced(taken, want),
            Limit::FixedWindow(v) => v.answer_forced(taken, want),
            Limit::Concurrency(v) => v.answer(taken, want),
        }
    }
}

/// The whole reply's first six elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Whole {
    /// 1/0, or the requests granted with PARTIAL; for a refund, n when any
    /// limit took units back, else 0.
    pub allowed: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ms: i64,
    pub reset_after_ms: u64,
    /// 0-based index of the binding limit.
    pub binding: usize,
}

/// `cost × weight` when it stays within `MAX_ARG` (the parser refuses the
/// call otherwise).
#[inline]
pub fn units(cost: u64, weight: u64) -> Option<u64> {
    cost.checked_mul(weight).filter(|&u| u <= MAX_ARG)
}

/// The requests `g` a call takes: with `avail_weight` the `(available,
/// WEIGHT)` of every limit (WEIGHT ≥ 1), `COST` when every limit can take
/// `COST × WEIGHT`, else with PARTIAL the largest `g` every limit can take
/// `g × WEIGHT` of, else 0.
#[inline]
pub fn requests(avail_weight: impl Iterator<Item = (u64, u64)>, cost: u64, partial: bool) -> u64 {
    let mut g = cost;
    for (avail, weight) in avail_weight {
        g = g.min(if weight <= 1 { avail } else { avail / weight });
    }
    if g == cost || partial {
        g
    } else {
        0
    }
}

/// `retry_after_ms` values ordered by how long they wait: −1 (never) is the
/// longest.
#[inline]
fn wait_key(retry: i64) -> u128 {
    if retry < 0 {
        u128::MAX
    } else {
        retry as u128
    }
}

/// The limit with the fewest whole requests left (`remaining ÷ WEIGHT`),
/// ties to the lowest index. `per` is not empty.
#[inline]
fn fewest_left(per: &[Decision], weights: &[u64]) -> usize {
    let mut best = 0;
    let mut best_left = u64::MAX;
    for (i, (d, &w)) in per.iter().zip(weights).enumerate() {
        let left = if w <= 1 { d.remaining } else { d.remaining / w };
        if left < best_left {
            best = i;
            best_left = left;
        }
    }
    best
}

/// The longest of the limits' waits (−1 when any limit never can), with
/// the index of the first limit that waits that long.
#[inline]
fn longest_wait(per: &[Decision]) -> (i64, usize) {
    let mut best = 0;
    let mut key = 0u128;
    for (i, d) in per.iter().enumerate() {
        let k = wait_key(d.retry_after_ms);
        if k > key {
            best = i;
            key = k;
        }
    }
    (per.get(best).map_or(0, |d| d.retry_after_ms), best)
}

#[inline]
fn whole_from(allowed: u64, retry_after_ms: i64, b: usize, per: &[Decision]) -> Whole {
    let d =
        per.get(b).copied().unwrap_or(Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 });
    Whole { allowed, limit: d.limit, remaining: d.remaining, retry_after_ms, reset_after_ms: d.reset_after_ms, binding: b }
}

/// The whole reply of a call that took `g` of `cost` requests, from the
/// per-limit replies: granted (`g == cost`) binds the limit with the fewest
/// whole requests left and retries in 0; otherwise the longest wait binds
/// and is the call's wait.
#[inline]
pub fn combine(per: &[Decision], weights: &[u64], g: u64, cost: u64, partial: bool) -> Whole {
    let allowed = if partial { g } else { u64::from(g == cost) };
    if g == cost {
        whole_from(allowed, 0, fewest_left(per, weights), per)
    } else {
        let (retry, b) = longest_wait(per);
        whole_from(allowed, retry, b, per)
    }
}

/// [`combine`] of a call whose every limit has WEIGHT 1 (RL.MULTI's fast
/// path): the same whole reply, the fewest whole requests left being the
/// fewest remaining units.
#[inline(always)]
pub fn combine_unweighted(per: &[Decision], g: u64, cost: u64, partial: bool) -> Whole {
    let allowed = if partial { g } else { u64::from(g == cost) };
    if g == cost {
        let mut best = 0;
        let mut best_left = u64::MAX;
        for (i, d) in per.iter().enumerate() {
            if d.remaining < best_left {
                best = i;
                best_left = d.remaining;
            }
        }
        whole_from(allowed, 0, best, per)
    } else {
        let (retry, b) = longest_wait(per);
        whole_from(allowed, retry, b, per)
    }
}

/// The whole reply of `REFUND n`: element 1 is `n` when any limit took
/// units back, else 0; the binding limit is the one with the fewest whole
/// requests left; retry_after_ms is the longest of the limits' waits for
/// one request.
pub fn combine_refund(per: &[Decision], weights: &[u64], n: u64) -> Whole {
    let allowed = if per.iter().any(|d| d.granted > 0) { n } else { 0 };
    let (retry, _) = longest_wait(per);
    whole_from(allowed, retry, fewest_left(per, weights), per)
}

/// Decide a grant over `limits` (each with its WEIGHT): the requests taken
/// and every limit's reply, in `per` (the first `limits.len()` entries).
/// Returns `g`; the caller writes every limit (`g × WEIGHT` units each)
/// when `g > 0` and the call is not a dry run.
#[inline]
pub fn decide(limits: &[Option<Limit>], weights: &[u64], cost: u64, partial: bool, per: &mut [Decision]) -> u64 {
    let avail = limits.iter().zip(weights).map(|(l, &w)| (l.map_or(0, |l| l.available()), w));
    let g = requests(avail, cost, partial);
    for ((l, &w), d) in limits.iter().zip(weights).zip(per.iter_mut()) {
        if let Some(l) = l {
            // The parser checked cost × weight ≤ MAX_ARG, so g × w is too.
            *d = l.answer(g.saturating_mul(w), cost.saturating_mul(w));
        }
    }
    g
}

/// The whole reply of a FORCE call that took its `COST × WEIGHT` from
/// every limit: element 1 is 1 (granted), the binding limit the one with
/// the fewest whole requests left, retry_after_ms the longest of the
/// limits' waits for one following request (0 when one fits everywhere).
pub fn combine_forced(per: &[Decision], weights: &[u64]) -> Whole {
    let (retry, _) = longest_wait(per);
    whole_from(1, retry, fewest_left(per, weights), per)
}

/// What a call does: take `cost` requests (PARTIAL, DRYRUN), take them
/// past the limits (FORCE, DRYRUN), or give `n` back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Take { cost: u64, partial: bool, dryrun: bool },
    Force { cost: u64, dryrun: bool },
    Refund(u64),
}

/// One limit's stored state, to read and (when the call writes) update in
/// place, paired with its parameters (a state cannot be read under another
/// algorithm's). A missing key is a fresh (`Default`) state.
pub enum LimitMut<'a> {
    TokenBucket(&'a mut tb::State, tb::Params),
    SlidingLog(&'a mut sl::State, sl::Params),
    SlidingCounter(&'a mut sc::State, sc::Params),
    FixedWindow(&'a mut fw::State, fw::Params),
    Concurrency(&'a mut cc::State, cc::Params),
}

/// One limit of a call as the caller holds it: its state paired with its
/// parameters, and its WEIGHT. [`run`] reads each twice: to decide, then
/// to write.
pub trait Slot {
    fn limit(&mut self) -> LimitMut<'_>;
    fn weight(&self) -> u64;
}

/// A [`Slot`] of states held elsewhere.
pub struct Entry<'a> {
    pub limit: LimitMut<'a>,
    pub weight: u64,
}

impl Slot for Entry<'_> {
    #[inline]
    fn limit(&mut self) -> LimitMut<'_> {
        match &mut self.limit {
            LimitMut::TokenBucket(s, p) => LimitMut::TokenBucket(s, *p),
            LimitMut::SlidingLog(s, p) => LimitMut::SlidingLog(s, *p),
            LimitMut::SlidingCounter(s, p) => LimitMut::SlidingCounter(s, *p),
            LimitMut::FixedWindow(s, p) => LimitMut::FixedWindow(s, *p),
            LimitMut::Concurrency(s, p) => LimitMut::Concurrency(s, *p),
        }
    }
    #[inline]
    fn weight(&self) -> u64 {
        self.weight
    }
}

/// The parameters of one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Params {
    TokenBucket(tb::Params),
    SlidingLog(sl::Params),
    SlidingCounter(sc::Params),
    FixedWindow(fw::Params),
    /// Its id's hash is in its parameters.
    Concurrency(cc::Params),
}

impl<'a> LimitMut<'a> {
    /// The state read at `now_us`.
    #[inline]
    fn view(self, now_us: u64) -> Limit<'a> {
        match self {
            LimitMut::TokenBucket(s, p) => Limit::TokenBucket(tb::View::at(s, &p, now_us)),
            LimitMut::SlidingLog(s, p) => Limit::SlidingLog(sl::View::at(s, &p, now_us)),
            LimitMut::SlidingCounter(s, p) => Limit::SlidingCounter(sc::View::at(s, &p, now_us)),
            LimitMut::FixedWindow(s, p) => Limit::FixedWindow(fw::View::at(s, &p, now_us)),
            LimitMut::Concurrency(s, p) => Limit::Concurrency(cc::View::at(s, &p, now_us)),
        }
    }

    /// Give `units` back; the reply (element 1: the units given back) for a
    /// following request of `want` units. Changes the state only when units
    /// were given back.
    fn give_back(self, units: u64, want: u64, now_us: u64) -> Decision {
        match self {
            LimitMut::TokenBucket(s, p) => {
                let (d, new) = tb::refund(s, &p, units, want, now_us);
                if d.granted > 0 {
                    *s = new;
                }
                d
            }
            LimitMut::SlidingLog(s, p) => {
                let given = sl::refund(s, p.window_ms, units, now_us);
                let mut d = sl::View::at(s, &p, now_us).answer(0, want);
                d.granted = given;
                d
            }
            LimitMut::SlidingCounter(s, p) => {
                let (d, new) = sc::refund(s, &p, units, want, now_us);
                if d.granted > 0 {
                    *s = new;
                }
                d
            }
            LimitMut::FixedWindow(s, p) => {
                let (d, new) = fw::refund(s, &p, units, want, now_us);
                if d.granted > 0 {
                    *s = new;
                }
                d
            }
            LimitMut::Concurrency(s, p) => {
                let (d, change) = cc::View::at(s, &p, now_us).give_back(units, want);
                if let Some(c) = change {
                    // A change made by the view of this state fits it.
                    let _ = s.apply(&c);
                }
                d
            }
        }
    }
}

/// Run a call over `limits` (every one `Some`: a `None` is no limit, left
/// out) at `now_us`: decide, and when the call writes,
/// update every state in place. Fills `per` (one reply per limit, in the
/// same order) and returns the whole reply.
///
/// Which states changed: with `Op::Take` (not DRYRUN) all of them when the
/// call took any units (`per[i].granted` is not 0), else none; with
/// `Op::Refund` those whose `per[i].granted` is not 0. A changed state
/// whose `reset_after_ms` is 0 is fresh again (a refund gave everything
/// back): the caller deletes its key. A state that did not change is left
/// untouched, bit for bit.
pub fn run(limits: &mut [Option<impl Slot>], op: Op, now_us: u64, per: &mut [Decision]) -> Whole {
    let n = limits.len().min(per.len()).min(MAX_LIMITS);
    let (limits, per) = (&mut limits[..n], &mut per[..n]);
    // The views live in a stack array sized for the call: one or two
    // limits (the common calls) do not build sixteen.
    match n {
        0 | 1 => run_n::<1>(limits, op, now_us, per),
        2 => run_n::<2>(limits, op, now_us, per),
        3 | 4 => run_n::<4>(limits, op, now_us, per),
        _ => run_n::<MAX_LIMITS>(limits, op, now_us, per),
    }
}

/// [`run`] over `n ≤ N` limits (the slices have the same length).
#[inline(always)]
fn run_n<const N: usize>(limits: &mut [Option<impl Slot>], op: Op, now_us: u64, per: &mut [Decision]) -> Whole {
    let mut weights = [1u64; N];
    for (w, e) in weights.iter_mut().zip(limits.iter().flatten()) {
        *w = e.weight();
    }
    let weights = &weights[..limits.len().min(N)];
    match op {
        Op::Take { cost, partial, dryrun } => {
            let g = {
                let mut views: [Option<Limit>; N] = [None; N];
                for (v, e) in views.iter_mut().zip(limits.iter_mut()) {
                    *v = e.as_mut().map(|e| e.limit().view(now_us));
                }
                decide(&views[..weights.len()], weights, cost, partial, per)
            };
            if g > 0 && !dryrun {
                // Each state after its take, from the view the decision used
                // (the state, parameters and instant are the same).
                for (e, d) in limits.iter_mut().zip(per.iter()) {
                    let (Some(e), units) = (e, d.granted) else { continue };
                    match e.limit() {
                        LimitMut::TokenBucket(s, p) => *s = tb::View::at(s, &p, now_us).state_after(units),
                        LimitMut::SlidingLog(s, p) => sl::grant(s, p.window_ms, units, now_us),
                        LimitMut::SlidingCounter(s, p) => *s = sc::View::at(s, &p, now_us).state_after(units),
                        LimitMut::FixedWindow(s, p) => *s = fw::View::at(s, &p, now_us).state_after(units),
                        LimitMut::Concurrency(s, p) => {
                            let c = cc::View::at(s, &p, now_us).acquired(units);
                            let _ = s.apply(&c);
                        }
                    }
                }
            }
            combine(per, weights, g, cost, partial)
        }
        Op::Force { cost, dryrun } => {
            let forced = {
                let mut ok = true;
                for (e, &w) in limits.iter_mut().zip(weights) {
                    if let Some(e) = e {
                        ok &= e.limit().view(now_us).can_force(cost.saturating_mul(w));
                    }
                }
                ok
            };
            if !forced {
                // A debt past 2^53 − 1 somewhere: decided as without FORCE.
                return run_n::<N>(limits, Op::Take { cost, partial: false, dryrun }, now_us, per);
            }
            for ((e, &w), d) in limits.iter_mut().zip(weights).zip(per.iter_mut()) {
                let Some(e) = e else { continue };
                let units = cost.saturating_mul(w);
                // The reply for one following request: WEIGHT units.
                *d = e.limit().view(now_us).answer_forced(units, w);
                if units == 0 || dryrun {
                    continue;
                }
                match e.limit() {
                    LimitMut::TokenBucket(s, p) => *s = tb::View::at(s, &p, now_us).state_after_forced(units),
                    LimitMut::SlidingLog(s, p) => sl::grant(s, p.window_ms, units, now_us),
                    LimitMut::SlidingCounter(s, p) => *s = sc::View::at(s, &p, now_us).state_after(units),
                    LimitMut::FixedWindow(s, p) => *s = fw::View::at(s, &p, now_us).state_after(units),
                    // Refused by the parser: no lease is taken past a limit.
                    LimitMut::Concurrency(..) => {}
                }
            }
            combine_forced(per, weights)
        }
        Op::Refund(units) => {
            for (e, d) in limits.iter_mut().zip(per.iter_mut()) {
                let Some(e) = e else { continue };
                let w = e.weight();
                *d = e.limit().give_back(units.saturating_mul(w), w, now_us);
            }
            combine_refund(per, weights, units)
        }
    }
}

/// What a limit with `flags` takes when the call takes `g` requests of
/// `cost` and it could take `avail` units: a plain limit `g × w`, a CHECK
/// limit nothing, a SHADOW limit `g × w` when that fits, else nothing.
#[inline]
pub fn flagged_take(flags: u8, avail: u64, g: u64, w: u64) -> u64 {
    let take = g.saturating_mul(w);
    if flags & CHECK != 0 || (flags & SHADOW != 0 && take > avail) {
        0
    } else {
        take
    }
}

/// [`combine`] of a call with flags: elements 1–6 from the limits without
/// SHADOW (all of them when every limit has SHADOW), indices kept.
pub fn combine_flagged(per: &[Decision], weights: &[u64], flags: &[u8], g: u64, cost: u64, partial: bool) -> Whole {
    let allowed = if partial { g } else { u64::from(g == cost) };
    let all_shadow = flags.iter().take(per.len()).all(|&f| f & SHADOW != 0);
    let counts = |i: usize| all_shadow || flags.get(i).is_none_or(|&f| f & SHADOW == 0);
    if g == cost {
        let mut best = 0;
        let mut best_left = u64::MAX;
        for (i, (d, &w)) in per.iter().zip(weights).enumerate() {
            let left = if w <= 1 { d.remaining } else { d.remaining / w };
            if counts(i) && left < best_left {
                best = i;
                best_left = left;
            }
        }
        whole_from(allowed, 0, best, per)
    } else {
        let mut best = usize::MAX;
        let mut key = 0u128;
        for (i, d) in per.iter().enumerate() {
            let k = wait_key(d.retry_after_ms);
            if counts(i) && (best == usize::MAX || k > key) {
                best = i;
                key = k;
            }
        }
        let best = if best == usize::MAX { 0 } else { best };
        whole_from(allowed, per.get(best).map_or(0, |d| d.retry_after_ms), best, per)
    }
}

/// [`run`] of a take whose limits have flags (`flags[i]` of limit i:
/// [`CHECK`], [`SHADOW`]; the parser refuses them with REFUND): the
/// requests `g` the limits without SHADOW can take (all `COST` when every
/// limit has SHADOW), each limit's take by [`flagged_take`], its reply
/// `answer(taken, COST × WEIGHT)`; unless DRYRUN, each limit that took
/// units is written (the others are left untouched, bit for bit).
pub fn run_flagged(limits: &mut [Option<impl Slot>], flags: &[u8], op: Op, now_us: u64, per: &mut [Decision]) -> Whole {
    let n = limits.len().min(per.len()).min(MAX_LIMITS);
    let (limits, per) = (&mut limits[..n], &mut per[..n]);
    let Op::Take { cost, partial, dryrun } = op else {
        // FORCE has no flagged limits (the parser refuses CHECK and SHADOW
        // with it); REFUND neither.
        return run(limits, op, now_us, per);
    };
    let mut weights = [1u64; MAX_LIMITS];
    let mut fl = [0u8; MAX_LIMITS];
    let mut avail = [0u64; MAX_LIMITS];
    for (i, e) in limits.iter_mut().enumerate() {
        let Some(e) = e else { continue };
        weights[i] = e.weight();
        fl[i] = flags.get(i).copied().unwrap_or(0);
        avail[i] = e.limit().view(now_us).available();
    }
    let all_shadow = fl[..n].iter().all(|&f| f & SHADOW != 0);
    let vetoing = (0..n).filter(|&i| all_shadow || fl[i] & SHADOW == 0).map(|i| (avail[i], weights[i]));
    let g = if all_shadow { cost } else { requests(vetoing, cost, partial) };
    for (i, (e, d)) in limits.iter_mut().zip(per.iter_mut()).enumerate() {
        let Some(e) = e else { continue };
        let taken = flagged_take(fl[i], avail[i], g, weights[i]);
        let view = e.limit().view(now_us);
        *d = view.answer(taken, cost.saturating_mul(weights[i]));
        if taken == 0 || dryrun {
            continue;
        }
        match e.limit() {
            LimitMut::TokenBucket(s, p) => *s = tb::View::at(s, &p, now_us).state_after(taken),
            LimitMut::SlidingLog(s, p) => sl::grant(s, p.window_ms, taken, now_us),
            LimitMut::SlidingCounter(s, p) => *s = sc::View::at(s, &p, now_us).state_after(taken),
            LimitMut::FixedWindow(s, p) => *s = fw::View::at(s, &p, now_us).state_after(taken),
            LimitMut::Concurrency(s, p) => {
                let c = cc::View::at(s, &p, now_us).acquired(taken);
                let _ = s.apply(&c);
            }
        }
    }
    combine_flagged(per, &weights[..n], &fl[..n], g, cost, partial)
}

#[cfg(test)]
#[path = "multi_tests.rs"]
mod tests;
