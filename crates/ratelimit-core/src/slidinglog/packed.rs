//! The sliding log's container: entries packed at a variable width.
//!
//! # Memory layout
//!
//! Header (a few words): `head_time` (absolute time of the oldest entry),
//! `tail_time` (newest), `total` (sum of all units, O(1)), `head` / `len`
//! (index of the oldest entry and number of entries), and the entry format
//! `words` / `cbits`. The entries live in one `Vec<u32>`; every entry takes
//! `words` ∈ {1, 2, 4} consecutive little-endian 32-bit words holding the
//! value
//!
//! ```text
//! value = delta << cbits | (count − 1)     (32 × words bits)
//! delta = time − time of the previous entry  (the head entry's delta is
//!         ignored: its time is head_time)
//! ```
//!
//! so the delta field has `dbits = 32 × words − cbits` bits (`words = 4`:
//! 64 + 64 bits). Deltas between consecutive entries inside one window are
//! smaller than `W`, so they are small when entries are many: 1,000 grants
//! in 60 s average 60 ms (16 bits). A state uses the narrowest format that
//! holds its live entries: one 4-byte word per entry when `delta bits +
//! count bits ≤ 32` (e.g. any 60 s window with counts ≤ 64, or 1,000 grants
//! spread over an hour), 8 bytes up to 64 bits (windows of days with large
//! counts), and 16 bytes only for pathological combinations (a window of
//! years *and* counts near 2^53), documented fallback. Spare bits go to the
//! delta field up to the width of `W − 1`, the rest to the count field.
//!
//! The live entries are `buf[head × words .. (head + len) × words]`: trimming
//! advances `head` (no memmove per grant). When the tail reaches the
//! capacity, the live entries are moved to the front if about a fifth of the
//! capacity is dead, otherwise the buffer is reallocated at [`target`]`(n)`
//! entries: the next power of two of at least 4 up to 16 entries (a log
//! growing one entry per grant reallocates after 2, 4, 8 grants, not every
//! 1–3), `1.25 × n + 1` beyond. It is also reallocated (shrunk to that size)
//! when the capacity exceeds both twice the entries and that size, and re-packed when the new entry does not fit
//! the format; every reallocation recomputes the narrowest format. A move or
//! reallocation of `n` entries follows Ω(n) appends or trims, and a re-pack
//! for a value that does not fit widens a field beyond every entry in the
//! log, which can happen at most 128 times (bits) while those entries stay
//! in the window — so trimming and appending are amortized O(1) (the tests
//! count the entries moved). After every grant `capacity ≤ 2 × (len + 1)`
//! entries: with 4-byte entries at most `8 × (len + 1)` bytes, and the heap
//! follows the live entries down as they expire. An empty log (`Default`)
//! owns no heap at all.

/// The log of grants. See the module documentation for the layout.
/// Equality is logical: two states are equal when they hold the same
/// entries, whatever their in-memory format or capacity.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Packed entries; live ones are `[head * words, (head + len) * words)`
    /// and `buf.len() == (head + len) * words`.
    pub(super) buf: Vec<u32>,
    /// Entry index of the oldest entry.
    pub(super) head: usize,
    /// Number of entries.
    pub(super) len: usize,
    /// Absolute time of the oldest entry (meaningful when `len > 0`).
    pub(super) head_time: u64,
    /// Absolute time of the newest entry (meaningful when `len > 0`).
    pub(super) tail_time: u64,
    /// Sum of the units of all entries.
    pub(super) total: u64,
    /// Entry width in 32-bit words: 1, 2 or 4 (0 only before the first
    /// entry was ever written).
    pub(super) words: u8,
    /// Bits of the count field (`count − 1`), the low bits of an entry.
    pub(super) cbits: u8,
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.entries().eq(other.entries())
    }
}

impl Eq for State {}

/// Number of bits needed to represent `x` (0 for 0).
#[inline]
pub(super) fn bit_len(x: u64) -> u32 {
    64 - x.leading_zeros()
}

/// Delta bits of a format.
#[inline]
pub(super) fn dbits_of(words: u8, cbits: u8) -> u32 {
    if words >= 4 {
        64
    } else {
        (32 * u32::from(words)).saturating_sub(u32::from(cbits))
    }
}

#[inline]
pub(super) fn pack(cbits: u8, delta: u64, count: u64) -> u128 {
    (u128::from(delta) << u32::from(cbits).min(64)) | u128::from(count.saturating_sub(1))
}

