//! RL.SLIDINGLOG — the exact sliding-window log, pure (no Redis symbols).
//!
//! # Algorithm
//!
//! The state is the log of the grants still inside the window: entries
//! `(time µs, units)` in strictly increasing time order. Two grants at the
//! same microsecond merge into one entry, so a grant of COST n costs one entry
//! exactly like a grant of 1. With `W = window_ms × 1000` µs and
//! `now_eff = max(now, newest entry time)` (a clock that steps back counts as
//! no elapsed time), an entry at `t` is in the window iff `now_eff − W < t`
//! (always `t ≤ now_eff`).
//!
//! - [`decide`] (pure) sums the units in the window — `used` — and answers:
//!   without PARTIAL `granted = cost` if `used + cost ≤ limit`, else 0; with
//!   PARTIAL `granted = min(cost, limit − used)`. `retry_after_ms` walks the
//!   log (with this call's grant appended) from the oldest entry until the
//!   units that will have expired cover the excess `used_after + cost −
//!   limit`; the call becomes grantable exactly when that entry leaves the
//!   window. `reset_after_ms` is when the newest entry leaves the window.
//!   Both waits are measured from the real clock reading `now` (if it is
//!   behind the newest entry they include the gap), so a TTL of
//!   `reset_after_ms` covers the whole time the log matters.
//!   Expired entries that no grant has trimmed yet are skipped by walking
//!   from the oldest (`decide` never mutates); when the oldest entry is still
//!   in the window, `used` is the O(1) running total.
//! - [`grant`] trims the entries that left the window from the head (O(1)
//!   per trimmed entry) and appends the grant at the tail (or adds it to the
//!   tail entry when it has the same time).
//!
//! # Why it is exact
//!
//! Times are integer microseconds and window comparisons are made as
//! `t + W > now` in `u128`, so nothing overflows or rounds. Units are summed
//! in integers; the only rounding is the final ⌈µs / 1000⌉ of the two
//! durations in the reply. The packed entries below are lossless: when a
//! delta or a count does not fit the current entry format, the whole log is
//! re-packed in a wider format (up to 128-bit entries, which hold any `u64`
//! delta and count), never truncated. The only saturation is in [`grant`]
//! for inputs a master can never produce (the sum of all units in the log
//! beyond `u64::MAX`; on a master it is at most `limit ≤ 2^53 − 1`), so it
//! keeps the invariants for any replayed input without panicking.
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
//! capacity is dead, otherwise the buffer is reallocated at `1.25 × n + 1`
//! entries. It is also reallocated (shrunk to that size) when the capacity
//! exceeds twice the entries, and re-packed when the new entry does not fit
//! the format; every reallocation recomputes the narrowest format. A move or
//! reallocation of `n` entries follows Ω(n) appends or trims, and a re-pack
//! for a value that does not fit widens a field beyond every entry in the
//! log, which can happen at most 128 times (bits) while those entries stay
//! in the window — so trimming and appending are amortized O(1) (the tests
//! count the entries moved). After every grant `capacity ≤ 2 × (len + 1)`
//! entries: with 4-byte entries at most `8 × (len + 1)` bytes, and the heap
//! follows the live entries down as they expire. An empty log (`Default`)
//! owns no heap at all.
//!
//! # Encoding (RDB, DUMP, AOF rewrite, DEBUG DIGEST)
//!
//! Canonical: a function of the logical log only (not of the in-memory
//! format or capacity), so master and replica digest equally.
//!
//! ```text
//! u8      version = 1
//! u64 LE  n = number of entries; n = 0 ends the encoding (empty log)
//! u64 LE  time of the oldest entry (µs)
//! u8      words ∈ {1, 2, 4}: entry width in 32-bit words
//! u8      cbits: count bits (words = 4 ⇒ 64)
//! n × (4 × words) bytes: entries, value = delta << cbits | (count − 1),
//!         little endian; the first entry's delta is 0, every other ≥ 1
//! ```
//!
//! `words`/`cbits` must be the canonical format: the smallest `words` whose
//! `32 × words` bits hold the widest delta plus the widest `count − 1`, and
//! `cbits` = the bits of the widest `count − 1` (64 when `words = 4`).
//! The decoder checks all of it, the time and unit sums for overflow, and
//! that the byte count is exactly `n × 4 × words` before it allocates.

use super::{ms_to_us, to_i64, us_to_ms_ceil, Decision, DecodeError, Reader};

/// First byte of the binary encoding.
pub const ENCODING_VERSION: u8 = 1;

/// The command's parameters (both `1..=MAX_ARG`, validated by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub window_ms: u64,
}

/// The log of grants. See the module documentation for the layout.
/// Equality is logical: two states are equal when they hold the same
/// entries, whatever their in-memory format or capacity.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Packed entries; live ones are `[head * words, (head + len) * words)`
    /// and `buf.len() == (head + len) * words`.
    buf: Vec<u32>,
    /// Entry index of the oldest entry.
    head: usize,
    /// Number of entries.
    len: usize,
    /// Absolute time of the oldest entry (meaningful when `len > 0`).
    head_time: u64,
    /// Absolute time of the newest entry (meaningful when `len > 0`).
    tail_time: u64,
    /// Sum of the units of all entries.
    total: u64,
    /// Entry width in 32-bit words: 1, 2 or 4 (0 only before the first
    /// entry was ever written).
    words: u8,
    /// Bits of the count field (`count − 1`), the low bits of an entry.
    cbits: u8,
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.entries().eq(other.entries())
    }
}

impl Eq for State {}

/// Number of bits needed to represent `x` (0 for 0).
#[inline]
fn bit_len(x: u64) -> u32 {
    64 - x.leading_zeros()
}

/// Delta bits of a format.
#[inline]
fn dbits_of(words: u8, cbits: u8) -> u32 {
    if words >= 4 {
        64
    } else {
        (32 * u32::from(words)).saturating_sub(u32::from(cbits))
    }
}

#[inline]
fn pack(cbits: u8, delta: u64, count: u64) -> u128 {
    (u128::from(delta) << u32::from(cbits).min(64)) | u128::from(count.saturating_sub(1))
}

/// `(delta, count − 1)` of a packed value.
#[inline]
fn unpack(cbits: u8, v: u128) -> (u64, u64) {
    let c = u32::from(cbits).min(64);
    let mask = (1u128 << c) - 1;
    ((v >> c) as u64, (v & mask) as u64)
}

#[inline]
fn push_value(buf: &mut Vec<u32>, words: usize, v: u128) {
    for i in 0..words {
        buf.push((v >> (32 * i)) as u32);
    }
}

/// Capacity (in entries) allocated for `n` entries: 25 % slack.
#[inline]
fn target(n: usize) -> usize {
    n.saturating_add(n / 4).saturating_add(1)
}

