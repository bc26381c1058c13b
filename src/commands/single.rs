//! RL.TOKENBUCKET, RL.SLIDINGCOUNTER, RL.FIXEDWINDOW and RL.SLIDINGLOG:
//! one key, one limit. The three word-sized states share one generic
//! handler; the log is
//! read and written in place. Each handler reads as the request runs:
//! parse, open and read the key, decide, commit (`super::write`), reply.

use ratelimit_core::args::{self, Arg, Call};
use ratelimit_core::catalogue::Kind;
use ratelimit_core::{codec, fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, Decision};

use super::reply::{reply, reply_arg_error};
use super::{write, Decided};
use crate::api::{Ctx, Key, Replied, Str};
use crate::clock;
use crate::ffi;
use crate::stats::Cmd;
use crate::value::{Holds, Packable, TypedKey};

/// A limiter whose whole state is a few machine words (token bucket,
/// sliding counter, fixed window): the pure `step` returns the new state by value, and the
/// effect replicated is that state.
pub(super) trait WordLimiter: Packable + Copy + Default {
    type Params;
    /// Its kind: its arguments, whether it takes `FROMFIRST`
    /// (`args::parse_fixedwindow`) and its INFO row come from the catalogue.
    const KIND: Kind;
    const ARGS: &'static [Arg] = Self::KIND.args();
    const FROMFIRST: bool = Self::KIND.spec().from_first;
    const CMD: Cmd = Cmd::of(Self::KIND);
    fn params(nums: [u64; 3]) -> Self::Params;
    fn step(&self, p: &Self::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self);
    /// `REFUND n`, replying for a following request of `want` units.
    fn refund(&self, p: &Self::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self);
    /// `COST n FORCE`, replying for a following request of `want` units.
    fn force(&self, p: &Self::Params, cost: u64, want: u64, now_us: u64) -> (Decision, Self);
    fn effect(&self, abs_expire_ms: u64) -> codec::Small;
}

impl WordLimiter for tb::State {
    type Params = tb::Params;
    const KIND: Kind = Kind::TokenBucket;
    #[inline]
    fn params(nums: [u64; 3]) -> tb::Params {
        tb::Params::from_nums(nums)
    }
    #[inline(always)]
    fn step(&self, p: &tb::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self) {
        tb::step(self, p, cost, partial, now_us)
    }
    #[inline]
    fn refund(&self, p: &tb::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self) {
        tb::refund(self, p, n, want, now_us)
    }
    #[cold]
    #[inline(never)]
    fn force(&self, p: &tb::Params, cost: u64, want: u64, now_us: u64) -> (Decision, Self) {
        tb::force(self, p, cost, want, now_us)
    }
    #[inline]
    fn effect(&self, abs: u64) -> codec::Small {
        codec::tokenbucket(self, abs)
    }
}

impl WordLimiter for sc::State {
    type Params = sc::Params;
    const KIND: Kind = Kind::SlidingCounter;
    #[inline]
    fn params(nums: [u64; 3]) -> sc::Params {
        sc::Params::from_nums(nums)
    }
    #[inline(always)]
    fn step(&self, p: &sc::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self) {
        sc::step(self, p, cost, partial, now_us)
    }
    #[inline]
    fn refund(&self, p: &sc::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self) {
        sc::refund(self, p, n, want, now_us)
    }
    #[cold]
    #[inline(never)]
    fn force(&self, p: &sc::Params, cost: u64, want: u64, now_us: u64) -> (Decision, Self) {
        sc::force(self, p, cost, want, now_us)
    }
    #[inline]
    fn effect(&self, abs: u64) -> codec::Small {
        codec::slidingcounter(self, abs)
    }
}

/// Parse, then read the key once, decide, and on a grant write once,
/// expire, signal, notify and replicate the new state (a grant that cannot
/// be stored answers an error); reply.
#[inline]
fn word_limiter<T: WordLimiter>(ctx: Ctx, argv: &[Str]) -> Replied {
    let (name, call) = match parse(ctx, argv, T::ARGS, T::FROMFIRST) {
        Ok(v) => v,
        Err(r) => return r,
    };
    match word_apply::<T>(ctx, name, &call, T::CMD) {
        Ok(d) => reply(ctx, T::CMD, &d, &call),
        Err(r) => r,
    }
}

