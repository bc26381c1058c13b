//! RL.CONCURRENCY by the words of docs/contract.md: a map from id hash to
//! `(units, expiry)`, live while `max(now, last write) < expiry` (a clock
//! behind the last write counts as no elapsed time), with every wait found
//! by trying the real instants at which some lease lapses (the only ones at
//! which the answer can change), in `u128` µs that never saturate.

use std::collections::BTreeMap;

use super::{ceil_ms, wait_i64};
use crate::concurrency::Params;
use crate::Decision;

/// The model's state: hash → (units, expiry µs), lapsed ones included,
/// and the instant of the last write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leases {
    pub by_hash: BTreeMap<u64, (u64, u64)>,
    pub last: u64,
}

impl Leases {
    /// The live leases at real time `t` as `(hash, units, expiry)`, sorted
    /// by hash.
    pub fn live(&self, t: u64) -> Vec<(u64, u64, u64)> {
        let t = t.max(self.last);
        self.by_hash.iter().filter(|(_, &(_, e))| t < e).map(|(&h, &(u, e))| (h, u, e)).collect()
    }

    /// Units live at real instant `t` (µs), leaving out hash `skip`.
    fn held_at(&self, t: u128, skip: Option<u64>) -> u128 {
        let t = t.max(u128::from(self.last));
        self.by_hash
            .iter()
            .filter(|(&h, &(_, e))| Some(h) != skip && t < u128::from(e))
            .map(|(_, &(u, _))| u128::from(u))
            .sum()
    }

    /// The first real instant `≥ now` at which `held_at(t, skip) + want ≤
    /// limit` (searched over `now` and every expiry), as a wait in ms; −1
    /// when `want > limit`.
    fn wait(&self, now: u64, limit: u64, want: u64, skip: Option<u64>) -> i64 {
        if want > limit {
            return -1;
        }
        let fits = |t: u128| self.held_at(t, skip) + u128::from(want) <= u128::from(limit);
        let mut instants: Vec<u128> = vec![u128::from(now)];
        instants.extend(self.by_hash.values().map(|&(_, e)| u128::from(e)).filter(|&e| e > u128::from(now)));
        instants.sort_unstable();
        let t = instants.into_iter().find(|&t| fits(t)).expect("model: nothing lapses far enough");
        wait_i64(ceil_ms(t - u128::from(now)))
    }

    /// ms until no lease is live (0 when none is now).
    fn reset(&self, now: u64) -> u64 {
        let t = now.max(self.last);
        let end = self.by_hash.values().map(|&(_, e)| e).filter(|&e| t < e).max().unwrap_or(now);
        ceil_ms(u128::from(end - now))
    }

    fn free(&self, now: u64, limit: u64) -> u64 {
        u64::try_from(u128::from(limit).saturating_sub(self.held_at(u128::from(now), None))).unwrap()
    }

    fn own(&self, h: u64, now: u64) -> Option<(u64, u64)> {
        let t = now.max(self.last);
        self.by_hash.get(&h).copied().filter(|&(_, e)| t < e)
    }

    /// A write at real time `now`: the last write's instant moves on.
    fn wrote(&mut self, now: u64) {
        self.last = self.last.max(now);
    }

    /// Units an ACQUIRE of the id could hold at `now`.
    pub fn room(&self, p: &Params, now: u64) -> u64 {
        let others = self.held_at(u128::from(now), Some(p.id_hash));
        u64::try_from(u128::from(p.limit).saturating_sub(others)).unwrap()
    }

    /// The reply of an ACQUIRE of `want` units that holds `taken` of them
    /// (0: nothing changes), and the state after it.
    pub fn take(&self, p: &Params, taken: u64, want: u64, now: u64) -> (Decision, Leases) {
        let h = p.id_hash;
        let mut after = self.clone();
        if taken > 0 {
            after.by_hash.insert(h, (taken, now.max(self.last) + p.lease_ms * 1000));
            after.wrote(now);
        }
        let retry = if taken == want { 0 } else { self.wait(now, p.limit, want, Some(h)) };
        let d = Decision {
            granted: taken,
            limit: p.limit,
            remaining: after.free(now, p.limit),
            retry_after_ms: retry,
            reset_after_ms: after.reset(now),
        };
        (d, after)
    }

    /// `ACQUIRE id COST cost [PARTIAL]` at `now`, written when `write`:
    /// `granted` is the units the id holds after it (0: denied).
    pub fn acquire(&mut self, p: &Params, cost: u64, partial: bool, now: u64, write: bool) -> Decision {
        let room = self.room(p, now);
        let taken = if cost <= room {
            cost
        } else if partial {
            room
        } else {
            0
        };
        let (d, after) = self.take(p, taken, cost, now);
        if write {
            *self = after;
        }
        d
    }

    /// Give `n` of the id's live units back (RELEASE: all of them); the
    /// reply for a new id's ACQUIRE of `want` units.
    pub fn give_back(&mut self, p: &Params, n: u64, want: u64, now: u64) -> Decision {
        let h = p.id_hash;
        let given = match self.own(h, now) {
            Some((u, e)) => {
                let g = n.min(u);
                if g == u {
                    self.by_hash.remove(&h);
                } else {
                    self.by_hash.insert(h, (u - g, e));
                }
                if g > 0 {
                    self.wrote(now);
                }
                // the key is deleted when no live lease is left
                if g > 0 && self.live(now).is_empty() {
                    *self = Leases::default();
                }
                g
            }
            None => 0,
        };
        Decision {
            granted: given,
            limit: p.limit,
            remaining: self.free(now, p.limit),
            retry_after_ms: self.wait(now, p.limit, want, None),
            reset_after_ms: self.reset(now),
        }
    }

    /// `RENEW id`: element 1 is 1 when the id held a live lease.
    pub fn renew(&mut self, p: &Params, now: u64) -> Decision {
        let h = p.id_hash;
        let renewed = match self.own(h, now) {
            Some((u, _)) => {
                self.by_hash.insert(h, (u, now.max(self.last) + p.lease_ms * 1000));
                self.wrote(now);
                true
            }
            None => false,
        };
        Decision {
            granted: u64::from(renewed),
            limit: p.limit,
            remaining: self.free(now, p.limit),
            retry_after_ms: if renewed { 0 } else { -1 },
            reset_after_ms: self.reset(now),
        }
    }
}