/// The canonical (encoding) format for the widest delta `d` and count `c`
/// bits: all spare bits go to the delta field.
fn canonical_format(d: u32, c: u32) -> (u8, u8) {
    let need = d + c;
    if need <= 32 {
        (1, c as u8)
    } else if need <= 64 {
        (2, c as u8)
    } else {
        (4, 64)
    }
}

/// The in-memory format: like the canonical one, but spare bits go to the
/// delta field only up to the width of the largest delta the window allows
/// (`W − 1`), the rest to the count field, to make later re-packs rare.
fn memory_format(d: u32, c: u32, window_us: u64) -> (u8, u8) {
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
    static MOVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[inline]
fn note_moved(_n: usize) {
    #[cfg(test)]
    MOVED.with(|m| m.set(m.get() + _n as u64));
}

/// Iterator over `(time, count)` of the entries, oldest first.
struct Entries<'a> {
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

    #[inline]
    fn wn(&self) -> usize {
        usize::from(self.words.max(1))
    }

    #[inline]
    fn cap_entries(&self) -> usize {
        self.buf.capacity() / self.wn()
    }

    /// Packed value of the entry at absolute index `idx`.
    #[inline]
    fn load(&self, idx: usize) -> u128 {
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
    fn raw(&self, idx: usize) -> (u64, u64) {
        let (delta, cm1) = unpack(self.cbits, self.load(idx));
        (delta, cm1.saturating_add(1))
    }

    fn store(&mut self, idx: usize, delta: u64, count: u64) {
        let w = self.wn();
        let v = pack(self.cbits, delta, count);
        let start = idx.saturating_mul(w);
        for i in 0..w {
            if let Some(slot) = self.buf.get_mut(start.saturating_add(i)) {
                *slot = (v >> (32 * i)) as u32;
            }
        }
    }

    #[inline]
    fn fits(&self, delta: u64, count: u64) -> bool {
        self.words != 0
            && bit_len(delta) <= dbits_of(self.words, self.cbits)
            && bit_len(count.saturating_sub(1)) <= u32::from(self.cbits)
    }

    fn entries(&self) -> Entries<'_> {
        Entries { st: self, idx: self.head, end: self.head + self.len, time: self.head_time, first: true }
    }

    /// Widest delta bits (head excluded) and count bits of the entries.
    fn widths(&self) -> (u32, u32) {
        let (mut d, mut c) = (0, 0);
        for idx in self.head..self.head + self.len {
            let (delta, count) = self.raw(idx);
            if idx != self.head {
                d = d.max(bit_len(delta));
            }
            c = c.max(bit_len(count - 1));
        }
        (d, c)
    }

    /// Units of the entries in the window `W` at `now` (`now ≥ tail_time`).
    fn used_at(&self, now: u64, window_us: u128) -> u64 {
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

    /// Drops the entries that left the window `W` at `now` (`now ≥ tail_time`).
    fn trim(&mut self, now: u64, window_us: u64) {
        if self.len == 0 {
            return;
        }
        let now = u128::from(now);
        let w = u128::from(window_us);
        if u128::from(self.tail_time) + w <= now {
            self.clear();
            return;
        }
        // The tail is in the window, so the loop stops before it.
        while self.len > 1 && u128::from(self.head_time) + w <= now {
            let (_, count) = self.raw(self.head);
            self.total = self.total.saturating_sub(count);
            self.head += 1;
            self.len -= 1;
            let (delta, _) = self.raw(self.head);
            self.head_time = self.head_time.saturating_add(delta);
        }
    }

    /// Removes every entry, keeping the buffer (the next append decides
    /// whether to shrink it).
    fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
        self.len = 0;
        self.total = 0;
    }

    /// Moves the live entries to the front of the buffer.
    fn compact(&mut self) {
        let w = self.wn();
        let start = self.head * w;
        let end = (self.head + self.len) * w;
        if start == 0 || end > self.buf.len() {
            return;
        }
        self.buf.copy_within(start..end, 0);
        self.buf.truncate(end - start);
        self.head = 0;
        note_moved(self.len);
    }

    /// Re-packs the live entries into a new buffer of `cap` entries, in the
    /// narrowest format that also holds the entry `(delta, count)` about to
    /// be appended.
    fn rebuild(&mut self, cap: usize, delta: u64, count: u64, window_us: u64) {
        let (d, c) = self.widths();
        let d = d.max(bit_len(delta));
        let c = c.max(bit_len(count.saturating_sub(1)));
        let (words, cbits) = memory_format(d, c, window_us);
        let wn = usize::from(words);
        let mut nb = Vec::with_capacity(cap.saturating_mul(wn));
        for idx in self.head..self.head + self.len {
            let (dl, cnt) = self.raw(idx);
            let dl = if idx == self.head { 0 } else { dl };
            push_value(&mut nb, wn, pack(cbits, dl, cnt));
        }
        note_moved(self.len);
        self.buf = nb;
        self.head = 0;
        self.words = words;
        self.cbits = cbits;
    }

    /// Appends an entry at `time` (> tail_time, or the log is empty).
    fn append(&mut self, time: u64, count: u64, window_us: u64) {
        let delta = if self.len == 0 { 0 } else { time.saturating_sub(self.tail_time) };
        let n = self.len + 1;
        let cap = self.cap_entries();
        let tail_full = self.head + n > cap;
        if !self.fits(delta, count) || cap > 2 * n || (tail_full && cap < target(n)) {
            self.rebuild(target(n), delta, count, window_us);
        } else if tail_full {
            self.compact();
        }
        let wn = self.wn();
        push_value(&mut self.buf, wn, pack(self.cbits, delta, count));
        if self.len == 0 {
            self.head_time = time;
        }
        self.tail_time = time;
        self.len = n;
        self.total = self.total.saturating_add(count);
    }

    /// Adds `units` to the newest entry.
    fn merge_tail(&mut self, units: u64, window_us: u64) {
        let idx = self.head + self.len - 1;
        let (delta, count) = self.raw(idx);
        let new_count = count.saturating_add(units);
        if self.fits(delta, new_count) && self.cap_entries() <= 2 * (self.len + 1) {
            self.store(idx, delta, new_count);
            self.total = self.total.saturating_add(units);
            return;
        }
        // Does not fit (or the buffer should shrink): remove the tail entry
        // and append it again through the general path.
        let time = self.tail_time;
        self.len -= 1;
        self.total = self.total.saturating_sub(count);
        if self.len == 0 {
            self.clear();
        } else {
            self.buf.truncate((self.head + self.len) * self.wn());
            self.tail_time = self.tail_time.saturating_sub(delta);
        }
        self.append(time, new_count, window_us);
    }

    /// Versioned canonical binary encoding (see the module documentation).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(ENCODING_VERSION);
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        if self.len == 0 {
            return;
        }
        out.extend_from_slice(&self.head_time.to_le_bytes());
        let (d, c) = self.widths();
        let (words, cbits) = canonical_format(d, c);
        out.push(words);
        out.push(cbits);
        let nbytes = 4 * usize::from(words);
        out.reserve(self.len.saturating_mul(nbytes));
        for idx in self.head..self.head + self.len {
            let (delta, count) = self.raw(idx);
            let delta = if idx == self.head { 0 } else { delta };
            let bytes = pack(cbits, delta, count).to_le_bytes();
            out.extend_from_slice(bytes.get(..nbytes).unwrap_or(&bytes));
        }
    }

    /// Strict decoder: accepts exactly the canonical encodings of valid
    /// states, never panics, allocates only what the input's length holds.
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err(DecodeError::UnknownVersion);
        }
        let n = r.u64()?;
        if n == 0 {
            r.finish()?;
            return Ok(State::default());
        }
        let head_time = r.u64()?;
        let words = r.u8()?;
        let cbits = r.u8()?;
        if !matches!(words, 1 | 2 | 4) {
            return Err(DecodeError::Invalid("entry width"));
        }
        if (words == 4 && cbits != 64) || (words < 4 && u32::from(cbits) > 32 * u32::from(words)) {
            return Err(DecodeError::Invalid("count bits"));
        }
        let wn = usize::from(words);
        let body = usize::try_from(n).ok().and_then(|n| n.checked_mul(4 * wn)).ok_or(DecodeError::Truncated)?;
        if r.remaining() < body {
            return Err(DecodeError::Truncated);
        }
        if r.remaining() > body {
            return Err(DecodeError::TrailingBytes);
        }
        let raw = r.take(body)?;
        r.finish()?;
        let len = body / (4 * wn);
        let mut buf = Vec::with_capacity(body / 4);
        for chunk in raw.chunks_exact(4) {
            let mut a = [0u8; 4];
            a.copy_from_slice(chunk);
            buf.push(u32::from_le_bytes(a));
        }
        let mut st = State { buf, head: 0, len, head_time, tail_time: head_time, total: 0, words, cbits };
        let (mut d, mut c) = (0u32, 0u32);
        let mut time = head_time;
        let mut total = 0u64;
        for idx in 0..len {
            let (delta, cm1) = unpack(cbits, st.load(idx));
            if idx == 0 {
                if delta != 0 {
                    return Err(DecodeError::Invalid("first entry delta"));
                }
            } else {
                if delta == 0 {
                    return Err(DecodeError::Invalid("entry times not increasing"));
                }
                time = time.checked_add(delta).ok_or(DecodeError::Invalid("entry time overflows"))?;
                d = d.max(bit_len(delta));
            }
            let count = cm1.checked_add(1).ok_or(DecodeError::Invalid("entry count overflows"))?;
            total = total.checked_add(count).ok_or(DecodeError::Invalid("total units overflow"))?;
            c = c.max(bit_len(cm1));
        }
        if canonical_format(d, c) != (words, cbits) {
            return Err(DecodeError::Invalid("entry format not canonical"));
        }
        st.tail_time = time;
        st.total = total;
        Ok(st)
    }
}

