//! CL.THROTTLE: redis-cell 0.5's command, answered by the core's GCRA
//! (`ratelimit_core::gcra`), enabled by the load argument `CL.THROTTLE`
//! (docs/operations.md). The same path as the RL commands: parse, open and
//! read the key once, decide, write once (store, then `commands::commit`:
//! expire, signal, notify, replicate the state as an effect), count in
//! INFO, reply; no allocation and no formatting
//! except for an argument that is not an integer, whose error text quotes
//! it as redis-cell's does.
//!
//! The key holds this module's `rl-gcrate` value, or redis-cell's own form:
//! a string with the TAT in decimal ns, which is read and continued; an
//! allowed call replaces it with the native value (a denied one leaves it).

use std::ffi::{CStr, CString};

use ratelimit_core::codec;
use ratelimit_core::gcra::{self, ParamError, State};

use super::reply::STORE_FAILED;
use super::{commit, Effects};
use crate::api::{Ctx, Replied, Str};
use crate::clock;
use crate::ffi;
use crate::stats::{self, Cmd};
use crate::value::{Holds, Packable, TypedKey};

/// redis-cell's texts (its errors are `Cell error: Store error: ...`).
const USAGE: &CStr =
    c"Cell error: Store error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";
const ZERO_RATE: &CStr = c"Cell error: Store error: Zero rates are not supported";
/// Decided here: where redis-cell computes with negative numbers or wraps.
const NEGATIVE: &CStr = c"ERR CL.THROTTLE max_burst, count per period, period and quantity must not be negative";
const TOO_LARGE: &CStr =
    c"ERR CL.THROTTLE (max_burst + 1) and quantity times the emission interval must each fit in 2^63 ns";
const OUT_OF_RANGE: &CStr = c"ERR CL.THROTTLE the stored time is out of range";

pub fn throttle(ctx: Ctx, argv: &[Str]) -> Replied {
    let (6 | 7) = argv.len() + 1 else {
        return ctx.reply_error(USAGE);
    };
    let name = argv[1];
    let mut nums = [1i64; 4];
    for (n, s) in nums.iter_mut().zip(&argv[2..]) {
        match gcra::parse_i64(s.bytes()) {
            Some(v) => *n = v,
            None => return not_an_integer(ctx, s.bytes()),
        }
    }
    let [burst, count, period, quantity] = nums;
    let p = match gcra::Params::new(burst, count, period, quantity) {
        Ok(p) => p,
        Err(ParamError::ZeroRate) => return ctx.reply_error(ZERO_RATE),
        Err(ParamError::Negative) => return ctx.reply_error(NEGATIVE),
        Err(ParamError::TooLarge) => return ctx.reply_error(TOO_LARGE),
    };
    let now_us = clock::now_us();
    let mut key = ctx.open_key(name, false);
    let cur = match key.holds(State::redis_type()) {
        Holds::Ours => key.read::<State>(),
        Holds::Empty => None,
        // redis-cell's string (a key it wrote before the swap).
        Holds::WrongType => match key.string_bytes().map(gcra::parse_cell_string) {
            Some(Some(tat_ns)) => Some(State { tat_ns }),
            _ => return ctx.reply_error(ffi::WRONGTYPE),
        },
    };
    let Ok(o) = gcra::step(cur, &p, now_us.saturating_mul(1000)) else {
        return ctx.reply_error(OUT_OF_RANGE);
    };
    if let Some(new) = o.write {
        if !key.store(new) {
            return ctx.reply_error(STORE_FAILED);
        }
        let mut effects = Effects::new(Cmd::THROTTLE, false);
        commit(ctx, &key, name, now_us, o.ttl_ms, &mut effects, |abs| codec::gcra(&new, abs));
    }
    // Counted as the RL commands count: granted (quantity 0 included) or
    // denied; CL.THROTTLE has no PARTIAL.
    let quantity = quantity.unsigned_abs();
    stats::record(Cmd::THROTTLE, if o.limited { 0 } else { quantity }, quantity);
    ctx.reply_ints(gcra::reply(&o))
}

/// `Couldn't parse as integer: <arg>`, quoting the argument as redis-cell
/// does (the one error that formats: the call is invalid anyway).
#[cold]
fn not_an_integer(ctx: Ctx, arg: &[u8]) -> Replied {
    let mut text = b"Cell error: Store error: Couldn't parse as integer: ".to_vec();
    text.extend(String::from_utf8_lossy(arg).bytes().filter(|&b| b != 0));
    match CString::new(text) {
        Ok(t) => ctx.reply_error(&t),
        Err(_) => ctx.reply_error(USAGE),
    }
}
