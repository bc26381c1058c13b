//! What a handler answers: the error texts (static, so an error costs no
//! formatting), the five-integer reply of the single commands and RL.MULTI's
//! nested one, each counted in INFO as it is sent.

use std::ffi::CStr;

use crate::api::{Ctx, Replied};
use crate::stats::{self, Cmd};
use ratelimit_core::args::{Arg, ArgError, Call};
use ratelimit_core::multi::Whole;
use ratelimit_core::{to_i64, Decision};

pub(super) const SYNTAX_ERROR: &CStr = c"ERR syntax error";
/// The key could not be set (the server refused the value): nothing was
/// granted or counted.
pub(super) const STORE_FAILED: &CStr = c"ERR could not store the value";

/// The reply text of a numeric argument out of range (static: an error
/// costs no formatting).
pub(super) fn arg_error(a: Arg) -> &'static CStr {
    match a {
        Arg::Capacity => c"ERR capacity must be an integer between 1 and 9007199254740991",
        Arg::Rate => c"ERR rate must be an integer between 1 and 9007199254740991",
        Arg::PeriodMs => c"ERR period_ms must be an integer between 1 and 9007199254740991",
        Arg::Limit => c"ERR limit must be an integer between 1 and 9007199254740991",
        Arg::WindowMs => c"ERR window_ms must be an integer between 1 and 9007199254740991",
        Arg::Cost => c"ERR COST must be an integer between 0 and 9007199254740991",
        Arg::Refund => c"ERR REFUND must be an integer between 1 and 9007199254740991",
        Arg::Weight => c"ERR WEIGHT must be an integer between 1 and 9007199254740991",
        Arg::LeaseMs => c"ERR lease_ms must be an integer between 1 and 9007199254740991",
        Arg::NumKeys => c"ERR numkeys must be an integer between 1 and 16",
    }
}

/// Answer an argument error.
pub(super) fn reply_arg_error(ctx: Ctx, e: ArgError) -> Replied {
    match e {
        ArgError::Arity => ctx.wrong_arity(),
        ArgError::Number(a) => ctx.reply_error(arg_error(a)),
        ArgError::Syntax => ctx.reply_error(SYNTAX_ERROR),
        ArgError::LimitCount => ctx.reply_error(c"ERR the number of limits must equal numkeys"),
        ArgError::DuplicateKey => ctx.reply_error(c"ERR every key must be distinct"),
        ArgError::Product(Arg::Refund) => ctx.reply_error(c"ERR REFUND * WEIGHT must not exceed 9007199254740991"),
        ArgError::Product(_) => ctx.reply_error(c"ERR COST * WEIGHT must not exceed 9007199254740991"),
    }
}

#[inline]
pub(super) fn reply(ctx: Ctx, cmd: Cmd, d: &Decision, call: &Call) -> Replied {
    // A refund's element 1 is the units it gave back.
    let first = if call.refund > 0 {
        stats::record_refund(cmd);
        d.granted
    } else {
        stats::record(cmd, d.granted, call.cost);
        d.allowed(call.cost, call.partial)
    };
    ctx.reply_ints([to_i64(first), to_i64(d.limit), to_i64(d.remaining), d.retry_after_ms, to_i64(d.reset_after_ms)])
}

/// RL.MULTI's reply, counted in INFO: the five integers of the whole call,
/// the binding limit's index, then each of the `n` limits' own five.
#[inline(always)]
pub(super) fn reply_multi<const N: usize>(
    ctx: Ctx,
    refund: u64,
    partial: bool,
    cost: u64,
    whole: &Whole,
    per: &[Decision; N],
    n: usize,
) -> Replied {
    if refund > 0 {
        stats::record_refund(Cmd::MULTI);
    } else {
        // Requests granted: with PARTIAL element 1 says, else all or none.
        stats::record(Cmd::MULTI, ratelimit_core::reply::granted(whole.allowed, cost, partial), cost);
    }
    ctx.reply_array(
        7,
        // Inlined into the caller (RL.MULTI's fast path): out of line, the
        // closure cost a call and its own frame per reply.
        #[inline(always)]
        |e| {
            for v in [
                to_i64(whole.allowed),
                to_i64(whole.limit),
                to_i64(whole.remaining),
                whole.retry_after_ms,
                to_i64(whole.reset_after_ms),
            ] {
                e.int(v);
            }
            e.int(i64::try_from(whole.binding).unwrap_or(0));
            e.array(n, |e| {
                for d in per.iter().take(n) {
                    e.ints([
                        to_i64(d.granted),
                        to_i64(d.limit),
                        to_i64(d.remaining),
                        d.retry_after_ms,
                        to_i64(d.reset_after_ms),
                    ]);
                }
            });
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::args::{self, MAX_LIMITS};

    #[test]
    fn error_texts_name_the_argument_and_its_range() {
        let all = [
            Arg::Capacity,
            Arg::Rate,
            Arg::PeriodMs,
            Arg::Limit,
            Arg::WindowMs,
            Arg::Cost,
            Arg::Refund,
            Arg::Weight,
            Arg::LeaseMs,
        ];
        for a in all {
            let e = arg_error(a).to_str().unwrap();
            assert_eq!(e, format!("ERR {} must be an integer between {} and 9007199254740991", a.name(), a.min()));
        }
        let e = arg_error(Arg::NumKeys).to_str().unwrap();
        assert_eq!(e, format!("ERR numkeys must be an integer between 1 and {MAX_LIMITS}"));
        assert!(args::TOKENBUCKET_ARGS.iter().chain(args::WINDOW_ARGS).all(|a| all.contains(a)));
    }
}
