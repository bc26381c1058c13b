//! Model tests for RL.MULTI: random sequences of multi-limit calls (2–4
//! limits, mixed algorithms, WEIGHT, PARTIAL, DRYRUN, COST 0, REFUND, clock
//! steps back) against a reference that evaluates each limit on its own,
//! by brute force over exact integers and rationals, and commits all or
//! nothing. Every reply field must agree.

use super::*;
use crate::{slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision};
use proptest::prelude::*;

fn ceil_ms(us: u128) -> u64 {
    us.div_ceil(1000) as u64
}

// ---- Reference models, one limit each. ----

/// Token bucket as an exact rational level `num / d` tokens, `d` the
/// period in µs (the parameters never change within a run).
#[derive(Clone, Debug)]
struct TbModel {
    p: tb::Params,
    num: u128,
    last: u64,
    fresh: bool,
}

impl TbModel {
    fn d(&self) -> u128 {
        u128::from(self.p.period_ms) * 1000
    }
    fn full(&self) -> u128 {
        u128::from(self.p.capacity) * self.d()
    }
    /// (level, instant read at) at `now`.
    fn level(&self, now: u64) -> (u128, u64) {
        if self.fresh {
            return (self.full(), now);
        }
        let at = now.max(self.last);
        ((self.num + u128::from(at - self.last) * u128::from(self.p.rate)).min(self.full()), at)
    }
    fn avail(&self, now: u64) -> u64 {
        (self.level(now).0 / self.d()) as u64
    }
    fn wait(&self, level: u128, target: u128, gap: u128) -> u64 {
        if level >= target {
            0
        } else {
            ceil_ms((target - level).div_ceil(u128::from(self.p.rate)) + gap)
        }
    }
    fn reply_at(&self, level: u128, at: u64, now: u64, taken: u64, want: u64) -> Decision {
        let after = level - u128::from(taken) * self.d();
        let gap = u128::from(at - now);
        Decision {
            granted: taken,
            limit: self.p.capacity,
            remaining: (after / self.d()) as u64,
            retry_after_ms: if taken == want {
                0
            } else if want > self.p.capacity {
                -1
            } else {
                self.wait(after, u128::from(want) * self.d(), gap) as i64
            },
            reset_after_ms: self.wait(after, self.full(), gap),
        }
    }
    fn reply(&self, now: u64, taken: u64, want: u64) -> Decision {
        let (level, at) = self.level(now);
        self.reply_at(level, at, now, taken, want)
    }
    fn commit(&mut self, now: u64, taken: u64) {
        let (level, at) = self.level(now);
        self.num = level - u128::from(taken) * self.d();
        self.last = at;
        self.fresh = false;
    }
    fn refund(&mut self, now: u64, n: u64, want: u64) -> Decision {
        let (level, at) = self.level(now);
        let new = (level + u128::from(n) * self.d()).min(self.full());
        let mut d = self.reply_at(new, at, now, 0, want);
        d.granted = ((new / self.d()) - (level / self.d())) as u64;
        if d.granted > 0 {
            self.num = new;
            self.last = at;
            self.fresh = d.reset_after_ms == 0;
        }
        d
    }
}

/// Sliding log as a plain list of grants `(time, units)`.
#[derive(Clone, Debug)]
struct LogModel {
    p: sl::Params,
    grants: Vec<(u64, u64)>,
}

