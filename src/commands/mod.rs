//! The command handlers. A request reads in one direction: parse (the
//! handler's file, over `ratelimit_core::args`), open the key and read its
//! state once (`api`, `value`), decide (the pure core), commit ([`write`]
//! here: store, expire, signal, notify, replicate) and reply (`reply.rs`).
//! Only a call that changed a limiter writes: nothing for a denial, COST 0
//! or DRYRUN. Registered with the raw API so that a request costs no heap
//! allocation for arguments or the reply.
//!
//! # Parts
//!
//! - this file: the commit step every handler shares ([`write`], and its
//!   parts [`commit`] and [`delete`], which RL.MULTI calls per key) and the
//!   keyspace event each write emits;
//! - [`single`]: RL.TOKENBUCKET, RL.SLIDINGCOUNTER, RL.FIXEDWINDOW and
//!   RL.SLIDINGLOG, with
//!   their argument parse;
//! - [`concurrency`]: RL.CONCURRENCY (leases: ACQUIRE, RELEASE, RENEW);
//! - [`multi`]: RL.MULTI (several limits at one clock reading, all or
//!   nothing);
//! - [`state`]: RL.STATE, the effect command replicas and AOF replay run;
//! - [`reply`]: error texts and the reply writers (with the INFO counts).
//!
//! The handlers are safe code over `crate::api` (context, arguments, keys,
//! replies) and `crate::value` (a key's limiter state); `cmdinfo/` turns
//! each into the `extern "C"` function Redis calls with `api::entry!`, which
//! keeps the panic guard.

mod concurrency;
mod multi;
mod reply;
mod single;
mod state;
mod throttle;

pub use concurrency::concurrency;
pub use multi::{multi, multi_keys};
pub use single::{fixedwindow, slidingcounter, slidinglog, tokenbucket};
pub use state::state;
pub use throttle::throttle;

use std::ffi::CStr;

use ratelimit_core::args::Call;
use ratelimit_core::Decision;

use self::reply::STORE_FAILED;
use crate::api::{Ctx, Key, Replied, Str};
use crate::listeners;
use crate::stats::Cmd;

/// The keyspace event of a write (module class, `d`): the command's name
/// (the catalogue's), or `rl.refund` for a REFUND that gave units back.
/// Static C strings: an event costs no formatting.
#[inline]
pub(super) fn event(cmd: Cmd, refund: bool) -> &'static CStr {
    if refund {
        REFUND_EVENT
    } else {
        cmd.event()
    }
}

/// The event of a REFUND write (a key stored or deleted).
pub(super) const REFUND_EVENT: &CStr = ratelimit_core::catalogue::REFUND_EVENT;

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

/// What a call's written keys emit: the keyspace event of the call, and
/// how they replicate: whether anything can read effects is read once per
/// call, at its first written key; where nothing can, the command itself is
/// replicated once for the call, not once per written key (a second copy
/// would only cost a MULTI/EXEC wrap).
pub(super) struct Effects {
    event: &'static CStr,
    listen: Option<bool>,
    verbatim: bool,
}

impl Effects {
    /// For the writes of one call of `cmd` (a refund when `refund`).
    #[inline]
    pub(super) fn new(cmd: Cmd, refund: bool) -> Effects {
        Effects { event: event(cmd, refund), listen: None, verbatim: false }
    }
}

/// After a state was stored: the key expires when the limiter is fresh
/// again (`reset_ms` from `now_us`), is signalled modified, emits the
/// call's keyspace event, and the effect `payload(abs)` is replicated
/// (skipped where nothing reads it: see [`Effects`]). Every command that
/// writes a limiter commits it here.
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
    key.modified(ctx, effects.event);
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
    /// Nothing: denied, COST 0, DRYRUN, or a refund that gave nothing back.
    None,
    /// A refund left the limiter fresh: delete its key.
    Delete,
    /// Store the new state, then expire, signal, notify and replicate it.
    Store,
}

/// What the decision `d` of `call` writes.
#[inline]
pub(super) fn what_to_write(d: &Decision, call: &Call) -> Write {
    if d.granted == 0 || call.dryrun {
        Write::None
    } else if call.refund > 0 && d.reset_after_ms == 0 {
        Write::Delete
    } else {
        Write::Store
    }
}

