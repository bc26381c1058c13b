//! RL.CONCURRENCY — an in-flight limit held by leases, pure (no Redis).
//!
//! # Model
//!
//! The state is a set of leases `(expiry µs, id hash, units)`, at most one
//! per hash, kept in one buffer sorted by `(expiry, hash)`, and the instant
//! of the key's last write, `last_us`. As everywhere in the crate a clock
//! behind the state counts as no elapsed time: a call is read at
//! `now_eff = max(now, last_us)`, and a lease is live while
//! `now_eff < expiry`; a lapsed one holds nothing, whether or not it is
//! still stored (every write drops the lapsed leases, a prefix of the
//! buffer). The waits are measured from the real `now` (they include the
//! gap). For a call on id hash `h`, `own` is `h`'s live units and `others`
//! the live units of every other hash.
//!
//! - **ACQUIRE n** sets `h`'s lease to `n` units until `now_eff + lease_ms`
//!   when `others + n ≤ limit` (with PARTIAL `g = min(n, limit − others)`;
//!   0 is a denial, which changes nothing). A retried ACQUIRE is thus
//!   idempotent: the id's own units never count against it.
//! - **RELEASE** removes `h`'s live lease; **RENEW** moves a live lease's
//!   expiry to `now_eff + lease_ms`; **give back n** (RL.MULTI's REFUND)
//!   takes `min(n, own)` units off the lease, which keeps its expiry.
//! - `retry_after_ms` walks the live leases in expiry order (skipping the
//!   ones that do not count) until the units lapsed cover the excess;
//!   `reset_after_ms` is the latest live expiry after the call. Both are
//!   rounded up from µs to ms (docs/contract.md, "RL.CONCURRENCY").
//!
//! Every change, on a master or a replica, is one [`Change`]: "at `now`,
//! drop the lapsed leases, then `h` holds `units` until `expiry`" (0 units:
//! `h` holds nothing), applied by [`State::apply`]; the master replicates
//! the same change (`codec::KIND_LEASE`), so both hold the same buffer.
//!
//! # Numbers
//!
//! `limit`, `lease_ms` and units are in `1..=MAX_ARG`; every sum of units a
//! call can store is at most a limit (a grant needs `others + n ≤ limit`),
//! so the held total stays within `MAX_ARG` and the decoder refuses more.
//! Times saturate at the end of `u64` (`now + lease_ms × 1000` fits for
//! every accepted argument until the year 287,000). Nothing here panics:
//! no indexing, no unchecked arithmetic.

pub mod encoding;
pub mod hash;

pub use encoding::ENCODING_VERSION;
pub use hash::id_hash;

use crate::args::{parse_num, Arg, ArgError};
use crate::{ms_to_us, to_i64, us_to_ms_ceil, Decision, MAX_ARG};

/// The rule of a call: `limit` and `lease_ms` in `1..=MAX_ARG`, and the
/// hash of the id it acts for ([`id_hash`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub lease_ms: u64,
    pub id_hash: u64,
}

/// One lease. Ordered by expiry, then hash: the buffer's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lease {
    /// The instant it lapses (µs since the Unix epoch): live while
    /// `now < expiry_us`.
    pub expiry_us: u64,
    /// The id's hash.
    pub hash: u64,
    /// Units held, `1..=MAX_ARG`.
    pub units: u64,
}

/// A key's leases. `Default` is the fresh state (no key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The instant of the last write (µs): every lease stored lapses after
    /// it.
    last_us: u64,
    /// Sorted strictly by `(expiry_us, hash)`, each hash once, units ≥ 1,
    /// their sum ≤ MAX_ARG, every expiry after `last_us`.
    leases: Vec<Lease>,
}

/// One change of a key: what a write stores and what its effect carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The call's instant: leases lapsed at it are dropped.
    pub now_us: u64,
    pub hash: u64,
    /// The id's units after the call; 0: it holds nothing.
    pub units: u64,
    /// Its lease's expiry (µs) when `units > 0`.
    pub expiry_us: u64,
}

impl State {
    /// The leases, in the buffer's order (lapsed ones included until the
    /// next write).
    #[inline]
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The instant of the last write (µs).
    #[inline]
    pub fn last_us(&self) -> u64 {
        self.last_us
    }