/// `(delta, count − 1)` of a packed value.
#[inline]
pub(super) fn unpack(cbits: u8, v: u128) -> (u64, u64) {
    let c = u32::from(cbits).min(64);
    let mask = (1u128 << c) - 1;
    ((v >> c) as u64, (v & mask) as u64)
}

#[inline]
pub(super) fn push_value(buf: &mut Vec<u32>, words: usize, v: u128) {
    for i in 0..words {
        buf.push((v >> (32 * i)) as u32);
    }
}

/// Entries a log of up to this many is allocated in powers of two (at
/// least [`MIN_CAP`]); beyond it, with 25 % slack.
pub(super) const DOUBLING_UP_TO: usize = 16;

/// The smallest buffer a log allocates, in entries (16 bytes of 4-byte
/// entries: the smallest jemalloc class above 8 bytes; libc malloc's
/// smallest chunk already holds 24 usable bytes).
pub(super) const MIN_CAP: usize = 4;

/// Capacity (in entries) allocated for `n` entries. Small logs double
/// (4, 8, 16): a log that grows by one entry per grant then reallocates
/// after 2, 4 and 8 grants instead of every 1–3 (each reallocation is a
/// malloc, a re-pack and a free, ~1,000 instructions), for at most 32 bytes
/// of slack; larger logs keep 25 % slack (4–5 bytes per entry).
#[inline]
pub(super) fn target(n: usize) -> usize {
    if n <= DOUBLING_UP_TO {
        n.max(MIN_CAP).next_power_of_two()
    } else {
        n.saturating_add(n / 4).saturating_add(1)
    }
}

/// Whether a buffer of `cap` entries is too large for `n` live entries
/// (then the next append shrinks it to [`target`]): more than twice the
/// entries, and more than a new buffer for them would take.
#[inline]
pub(super) fn oversized(cap: usize, n: usize) -> bool {
    cap > 2 * n && cap > target(n)
}

/// The in-memory format: like the canonical one, but spare bits go to the
/// delta field only up to the width of the largest delta the window allows
/// (`W − 1`), the rest to the count field, to make later re-packs rare.
pub(super) fn memory_format(d: u32, c: u32, window_us: u64) -> (u8, u8) {
    let need = d + c;
    let words: u32 = if need <= 32 {
        1
    } else if need <= 64 {
        2
    } else {
        return (4, 64);
    };
    let spare = 32 * words - need;
    let extra_d = spare.min(bit_len(window_us.saturating_sub(1)).saturating_sub(d));
    (words as u8, (c + spare - extra_d) as u8)
}

#[cfg(test)]
thread_local! {
    /// Entries moved by compaction and re-packing (tests check amortized O(1)).
    pub(super) static MOVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[inline]
pub(super) fn note_moved(_n: usize) {
    #[cfg(test)]
    MOVED.with(|m| m.set(m.get() + _n as u64));
}

/// Iterator over `(time, count)` of the entries, oldest first.
pub(super) struct Entries<'a> {
    st: &'a State,
    idx: usize,
    end: usize,
    time: u64,
    first: bool,
}

impl Iterator for Entries<'_> {
    type Item = (u64, u64);
    #[inline]
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.idx >= self.end {
            return None;
        }
        let (delta, count) = self.st.raw(self.idx);
        if self.first {
            self.first = false;
            self.time = self.st.head_time;
        } else {
            self.time = self.time.saturating_add(delta);
        }
        self.idx += 1;
        Some((self.time, count))
    }
}

/// The header of a log: every field of [`State`] but the buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Header {
    head: usize,
    len: usize,
    head_time: u64,
    tail_time: u64,
    total: u64,
    words: u8,
    cbits: u8,
}

/// A grant decided but not applied: the header after it and the buffer
/// changes, in order (truncate, re-lay, write one entry).
pub(super) struct Plan {
    h: Header,
    truncate_to: Option<usize>,
    relayout: Relayout,
    write: Write,
    /// The buffer's length after the truncation and re-layout (planning
    /// only).
    buf_len: usize,
}

enum Relayout {
    Keep,
    /// Move the words `start..end` to the front.
    Compact {
        start: usize,
        end: usize,
    },
    /// A re-packed buffer (built, and allocated, while planning).
    Replace(Vec<u32>),
}

enum Write {
    Nothing,
    /// Append one packed entry.
    Push(u128),
    /// Overwrite the entry at an index.
    Store(usize, u128),
}

impl Plan {
    /// Remove every entry, keeping the buffer's allocation (the next append
    /// decides whether to shrink it).
    fn clear(&mut self) {
        self.truncate(0);
        self.h.head = 0;
        self.h.len = 0;
        self.h.total = 0;
    }