impl LogModel {
    fn w(&self) -> u128 {
        u128::from(self.p.window_ms) * 1000
    }
    fn at(&self, now: u64) -> u64 {
        self.grants.last().map_or(now, |&(t, _)| now.max(t))
    }
    fn used(grants: &[(u64, u64)], w: u128, at: u128) -> u64 {
        grants.iter().filter(|&&(t, _)| u128::from(t) + w > at).map(|&(_, u)| u).sum()
    }
    fn avail(&self, now: u64) -> u64 {
        self.p.limit.saturating_sub(Self::used(&self.grants, self.w(), u128::from(self.at(now))))
    }
    fn reply(&self, now: u64, taken: u64, want: u64) -> Decision {
        let at = self.at(now);
        let w = self.w();
        let mut after = self.grants.clone();
        if taken > 0 {
            after.push((at, taken));
        }
        let real = u128::from(now);
        let used = Self::used(&after, w, u128::from(at));
        // Smallest instant from `at` on at which `want` more units fit:
        // the instants when grants leave the window are the candidates.
        let retry = if taken == want {
            0
        } else if want > self.p.limit {
            -1
        } else {
            let mut cands: Vec<u128> = vec![u128::from(at)];
            cands.extend(after.iter().map(|&(t, _)| u128::from(t) + w));
            cands.sort();
            let t = cands
                .into_iter()
                .filter(|&c| c >= u128::from(at))
                .find(|&c| Self::used(&after, w, c) + want <= self.p.limit)
                .unwrap();
            // Fits at the instant the call is read at: no wait at all.
            if t == u128::from(at) {
                0
            } else {
                ceil_ms(t - real) as i64
            }
        };
        let live: Vec<_> = after.iter().filter(|&&(t, _)| u128::from(t) + w > u128::from(at)).collect();
        Decision {
            granted: taken,
            limit: self.p.limit,
            remaining: self.p.limit.saturating_sub(used),
            retry_after_ms: retry,
            reset_after_ms: live.last().map_or(0, |&&(t, _)| ceil_ms(u128::from(t) + w - real)),
        }
    }
    fn trim(&mut self, at: u64) {
        let w = self.w();
        self.grants.retain(|&(t, _)| u128::from(t) + w > u128::from(at));
    }
    fn commit(&mut self, now: u64, taken: u64) {
        let at = self.at(now);
        self.trim(at);
        self.grants.push((at, taken));
    }
    fn refund(&mut self, now: u64, n: u64, want: u64) -> Decision {
        let at = self.at(now);
        let mut after = self.grants.clone();
        after.retain(|&(t, _)| u128::from(t) + self.w() > u128::from(at));
        let mut left = n;
        while left > 0 {
            let Some(last) = after.last_mut() else { break };
            let take = left.min(last.1);
            last.1 -= take;
            left -= take;
            if last.1 == 0 {
                after.pop();
            }
        }
        let given = n - left;
        if given > 0 {
            self.grants = after;
        }
        let mut d = self.reply(now, 0, want);
        d.granted = given;
        d
    }
}

/// Sliding counter with the estimate compared in exact integers; waits
/// found by binary search over whole µs (the estimate never rises while
/// nothing is granted).
#[derive(Clone, Debug, Default)]
struct CounterModel {
    p: Option<sc::Params>,
    start: u64,
    cur: u64,
    prev: u64,
}

