//! `INFO ratelimit`: calls granted, partially granted and denied, and
//! refunds, per command (RL.MULTI counts a call once, whatever the number
//! of limits). Redis runs commands on one thread; the counters are atomics only
//! so that INFO can be read from a crash report safely, and they are bumped
//! with a plain load and store (no locked instruction on the request path).

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::api::InfoCtx;
use crate::listeners;

#[derive(Clone, Copy)]
pub enum Cmd {
    TokenBucket = 0,
    SlidingLog = 1,
    SlidingCounter = 2,
    Multi = 3,
    FixedWindow = 4,
}

const NCMD: usize = 5;

/// Per command: granted, partial, denied, refunds.
const NAMES: [[&CStr; 4]; NCMD] = [
    [c"tokenbucket_granted", c"tokenbucket_partial", c"tokenbucket_denied", c"tokenbucket_refunds"],
    [c"slidinglog_granted", c"slidinglog_partial", c"slidinglog_denied", c"slidinglog_refunds"],
    [c"slidingcounter_granted", c"slidingcounter_partial", c"slidingcounter_denied", c"slidingcounter_refunds"],
    [c"multi_granted", c"multi_partial", c"multi_denied", c"multi_refunds"],
    [c"fixedwindow_granted", c"fixedwindow_partial", c"fixedwindow_denied", c"fixedwindow_refunds"],
];
const REFUNDS: usize = 3;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const ROW: [AtomicU64; 4] = [ZERO; 4];
static COUNTS: [[AtomicU64; 4]; NCMD] = [ROW; NCMD];

/// Count one call: granted (all COST units, including COST 0), partial
/// (PARTIAL granted some but not all) or denied (nothing granted).
#[inline]
pub fn record(cmd: Cmd, granted: u64, cost: u64) {
    let outcome = if granted == cost {
        0
    } else if granted > 0 {
        1
    } else {
        2
    };
    bump(cmd, outcome);
}

/// Count one `REFUND` call (whether or not it gave anything back).
#[inline]
pub fn record_refund(cmd: Cmd) {
    bump(cmd, REFUNDS);
}

#[inline]
fn bump(cmd: Cmd, column: usize) {
    if let Some(c) = COUNTS.get(cmd as usize).and_then(|row| row.get(column)) {
        c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
    }
}

/// The `ratelimit_stats` INFO section: the counts, and whether grants
/// replicate their effect.
pub fn info_section(ctx: InfoCtx) {
    ctx.section(c"stats");
    for (names, counts) in NAMES.iter().zip(COUNTS.iter()) {
        for (name, c) in names.iter().zip(counts.iter()) {
            ctx.field_u64(name, c.load(Relaxed));
        }
    }
    // 1 while grants replicate their effect (a replica, a backlog or the
    // AOF may read it), 0 while nothing can (see listeners.rs).
    ctx.field_u64(c"effects_replicated", u64::from(listeners::replicating()));
}