/// The work of a word-state limiter's call after parsing: open and read
/// the key, decide, commit (shared with RL.MULTI of one plain limit, which
/// answers what the single command does, as `cmd`: [`word_apply_with`]).
/// The decision to reply with, or the error reply sent.
#[inline(always)]
fn word_apply<'a, T: WordLimiter>(ctx: Ctx<'a>, name: Str<'a>, call: &Call, cmd: Cmd) -> Result<Decision, Replied> {
    word_apply_with::<T, false>(ctx, name, call, cmd, T::params(call.nums))
}

/// [`word_apply`] with the limit's parameters given (RL.MULTI's one plain
/// limit, whose parameters are parsed already). `MULTI` says which: it
/// only makes each caller its own copy, so that the decision and the store
/// stay inlined in both (a shared copy kept them out of line: 35 more
/// instructions per RL.TOKENBUCKET).
#[inline(always)]
pub(super) fn word_apply_with<'a, T: WordLimiter, const MULTI: bool>(
    ctx: Ctx<'a>,
    name: Str<'a>,
    call: &Call,
    cmd: Cmd,
    p: T::Params,
) -> Result<Decision, Replied> {
    let now = clock::now_us();
    let mut key = ctx.open_key(name, call.dryrun);
    let cur = match key.holds(T::redis_type()) {
        Holds::WrongType => return Err(ctx.reply_error(ffi::WRONGTYPE)),
        Holds::Ours => key.read::<T>().unwrap_or_default(),
        Holds::Empty => T::default(),
    };
    // A refund that gives nothing back writes nothing; one that leaves the
    // limiter fresh deletes the key (`write`).
    let (d, new) = if call.refund > 0 {
        cur.refund(&p, call.refund, 1, now)
    } else if call.force {
        // A debit: all COST units, past the limit if need be; the reply
        // answers for a following request of one unit.
        cur.force(&p, call.cost, 1, now)
    } else {
        cur.step(&p, call.cost, call.partial, now)
    };
    write(ctx, &mut key, name, Decided { cmd, call, d: &d, now_us: now }, |k| k.store(new), |abs| new.effect(abs))?;
    Ok(d)
}

impl WordLimiter for fw::State {
    type Params = fw::Params;
    const KIND: Kind = Kind::FixedWindow;
    #[inline]
    fn params(nums: [u64; 3]) -> fw::Params {
        fw::Params::from_nums(nums)
    }
    #[inline(always)]
    fn step(&self, p: &fw::Params, cost: u64, partial: bool, now_us: u64) -> (Decision, Self) {
        fw::step(self, p, cost, partial, now_us)
    }
    #[inline]
    fn refund(&self, p: &fw::Params, n: u64, want: u64, now_us: u64) -> (Decision, Self) {
        fw::refund(self, p, n, want, now_us)
    }
    #[cold]
    #[inline(never)]
    fn force(&self, p: &fw::Params, cost: u64, want: u64, now_us: u64) -> (Decision, Self) {
        fw::force(self, p, cost, want, now_us)
    }
    #[inline]
    fn effect(&self, abs: u64) -> codec::Small {
        codec::fixedwindow(self, abs)
    }
}

pub fn tokenbucket(ctx: Ctx, argv: &[Str]) -> Replied {
    word_limiter::<tb::State>(ctx, argv)
}

pub fn slidingcounter(ctx: Ctx, argv: &[Str]) -> Replied {
    word_limiter::<sc::State>(ctx, argv)
}

pub fn fixedwindow(ctx: Ctx, argv: &[Str]) -> Replied {
    word_limiter::<fw::State>(ctx, argv)
}

pub fn slidinglog(ctx: Ctx, argv: &[Str]) -> Replied {
    const KIND: Kind = Kind::SlidingLog;
    let (name, call) = match parse(ctx, argv, KIND.args(), KIND.spec().from_first) {
        Ok(v) => v,
        Err(r) => return r,
    };
    match log_apply(ctx, name, &call, Cmd::of(KIND)) {
        Ok(d) => reply(ctx, Cmd::of(KIND), &d, &call),
        Err(r) => r,
    }
}