impl CounterModel {
    fn w(&self) -> u64 {
        self.p.map_or(1, |p| p.window_ms) * 1000
    }
    fn limit(&self) -> u64 {
        self.p.map_or(0, |p| p.limit)
    }
    /// (at, prev, cur) in the window of `max(now, start)`.
    fn view(&self, now: u64) -> (u64, u64, u64) {
        let at = now.max(self.start);
        let w = self.w();
        match at / w - self.start / w {
            0 => (at, self.prev, self.cur),
            1 => (at, self.cur, 0),
            _ => (at, 0, 0),
        }
    }
    /// `want` more fit at instant `t` (≥ at) given (prev, cur) in the
    /// window of `at`.
    fn fits(&self, at: u64, prev: u64, cur: u64, t: u64, want: u64) -> bool {
        let w = u128::from(self.w());
        let k = t / self.w() - at / self.w();
        let (p, c) = match k {
            0 => (prev, cur),
            1 => (cur, 0),
            _ => (0, 0),
        };
        let e = u128::from(t % self.w());
        u128::from(p) * (w - e) + u128::from(c + want) * w <= u128::from(self.limit()) * w
    }
    fn avail_at(&self, at: u64, prev: u64, cur: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, self.limit());
        if !self.fits(at, prev, cur, at, 0) {
            return 0;
        }
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.fits(at, prev, cur, at, mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
    fn avail(&self, now: u64) -> u64 {
        let (at, prev, cur) = self.view(now);
        self.avail_at(at, prev, cur)
    }
    fn reply_at(&self, now: u64, at: u64, prev: u64, cur: u64, taken: u64, want: u64) -> Decision {
        let w = self.w();
        let cur = cur + taken;
        let retry = if taken == want {
            0
        } else if want > self.limit() {
            -1
        } else {
            let (mut lo, mut hi) = (at, (at / w + 2) * w);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if self.fits(at, prev, cur, mid, want) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            // Fits at the instant the call is read at: no wait at all.
            if lo == at {
                0
            } else {
                ceil_ms(u128::from(lo - now)) as i64
            }
        };
        let reset = if cur > 0 {
            ceil_ms(u128::from((at / w + 2) * w - now))
        } else if prev > 0 {
            ceil_ms(u128::from((at / w + 1) * w - now))
        } else {
            0
        };
        Decision {
            granted: taken,
            limit: self.limit(),
            remaining: self.avail_at(at, prev, cur),
            retry_after_ms: retry,
            reset_after_ms: reset,
        }
    }
    fn reply(&self, now: u64, taken: u64, want: u64) -> Decision {
        let (at, prev, cur) = self.view(now);
        self.reply_at(now, at, prev, cur, taken, want)
    }
    fn commit(&mut self, now: u64, taken: u64) {
        let (at, prev, cur) = self.view(now);
        let ws = at - at % self.w();
        *self = CounterModel { p: self.p, start: ws.max(self.start), cur: cur + taken, prev };
    }
    fn refund(&mut self, now: u64, n: u64, want: u64) -> Decision {
        let (at, prev, cur) = self.view(now);
        let from_cur = n.min(cur);
        let from_prev = (n - from_cur).min(prev);
        let mut d = self.reply_at(now, at, prev - from_prev, cur - from_cur, 0, want);
        d.granted = from_cur + from_prev;
        if d.granted > 0 {
            let ws = at - at % self.w();
            *self = CounterModel { p: self.p, start: ws.max(self.start), cur: cur - from_cur, prev: prev - from_prev };
        }
        d
    }
}

#[derive(Clone, Debug)]
enum Model {
    Tb(TbModel),
    Log(LogModel),
    Counter(CounterModel),
}

impl Model {
    fn avail(&self, now: u64) -> u64 {
        match self {
            Model::Tb(m) => m.avail(now),
            Model::Log(m) => m.avail(now),
            Model::Counter(m) => m.avail(now),
        }
    }
    fn reply(&self, now: u64, taken: u64, want: u64) -> Decision {
        match self {
            Model::Tb(m) => m.reply(now, taken, want),
            Model::Log(m) => m.reply(now, taken, want),
            Model::Counter(m) => m.reply(now, taken, want),
        }
    }
    fn commit(&mut self, now: u64, taken: u64) {
        match self {
            Model::Tb(m) => m.commit(now, taken),
            Model::Log(m) => m.commit(now, taken),
            Model::Counter(m) => m.commit(now, taken),
        }
    }
    fn refund(&mut self, now: u64, n: u64, want: u64) -> Decision {
        let d = match self {
            Model::Tb(m) => m.refund(now, n, want),
            Model::Log(m) => m.refund(now, n, want),
            Model::Counter(m) => m.refund(now, n, want),
        };
        if d.granted > 0 && d.reset_after_ms == 0 {
            // Fresh again: the key is deleted.
            self.reset();
        }
        d
    }
    fn reset(&mut self) {
        match self {
            Model::Tb(m) => m.fresh = true,
            Model::Log(m) => m.grants.clear(),
            Model::Counter(m) => *m = CounterModel { p: m.p, ..CounterModel::default() },
        }
    }
}

/// The whole reply by the words of SPEC.md.
fn model_whole(per: &[Decision], weights: &[u64], op: Op) -> Whole {
    let n = per.len();
    let fewest = (0..n).min_by_key(|&i| (per[i].remaining / weights[i], i)).unwrap();
    let never = per.iter().any(|d| d.retry_after_ms == -1);
    let longest = if never { -1 } else { per.iter().map(|d| d.retry_after_ms).max().unwrap() };
    let pick = |b: usize, allowed: u64, retry: i64| Whole {
        allowed,
        limit: per[b].limit,
        remaining: per[b].remaining,
        retry_after_ms: retry,
        reset_after_ms: per[b].reset_after_ms,
        binding: b,
    };
    match op {
        Op::Refund(units) => pick(fewest, if per.iter().any(|d| d.granted > 0) { units } else { 0 }, longest),
        Op::Take { cost, partial, .. } => {
            let g = per[0].granted / weights[0];
            let allowed = if partial { g } else { u64::from(g == cost) };
            if g == cost {
                pick(fewest, allowed, 0)
            } else {
                let b = (0..n).find(|&i| per[i].retry_after_ms == longest).unwrap();
                pick(b, allowed, longest)
            }
        }
    }
}

// ---- The implementation under test, driven like the handler drives it. ----

#[derive(Clone, Debug)]
enum Real {
    Tb(tb::State),
    Log(sl::State),
    Counter(sc::State),
}

fn run_real(states: &mut [Real], params: &[Params], weights: &[u64], op: Op, now: u64) -> (Whole, Vec<Decision>) {
    let mut per = [Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 }; MAX_LIMITS];
    let whole = {
        let mut refs: Vec<Option<StateMut>> = states
            .iter_mut()
            .map(|s| match s {
                Real::Tb(s) => Some(StateMut::TokenBucket(s)),
                Real::Log(s) => Some(StateMut::SlidingLog(s)),
                Real::Counter(s) => Some(StateMut::SlidingCounter(s)),
            })
            .collect();
        run(&mut refs, params, weights, op, now, &mut per)
    };
    let per = per[..states.len()].to_vec();
    // The handler deletes a key that a refund made fresh.
    if let Op::Refund(_) = op {
        for (s, d) in states.iter_mut().zip(&per) {
            if d.granted > 0 && d.reset_after_ms == 0 {
                *s = match s {
                    Real::Tb(_) => Real::Tb(tb::State::default()),
                    Real::Log(_) => Real::Log(sl::State::default()),
                    Real::Counter(_) => Real::Counter(sc::State::default()),
                };
            }
        }
    }
    (whole, per)
}

