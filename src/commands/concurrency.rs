//! RL.CONCURRENCY: one key of leases, an in-flight limit. Parse, open and
//! read the key once, decide (`ratelimit_core::concurrency`), store the one
//! lease the call changed in place, commit (expire, signal, notify,
//! replicate the change), reply. A release that leaves no live lease
//! deletes the key.

use ratelimit_core::args::ArgError;
use ratelimit_core::catalogue::Kind;
use ratelimit_core::concurrency::{self as cc, Action};
use ratelimit_core::{codec, to_i64, Decision};

use super::reply::{reply_arg_error, STORE_FAILED};
use super::{commit, delete, Effects};
use crate::api::{Ctx, Replied, Str};
use crate::clock;
use crate::ffi;
use crate::stats::{self, Cmd};
use crate::value::{Holds, Packable, TypedKey};

const CMD: Cmd = Cmd::of(Kind::Concurrency);

/// The most words a call can have after the key (`limit lease_ms ACQUIRE
/// id COST n PARTIAL DRYRUN`): a longer call is an error, which the parse
/// of its first eight words already finds or makes (`ratelimit_core`'s
/// test `a_long_call_fails_on_its_first_eight_words`).
const MAX_WORDS: usize = 8;

pub fn concurrency(ctx: Ctx, argv: &[Str]) -> Replied {
    let (Some(&name), Some(rest)) = (argv.get(1), argv.get(2..)) else {
        return ctx.wrong_arity();
    };
    if rest.len() < 4 {
        return ctx.wrong_arity();
    }
    let mut words: [&[u8]; MAX_WORDS] = [&[]; MAX_WORDS];
    for (w, s) in words.iter_mut().zip(rest) {
        *w = s.bytes();
    }
    let call = match cc::parse(words.get(..rest.len().min(MAX_WORDS)).unwrap_or_default()) {
        Ok(_) if rest.len() > MAX_WORDS => return reply_arg_error(ctx, ArgError::Syntax),
        Ok(call) => call,
        Err(e) => return reply_arg_error(ctx, e),
    };
    match apply(ctx, name, &call) {
        Ok(d) => reply(ctx, &d, &call.action),
        Err(r) => r,
    }
}

/// Open and read the key, decide, write what changed.
#[inline]
fn apply<'a>(ctx: Ctx<'a>, name: Str<'a>, call: &cc::Call) -> Result<Decision, Replied> {
    let now = clock::now_us();
    let dryrun = matches!(call.action, Action::Acquire { dryrun: true, .. });
    let mut key = ctx.open_key(name, dryrun);
    if key.holds(cc::State::redis_type()) == Holds::WrongType {
        return Err(ctx.reply_error(ffi::WRONGTYPE));
    }
    // The key's leases borrowed once: decided, then the one change applied
    // in place (it always fits the state its view made it from: `apply`
    // refuses only what a master never sends).
    let (d, change, stored, fresh) = match key.wide_mut::<cc::State>() {
        Some(s) => {
            let (d, change) = cc::step(s, call, now);
            let Some(change) = change else { return Ok(d) };
            let ok = s.apply(&change).is_ok();
            (d, change, ok, s.is_fresh_at(now))
        }
        None => {
            let mut s = cc::State::default();
            let (d, change) = cc::step(&s, call, now);
            let Some(change) = change else { return Ok(d) };
            let ok = s.apply(&change).is_ok();
            let fresh = s.is_fresh_at(now);
            (d, change, ok && (fresh || key.set_new(s)), fresh)
        }
    };
    if !stored {
        return Err(ctx.reply_error(STORE_FAILED));
    }
    if fresh {
        // The last live lease was released: the key goes (and `DEL`
        // replicates), as a refund to a fresh limiter does.
        delete(ctx, &mut key, name);
    } else {
        let mut effects = Effects::new(CMD, matches!(call.action, Action::Release));
        commit(ctx, &key, name, now, d.reset_after_ms, &mut effects, |abs| codec::lease(&change, abs));
    }
    Ok(d)
}

/// The five integers, counted in INFO: ACQUIRE as every grant (element 1
/// 1/0, the units with PARTIAL), RELEASE as a refund (the units freed),
/// RENEW as a grant of one (1/0).
#[inline]
fn reply(ctx: Ctx, d: &Decision, action: &Action) -> Replied {
    let first = match *action {
        Action::Acquire { cost, partial, .. } => {
            stats::record(CMD, d.granted, cost);
            d.allowed(cost, partial)
        }
        Action::Release => {
            stats::record_refund(CMD);
            d.granted
        }
        Action::Renew => {
            stats::record(CMD, d.granted, 1);
            d.granted
        }
    };
    ctx.reply_ints([to_i64(first), to_i64(d.limit), to_i64(d.remaining), d.retry_after_ms, to_i64(d.reset_after_ms)])
}