/// [`word_apply`] for the sliding log, read and written in place.
#[inline(always)]
fn log_apply<'a>(ctx: Ctx<'a>, name: Str<'a>, call: &Call, cmd: Cmd) -> Result<Decision, Replied> {
    let p = sl::Params::from_nums(call.nums);
    let now = clock::now_us();
    let mut key = ctx.open_key(name, call.dryrun);
    if key.holds(sl::State::redis_type()) == Holds::WrongType {
        return Err(ctx.reply_error(ffi::WRONGTYPE));
    }
    let empty = sl::State::default();
    if call.refund > 0 {
        // The refund changes the log in place, then answers for a request
        // of one unit; a missing log has nothing to give back.
        let (given, mut d) = match key.wide_mut::<sl::State>() {
            Some(s) => {
                let given = sl::refund(s, p.window_ms, call.refund, now);
                (given, sl::View::at(s, &p, now).answer(0, 1))
            }
            None => (0, sl::View::at(&empty, &p, now).answer(0, 1)),
        };
        d.granted = given;
        let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: given };
        write(ctx, &mut key, name, Decided { cmd, call, d: &d, now_us: now }, |_| true, |abs| codec::log_refund(&g, abs))?;
        return Ok(d);
    }
    let decide = |s: &sl::State| {
        if call.force {
            // A debit: one entry of all COST units, past the limit if need be.
            sl::decide_forced(s, &p, call.cost, 1, now)
        } else {
            sl::decide(s, &p, call.cost, call.partial, now)
        }
    };
    let d = match key.wide_mut::<sl::State>() {
        Some(s) => decide(s),
        None => decide(&empty),
    };
    // sl::grant decides everything before it mutates the log: a panic
    // cannot leave it half-updated. A missing log is a new one, set
    // through the key.
    let grant = |k: &mut Key| match k.wide_mut::<sl::State>() {
        Some(s) => {
            sl::grant(s, p.window_ms, d.granted, now);
            true
        }
        None => {
            let mut s = sl::State::default();
            sl::grant(&mut s, p.window_ms, d.granted, now);
            k.set_new(s)
        }
    };
    let g = codec::LogGrant { now_us: now, window_ms: p.window_ms, units: d.granted };
    write(ctx, &mut key, name, Decided { cmd, call, d: &d, now_us: now }, grant, |abs| codec::log_grant(&g, abs))?;
    Ok(d)
}

/// Parse `key <positional> [options]`; an error is answered.
/// A call of the numbers only (the common one: the argument count says so)
/// reads them straight into the call (`args::parse_exact`, the same
/// result); any other goes through the full parser (with `FROMFIRST` for
/// RL.FIXEDWINDOW, `from_first`).
#[inline(always)]
fn parse<'a>(ctx: Ctx<'a>, argv: &[Str<'a>], positional: &[Arg], from_first: bool) -> Result<(Str<'a>, Call), Replied> {
    let (Some(&key), Some(rest)) = (argv.get(1), argv.get(2..)) else {
        return Err(ctx.wrong_arity());
    };
    let parsed = if rest.len() == positional.len() && rest.len() <= 3 {
        let mut nums: [&[u8]; 3] = [&[]; 3];
        for (b, &s) in nums.iter_mut().zip(rest) {
            *b = s.bytes();
        }
        args::parse_exact(&nums[..rest.len()], positional)
    } else {
        parse_general(rest, positional, from_first)
    };
    match parsed {
        Ok(call) => Ok((key, call)),
        Err(e) => Err(reply_arg_error(ctx, e)),
    }
}

/// The full parser, for calls with options (kept out of line).
#[inline(never)]
fn parse_general(rest: &[Str], positional: &[Arg], from_first: bool) -> Result<Call, args::ArgError> {
    let rest = rest.iter().map(|&s| s.bytes());
    if from_first {
        args::parse_fixedwindow(rest)
    } else {
        args::parse(rest, positional)
    }
}
