//! `INFO ratelimit`: calls granted, partially granted and denied, and
//! refunds, per command (the catalogue's rows: each kind, RL.MULTI and
//! CL.THROTTLE) (RL.MULTI counts a call once, whatever the number
//! of limits). Redis runs commands on one thread; the counters are atomics only
//! so that INFO can be read from a crash report safely, and they are bumped
//! with a plain load and store (no locked instruction on the request path).

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ratelimit_core::catalogue::{self, Counted, Kind};

use crate::api::InfoCtx;
use crate::listeners;

/// A command that counts in INFO: a kind's own command, RL.MULTI or
/// CL.THROTTLE, as the catalogue (`ratelimit_core::catalogue`) declares its
/// event and counters.
#[derive(Clone, Copy)]
pub struct Cmd(&'static Counted);

impl Cmd {
    /// The single command of `kind`.
    pub const fn of(kind: Kind) -> Cmd {
        Cmd(&kind.spec().counted)
    }
    pub const MULTI: Cmd = Cmd(&catalogue::MULTI);
    pub const THROTTLE: Cmd = Cmd(&catalogue::THROTTLE);
    /// The keyspace event of its writes.
    #[inline(always)]
    pub const fn event(self) -> &'static CStr {
        self.0.event
    }
}

const NCMD: usize = catalogue::COUNTED_ROWS;
const REFUNDS: usize = 3;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const ROW: [AtomicU64; 4] = [ZERO; 4];
static COUNTS: [[AtomicU64; 4]; NCMD] = [ROW; NCMD];

/// The columns of a row, as its counters' names end.
const COLUMNS: [&str; 4] = ["granted", "partial", "denied", "refunds"];

/// Every counted command with its INFO name, in INFO's order (by slot).
fn rows() -> [Option<(&'static str, &'static Counted)>; NCMD] {
    let mut rows = [None; NCMD];
    for (name, c) in catalogue::counted_rows() {
        if let Some(r) = rows.get_mut(c.slot) {
            *r = Some((name, c));
        }
    }
    rows
}

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
    if let Some(c) = COUNTS.get(cmd.0.slot).and_then(|row| row.get(column)) {
        c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
    }
}

/// The `ratelimit_stats` INFO section: the counts, and whether grants
/// replicate their effect.
pub fn info_section(ctx: InfoCtx) {
    ctx.section(c"stats");
    for (row, counts) in rows().into_iter().zip(COUNTS.iter()) {
        let Some((name, row)) = row else { continue };
        for (column, c) in COLUMNS.iter().zip(counts.iter()) {
            // CL.THROTTLE has no PARTIAL or REFUND: no such counters.
            if !row.partial_and_refunds && (*column == "partial" || *column == "refunds") {
                continue;
            }
            // Formatted when INFO is read, never on the request path.
            if let Ok(field) = CString::new(format!("{name}_{column}")) {
                ctx.field_u64(&field, c.load(Relaxed));
            }
        }
    }
    // 1 while grants replicate their effect (a replica, a backlog or the
    // AOF may read it), 0 while nothing can (see listeners.rs).
    ctx.field_u64(c"effects_replicated", u64::from(listeners::replicating()));
}