    fn truncate(&mut self, n: usize) {
        self.truncate_to = Some(n);
        self.buf_len = self.buf_len.min(n);
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: panic at the end of the next plan (see `fail_point`).
    pub(super) static FAIL_PLAN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Tests: stands for any panic while planning (an overflow check, a bug).
#[cfg(test)]
fn fail_point() {
    if FAIL_PLAN.with(|f| f.replace(false)) {
        panic!("injected failure while planning a grant");
    }
}

impl State {
    /// No entries at all.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of heap this state owns (the buffer's capacity).
    #[inline]
    pub fn heap_bytes(&self) -> usize {
        self.buf.capacity().saturating_mul(std::mem::size_of::<u32>())
    }

    /// The start of the heap block this state owns (None when it owns
    /// none), so the glue can ask the allocator what the block really takes.
    #[inline]
    pub fn heap_block(&self) -> Option<*const u8> {
        (self.buf.capacity() > 0).then(|| self.buf.as_ptr().cast::<u8>())
    }

    #[inline]
    pub(super) fn wn(&self) -> usize {
        usize::from(self.words.max(1))
    }

    #[inline]
    pub(super) fn cap_entries(&self) -> usize {
        self.buf.capacity() / self.wn()
    }

    /// Packed value of the entry at absolute index `idx`.
    #[inline]
    pub(super) fn load(&self, idx: usize) -> u128 {
        let w = self.wn();
        let start = idx.saturating_mul(w);
        let mut v = 0u128;
        for i in 0..w {
            let word = self.buf.get(start.saturating_add(i)).copied().unwrap_or(0);
            v |= u128::from(word) << (32 * i);
        }
        v
    }

    /// `(stored delta, count)` of the entry at absolute index `idx`.
    #[inline]
    pub(super) fn raw(&self, idx: usize) -> (u64, u64) {
        let (delta, cm1) = unpack(self.cbits, self.load(idx));
        (delta, cm1.saturating_add(1))
    }

    #[inline]
    pub(super) fn fits(&self, delta: u64, count: u64) -> bool {
        self.words != 0
            && bit_len(delta) <= dbits_of(self.words, self.cbits)
            && bit_len(count.saturating_sub(1)) <= u32::from(self.cbits)
    }

    pub(super) fn entries(&self) -> Entries<'_> {
        Entries { st: self, idx: self.head, end: self.head + self.len, time: self.head_time, first: true }
    }

    /// Widest delta bits (head excluded) and count bits of the entries.
    pub(super) fn widths(&self) -> (u32, u32) {
        self.widths_of(self.head, self.len)
    }

    /// [`State::widths`] of the `len` entries from index `head`.
    fn widths_of(&self, head: usize, len: usize) -> (u32, u32) {
        let (mut d, mut c) = (0, 0);
        for idx in head..head + len {
            let (delta, count) = self.raw(idx);
            if idx != head {
                d = d.max(bit_len(delta));
            }
            c = c.max(bit_len(count - 1));
        }
        (d, c)
    }

    /// Units of the entries in the window `W` at `now` (`now ≥ tail_time`).
    pub(super) fn used_at(&self, now: u64, window_us: u128) -> u64 {
        let now = u128::from(now);
        if self.len == 0 || u128::from(self.tail_time) + window_us <= now {
            return 0;
        }
        if u128::from(self.head_time) + window_us > now {
            return self.total;
        }
        let mut expired = 0u64;
        for (t, count) in self.entries() {
            if u128::from(t) + window_us > now {
                break;
            }
            expired = expired.saturating_add(count);
        }
        self.total.saturating_sub(expired)
    }

    /// The header: every field but the buffer.
    fn header(&self) -> Header {
        Header {
            head: self.head,
            len: self.len,
            head_time: self.head_time,
            tail_time: self.tail_time,
            total: self.total,
            words: self.words,
            cbits: self.cbits,
        }
    }

    /// Decides how a grant of `units` (≥ 1) at `now` (≥ the newest entry)
    /// under a window of `window_us` changes the log, without changing it.
    /// Everything that could fail — arithmetic, indexing, the allocation of
    /// a re-packed buffer — happens here; [`State::apply`] then only moves
    /// words and assigns fields, so a panic can never leave a log
    /// half-updated.
    pub(super) fn plan_grant(&self, now: u64, units: u64, window_us: u64) -> Plan {
        let mut plan = Plan {
            h: self.header(),
            truncate_to: None,
            relayout: Relayout::Keep,
            write: Write::Nothing,
            buf_len: self.buf.len(),
        };
        self.plan_trim(&mut plan, now, window_us);
        let units = units.min(u64::MAX - plan.h.total);
        if units > 0 {
            if plan.h.len > 0 && plan.h.tail_time == now {
                self.plan_merge_tail(&mut plan, units, window_us);
            } else {
                self.plan_append(&mut plan, now, units, window_us);
            }
        }
        #[cfg(test)]
        fail_point();
        plan
    }

    /// Decides how a refund of `units` at `now` (≥ the newest entry) under
    /// a window of `window_us` changes the log: the entries that left the
    /// window are dropped, then up to `units` units come off the newest
    /// entries (an entry whose count drops to 0 goes). Returns the plan and
    /// the units removed. The buffer keeps its capacity (the next grant
    /// shrinks it; the key expires at the latest when the window passes).
    pub(super) fn plan_refund(&self, now: u64, units: u64, window_us: u64) -> (Plan, u64) {
        let mut plan = Plan {
            h: self.header(),
            truncate_to: None,
            relayout: Relayout::Keep,
            write: Write::Nothing,
            buf_len: self.buf.len(),
        };
        self.plan_trim(&mut plan, now, window_us);
        let mut left = units;
        while left > 0 && plan.h.len > 0 {
            let idx = plan.h.head + plan.h.len - 1;
            let (delta, count) = self.raw(idx);
            if count > left {
                // A smaller count always fits the entry's format.
                plan.write = Write::Store(idx, pack(plan.h.cbits, delta, count - left));
                plan.h.total = plan.h.total.saturating_sub(left);
                left = 0;
            } else {
                left -= count;
                plan.h.total = plan.h.total.saturating_sub(count);
                plan.h.len -= 1;
                if plan.h.len == 0 {
                    plan.clear();
                } else {
                    plan.h.tail_time = plan.h.tail_time.saturating_sub(delta);
                    let live_words = (plan.h.head + plan.h.len) * self.wn();
                    plan.truncate(live_words);
                }
            }
        }
        #[cfg(test)]
        fail_point();
        (plan, units - left)
    }

    /// Drops the entries that left the window `W` at `now` (`now ≥ tail_time`).
    fn plan_trim(&self, plan: &mut Plan, now: u64, window_us: u64) {
        let h = &mut plan.h;
        if h.len == 0 {
            return;
        }
        let now = u128::from(now);
        let w = u128::from(window_us);
        if u128::from(h.tail_time) + w <= now {
            plan.clear();
            return;
        }
        // The tail is in the window, so the loop stops before it.
        while h.len > 1 && u128::from(h.head_time) + w <= now {
            let (_, count) = self.raw(h.head);
            h.total = h.total.saturating_sub(count);
            h.head += 1;
            h.len -= 1;
            let (delta, _) = self.raw(h.head);
            h.head_time = h.head_time.saturating_add(delta);
        }
    }

    /// Re-packs the live entries into a new buffer of `cap` entries, in the
    /// narrowest format that also holds the entry `(delta, count)` about to
    /// be appended.
    fn plan_rebuild(&self, plan: &mut Plan, cap: usize, delta: u64, count: u64, window_us: u64) {
        let h = &mut plan.h;
        let (d, c) = self.widths_of(h.head, h.len);
        let d = d.max(bit_len(delta));
        let c = c.max(bit_len(count.saturating_sub(1)));
        let (words, cbits) = memory_format(d, c, window_us);
        let wn = usize::from(words);
        let mut nb = Vec::with_capacity(cap.saturating_mul(wn));
        for idx in h.head..h.head + h.len {
            let (dl, cnt) = self.raw(idx);
            let dl = if idx == h.head { 0 } else { dl };
            push_value(&mut nb, wn, pack(cbits, dl, cnt));
        }
        note_moved(h.len);
        plan.buf_len = nb.len();
        plan.relayout = Relayout::Replace(nb);
        h.head = 0;
        h.words = words;
        h.cbits = cbits;
    }

    /// Appends an entry at `time` (> tail_time, or the log is empty). Before
    /// it, the format and capacity are those of `self`: the plan re-packs
    /// only here.
    fn plan_append(&self, plan: &mut Plan, time: u64, count: u64, window_us: u64) {
        let h = plan.h;
        let delta = if h.len == 0 { 0 } else { time.saturating_sub(h.tail_time) };
        let n = h.len + 1;
        let cap = self.cap_entries();
        let tail_full = h.head + n > cap;
        if !self.fits(delta, count) || oversized(cap, n) || (tail_full && cap < target(n)) {
            self.plan_rebuild(plan, target(n), delta, count, window_us);
        } else if tail_full {
            // Move the live entries to the front of the buffer.
            let w = self.wn();
            let (start, end) = (h.head * w, (h.head + h.len) * w);
            if start != 0 && end <= plan.buf_len {
                plan.relayout = Relayout::Compact { start, end };
                plan.buf_len = end - start;
                plan.h.head = 0;
                note_moved(h.len);
            }
        }
        let h = &mut plan.h;
        plan.write = Write::Push(pack(h.cbits, delta, count));
        if h.len == 0 {
            h.head_time = time;
        }
        h.tail_time = time;
        h.len = n;
        h.total = h.total.saturating_add(count);
    }

    /// Adds `units` to the newest entry.
    fn plan_merge_tail(&self, plan: &mut Plan, units: u64, window_us: u64) {
        let h = &mut plan.h;
        let idx = h.head + h.len - 1;
        let (delta, count) = self.raw(idx);
        let new_count = count.saturating_add(units);
        if self.fits(delta, new_count) && !oversized(self.cap_entries(), h.len + 1) {
            plan.write = Write::Store(idx, pack(h.cbits, delta, new_count));
            h.total = h.total.saturating_add(units);
            return;
        }
        // Does not fit (or the buffer should shrink): remove the tail entry
        // and append it again through the general path.
        let time = h.tail_time;
        h.len -= 1;
        h.total = h.total.saturating_sub(count);
        if h.len == 0 {
            plan.clear();
        } else {
            h.tail_time = h.tail_time.saturating_sub(delta);
            let live_words = (h.head + h.len) * self.wn();
            plan.truncate(live_words);
        }
        self.plan_append(plan, time, new_count, window_us);
    }

    /// What [`State::plan_grant`] then [`State::apply`] do for a grant of
    /// `units` at `now` (> the newest entry) when nothing left the window
    /// (the oldest entry is still in it), the sum stays below `u64::MAX`,
    /// the new entry fits the format and the buffer has room for it without
    /// being oversized: append the entry in place. Returns false, changing
    /// nothing, in every other case (the caller then plans the grant).
    /// Cannot panic or allocate (the push stays within the capacity).
    #[inline]
    pub(super) fn append_in_place(&mut self, now: u64, units: u64, window_us: u64) -> bool {
        if self.len == 0 || now <= self.tail_time || u128::from(self.head_time) + u128::from(window_us) <= u128::from(now) {
            return false;
        }
        let Some(total) = self.total.checked_add(units).filter(|&t| t < u64::MAX) else {
            return false;
        };
        let delta = now - self.tail_time;
        let n = self.len + 1;
        let cap = self.cap_entries();
        if !self.fits(delta, units) || self.head + n > cap || oversized(cap, n) {
            return false;
        }
        let w = self.wn();
        push_value(&mut self.buf, w, pack(self.cbits, delta, units));
        self.tail_time = now;
        self.len = n;
        self.total = total;
        true
    }

    /// Carries out a plan made by [`State::plan_grant`] on this state. No
    /// step can panic: no arithmetic beyond what the plan checked, no
    /// indexing, no allocation but the push of one entry into a buffer the
    /// plan sized (an allocation failure aborts; it does not unwind).
    pub(super) fn apply(&mut self, plan: Plan) {
        if let Some(n) = plan.truncate_to {
            self.buf.truncate(n);
        }
        match plan.relayout {
            Relayout::Keep => {}
            Relayout::Compact { start, end } => {
                if start <= end && end <= self.buf.len() {
                    self.buf.copy_within(start..end, 0);
                    self.buf.truncate(end - start);
                }
            }
            Relayout::Replace(nb) => self.buf = nb,
        }
        let h = plan.h;
        self.head = h.head;
        self.len = h.len;
        self.head_time = h.head_time;
        self.tail_time = h.tail_time;
        self.total = h.total;
        self.words = h.words;
        self.cbits = h.cbits;
        match plan.write {
            Write::Nothing => {}
            Write::Push(v) => {
                let w = self.wn();
                push_value(&mut self.buf, w, v);
            }
            Write::Store(idx, v) => {
                let w = self.wn();
                let start = idx.saturating_mul(w);
                for i in 0..w {
                    if let Some(slot) = self.buf.get_mut(start.saturating_add(i)) {
                        *slot = (v >> (32 * i)) as u32;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "packed_tests.rs"]
mod tests;
