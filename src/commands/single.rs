//! RL.TOKENBUCKET, RL.SLIDINGCOUNTER and RL.SLIDINGLOG: one key, one
//! limit. The two word-sized states share one generic handler; the log is
//! read and written in place.

use ratelimit_core::args::{self, Arg, Call};
use ratelimit_core::{codec, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision};

use super::reply::{reply, STORE_FAILED};
use super::{commit, delete, parse, write_grant, Effects, Write};
use crate::api::{Ctx, Replied, Str};
use crate::clock;
use crate::ffi;
use crate::stats::Cmd;
use crate::value::{Holds, Packable, TypedKey};

/// A limiter whose whole state is a few machine words (token bucket,
/// sliding counter): the pure `step` returns the new state by value, and the
/// effect replicated is that state.
pub(super) trait WordLimiter: Packable + Copy + Default {
    type Params;
    const ARGS: &'static [Arg];
    const CMD: Cmd;
    fn params(nums: [u64; 3]) -> Self::Params;
    fn step(&self, p: &Self::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self);
    /// `REFUND n`, replying for a following request of `want` units.
    fn refund(&self, p: &Self::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self);
    fn effect(&self, abs_expire_ms: u64) -> codec::Small;
}

impl WordLimiter for tb::State {
    type Params = tb::Params;
    const ARGS: &'static [Arg] = args::TOKENBUCKET_ARGS;
    const CMD: Cmd = Cmd::TokenBucket;
    #[inline]
    fn params(nums: [u64; 3]) -> tb::Params {
        tb::Params::from_nums(nums)
    }
    #[inline]
    fn step(&self, p: &tb::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self) {
        tb::step(self, p, cost, partial, now_us)
    }
    #[inline]
    fn refund(&self, p: &tb::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self) {
        tb::refund(self, p, n, want, now_us)
    }
    #[inline]
    fn effect(&self, abs: u64) -> codec::Small {
        codec::tokenbucket(self, abs)
    }
}

impl WordLimiter for sc::State {
    type Params = sc::Params;
    const ARGS: &'static [Arg] = args::WINDOW_ARGS;
    const CMD: Cmd = Cmd::SlidingCounter;
    #[inline]
    fn params(nums: [u64; 3]) -> sc::Params {
        sc::Params::from_nums(nums)
    }
    #[inline]
    fn step(&self, p: &sc::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self) {
        sc::step(self, p, cost, partial, now_us)
    }
    #[inline]
    fn refund(&self, p: &sc::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self) {
        sc::refund(self, p, n, want, now_us)
    }
    #[inline]
    fn effect(&self, abs: u64) -> codec::Small {
        codec::slidingcounter(self, abs)
    }
}

/// Read the key once, decide, and on a grant write once, expire, signal and
/// replicate the new state (a grant that cannot be stored answers an error).
#[inline]
fn word_limiter<T: WordLimiter>(ctx: Ctx, argv: &[Str]) -> Replied {
    let (name, call) = match parse(ctx, argv, T::ARGS) {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    match word_apply::<T>(ctx, name, &call) {
        Ok(d) => reply(ctx, T::CMD, &d, &call),
        Err(rc) => rc,
    }
}

/// The work of a word-state limiter's call after parsing: read the key,
/// decide, write (shared with RL.MULTI of one limit of weight 1, which
/// answers what the single command does). The decision to reply with, or
/// the error reply sent.
#[inline(always)]
pub(super) fn word_apply<'a, T: WordLimiter>(ctx: Ctx<'a>, name: Str<'a>, call: &Call) -> Result<Decision, Replied> {
    let p = T::params(call.nums);
    let now = clock::now_us();
    let mut key = ctx.open_key(name, call.dryrun);
    let held = key.holds(T::redis_type());
    let cur = match held {
        Holds::WrongType => return Err(ctx.reply_error(ffi::WRONGTYPE)),
        Holds::Ours => key.read::<T>().unwrap_or_default(),
        Holds::Empty => T::default(),
    };
    if call.refund > 0 {
        // A refund that gives nothing back writes nothing; one that
        // leaves the limiter fresh deletes the key.
        let (d, new) = cur.refund(&p, call.refund, 1, now);
        if d.granted > 0 {
            if d.reset_after_ms == 0 {
                delete(ctx, &mut key, name);
            } else if key.store(new) {
                commit(ctx, &key, name, now, d.reset_after_ms, &mut Effects::default(), |abs| new.effect(abs));
            } else {
                return Err(ctx.reply_error(STORE_FAILED));
            }
        }
        return Ok(d);
    }
    let (d, new) = cur.step(&p, call.cost, call.partial, now);
    match write_grant(&d, call.dryrun, || key.store(new)) {
        Write::None => {}
        Write::Failed => return Err(ctx.reply_error(STORE_FAILED)),
        Write::Done => {
            commit(ctx, &key, name, now, d.reset_after_ms, &mut Effects::default(), |abs| new.effect(abs));
        }
    }
    Ok(d)
}