#[derive(Clone, Debug)]
enum Step {
    Take { dt: i64, cost: u64, partial: bool, dryrun: bool },
    Refund { dt: i64, n: u64 },
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let dt = prop_oneof![6 => 0i64..400_000, 2 => Just(0i64), 1 => 0i64..5_000_000, 1 => -3_000_000i64..0];
    prop_oneof![
        5 => (dt.clone(), prop_oneof![1 => Just(0u64), 6 => 1u64..4, 2 => 1u64..15], any::<bool>(), prop::bool::weighted(0.15))
            .prop_map(|(dt, cost, partial, dryrun)| Step::Take { dt, cost, partial, dryrun }),
        1 => (dt, 1u64..6).prop_map(|(dt, n)| Step::Refund { dt, n }),
    ]
}

fn limit_strategy() -> impl Strategy<Value = (u8, u64, u64, u64, u64)> {
    // (algorithm, limit/capacity, rate, period/window ms, weight)
    (0u8..3, 1u64..20, 1u64..8, prop_oneof![1u64..50, 50u64..3000], prop_oneof![3 => Just(1u64), 1 => 1u64..4])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn multi_agrees_with_independent_limits(
        limits in proptest::collection::vec(limit_strategy(), 2..=4),
        steps in proptest::collection::vec(step_strategy(), 1..120),
        t0 in prop_oneof![Just(1_700_000_000_000_000u64), 0u64..10_000_000],
    ) {
        let mut params = Vec::new();
        let mut weights = Vec::new();
        let mut models = Vec::new();
        let mut states = Vec::new();
        for &(algo, limit, rate, ms, weight) in &limits {
            weights.push(weight);
            match algo {
                0 => {
                    let p = tb::Params { capacity: limit, rate, period_ms: ms };
                    params.push(Params::TokenBucket(p));
                    models.push(Model::Tb(TbModel { p, num: 0, last: 0, fresh: true }));
                    states.push(Real::Tb(tb::State::default()));
                }
                1 => {
                    let p = sl::Params { limit, window_ms: ms };
                    params.push(Params::SlidingLog(p));
                    models.push(Model::Log(LogModel { p, grants: Vec::new() }));
                    states.push(Real::Log(sl::State::default()));
                }
                _ => {
                    let p = sc::Params { limit, window_ms: ms };
                    params.push(Params::SlidingCounter(p));
                    models.push(Model::Counter(CounterModel { p: Some(p), ..CounterModel::default() }));
                    states.push(Real::Counter(sc::State::default()));
                }
            }
        }
        let mut now = t0;
        for step in steps {
            let (dt, op) = match step {
                Step::Take { dt, cost, partial, dryrun } => (dt, Op::Take { cost, partial, dryrun }),
                Step::Refund { dt, n } => (dt, Op::Refund(n)),
            };
            now = now.saturating_add_signed(dt);
            // The reference: each limit on its own, then all or nothing.
            let per_model: Vec<Decision> = match op {
                Op::Take { cost, partial, dryrun } => {
                    let mut g = cost;
                    while g > 0 && !models.iter().zip(&weights).all(|(m, &w)| g * w <= m.avail(now)) {
                        g -= 1;
                    }
                    if !partial && g != cost {
                        g = 0;
                    }
                    let per: Vec<Decision> = models.iter().zip(&weights).map(|(m, &w)| m.reply(now, g * w, cost * w)).collect();
                    if g > 0 && !dryrun {
                        for (m, &w) in models.iter_mut().zip(&weights) {
                            m.commit(now, g * w);
                        }
                    }
                    per
                }
                Op::Refund(n) => models.iter_mut().zip(&weights).map(|(m, &w)| m.refund(now, n * w, w)).collect(),
            };
            let expect = model_whole(&per_model, &weights, op);
            let (whole, per) = run_real(&mut states, &params, &weights, op, now);
            prop_assert_eq!(&per, &per_model, "op {:?} at {}", op, now);
            prop_assert_eq!(whole, expect, "op {:?} at {}", op, now);
        }
    }

    /// One limit of weight 1: RL.MULTI answers exactly what the single
    /// command answers, and leaves the same state.
    #[test]
    fn one_limit_is_the_single_command(
        limit in limit_strategy(),
        steps in proptest::collection::vec(step_strategy(), 1..150),
    ) {
        let (algo, lim, rate, ms, _) = limit;
        let mut now = 1_700_000_000_000_000u64;
        let (params, mut multi_state, mut single_state) = match algo {
            0 => (Params::TokenBucket(tb::Params { capacity: lim, rate, period_ms: ms }), Real::Tb(Default::default()), Real::Tb(Default::default())),
            1 => (Params::SlidingLog(sl::Params { limit: lim, window_ms: ms }), Real::Log(Default::default()), Real::Log(Default::default())),
            _ => (Params::SlidingCounter(sc::Params { limit: lim, window_ms: ms }), Real::Counter(Default::default()), Real::Counter(Default::default())),
        };
        for step in steps {
            let (dt, op) = match step {
                Step::Take { dt, cost, partial, dryrun } => (dt, Op::Take { cost, partial, dryrun }),
                Step::Refund { dt, n } => (dt, Op::Refund(n)),
            };
            now = now.saturating_add_signed(dt);
            let (whole, per) = run_real(std::slice::from_mut(&mut multi_state), &[params], &[1], op, now);
            let single = single_call(&mut single_state, &params, op, now);
            match op {
                Op::Take { cost, partial, .. } => {
                    prop_assert_eq!(per[0], single);
                    prop_assert_eq!(whole.allowed, single.allowed(cost, partial));
                }
                Op::Refund(n) => {
                    prop_assert_eq!(per[0], single);
                    prop_assert_eq!(whole.allowed, if single.granted > 0 { n } else { 0 });
                }
            }
            prop_assert_eq!((whole.limit, whole.remaining, whole.retry_after_ms, whole.reset_after_ms, whole.binding),
                (single.limit, single.remaining, single.retry_after_ms, single.reset_after_ms, 0));
            let same = match (&multi_state, &single_state) {
                (Real::Tb(a), Real::Tb(b)) => a == b,
                (Real::Log(a), Real::Log(b)) => a == b,
                (Real::Counter(a), Real::Counter(b)) => a == b,
                _ => false,
            };
            prop_assert!(same);
        }
    }
}

