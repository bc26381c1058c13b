//! The command handlers: parse, read the key once, decide with the pure
//! core, and only when units were granted (and not DRYRUN) write once, set
//! the expiry and replicate the effect. Registered with the raw API so that a
//! request costs no heap allocation for arguments or the reply.
//!
//! # Parts
//!
//! - this file: the path every handler shares: the argument parse, the
//!   expiry of a written state, the commit step (expire, signal,
//!   replicate), the write decision and the delete of a refunded key;
//! - [`single`]: RL.TOKENBUCKET, RL.SLIDINGCOUNTER and RL.SLIDINGLOG;
//! - [`multi`]: RL.MULTI (several limits at one clock reading, all or
//!   nothing);
//! - [`state`]: RL.STATE, the effect command replicas and AOF replay run;
//! - [`reply`]: error texts and the reply writers (with the INFO counts).
//!
//! The handlers are safe code over `crate::api` (context, arguments, keys,
//! replies); `lib.rs` turns each into the `extern "C"` function Redis
//! calls with `api::entry!`, which keeps the panic guard.

mod multi;
mod reply;
mod single;
mod state;

pub use multi::{multi, multi_keys};
pub use single::{slidingcounter, slidinglog, tokenbucket};
pub use state::state;

use ratelimit_core::args::{self, Arg, Call};
use ratelimit_core::Decision;

use self::reply::reply_arg_error;
use crate::api::{Ctx, Key, Replied, Str};
use crate::listeners;

/// Parse `key <positional> [options]`; an error is answered.
/// A call of the numbers only (the common one: the argument count says so)
/// reads them straight into the call (`args::parse_exact`, the same
/// result); any other goes through the full parser.
#[inline(always)]
pub(super) fn parse<'a>(ctx: Ctx<'a>, argv: &[Str<'a>], positional: &[Arg]) -> Result<(Str<'a>, Call), Replied> {
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
        parse_general(rest, positional)
    };
    match parsed {
        Ok(call) => Ok((key, call)),
        Err(e) => Err(reply_arg_error(ctx, e)),
    }
}

/// The full parser, for calls with options (kept out of line).
#[inline(never)]
fn parse_general(rest: &[Str], positional: &[Arg]) -> Result<Call, args::ArgError> {
    args::parse(rest.iter().map(|&s| s.bytes()), positional)
}

/// Absolute expiry (Unix ms) for a state written at `now_us` whose reset is
/// `reset_ms` away (the cores measure waits from the real clock, also when
/// it stepped back): the key then lives exactly until it would be
/// indistinguishable from a fresh one, and its TTL equals reset_after_ms.
/// Redis deletes a key once `mstime() > expiry`, so it survives the whole
/// millisecond `now_ms + reset_ms`, which ends after the exact µs reset.
#[inline]
pub(super) fn abs_expiry(now_us: u64, reset_ms: u64) -> u64 {
    (now_us / 1000).saturating_add(reset_ms)
}

/// How a call's written keys replicate: whether anything can read effects
/// is read once per call, at its first written key; where nothing can, the
/// command itself is replicated once for the call, not once per written
/// key (a second copy would only cost a MULTI/EXEC wrap).
#[derive(Default)]
pub(super) struct Effects {
    listen: Option<bool>,
    verbatim: bool,
}

/// After a state was stored: the key expires when the limiter is fresh
/// again (`reset_ms` from `now_us`), is signalled modified, and the effect
/// `payload(abs)` is replicated (skipped where nothing reads it: see
/// [`Effects`]). Every command that writes a limiter commits it here.
#[inline(always)]
pub(super) fn commit<'a, P: AsRef<[u8]>>(
    ctx: Ctx<'a>,
    key: &Key<'a>,
    name: Str<'a>,
    now_us: u64,
    reset_ms: u64,
    effects: &mut Effects,
    payload: impl FnOnce(u64) -> P,
) {
    let abs = abs_expiry(now_us, reset_ms);
    key.set_abs_expire(abs);
    key.signal_modified();
    if *effects.listen.get_or_insert_with(listeners::must_replicate) {
        ctx.replicate_state(name, payload(abs).as_ref());
    } else if !effects.verbatim {
        ctx.replicate_verbatim();
        effects.verbatim = true;
    }
}

/// The write a decided call makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Write {
    /// Nothing to write: denied, COST 0 or DRYRUN.
    None,
    /// The grant was stored: expire, signal and replicate it.
    Done,
    /// The grant could not be stored: answer an error, count nothing.
    Failed,
}

/// Store a grant (with `store`) when the decision made one and the call is
/// not a dry run.
#[inline]
pub(super) fn write_grant(d: &Decision, dryrun: bool, store: impl FnOnce() -> bool) -> Write {
    if d.granted == 0 || dryrun {
        Write::None
    } else if store() {
        Write::Done
    } else {
        Write::Failed
    }
}

/// Delete a limiter's key that a refund made fresh, and replicate the
/// deletion.
#[inline]
pub(super) fn delete<'a>(ctx: Ctx<'a>, key: &mut Key<'a>, name: Str<'a>) {
    if key.delete() {
        key.signal_modified();
        ctx.replicate_del(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(n: u64) -> Decision {
        Decision { granted: n, limit: 5, remaining: 0, retry_after_ms: 0, reset_after_ms: 1 }
    }

    /// A grant whose store fails is a failure (answered with an error, not
    /// counted), never a silent "granted".
    #[test]
    fn a_failed_store_is_not_a_grant() {
        assert_eq!(write_grant(&granted(1), false, || false), Write::Failed);
        assert_eq!(write_grant(&granted(1), false, || true), Write::Done);
    }

    #[test]
    fn nothing_is_written_without_a_grant_or_on_dryrun() {
        let never = || -> bool { panic!("no write expected") };
        assert_eq!(write_grant(&granted(0), false, never), Write::None);
        assert_eq!(write_grant(&granted(3), true, never), Write::None);
    }
}