/// Pure: what the call would answer at `now_us`, without changing anything.
pub fn decide(state: &State, p: &Params, cost: u64, partial: bool, now_us: u64) -> Decision {
    let w = u128::from(ms_to_us(p.window_ms));
    // The window is evaluated at `now` (never earlier than the newest
    // entry); waits are measured from the real clock reading `now_us`.
    let now = if state.len > 0 { now_us.max(state.tail_time) } else { now_us };
    let now128 = u128::from(now);
    let real = u128::from(now_us);
    let limit = p.limit;
    let used = state.used_at(now, w);
    let avail = limit.saturating_sub(used);
    let granted = if partial {
        cost.min(avail)
    } else if cost <= avail {
        cost
    } else {
        0
    };
    let remaining = avail.saturating_sub(granted);
    // Every entry in the window has `t + w > now ≥ now_us`, so the waits
    // below are positive.
    let retry_after_ms = if granted == cost {
        0
    } else if cost > limit {
        -1
    } else {
        // Units that must leave the window before the same call fits, in
        // the log as it is after this call's grant.
        let excess = (u128::from(used) + u128::from(granted) + u128::from(cost)).saturating_sub(u128::from(limit));
        let mut acc = 0u128;
        // Not reached before this call's own grant (at `now`, the newest).
        let mut leaves_at = now128 + w;
        for (t, count) in state.entries() {
            if u128::from(t) + w <= now128 {
                continue;
            }
            acc += u128::from(count);
            if acc >= excess {
                leaves_at = u128::from(t) + w;
                break;
            }
        }
        to_i64(us_to_ms_ceil(leaves_at.saturating_sub(real)))
    };
    let reset_after_ms = if granted > 0 {
        us_to_ms_ceil((now128 + w).saturating_sub(real))
    } else if state.len > 0 && u128::from(state.tail_time) + w > now128 {
        us_to_ms_ceil((u128::from(state.tail_time) + w).saturating_sub(real))
    } else {
        0
    };
    Decision { granted, limit, remaining, retry_after_ms, reset_after_ms }
}

/// Apply a grant of `units` made at `now_us` under window `window_ms`: trims
/// the entries that left the window and records the grant at
/// `max(now_us, newest entry)`. Deterministic, and total for any `u64`
/// inputs: `units == 0` changes nothing, `window_ms` saturates, and units
/// that would push the log's sum beyond `u64::MAX` (impossible on a master,
/// whose log never holds more than `limit`) are dropped.
pub fn grant(state: &mut State, window_ms: u64, units: u64, now_us: u64) {
    if units == 0 {
        return;
    }
    let w = ms_to_us(window_ms);
    let now = if state.len > 0 { now_us.max(state.tail_time) } else { now_us };
    state.trim(now, w);
    let units = units.min(u64::MAX - state.total);
    if units == 0 {
        return;
    }
    if state.len > 0 && state.tail_time == now {
        state.merge_tail(units, w);
    } else {
        state.append(now, units, w);
    }
}