    /// A state of `leases` written last at `last_us` when they satisfy
    /// every invariant of a stored state (sorted strictly by `(expiry,
    /// hash)`, each hash once, units in `1..=MAX_ARG`, their sum within
    /// MAX_ARG, every expiry after `last_us`, at least one lease).
    pub fn from_leases(last_us: u64, leases: Vec<Lease>) -> Result<State, &'static str> {
        if leases.is_empty() {
            return Err("concurrency: no lease (a fresh state is never stored)");
        }
        if leases.iter().any(|l| l.expiry_us <= last_us) {
            return Err("concurrency: a lease lapsed before the last write");
        }
        let mut total = 0u64;
        for l in &leases {
            if l.units == 0 || l.units > MAX_ARG {
                return Err("concurrency: units outside 1..=2^53-1");
            }
            total = total.checked_add(l.units).filter(|&t| t <= MAX_ARG).ok_or("concurrency: units above 2^53-1")?;
        }
        if leases.windows(2).any(|w| matches!(w, [a, b] if a >= b)) {
            return Err("concurrency: leases not sorted by (expiry, hash)");
        }
        let mut hashes: Vec<u64> = leases.iter().map(|l| l.hash).collect();
        hashes.sort_unstable();
        if hashes.windows(2).any(|w| matches!(w, [a, b] if a == b)) {
            return Err("concurrency: a hash twice");
        }
        Ok(State { last_us, leases })
    }

    /// Holds no live lease at `now_us`: as good as no key.
    #[inline]
    pub fn is_fresh_at(&self, now_us: u64) -> bool {
        let now = now_us.max(self.last_us);
        self.leases.last().is_none_or(|l| l.expiry_us <= now)
    }

    /// The bytes its buffer has allocated (for MEMORY USAGE).
    #[inline]
    pub fn heap_bytes(&self) -> usize {
        self.leases.capacity().saturating_mul(core::mem::size_of::<Lease>())
    }

    /// The buffer's heap block, if it has one (MEMORY USAGE asks the
    /// allocator for its real size).
    #[inline]
    pub fn heap_block(&self) -> Option<*const u8> {
        (self.leases.capacity() > 0).then(|| self.leases.as_ptr().cast())
    }

    /// A buffer left at most a quarter full gives the rest back.
    fn shrink(&mut self) {
        if self.leases.capacity() > 16 && self.leases.len() <= self.leases.capacity() / 4 {
            self.leases.shrink_to(self.leases.len() + self.leases.len() / 4 + 4);
        }
    }

    /// Apply `c` at `now_eff = max(c.now_us, last_us)`, which becomes
    /// `last_us`: drop the leases lapsed then, then the id holds `c.units`
    /// until `c.expiry_us` (none when 0, or when that expiry is not after
    /// `now_eff`: lapsed at birth, only at the end of `u64` time). Refuses
    /// (changing nothing) a change that would put the held total above
    /// MAX_ARG: a master never makes one, a replayed RL.STATE might. The
    /// buffer grows only when a lease is added to a full one. Afterwards
    /// [`State::is_fresh_at`] `now_eff` says whether the key is to be
    /// deleted.
    #[inline(always)]
    pub fn apply(&mut self, c: &Change) -> Result<(), &'static str> {
        // The common write, in place: the id's lease is the latest, none
        // has lapsed, and the new one (renewed, or resized by a retried
        // ACQUIRE) stays the latest. Everything else: `apply_any`.
        let now = c.now_us.max(self.last_us);
        if let Some((last, before)) = self.leases.split_last_mut() {
            let lease = Lease { expiry_us: c.expiry_us, hash: c.hash, units: c.units };
            if last.hash == c.hash
                && (1..=MAX_ARG).contains(&c.units)
                && c.expiry_us > now
                && before.first().unwrap_or(last).expiry_us > now
                && before.last().is_none_or(|l| *l <= lease)
                && before.iter().try_fold(c.units, |sum, l| sum.checked_add(l.units).filter(|&s| s <= MAX_ARG)).is_some()
            {
                *last = lease;
                self.last_us = now;
                return Ok(());
            }
        }
        self.apply_any(c)
    }

    /// [`State::apply`] for any change.
    #[inline(never)]
    fn apply_any(&mut self, c: &Change) -> Result<(), &'static str> {
        if c.units > MAX_ARG {
            return Err("concurrency: units above 2^53-1");
        }
        let now = c.now_us.max(self.last_us);
        let lapsed = self.leases.partition_point(|l| l.expiry_us <= now);
        // One pass over the live leases: the id's (its index once the
        // lapsed ones are gone; a lapsed lease of the id goes with them)
        // and the others' units.
        let (mut own, mut others) = (None, 0u64);
        for (i, l) in self.leases.get(lapsed..).unwrap_or_default().iter().enumerate() {
            if l.hash == c.hash {
                own = Some(i);
            } else {
                others = others.saturating_add(l.units);
            }
        }
        if c.units > 0 && others.saturating_add(c.units) > MAX_ARG {
            return Err("concurrency: units above 2^53-1");
        }
        if lapsed > 0 {
            self.leases.drain(..lapsed);
        }
        self.last_us = now;
        let lease = Lease { expiry_us: c.expiry_us, hash: c.hash, units: c.units };
        let keep = c.units > 0 && c.expiry_us > now;
        match (own, keep) {
            (Some(i), true) => {
                // In place, moved to its sorted place by a rotation of the
                // leases between (a renewal: usually to the end).
                let old = self.leases.get(i).copied().unwrap_or(lease);
                let stays = self.leases.get(i + 1).is_none_or(|next| lease <= *next)
                    && i.checked_sub(1).and_then(|p| self.leases.get(p)).is_none_or(|prev| *prev <= lease);
                if stays {
                    // Already in its sorted place (a renewal of the latest
                    // lease, the common case): written where it is.
                    if let Some(l) = self.leases.get_mut(i) {
                        *l = lease;
                    }
                } else if lease > old {
                    let after = self.leases.get(i + 1..).map_or(0, |t| t.partition_point(|l| *l < lease));
                    if let Some(span) = self.leases.get_mut(i..=i + after) {
                        span.rotate_left(1);
                        if let Some(last) = span.last_mut() {
                            *last = lease;
                        }
                    }
                } else {
                    let at = self.leases.get(..i).map_or(0, |h| h.partition_point(|l| *l < lease));
                    if let Some(span) = self.leases.get_mut(at..=i) {
                        span.rotate_right(1);
                        if let Some(first) = span.first_mut() {
                            *first = lease;
                        }
                    }
                }
            }
            (Some(i), false) => {
                self.leases.remove(i);
                self.shrink();
            }
            (None, true) => {
                let at = self.leases.partition_point(|l| *l < lease);
                if self.leases.len() == self.leases.capacity() {
                    // 25 % more (at least 4): at most 1.25 n + 4 leases' room
                    // after a growth, instead of Vec's doubling.
                    self.leases.reserve_exact((self.leases.len() / 4).max(4));
                }
                self.leases.insert(at, lease);
            }
            (None, false) => self.shrink(),
        }
        Ok(())
    }
}