/// The single commands, driven like their handlers: `step`/`decide` +
/// `grant`, and the refunds.
fn single_call(s: &mut Real, p: &Params, op: Op, now: u64) -> Decision {
    match (s, p, op) {
        (Real::Tb(s), Params::TokenBucket(p), Op::Take { cost, partial, dryrun }) => {
            let (d, n) = tb::step(s, p, cost, partial, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Log(s), Params::SlidingLog(p), Op::Take { cost, partial, dryrun }) => {
            let d = sl::decide(s, p, cost, partial, now);
            if d.granted > 0 && !dryrun {
                sl::grant(s, p.window_ms, d.granted, now);
            }
            d
        }
        (Real::Counter(s), Params::SlidingCounter(p), Op::Take { cost, partial, dryrun }) => {
            let (d, n) = sc::step(s, p, cost, partial, now);
            if d.granted > 0 && !dryrun {
                *s = n;
            }
            d
        }
        (Real::Tb(s), Params::TokenBucket(p), Op::Refund(n)) => {
            let (d, new) = tb::refund(s, p, n, 1, now);
            if d.granted > 0 {
                *s = if d.reset_after_ms == 0 { tb::State::default() } else { new };
            }
            d
        }
        (Real::Log(s), Params::SlidingLog(p), Op::Refund(n)) => {
            let given = sl::refund(s, p.window_ms, n, now);
            let mut d = sl::View::at(s, p, now).answer(0, 1);
            d.granted = given;
            if given > 0 && d.reset_after_ms == 0 {
                *s = sl::State::default();
            }
            d
        }
        (Real::Counter(s), Params::SlidingCounter(p), Op::Refund(n)) => {
            let (d, new) = sc::refund(s, p, n, 1, now);
            if d.granted > 0 {
                *s = if d.reset_after_ms == 0 { sc::State::default() } else { new };
            }
            d
        }
        _ => unreachable!(),
    }
}

#[test]
fn partial_with_weight_grants_what_every_limit_can_take() {
    // 7 and 10 units left, weights 1 and 2: COST 8 PARTIAL takes 5.
    let now = 1_700_000_000_000_000;
    let pa = tb::Params { capacity: 10, rate: 1, period_ms: 1 << 40 };
    let pb = sl::Params { limit: 20, window_ms: 1 << 40 };
    let (_, mut a) = tb::step(&tb::State::default(), &pa, 3, false, now);
    let mut b = sl::State::default();
    sl::grant(&mut b, pb.window_ms, 10, now);
    let params = [Params::TokenBucket(pa), Params::SlidingLog(pb)];
    let mut per = [Decision { granted: 0, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 }; 2];
    let mut states = [Some(StateMut::TokenBucket(&mut a)), Some(StateMut::SlidingLog(&mut b))];
    let whole = run(&mut states, &params, &[1, 2], Op::Take { cost: 8, partial: true, dryrun: false }, now + 1, &mut per);
    assert_eq!(whole.allowed, 5);
    assert_eq!((per[0].granted, per[0].remaining, per[1].granted, per[1].remaining), (5, 2, 10, 0));
    // Without PARTIAL nothing moves.
    let before = (a, b.clone());
    let mut states = [Some(StateMut::TokenBucket(&mut a)), Some(StateMut::SlidingLog(&mut b))];
    let whole = run(&mut states, &params, &[1, 2], Op::Take { cost: 1, partial: false, dryrun: false }, now + 2, &mut per);
    assert_eq!(whole.allowed, 0);
    assert_eq!(whole.binding, 1);
    assert_eq!((a, b), before);
}

#[test]
fn requests_is_the_largest_common_grant() {
    assert_eq!(requests([(7, 1), (10, 2)].into_iter(), 8, true), 5);
    assert_eq!(requests([(7, 1), (10, 2)].into_iter(), 8, false), 0);
    assert_eq!(requests([(7, 1), (10, 2)].into_iter(), 5, false), 5);
    assert_eq!(requests([(0, 1)].into_iter(), 0, false), 0);
    assert_eq!(requests([(u64::MAX, 1), (3, 0)].into_iter(), 9, true), 3);
    assert_eq!(units(1 << 27, 1 << 26), Some(1 << 53).filter(|_| false).or(None));
    assert_eq!(units((1 << 53) - 1, 1), Some((1 << 53) - 1));
    assert_eq!(units(u64::MAX, 2), None);
}