/// Microseconds at which the state becomes fresh (every entry has left the
/// window of `window_ms`), or None when it already is empty.
pub fn fresh_at_us(state: &State, window_ms: u64) -> Option<u64> {
    if state.len == 0 {
        None
    } else {
        Some(state.tail_time.saturating_add(ms_to_us(window_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::MAX_ARG;
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::Config as ProptestConfig;

    // ---------------------------------------------------------------
    // Reference model: a plain list of (time, units), exact arithmetic.
    // ---------------------------------------------------------------

    #[derive(Clone, Debug, Default)]
    struct Model {
        log: Vec<(u64, u128)>,
    }

    fn ceil_ms(us: i128) -> i128 {
        (us + 999).div_euclid(1000)
    }

    impl Model {
        fn now_eff(&self, now: u64) -> u64 {
            self.log.last().map_or(now, |&(t, _)| now.max(t))
        }

        fn in_window(t: u64, now: u64, window_ms: u64) -> bool {
            // now − W < t, in signed 128-bit arithmetic.
            i128::from(now) - i128::from(window_ms) * 1000 < i128::from(t)
        }

        fn decide(&self, p: &Params, cost: u64, partial: bool, now_real: u64) -> Decision {
            let now = self.now_eff(now_real);
            let live: Vec<(u64, u128)> =
                self.log.iter().copied().filter(|&(t, _)| Self::in_window(t, now, p.window_ms)).collect();
            let used: i128 = live.iter().map(|&(_, u)| u as i128).sum();
            let (limit, cost_i) = (i128::from(p.limit), i128::from(cost));
            let granted: i128 = if partial {
                cost_i.min((limit - used).max(0))
            } else if used + cost_i <= limit {
                cost_i
            } else {
                0
            };
            let remaining = (limit - used - granted).max(0);
            let mut after = live.clone();
            if granted > 0 {
                after.push((now, granted as u128));
            }
            let w = i128::from(p.window_ms) * 1000;
            let retry = if granted == cost_i {
                0
            } else if cost_i > limit {
                -1
            } else {
                let excess = used + granted + cost_i - limit;
                assert!(excess > 0);
                let mut acc = 0i128;
                let mut found = None;
                for &(t, u) in &after {
                    acc += u as i128;
                    if acc >= excess {
                        found = Some(t);
                        break;
                    }
                }
                let t = found.expect("model: the walk must reach the excess");
                ceil_ms(i128::from(t) + w - i128::from(now_real))
            };
            let reset = match after.last() {
                Some(&(t, _)) => ceil_ms(i128::from(t) + w - i128::from(now_real)),
                None => 0,
            };
            Decision {
                granted: granted as u64,
                limit: p.limit,
                remaining: remaining as u64,
                retry_after_ms: retry as i64,
                reset_after_ms: reset as u64,
            }
        }

        fn grant(&mut self, window_ms: u64, units: u64, now: u64) {
            let now = self.now_eff(now);
            match self.log.last_mut() {
                Some((t, u)) if *t == now => *u += u128::from(units),
                _ => self.log.push((now, u128::from(units))),
            }
            self.log.retain(|&(t, _)| Self::in_window(t, now, window_ms));
        }

        fn entries(&self) -> Vec<(u64, u64)> {
            self.log.iter().map(|&(t, u)| (t, u as u64)).collect()
        }
    }

    // ---------------------------------------------------------------
    // Invariants (what `decode` enforces, plus the memory bounds).
    // ---------------------------------------------------------------

    impl State {
        fn check_invariants(&self) {
            if self.len == 0 {
                assert_eq!(self.total, 0);
                assert_eq!(self.buf.len(), self.head * self.wn());
                return;
            }
            assert!(matches!(self.words, 1 | 2 | 4), "words {}", self.words);
            if self.words == 4 {
                assert_eq!(self.cbits, 64);
            } else {
                assert!(u32::from(self.cbits) <= 32 * u32::from(self.words));
                assert!(dbits_of(self.words, self.cbits) <= 64);
            }
            assert_eq!(self.buf.len(), (self.head + self.len) * self.wn());
            let es: Vec<(u64, u64)> = self.entries().collect();
            assert_eq!(es.len(), self.len);
            assert_eq!(es[0].0, self.head_time);
            assert_eq!(es[es.len() - 1].0, self.tail_time);
            let mut sum = 0u128;
            for (i, &(t, c)) in es.iter().enumerate() {
                assert!(c >= 1);
                if i > 0 {
                    assert!(t > es[i - 1].0, "times strictly increasing");
                    assert_eq!(self.raw(self.head + i).0, t - es[i - 1].0, "delta exact");
                }
                sum += u128::from(c);
            }
            assert_eq!(sum, u128::from(self.total));
            // Raw count field never holds u64::MAX (count would be 2^64).
            for idx in self.head..self.head + self.len {
                assert_ne!(unpack(self.cbits, self.load(idx)).1, u64::MAX);
            }
        }

        /// The bound every grant leaves: capacity ≤ 2 × (len + 1) entries.
        fn check_capacity(&self) {
            if self.len > 0 {
                assert!(
                    self.cap_entries() <= 2 * (self.len + 1),
                    "capacity {} entries for {} live",
                    self.cap_entries(),
                    self.len
                );
            }
        }

        fn entry_vec(&self) -> Vec<(u64, u64)> {
            self.entries().collect()
        }
    }

    fn enc(s: &State) -> Vec<u8> {
        let mut v = Vec::new();
        s.encode(&mut v);
        v
    }

    /// Proptest case counts are sized for optimized builds (`cargo test
    /// --release`, ~30 s on one core); unoptimized builds run a tenth.
    const fn scaled(cases: u32) -> u32 {
        if cfg!(debug_assertions) {
            cases / 10
        } else {
            cases
        }
    }

    fn moved() -> u64 {
        MOVED.with(|m| m.get())
    }

    const MS: u64 = 1000;

    // ---------------------------------------------------------------
    // Unit tests with hand-computed answers.
    // ---------------------------------------------------------------

    fn call(s: &mut State, p: Params, cost: u64, partial: bool, now: u64) -> Decision {
        let d = decide(s, &p, cost, partial, now);
        if d.granted > 0 {
            grant(s, p.window_ms, d.granted, now);
        }
        d
    }

    #[test]
    fn default_is_empty_and_unallocated() {
        let s = State::default();
        assert!(s.is_empty());
        assert_eq!(s.heap_bytes(), 0);
        assert_eq!(fresh_at_us(&s, 1000), None);
        assert_eq!(enc(&s), vec![1, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(State::decode(&enc(&s)), Ok(State::default()));
        let p = Params { limit: 5, window_ms: 1000 };
        assert_eq!(
            decide(&s, &p, 0, false, 123),
            Decision { granted: 0, limit: 5, remaining: 5, retry_after_ms: 0, reset_after_ms: 0 }
        );
    }

    #[test]
    fn basic_sequence_hand_computed() {
        let p = Params { limit: 3, window_ms: 1000 };
        let mut s = State::default();
        let t0 = 1_000_000_000;
        let d = call(&mut s, p, 1, false, t0);
        assert_eq!(d, Decision { granted: 1, limit: 3, remaining: 2, retry_after_ms: 0, reset_after_ms: 1000 });
        let d = call(&mut s, p, 1, false, t0 + 200 * MS);
        assert_eq!(d, Decision { granted: 1, limit: 3, remaining: 1, retry_after_ms: 0, reset_after_ms: 1000 });
        // Cost 2 does not fit: the first grant (t0) must leave, at t0 + 1000 ms.
        let d = call(&mut s, p, 2, false, t0 + 500 * MS);
        assert_eq!(d, Decision { granted: 0, limit: 3, remaining: 1, retry_after_ms: 500, reset_after_ms: 700 });
        // Partial: grants the 1 left; then the same call needs 2 more units
        // to leave: t0 (1) and t0+200ms (1) → at t0 + 1200 ms, 700 ms away.
        let d = call(&mut s, p, 2, true, t0 + 500 * MS);
        assert_eq!(d, Decision { granted: 1, limit: 3, remaining: 0, retry_after_ms: 700, reset_after_ms: 1000 });
        // Rounds up: 1 µs past the ms boundary.
        let d = decide(&s, &p, 1, false, t0 + 500 * MS + 1);
        assert_eq!(d.retry_after_ms, 500);
        assert_eq!(d.reset_after_ms, 1000);
        // Exactly when t0 leaves the window (t = now − W is out), one unit frees.
        let d = decide(&s, &p, 1, false, t0 + 1000 * MS);
        assert_eq!(d.granted, 1);
        let d = decide(&s, &p, 1, false, t0 + 1000 * MS - 1);
        assert_eq!((d.granted, d.retry_after_ms), (0, 1));
        // COST over the limit: never.
        let d = decide(&s, &p, 4, false, t0 + 600 * MS);
        assert_eq!((d.granted, d.retry_after_ms, d.remaining), (0, -1, 0));
        // COST 0 reports without granting.
        let d = decide(&s, &p, 0, true, t0 + 600 * MS);
        assert_eq!(d, Decision { granted: 0, limit: 3, remaining: 0, retry_after_ms: 0, reset_after_ms: 900 });
        assert_eq!(fresh_at_us(&s, 1000), Some(t0 + 1500 * MS));
        // After the window everything is fresh again.
        let d = decide(&s, &p, 3, false, t0 + 1500 * MS);
        assert_eq!(d, Decision { granted: 3, limit: 3, remaining: 0, retry_after_ms: 0, reset_after_ms: 1000 });
        let d = decide(&s, &p, 0, false, t0 + 1500 * MS);
        assert_eq!(d.reset_after_ms, 0);
    }

    #[test]
    fn limit_lowered_and_window_changed() {
        let mut s = State::default();
        let big = Params { limit: 10, window_ms: 1000 };
        for i in 0..8 {
            call(&mut s, big, 1, false, i * 10 * MS);
        }
        // Limit lowered to 5 while 8 are used: remaining 0, partial grants 0.
        let small = Params { limit: 5, window_ms: 1000 };
        let d = decide(&s, &small, 3, true, 100 * MS);
        assert_eq!((d.granted, d.remaining), (0, 0));
        // Needs 8 + 3 − 5 = 6 entries to leave: the 6th (t = 50 ms) leaves at 1050 ms.
        assert_eq!(d.retry_after_ms, 950);
        // Window shortened to 30 ms: only t = 50, 60, 70 ms are in (now 75 ms).
        let short = Params { limit: 10, window_ms: 30 };
        let d = decide(&s, &short, 0, false, 75 * MS);
        assert_eq!((d.remaining, d.reset_after_ms), (7, 25));
        // A grant under the short window trims the rest.
        call(&mut s, short, 1, false, 75 * MS);
        assert_eq!(s.entry_vec(), vec![(50 * MS, 1), (60 * MS, 1), (70 * MS, 1), (75 * MS, 1)]);
        s.check_invariants();
    }

    #[test]
    fn same_microsecond_merges_and_clock_back_counts_as_zero() {
        let p = Params { limit: 1000, window_ms: 1000 };
        let mut s = State::default();
        call(&mut s, p, 5, false, 1_000_000);
        call(&mut s, p, 7, false, 1_000_000);
        assert_eq!(s.entry_vec(), vec![(1_000_000, 12)]);
        // Clock steps back: the grant is recorded at the newest time.
        call(&mut s, p, 1, false, 10);
        assert_eq!(s.entry_vec(), vec![(1_000_000, 13)]);
        // Waits are measured from the real clock: the newest entry leaves
        // the window 2 s after the clock reading 0.
        let d = decide(&s, &p, 0, false, 0);
        assert_eq!((d.remaining, d.reset_after_ms), (987, 2000));
        let d = decide(&s, &p, 988, false, 400_000);
        assert_eq!((d.granted, d.retry_after_ms, d.reset_after_ms), (0, 1600, 1600));
        let d = decide(&s, &p, 1, false, 400_000);
        assert_eq!((d.granted, d.retry_after_ms, d.reset_after_ms), (1, 0, 1600));
        // A big count widens the count field without splitting the entry.
        call(&mut s, Params { limit: MAX_ARG, window_ms: 1000 }, MAX_ARG - 13, false, 1_000_000);
        assert_eq!(s.entry_vec(), vec![(1_000_000, MAX_ARG)]);
        s.check_invariants();
    }

    #[test]
    fn boundary_minute() {
        // 100 per 60 s; 100 grants in the last 100 ms of the first minute,
        // 100 attempts in the first 100 ms of the next: all denied.
        let p = Params { limit: 100, window_ms: 60_000 };
        let mut s = State::default();
        let minute = 1_700_000_040_000_000u64; // a multiple of 60 s in µs
        for i in 0..100 {
            let d = call(&mut s, p, 1, false, minute - 100_000 + i * 1000);
            assert_eq!(d.granted, 1);
        }
        for i in 0..100 {
            let now = minute + i * 1000;
            let d = call(&mut s, p, 1, false, now);
            assert_eq!(d.granted, 0, "attempt {i} after the boundary");
            assert_eq!(d.remaining, 0);
            // The oldest grant leaves 60 s after it was made.
            let oldest = minute - 100_000;
            assert_eq!(d.retry_after_ms as u64, (oldest + 60_000_000 - now).div_ceil(1000));
        }
        // Exactly one window after the first grant, one unit is free again.
        let d = decide(&s, &p, 2, false, minute - 100_000 + 60_000_000);
        assert_eq!((d.granted, d.retry_after_ms), (0, 1));
        let d = decide(&s, &p, 1, false, minute - 100_000 + 60_000_000);
        assert_eq!(d.granted, 1);
    }

    #[test]
    fn encoding_layout_exact_bytes() {
        // Entries (1000 µs, 1) and (1500 µs, 3): widest delta 500 (9 bits),
        // widest count−1 = 2 (2 bits) → canonical format words 1, cbits 2.
        let mut s = State::default();
        grant(&mut s, 1000, 1, 1000);
        grant(&mut s, 1000, 3, 1500);
        let mut expect = vec![1u8];
        expect.extend_from_slice(&2u64.to_le_bytes());
        expect.extend_from_slice(&1000u64.to_le_bytes());
        expect.extend_from_slice(&[1, 2]);
        expect.extend_from_slice(&0u32.to_le_bytes()); // delta 0, count 1
        expect.extend_from_slice(&((500u32 << 2) | 2).to_le_bytes()); // delta 500, count 3
        assert_eq!(enc(&s), expect);
        assert_eq!(State::decode(&expect), Ok(s.clone()));

        // Rejections.
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = expect.clone();
            f(&mut b);
            State::decode(&b)
        };
        assert_eq!(State::decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(bad(&|b| b[0] = 2), Err(DecodeError::UnknownVersion));
        assert_eq!(bad(&|b| b.push(0)), Err(DecodeError::TrailingBytes));
        assert_eq!(
            bad(&|b| {
                b.pop();
            }),
            Err(DecodeError::Truncated)
        );
        assert_eq!(bad(&|b| b[17] = 3), Err(DecodeError::Invalid("entry width")));
        assert_eq!(bad(&|b| b[18] = 33), Err(DecodeError::Invalid("count bits")));
        assert_eq!(bad(&|b| b[18] = 3), Err(DecodeError::Invalid("entry format not canonical")));
        assert_eq!(bad(&|b| b[19] = 4), Err(DecodeError::Invalid("first entry delta")));
        assert_eq!(
            bad(&|b| b[23..27].copy_from_slice(&2u32.to_le_bytes())),
            Err(DecodeError::Invalid("entry times not increasing"))
        );
        // n huge: refused before any allocation.
        assert_eq!(bad(&|b| b[1..9].copy_from_slice(&u64::MAX.to_le_bytes())), Err(DecodeError::Truncated));
        assert_eq!(bad(&|b| b[1..9].copy_from_slice(&(1u64 << 40).to_le_bytes())), Err(DecodeError::Truncated));
        // Time overflow.
        assert_eq!(
            bad(&|b| b[9..17].copy_from_slice(&(u64::MAX - 100).to_le_bytes())),
            Err(DecodeError::Invalid("entry time overflows"))
        );
        // Empty with trailing bytes.
        assert_eq!(State::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(DecodeError::TrailingBytes));
        // 4-word entries: count field of u64::MAX (count 2^64) is refused;
        // two counts summing past u64::MAX too.
        let mut w4 = vec![1u8];
        w4.extend_from_slice(&1u64.to_le_bytes());
        w4.extend_from_slice(&0u64.to_le_bytes());
        w4.extend_from_slice(&[4, 64]);
        w4.extend_from_slice(&u128::from(u64::MAX).to_le_bytes());
        assert_eq!(State::decode(&w4), Err(DecodeError::Invalid("entry count overflows")));
        let mut w4 = vec![1u8];
        w4.extend_from_slice(&2u64.to_le_bytes());
        w4.extend_from_slice(&0u64.to_le_bytes());
        w4.extend_from_slice(&[4, 64]);
        w4.extend_from_slice(&u128::from(u64::MAX - 1).to_le_bytes());
        w4.extend_from_slice(&((u128::from(u64::MAX >> 1) << 64) | 5).to_le_bytes());
        assert_eq!(State::decode(&w4), Err(DecodeError::Invalid("total units overflow")));
    }

    #[test]
    fn wide_formats_round_trip() {
        // Window of ~285,000 years and counts near 2^53: 4-word entries.
        let p = Params { limit: MAX_ARG, window_ms: MAX_ARG };
        let mut s = State::default();
        let mut now = 5u64;
        let mut m = Model::default();
        for (i, cost) in [1u64, MAX_ARG / 4, 3, MAX_ARG / 8, MAX_ARG / 16].into_iter().enumerate() {
            let d = call(&mut s, p, cost, true, now);
            assert_eq!(d, m.decide(&p, cost, true, now));
            m.grant(p.window_ms, d.granted, now);
            now += 1u64 << (50 + i);
            s.check_invariants();
        }
        assert_eq!(s.words, 4);
        assert_eq!(s.entry_vec(), m.entries());
        let e = enc(&s);
        assert_eq!(e[17], 4);
        assert_eq!(State::decode(&e), Ok(s.clone()));
        // Later everything expires except the newest, and the format narrows.
        let d = call(&mut s, Params { limit: MAX_ARG, window_ms: 1 }, 1, false, u64::MAX);
        assert_eq!(d.granted, 1);
        assert_eq!(s.entry_vec(), vec![(u64::MAX, 1)]);
        assert_eq!(s.words, 1);
        assert!(s.heap_bytes() <= 8);
    }

    // ---------------------------------------------------------------
    // Memory.
    // ---------------------------------------------------------------

    #[test]
    fn memory_1000_grants_in_60s() {
        let p = Params { limit: 1000, window_ms: 60_000 };
        let mut s = State::default();
        let t0 = 1_700_000_000_000_000u64;
        // Pseudo-random distinct times inside 60 s, increasing.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut t = t0;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += 1 + x % 119_000; // ≤ 119 ms apart: 1000 of them fit in 60 s
            let d = call(&mut s, p, 1, false, t);
            assert_eq!(d.granted, 1);
        }
        assert!(t - t0 < 60_000_000);
        assert_eq!(s.len, 1000);
        assert!(s.heap_bytes() <= 7000, "heap {}", s.heap_bytes());
        assert!(s.heap_bytes() <= 8 * 1000);
        s.check_invariants();
        // After the window passes, one more grant: back to a single entry.
        call(&mut s, p, 1, false, t + 60_000_000);
        assert_eq!(s.len, 1);
        assert!(s.heap_bytes() <= 8, "heap {}", s.heap_bytes());
    }

    #[test]
    fn cost_n_costs_the_same_as_cost_1() {
        let heap = |cost: u64| {
            let p = Params { limit: 1_000_000, window_ms: 60_000 };
            let mut s = State::default();
            for i in 0..1000u64 {
                assert_eq!(call(&mut s, p, cost, false, 1_000_000 + i * 59_000).granted, cost);
            }
            s.heap_bytes()
        };
        let one = heap(1);
        assert!(one <= 7000);
        assert_eq!(heap(50), one);
        assert_eq!(heap(64), one);
    }

    #[test]
    fn memory_proportional_to_live_entries() {
        // A limit of a million per hour reserves nothing up front.
        let p = Params { limit: 1_000_000, window_ms: 3_600_000 };
        let mut s = State::default();
        for i in 0..10 {
            call(&mut s, p, 1, false, i * 1_000_000);
        }
        assert!(s.heap_bytes() <= 10 * 8, "heap {}", s.heap_bytes());
        // 1000 grants spread evenly over an hour still fit 4-byte entries.
        let mut s = State::default();
        for i in 0..1000 {
            call(&mut s, p, 1, false, i * 3_599_000);
        }
        assert_eq!(s.words, 1);
        assert!(s.heap_bytes() <= 7000, "heap {}", s.heap_bytes());
        // Grow to 20,000 live entries, then let the rate drop: the capacity
        // follows the live entries down.
        let p = Params { limit: 1_000_000, window_ms: 1000 };
        let mut s = State::default();
        let mut now = 0;
        for _ in 0..20_000 {
            now += 50;
            call(&mut s, p, 1, false, now);
        }
        assert_eq!(s.len, 20_000);
        let peak = s.heap_bytes();
        for _ in 0..200 {
            now += 50_000;
            call(&mut s, p, 1, false, now);
            s.check_capacity();
        }
        assert!(s.len <= 21);
        assert!(s.heap_bytes() * 100 < peak, "{} vs {}", s.heap_bytes(), peak);
    }

    #[test]
    fn trimming_and_appending_are_amortized_o1() {
        // Steady state: ~1000 live entries, 200,000 grants; also a
        // bursty pattern and a limit change. Entries moved stay O(grants).
        let before = moved();
        let p = Params { limit: 1_000_000, window_ms: 60 };
        let mut s = State::default();
        let mut now = 1u64;
        let mut grants = 0u64;
        for i in 0..200_000u64 {
            now += 60 + (i % 7);
            if call(&mut s, p, 1 + i % 3, false, now).granted > 0 {
                grants += 1;
            }
            if i % 50_000 == 0 {
                s.check_invariants();
                s.check_capacity();
            }
        }
        for burst in 0..200u64 {
            for j in 0..500 {
                now += 1 + (j % 5);
                call(&mut s, p, 1, false, now);
                grants += 1;
            }
            now += 30_000 + burst * 100;
        }
        let moved = moved() - before;
        assert!(moved <= 6 * grants, "moved {moved} entries for {grants} grants");
    }

    // ---------------------------------------------------------------
    // Extremes.
    // ---------------------------------------------------------------

    /// Runs a call sequence against the state and the model and checks the
    /// limit is never exceeded within any window.
    fn run_against_model(steps: &[(Params, u64, bool, u64)]) {
        let mut s = State::default();
        let mut m = Model::default();
        for &(p, cost, partial, now) in steps {
            let d = decide(&s, &p, cost, partial, now);
            assert_eq!(d, m.decide(&p, cost, partial, now), "at {now} {p:?} cost {cost} partial {partial}");
            assert!(d.granted <= cost);
            if d.granted > 0 {
                grant(&mut s, p.window_ms, d.granted, now);
                m.grant(p.window_ms, d.granted, now);
                let eff = m.now_eff(now);
                let in_win: u128 =
                    m.log.iter().filter(|&&(t, _)| Model::in_window(t, eff, p.window_ms)).map(|&(_, u)| u).sum();
                assert!(in_win <= u128::from(p.limit), "limit exceeded");
            }
            s.check_invariants();
            assert_eq!(s.entry_vec(), m.entries());
            assert_eq!(State::decode(&enc(&s)), Ok(s.clone()));
        }
    }

    #[test]
    fn extremes() {
        let vals = [1, 2, MAX_ARG - 1, MAX_ARG];
        let costs = [0, 1, 2, MAX_ARG - 1, MAX_ARG];
        let times = [0, 1, 999, 1000, u64::MAX / 2, u64::MAX - 1_000_001, u64::MAX - 1, u64::MAX];
        for &limit in &vals {
            for &window_ms in &vals {
                let p = Params { limit, window_ms };
                let mut steps = Vec::new();
                for &cost in &costs {
                    for &now in &times {
                        for partial in [false, true] {
                            steps.push((p, cost, partial, now));
                        }
                    }
                }
                // Forward, then stepping back, then forward again.
                let mut rev = steps.clone();
                rev.reverse();
                steps.extend(rev);
                steps.extend((0..200u64).map(|i| (p, 1 + i % 2, i % 3 == 0, i * 400)));
                run_against_model(&steps);
            }
        }
        // Arbitrary replay inputs: no panic, invariants kept.
        let mut s = State::default();
        for &(w, u, t) in &[
            (0u64, 1u64, 5u64),
            (0, u64::MAX, 5),
            (u64::MAX, u64::MAX, 0),
            (u64::MAX, 1, u64::MAX),
            (1, u64::MAX, u64::MAX),
            (u64::MAX, 7, 3),
            (u64::MAX, u64::MAX, u64::MAX),
            (0, 0, 0),
            (1, 1, 0),
        ] {
            grant(&mut s, w, u, t);
            s.check_invariants();
            assert_eq!(State::decode(&enc(&s)), Ok(s.clone()));
            let _ = fresh_at_us(&s, w);
            let _ = decide(&s, &Params { limit: u64::MAX, window_ms: u64::MAX }, u64::MAX, true, t);
            let _ = decide(&s, &Params { limit: 0, window_ms: 0 }, u64::MAX, false, t);
        }
        assert_eq!(s.total, u64::MAX);
        assert_eq!(fresh_at_us(&s, u64::MAX), Some(u64::MAX));
    }

    // ---------------------------------------------------------------
    // Property tests against the model.
    // ---------------------------------------------------------------

    #[derive(Clone, Debug)]
    struct Op {
        dt: i64,
        cost: u64,
        partial: bool,
        params: Option<Params>,
    }

    fn params_strategy() -> impl Strategy<Value = Params> {
        (
            prop_oneof![6 => 1u64..=8, 2 => 1u64..=400, 1 => 1u64..=100_000, 1 => Just(MAX_ARG), 1 => 1u64..=MAX_ARG],
            prop_oneof![6 => 1u64..=5, 2 => 1u64..=2000, 1 => Just(MAX_ARG), 1 => 1u64..=MAX_ARG],
        )
            .prop_map(|(limit, window_ms)| Params { limit, window_ms })
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        let dt = prop_oneof![
            3 => Just(0i64),
            6 => 0i64..=300,
            6 => 0i64..=4000,
            2 => -3000i64..0,
            1 => 0i64..=100_000_000,
            1 => 0i64..=(1i64 << 62),
            1 => any::<i64>(),
        ];
        let cost = prop_oneof![
            5 => 0u64..=3,
            3 => 0u64..=12,
            1 => 0u64..=500,
            1 => Just(MAX_ARG),
            1 => 0u64..=MAX_ARG,
        ];
        (dt, cost, any::<bool>(), prop::option::weighted(0.03, params_strategy()))
            .prop_map(|(dt, cost, partial, params)| Op { dt, cost, partial, params })
    }

    fn start_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            0u64..=1_000_000,
            Just(1_700_000_000_000_000u64),
            Just(u64::MAX - 1_000_000),
            Just(u64::MAX),
            any::<u64>(),
        ]
    }

    /// Drives the state `s` (long in-memory history), a copy `r` that is
    /// replaced by decode(encode(r)) after every grant, and the model.
    fn run_ops(start: u64, p0: Params, ops: &[Op]) -> Result<(), TestCaseError> {
        let mut s = State::default();
        let mut r = State::default();
        let mut m = Model::default();
        let mut now = start;
        let mut p = p0;
        for op in ops {
            now = if op.dt >= 0 { now.saturating_add(op.dt as u64) } else { now.saturating_sub(op.dt.unsigned_abs()) };
            if let Some(np) = op.params {
                p = np;
            }
            let want = m.decide(&p, op.cost, op.partial, now);
            let d = decide(&s, &p, op.cost, op.partial, now);
            prop_assert_eq!(d, want, "now {} {:?} cost {} partial {}", now, p, op.cost, op.partial);
            prop_assert_eq!(decide(&r, &p, op.cost, op.partial, now), want);
            prop_assert_eq!(
                d.allowed(op.cost, op.partial),
                if op.partial { d.granted } else { u64::from(d.granted == op.cost) }
            );
            if d.granted > 0 {
                grant(&mut s, p.window_ms, d.granted, now);
                grant(&mut r, p.window_ms, d.granted, now);
                m.grant(p.window_ms, d.granted, now);
                // Never more than the limit inside the window.
                let eff = m.now_eff(now);
                let in_win: u128 =
                    m.log.iter().filter(|&&(t, _)| Model::in_window(t, eff, p.window_ms)).map(|&(_, u)| u).sum();
                prop_assert!(in_win <= u128::from(p.limit));
                s.check_invariants();
                s.check_capacity();
                prop_assert_eq!(s.entry_vec(), m.entries());
                prop_assert_eq!(
                    fresh_at_us(&s, p.window_ms),
                    m.log.last().map(|&(t, _)| t.saturating_add(p.window_ms * 1000))
                );
                let es = enc(&s);
                let er = enc(&r);
                prop_assert_eq!(&es, &er, "canonical encoding independent of history");
                let back = State::decode(&er);
                prop_assert_eq!(back.as_ref(), Ok(&r));
                r = back.unwrap_or_default();
                r.check_invariants();
                prop_assert_eq!(enc(&r), er);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: scaled(20_000),
            failure_persistence: None,
            .. ProptestConfig::default()
        })]

        /// Random sequences (~5 M steps) against the model.
        #[test]
        fn matches_model(start in start_strategy(), p0 in params_strategy(),
                         ops in prop::collection::vec(op_strategy(), 1..500)) {
            run_ops(start, p0, &ops)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: scaled(60),
            failure_persistence: None,
            .. ProptestConfig::default()
        })]

        /// Long logs: many live entries, so the buffer grows, compacts,
        /// shrinks and changes format (~240 k steps, each O(entries)).
        #[test]
        fn matches_model_long_logs(start in start_strategy(),
                                   window_ms in prop_oneof![1u64..=20, 1u64..=100_000, Just(MAX_ARG)],
                                   ops in prop::collection::vec(
                                       (prop_oneof![4 => 0i64..=60, 2 => 0i64..=2000, 1 => -500i64..0,
                                                    1 => 0i64..=50_000, 1 => 0i64..=(1i64 << 40)],
                                        prop_oneof![6 => 1u64..=2, 2 => 0u64..=300, 1 => 0u64..=(1u64 << 40)],
                                        any::<bool>()),
                                       2000..6000)) {
            let p0 = Params { limit: MAX_ARG, window_ms };
            let ops: Vec<Op> = ops.into_iter().map(|(dt, cost, partial)| Op { dt, cost, partial, params: None }).collect();
            run_ops(start, p0, &ops)?;
        }
    }

    // ---------------------------------------------------------------
    // Decoder fuzzing.
    // ---------------------------------------------------------------

    fn accepted_is_canonical(bytes: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(s) = State::decode(bytes) {
            s.check_invariants();
            prop_assert_eq!(enc(&s), bytes.to_vec());
            prop_assert!(s.heap_bytes() <= bytes.len());
            // Usable afterwards.
            let mut s2 = s.clone();
            let p = Params { limit: MAX_ARG, window_ms: 1000 };
            let d = decide(&s2, &p, 1, false, 0);
            if d.granted > 0 {
                grant(&mut s2, p.window_ms, d.granted, 0);
                s2.check_invariants();
            }
        }
        Ok(())
    }

    fn valid_encoding() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec((0u64..=5000, prop_oneof![1u64..=3, 1u64..=MAX_ARG], 1u64..=MAX_ARG), 0..40).prop_map(
            |gs| {
                let mut s = State::default();
                let mut now = 0u64;
                for (dt, units, window_ms) in gs {
                    now = now.wrapping_add(dt.wrapping_mul(dt).wrapping_mul(dt));
                    grant(&mut s, window_ms, units, now);
                }
                enc(&s)
            },
        )
    }

    #[derive(Clone, Debug)]
    enum Mutation {
        Set(usize, u8),
        Flip(usize, u8),
        Truncate(usize),
        Insert(usize, u8),
        Remove(usize),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
            (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
            any::<usize>().prop_map(Mutation::Truncate),
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
            any::<usize>().prop_map(Mutation::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: scaled(20_000),
            failure_persistence: None,
            .. ProptestConfig::default()
        })]

        #[test]
        fn decode_random_bytes(mut bytes in prop::collection::vec(any::<u8>(), 0..80), v in 0u8..3) {
            // Bias towards a plausible header.
            if let Some(b) = bytes.first_mut() {
                if v > 0 { *b = 1; }
            }
            if v == 2 && bytes.len() >= 19 {
                let n = (bytes.len() as u64 - 19) / 4;
                bytes[1..9].copy_from_slice(&n.to_le_bytes());
                bytes[17] = 1;
                bytes[18] %= 33;
            }
            accepted_is_canonical(&bytes)?;
        }

        #[test]
        fn decode_mutated(bytes in valid_encoding(), muts in prop::collection::vec(mutation(), 0..4)) {
            // The unmutated encoding is accepted and canonical.
            prop_assert!(State::decode(&bytes).is_ok());
            accepted_is_canonical(&bytes)?;
            let mut b = bytes.clone();
            for m in muts {
                let n = b.len().max(1);
                match m {
                    Mutation::Set(i, x) => { if let Some(y) = b.get_mut(i % n) { *y = x; } }
                    Mutation::Flip(i, bit) => { if let Some(y) = b.get_mut(i % n) { *y ^= 1 << bit; } }
                    Mutation::Truncate(i) => b.truncate(i % n),
                    Mutation::Insert(i, x) => { let at = i % (b.len() + 1); b.insert(at, x); }
                    Mutation::Remove(i) => { if !b.is_empty() { let at = i % b.len(); b.remove(at); } }
                }
                accepted_is_canonical(&b)?;
            }
        }
    }
}