/// A state read at one instant for one id under one call's parameters.
/// The single command and RL.MULTI's concurrency limits decide through it.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    leases: &'a [Lease],
    /// `limit` as given (the reply's element 2).
    limit_given: u64,
    /// `limit` for the arithmetic (≤ MAX_ARG).
    limit: u64,
    /// The real clock: waits are measured from it.
    now_us: u64,
    /// `max(now_us, last_us)`: liveness is read at it.
    now_eff: u64,
    lease_us: u64,
    hash: u64,
    /// The id's live units and its lease's expiry (0, 0 when none).
    own: u64,
    own_expiry: u64,
    /// The other ids' live units, and the latest of their expiries (0 when
    /// none).
    others: u64,
    others_last: u64,
}

impl<'a> View<'a> {
    #[inline]
    pub fn at(state: &'a State, p: &Params, now_us: u64) -> View<'a> {
        let now_eff = now_us.max(state.last_us);
        let first_live = state.leases.partition_point(|l| l.expiry_us <= now_eff);
        let leases = state.leases.get(first_live..).unwrap_or_default();
        let (mut own, mut own_expiry, mut others, mut others_last) = (0u64, 0u64, 0u64, 0u64);
        for l in leases {
            if l.hash == p.id_hash {
                (own, own_expiry) = (l.units, l.expiry_us);
            } else {
                others = others.saturating_add(l.units);
                others_last = l.expiry_us; // sorted: the last one seen is the latest
            }
        }
        View {
            leases,
            limit_given: p.limit,
            limit: p.limit.min(MAX_ARG),
            now_us,
            now_eff,
            lease_us: ms_to_us(p.lease_ms.clamp(1, MAX_ARG)),
            hash: p.id_hash,
            own,
            own_expiry,
            others,
            others_last,
        }
    }

    /// Units an ACQUIRE could hold now (its own lease does not count).
    #[inline]
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.others)
    }

    /// The id's live units.
    #[inline]
    pub fn own(&self) -> u64 {
        self.own
    }

    /// The expiry an ACQUIRE or RENEW gives now.
    #[inline]
    fn new_expiry(&self) -> u64 {
        self.now_eff.saturating_add(self.lease_us)
    }

    /// The reply of a call after which the id holds `own_after` units
    /// until `own_expiry_after`, element 1 `granted`; the wait is for
    /// `want` units: ACQUIRE's own (`own_counts` false: the id's units do
    /// not count against it) or a new id's (`own_counts`: they do).
    #[inline]
    fn reply(
        &self,
        granted: u64,
        own_after: u64,
        own_expiry_after: u64,
        want: u64,
        own_counts: bool,
        done: bool,
    ) -> Decision {
        let held = self.others.saturating_add(own_after);
        let remaining = self.limit.saturating_sub(held);
        let counted_own = if own_counts { own_after } else { 0 };
        let retry_after_ms = if done {
            0
        } else if want > self.limit {
            -1
        } else {
            // The units that must lapse: held − (limit − want) > 0.
            let over = self.others.saturating_add(counted_own).saturating_sub(self.limit - want);
            if over == 0 {
                0
            } else {
                self.wait(over, counted_own)
            }
        };
        let last = if own_after > 0 { self.others_last.max(own_expiry_after) } else { self.others_last };
        let reset_after_ms = us_to_ms_ceil(u128::from(last.saturating_sub(self.now_us)));
        Decision { granted, limit: self.limit_given, remaining, retry_after_ms, reset_after_ms }
    }

    /// ms until the live leases that lapse first free `over` units, the
    /// id's counted as `own_units` (at its stored expiry); −1 if they never
    /// do (not reached: `over` ≤ the units walked).
    #[inline]
    fn wait(&self, over: u64, own_units: u64) -> i64 {
        let mut freed = 0u64;
        for l in self.leases {
            freed = freed.saturating_add(if l.hash == self.hash { own_units } else { l.units });
            if freed >= over {
                return to_i64(us_to_ms_ceil(u128::from(l.expiry_us.saturating_sub(self.now_us))));
            }
        }
        -1
    }

    /// ACQUIRE's reply after holding `taken` (`≤ available()`; 0: nothing
    /// changes) of the `want` asked for.
    #[inline]
    pub fn answer(&self, taken: u64, want: u64) -> Decision {
        if taken > 0 {
            self.reply(taken, taken, self.new_expiry(), want, false, taken == want)
        } else {
            self.reply(0, self.own, self.own_expiry, want, false, want == 0)
        }
    }

    /// The change an ACQUIRE of `taken > 0` units makes.
    #[inline]
    pub fn acquired(&self, taken: u64) -> Change {
        Change { now_us: self.now_us, hash: self.hash, units: taken, expiry_us: self.new_expiry() }
    }

    /// RELEASE: its reply (element 1: the units freed; the wait of a new
    /// id's ACQUIRE of one unit) and its change, when it freed any.
    #[inline]
    pub fn release(&self) -> (Decision, Option<Change>) {
        self.give_back(self.own, 1)
    }

    /// Give `n` of the id's live units back (RL.MULTI's REFUND; RELEASE is
    /// all of them): the lease keeps its expiry and ends at 0 units. The
    /// reply (element 1: the units given back) is for a new id's ACQUIRE of
    /// `want` units.
    #[inline]
    pub fn give_back(&self, n: u64, want: u64) -> (Decision, Option<Change>) {
        let given = n.min(self.own);
        let own_after = self.own - given;
        let d = self.reply(given, own_after, self.own_expiry, want, true, false);
        let change = (given > 0).then_some(Change {
            now_us: self.now_us,
            hash: self.hash,
            units: own_after,
            expiry_us: self.own_expiry,
        });
        (d, change)
    }

    /// RENEW: a live lease runs `lease_ms` from now (element 1: 1, wait 0);
    /// without one, element 1 is 0 and the wait −1, and nothing changes.
    #[inline]
    pub fn renew(&self) -> (Decision, Option<Change>) {
        if self.own == 0 {
            let d = self.reply(0, 0, 0, 0, false, true);
            return (Decision { retry_after_ms: -1, ..d }, None);
        }
        let c = Change { now_us: self.now_us, hash: self.hash, units: self.own, expiry_us: self.new_expiry() };
        (self.reply(1, self.own, c.expiry_us, 0, false, true), Some(c))
    }
}