pub fn tokenbucket(ctx: Ctx, argv: &[Str]) -> Replied {
    word_limiter::<tb::State>(ctx, argv)
}

pub fn slidingcounter(ctx: Ctx, argv: &[Str]) -> Replied {
    word_limiter::<sc::State>(ctx, argv)
}

pub fn slidinglog(ctx: Ctx, argv: &[Str]) -> Replied {
    let (name, call) = match parse(ctx, argv, args::WINDOW_ARGS) {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    match log_apply(ctx, name, &call) {
        Ok(d) => reply(ctx, Cmd::SlidingLog, &d, &call),
        Err(rc) => rc,
    }
}

/// [`word_apply`] for the sliding log, read and written in place.
#[inline(always)]
pub(super) fn log_apply<'a>(ctx: Ctx<'a>, name: Str<'a>, call: &Call) -> Result<Decision, Replied> {
    let p = sl::Params::from_nums(call.nums);
    let now = clock::now_us();
    let mut key = ctx.open_key(name, call.dryrun);
    let held = key.holds(sl::State::redis_type());
    let log = match held {
        Holds::Ours => key.wide_mut::<sl::State>(),
        _ => None,
    };
    let empty = sl::State::default();
    let cur: &sl::State = match (&held, &log) {
        (Holds::WrongType, _) => return Err(ctx.reply_error(ffi::WRONGTYPE)),
        (_, Some(s)) => s,
        _ => &empty,
    };
    if call.refund > 0 {
        let (given, mut d) = match log {
            Some(s) => {
                let given = sl::refund(s, p.window_ms, call.refund, now);
                (given, sl::View::at(s, &p, now).answer(0, 1))
            }
            None => (0, sl::View::at(&empty, &p, now).answer(0, 1)),
        };
        d.granted = given;
        if given > 0 {
            if d.reset_after_ms == 0 {
                delete(ctx, &mut key, name);
            } else {
                let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: given };
                commit(ctx, &key, name, now, d.reset_after_ms, &mut Effects::default(), |abs| codec::log_refund(&g, abs));
            }
        }
        return Ok(d);
    }
    let d = sl::decide(cur, &p, call.cost, call.partial, now);
    // sl::grant decides everything before it mutates the log: a panic
    // cannot leave it half-updated.
    // (One `write_grant` per arm: the log in place borrows the key, a new
    // one is set through it.)
    let write = match log {
        Some(s) => write_grant(&d, call.dryrun, || {
            sl::grant(s, p.window_ms, d.granted, now);
            true
        }),
        None => write_grant(&d, call.dryrun, || {
            let mut s = sl::State::default();
            sl::grant(&mut s, p.window_ms, d.granted, now);
            key.set_new(s)
        }),
    };
    match write {
        Write::None => {}
        Write::Failed => return Err(ctx.reply_error(STORE_FAILED)),
        Write::Done => {
            let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: d.granted };
            commit(ctx, &key, name, now, d.reset_after_ms, &mut Effects::default(), |abs| codec::log_grant(&g, abs));
        }
    }
    Ok(d)
}