/// A one-key call once decided: what [`write`] commits.
#[derive(Clone, Copy)]
pub(super) struct Decided<'c> {
    /// The call's command (its event and INFO row).
    pub cmd: Cmd,
    pub call: &'c Call,
    pub d: &'c Decision,
    /// The clock reading the decision was made at.
    pub now_us: u64,
}

/// The commit step of a one-key call: write what the decision `c.d` of
/// `c.call` changed, once: `store` puts the new state in the key (false:
/// the server refused it, answered with an error and counted nothing,
/// never a silent grant), then [`commit`] expires, signals, notifies and
/// replicates `payload(abs)`; a refund that made the limiter fresh deletes
/// the key instead.
#[inline(always)]
pub(super) fn write<'a, P: AsRef<[u8]>>(
    ctx: Ctx<'a>,
    key: &mut Key<'a>,
    name: Str<'a>,
    c: Decided,
    store: impl FnOnce(&mut Key<'a>) -> bool,
    payload: impl FnOnce(u64) -> P,
) -> Result<(), Replied> {
    match what_to_write(c.d, c.call) {
        Write::None => Ok(()),
        Write::Delete => {
            delete(ctx, key, name);
            Ok(())
        }
        Write::Store if store(key) => {
            let mut effects = Effects::new(c.cmd, c.call.refund > 0);
            commit(ctx, key, name, c.now_us, c.d.reset_after_ms, &mut effects, payload);
            Ok(())
        }
        Write::Store => Err(ctx.reply_error(STORE_FAILED)),
    }
}

/// Delete a limiter's key that a refund made fresh: signal it, emit
/// `rl.refund`, and replicate the deletion.
#[inline]
pub(super) fn delete<'a>(ctx: Ctx<'a>, key: &mut Key<'a>, name: Str<'a>) {
    if key.delete() {
        key.modified(ctx, REFUND_EVENT);
        ctx.replicate_del(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::catalogue::Kind;

    fn decided(granted: u64, reset_after_ms: u64) -> Decision {
        Decision { granted, limit: 5, remaining: 0, retry_after_ms: 0, reset_after_ms }
    }

    fn call(dryrun: bool, refund: u64) -> Call {
        Call { nums: [5, 1, 1000], cost: 1, partial: false, dryrun, refund, force: false }
    }

    #[test]
    fn nothing_is_written_without_a_grant_or_on_dryrun() {
        assert_eq!(what_to_write(&decided(0, 10), &call(false, 0)), Write::None);
        assert_eq!(what_to_write(&decided(3, 10), &call(true, 0)), Write::None);
        assert_eq!(what_to_write(&decided(0, 0), &call(false, 2)), Write::None);
        assert_eq!(what_to_write(&decided(1, 10), &call(false, 0)), Write::Store);
    }

    /// Only a refund deletes: one that leaves the limiter fresh.
    #[test]
    fn a_refund_to_fresh_deletes() {
        assert_eq!(what_to_write(&decided(2, 0), &call(false, 2)), Write::Delete);
        assert_eq!(what_to_write(&decided(2, 5), &call(false, 2)), Write::Store);
        assert_eq!(what_to_write(&decided(2, 0), &call(false, 0)), Write::Store);
    }

    #[test]
    fn events_are_named_after_the_command() {
        assert_eq!(event(Cmd::of(Kind::TokenBucket), false), c"rl.tokenbucket");
        assert_eq!(event(Cmd::of(Kind::SlidingLog), false), c"rl.slidinglog");
        assert_eq!(event(Cmd::of(Kind::SlidingCounter), false), c"rl.slidingcounter");
        assert_eq!(event(Cmd::MULTI, false), c"rl.multi");
        assert_eq!(event(Cmd::of(Kind::FixedWindow), false), c"rl.fixedwindow");
        assert_eq!(event(Cmd::THROTTLE, false), c"cl.throttle");
        assert_eq!(event(Cmd::of(Kind::FixedWindow), true), c"rl.refund");
        assert_eq!(event(Cmd::MULTI, true), c"rl.refund");
        assert_eq!(event(Cmd::of(Kind::TokenBucket), true), c"rl.refund");
    }
}