/// What an RL.CONCURRENCY call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Acquire { cost: u64, partial: bool, dryrun: bool },
    Release,
    Renew,
}

/// A parsed RL.CONCURRENCY call: its parameters (with the id's hash) and
/// its action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub params: Params,
    pub action: Action,
}

/// Parse `args` = every argument after the key:
/// `limit lease_ms (ACQUIRE id [COST n] [PARTIAL] [DRYRUN] | RELEASE id | RENEW id)`.
/// Fewer than four → `Arity`; bad numbers → `Number(Limit | LeaseMs | Cost)`;
/// anything else out of place → `Syntax`.
#[inline(always)]
pub fn parse(args: &[&[u8]]) -> Result<Call, ArgError> {
    let [limit, lease_ms, action, id, opts @ ..] = args else { return Err(ArgError::Arity) };
    let limit = parse_num(limit, Arg::Limit.min()).ok_or(ArgError::Number(Arg::Limit))?;
    let lease_ms = parse_num(lease_ms, Arg::LeaseMs.min()).ok_or(ArgError::Number(Arg::LeaseMs))?;
    let params = Params { limit, lease_ms, id_hash: id_hash(id) };
    // The action, told by its length and first letter, then compared once
    // (capital letters only: `eq_upper_letters`).
    let word = match (action.len(), action.first().map(|b| b & 0xDF)) {
        (7, Some(b'A')) => Some((b"ACQUIRE".as_slice(), 0)),
        (7, _) => Some((b"RELEASE".as_slice(), 1)),
        (5, _) => Some((b"RENEW".as_slice(), 2)),
        _ => None,
    };
    let which = word.filter(|(w, _)| crate::args::eq_upper_letters(action, w)).map(|(_, n)| n);
    let action = if which == Some(0) {
        let (mut cost, mut partial, mut dryrun, mut seen_cost) = (1, false, false, false);
        let mut rest = opts.iter();
        while let Some(o) = rest.next() {
            if crate::args::eq_upper_letters(o, b"COST") && !seen_cost {
                seen_cost = true;
                let v = rest.next().ok_or(ArgError::Syntax)?;
                cost = parse_num(v, Arg::Cost.min()).ok_or(ArgError::Number(Arg::Cost))?;
            } else if crate::args::eq_upper_letters(o, b"PARTIAL") && !partial {
                partial = true;
            } else if crate::args::eq_upper_letters(o, b"DRYRUN") && !dryrun {
                dryrun = true;
            } else {
                return Err(ArgError::Syntax);
            }
        }
        Action::Acquire { cost, partial, dryrun }
    } else if !opts.is_empty() {
        return Err(ArgError::Syntax);
    } else if which == Some(1) {
        Action::Release
    } else if which == Some(2) {
        Action::Renew
    } else {
        return Err(ArgError::Syntax);
    };
    Ok(Call { params, action })
}

/// Decide a call on `state` at `now_us`: its reply and the change to store
/// (none when it writes nothing: a denial, COST 0, DRYRUN, a RELEASE or
/// RENEW of an id without a live lease). `granted` is the units an ACQUIRE
/// held (the reply's element 1 is [`Decision::allowed`] of it), the units
/// a RELEASE freed, 1/0 for RENEW: what element 1 says.
#[inline(always)]
pub fn step(state: &State, call: &Call, now_us: u64) -> (Decision, Option<Change>) {
    let v = View::at(state, &call.params, now_us);
    match call.action {
        Action::Acquire { cost, partial, dryrun } => {
            let taken = crate::grant_size(v.available(), cost, partial);
            let change = (taken > 0 && !dryrun).then(|| v.acquired(taken));
            (v.answer(taken, cost), change)
        }
        Action::Release => v.release(),
        Action::Renew => v.renew(),
    }
}

#[cfg(test)]
mod tests;
