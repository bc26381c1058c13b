//! Argument parsing for the commands. Pure: works on byte slices, so it is
//! unit-tested and fuzzed without a server. Errors name the argument
//! ([`Arg`]); the module maps each to its static reply text.
//!
//! ```text
//! RL.TOKENBUCKET    key capacity rate period_ms [COST n] [PARTIAL] [DRYRUN] [REFUND n]
//! RL.SLIDINGLOG     key limit    window_ms      [COST n] [PARTIAL] [DRYRUN] [REFUND n]
//! RL.SLIDINGCOUNTER key limit    window_ms      [COST n] [PARTIAL] [DRYRUN] [REFUND n]
//! RL.MULTI numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL] [DRYRUN] [REFUND n]
//!   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
//!          | SLIDINGLOG limit window_ms [WEIGHT w]
//!          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
//! ```
//!
//! `REFUND n` excludes COST, PARTIAL and DRYRUN (a syntax error).

use crate::MAX_ARG;

/// The parsed arguments after the key. `nums` holds the positional numbers
/// (`capacity rate period_ms`, or `limit window_ms` and a 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub nums: [u64; 3],
    pub cost: u64,
    pub partial: bool,
    pub dryrun: bool,
    /// `REFUND n` (then COST, PARTIAL and DRYRUN are absent); 0 when none.
    pub refund: u64,
}

/// A numeric argument, as named in error replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Capacity,
    Rate,
    PeriodMs,
    Limit,
    WindowMs,
    /// The value of the COST option (the only one that may be 0).
    Cost,
    /// The value of the REFUND option.
    Refund,
    /// RL.MULTI's `numkeys` (1 to [`MAX_LIMITS`]).
    NumKeys,
    /// The value of a limit's WEIGHT option in RL.MULTI.
    Weight,
}

impl Arg {
    /// The name the documentation and error replies use.
    pub const fn name(self) -> &'static str {
        match self {
            Arg::Capacity => "capacity",
            Arg::Rate => "rate",
            Arg::PeriodMs => "period_ms",
            Arg::Limit => "limit",
            Arg::WindowMs => "window_ms",
            Arg::Cost => "COST",
            Arg::Refund => "REFUND",
            Arg::NumKeys => "numkeys",
            Arg::Weight => "WEIGHT",
        }
    }
    /// Smallest accepted value (the largest is [`MAX_ARG`], for numkeys
    /// [`MAX_LIMITS`]).
    pub const fn min(self) -> u64 {
        match self {
            Arg::Cost => 0,
            _ => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// Too few arguments: Redis's standard arity error.
    Arity,
    /// A number out of range or not an integer.
    Number(Arg),
    /// Unknown or repeated option, or COST without a value.
    Syntax,
    /// RL.MULTI: the number of limits differs from numkeys.
    LimitCount,
    /// RL.MULTI: a key named twice.
    DuplicateKey,
    /// RL.MULTI: COST × WEIGHT (`Arg::Cost`) or REFUND × WEIGHT
    /// (`Arg::Refund`) above 2^53 − 1 for some limit.
    Product(Arg),
}

/// Positional numeric arguments of each command.
pub const TOKENBUCKET_ARGS: &[Arg] = &[Arg::Capacity, Arg::Rate, Arg::PeriodMs];
pub const WINDOW_ARGS: &[Arg] = &[Arg::Limit, Arg::WindowMs];

/// Parse a decimal integer in `min..=MAX_ARG`: ASCII digits only (no sign,
/// no spaces, no leading `+`), at most 16 digits so it cannot overflow.
#[inline(always)]
pub fn parse_num(s: &[u8], min: u64) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    let mut rest = s;
    // Eight digits at a time (a capacity like 1000000000 is ten).
    // At most 16 digits: v < 10^16 < 2^64 throughout, so the wrapping
    // operations never wrap (and cost no overflow check).
    while let Some((chunk, r)) = rest.split_first_chunk::<8>() {
        v = v.wrapping_mul(100_000_000).wrapping_add(eight_digits(*chunk)?);
        rest = r;
    }
    // Then four at a time (a period like 3600000 is seven).
    if let Some((chunk, r)) = rest.split_first_chunk::<4>() {
        v = v.wrapping_mul(10_000).wrapping_add(four_digits(*chunk)?);
        rest = r;
    }
    for &b in rest {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.wrapping_mul(10).wrapping_add(u64::from(d));
    }
    if v < min || v > MAX_ARG {
        None
    } else {
        Some(v)
    }
}

/// The value of eight ASCII digits (the first the most significant), or
/// None when any byte is not one, computed on the eight bytes at once: a
/// byte is a digit exactly when its high nibble is 3 and stays 3 after
/// adding 6; then pairs, quads and the halves are combined, every lane
/// staying below its width (99, 9999, 99999999), so nothing carries.
#[inline(always)]
fn eight_digits(chunk: [u8; 8]) -> Option<u64> {
    const HIGH: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    let v = u64::from_le_bytes(chunk);
    if v & HIGH != ZEROS || v.wrapping_add(0x0606_0606_0606_0606) & HIGH != ZEROS {
        return None;
    }
    let x = v - ZEROS;
    let x = (x.wrapping_mul(10) + (x >> 8)) & 0x00FF_00FF_00FF_00FF;
    let x = (x.wrapping_mul(100) + (x >> 16)) & 0x0000_FFFF_0000_FFFF;
    Some((x.wrapping_mul(10_000) + (x >> 32)) & 0xFFFF_FFFF)
}

/// [`eight_digits`] of four ASCII digits.
#[inline(always)]
fn four_digits(chunk: [u8; 4]) -> Option<u64> {
    const HIGH: u32 = 0xF0F0_F0F0;
    const ZEROS: u32 = 0x3030_3030;
    let v = u32::from_le_bytes(chunk);
    if v & HIGH != ZEROS || v.wrapping_add(0x0606_0606) & HIGH != ZEROS {
        return None;
    }
    let x = v - ZEROS;
    let x = (x.wrapping_mul(10) + (x >> 8)) & 0x00FF_00FF;
    Some(u64::from((x.wrapping_mul(100) + (x >> 16)) & 0xFFFF))
}

/// Parse `args` = every argument after the key. `positional` lists the
/// numeric arguments the command takes (2 or 3).
pub fn parse<'a>(args: impl ExactSizeIterator<Item = &'a [u8]>, positional: &[Arg]) -> Result<Call, ArgError> {
    let mut args = args;
    if args.len() < positional.len() {
        return Err(ArgError::Arity);
    }
    let mut call = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false, refund: 0 };
    for (i, &arg) in positional.iter().enumerate() {
        let a = args.next().ok_or(ArgError::Arity)?;
        let v = parse_num(a, arg.min()).ok_or(ArgError::Number(arg))?;
        if let Some(slot) = call.nums.get_mut(i) {
            *slot = v;
        }
    }
    let mut seen_cost = false;
    while let Some(opt) = args.next() {
        if !option(opt, &mut args, &mut call, &mut seen_cost)? {
            return Err(ArgError::Syntax);
        }
    }
    Ok(call)
}

/// [`parse`] of a call that gives only the positional numbers
/// (`nums.len() == positional.len()`, no options: the common call), with the
/// same result: nothing to read but the numbers. The module takes this path
/// when the argument count says there are no options.
#[inline(always)]
pub fn parse_exact(nums: &[&[u8]], positional: &[Arg]) -> Result<Call, ArgError> {
    if nums.len() != positional.len() {
        return parse(nums.iter().copied(), positional);
    }
    let mut call = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false, refund: 0 };
    for ((s, &arg), slot) in nums.iter().zip(positional).zip(call.nums.iter_mut()) {
        *slot = parse_num(s, arg.min()).ok_or(ArgError::Number(arg))?;
    }
    Ok(call)
}

/// Parse one of the options COST n, PARTIAL, DRYRUN, REFUND n into `call`;
/// `Ok(false)` when `opt` is none of them, repeated, or REFUND combined
/// with the others (a syntax error).
#[inline]
fn option<'a>(
    opt: &[u8],
    args: &mut impl Iterator<Item = &'a [u8]>,
    call: &mut Call,
    seen_cost: &mut bool,
) -> Result<bool, ArgError> {
    let refund = call.refund > 0;
    if opt.eq_ignore_ascii_case(b"COST") && !*seen_cost && !refund {
        *seen_cost = true;
        let v = args.next().ok_or(ArgError::Syntax)?;
        call.cost = parse_num(v, Arg::Cost.min()).ok_or(ArgError::Number(Arg::Cost))?;
    } else if opt.eq_ignore_ascii_case(b"PARTIAL") && !call.partial && !refund {
        call.partial = true;
    } else if opt.eq_ignore_ascii_case(b"DRYRUN") && !call.dryrun && !refund {
        call.dryrun = true;
    } else if opt.eq_ignore_ascii_case(b"REFUND") && !refund && !*seen_cost && !call.partial && !call.dryrun {
        let v = args.next().ok_or(ArgError::Syntax)?;
        call.refund = parse_num(v, Arg::Refund.min()).ok_or(ArgError::Number(Arg::Refund))?;
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// The algorithm a limit of RL.MULTI names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TokenBucket,
    SlidingLog,
    SlidingCounter,
}

impl Kind {
    /// The algorithm `w` names, case-insensitively: one comparison, picked
    /// by the length (the three names differ in length).
    #[inline]
    pub fn from_word(w: &[u8]) -> Option<Kind> {
        let (name, kind): (&[u8], Kind) = match w.len() {
            11 => (b"TOKENBUCKET", Kind::TokenBucket),
            10 => (b"SLIDINGLOG", Kind::SlidingLog),
            14 => (b"SLIDINGCOUNTER", Kind::SlidingCounter),
            _ => return None,
        };
        eq_upper_letters(w, name).then_some(kind)
    }
    /// Its positional numeric arguments.
    pub const fn args(self) -> &'static [Arg] {
        match self {
            Kind::TokenBucket => TOKENBUCKET_ARGS,
            Kind::SlidingLog | Kind::SlidingCounter => WINDOW_ARGS,
        }
    }
}

/// One limit of RL.MULTI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub kind: Kind,
    /// As in [`Call::nums`].
    pub nums: [u64; 3],
    pub weight: u64,
}

impl LimitSpec {
    /// The limit's algorithm parameters (from its kind and numbers).
    #[inline]
    pub const fn params(&self) -> crate::multi::Params {
        use crate::multi::Params;
        use crate::{slidingcounter as sc, slidinglog as sl, tokenbucket as tb};
        match self.kind {
            Kind::TokenBucket => Params::TokenBucket(tb::Params::from_nums(self.nums)),
            Kind::SlidingLog => Params::SlidingLog(sl::Params::from_nums(self.nums)),
            Kind::SlidingCounter => Params::SlidingCounter(sc::Params::from_nums(self.nums)),
        }
    }
}

/// Most limits (and keys) one RL.MULTI call may name.
pub const MAX_LIMITS: usize = crate::multi::MAX_LIMITS;

/// A parsed RL.MULTI call. The keys are arguments `1..=n` after the
/// command name; `limits[..n]` their limits. `N` is the room for limits
/// ([`parse_multi_n`] with a small `N` serves the common calls of a few
/// limits without building and copying sixteen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiCall<const N: usize = MAX_LIMITS> {
    pub n: usize,
    pub limits: [LimitSpec; N],
    pub cost: u64,
    pub partial: bool,
    pub dryrun: bool,
    /// `REFUND n` (then COST, PARTIAL and DRYRUN are absent), 0 when none.
    pub refund: u64,
}

/// `w` equals `upper` (ASCII capital letters only) ignoring case: a byte
/// with bit 5 cleared is a capital letter exactly when it is that letter in
/// either case, so this is `eq_ignore_ascii_case` for such names, eight
/// bytes at a time.
#[inline]
fn eq_upper_letters(w: &[u8], upper: &[u8]) -> bool {
    if w.len() != upper.len() {
        return false;
    }
    // Eight to sixteen bytes (the algorithm names): the first eight and the
    // last eight, overlapping.
    if let (Some((x0, _)), Some((_, x1)), Some((y0, _)), Some((_, y1))) = (
        w.split_first_chunk::<8>(),
        w.split_last_chunk::<8>(),
        upper.split_first_chunk::<8>(),
        upper.split_last_chunk::<8>(),
    ) {
        if w.len() <= 16 {
            const CASE: u64 = 0xDFDF_DFDF_DFDF_DFDF;
            return u64::from_le_bytes(*x0) & CASE == u64::from_le_bytes(*y0)
                && u64::from_le_bytes(*x1) & CASE == u64::from_le_bytes(*y1);
        }
    }
    let (mut a, mut b) = (w, upper);
    while a.len() >= 8 {
        let (Some((x, ra)), Some((y, rb))) = (a.split_first_chunk::<8>(), b.split_first_chunk::<8>()) else {
            return false;
        };
        if u64::from_le_bytes(*x) & 0xDFDF_DFDF_DFDF_DFDF != u64::from_le_bytes(*y) {
            return false;
        }
        (a, b) = (ra, rb);
    }
    a.iter().zip(b).all(|(&x, &y)| x & 0xDF == y)
}

fn is_option(w: &[u8]) -> bool {
    [&b"COST"[..], b"PARTIAL", b"DRYRUN", b"REFUND"].iter().any(|o| w.eq_ignore_ascii_case(o))
}

/// Parse `args` = every argument after `RL.MULTI`:
///
/// ```text
/// numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL] [DRYRUN] [REFUND n]
///   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
///          | SLIDINGLOG limit window_ms [WEIGHT w]
///          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
/// ```
///
/// Errors, first found from the left: fewer than 5 arguments → `Arity`; a
/// numkeys outside 1..=16 → `Number(NumKeys)`; where a limit is expected,
/// the end of the arguments or an option → `LimitCount`, another word →
/// `Syntax`; a limit where an option is expected → `LimitCount`; bad
/// numbers → `Number(..)`; an unknown, repeated or misplaced option (WEIGHT
/// after the options, REFUND with COST, PARTIAL or DRYRUN) → `Syntax`; then
/// a repeated key → `DuplicateKey`, and COST × WEIGHT (or REFUND × WEIGHT)
/// above 2^53 − 1 → `Product`.
pub fn parse_multi<'a>(args: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<MultiCall, ArgError> {
    parse_multi_n::<MAX_LIMITS>(args)
}

/// [`parse_multi_n`] of the common call: valid limits without WEIGHT, no
/// options, distinct keys (`args` is every argument after `RL.MULTI`).
/// Then it returns what `parse_multi_n` does; for any other input (an
/// error, a WEIGHT, an option) it returns None and the caller runs
/// `parse_multi_n`, so errors keep their one definition there.
#[inline(always)]
pub fn parse_multi_exact<const N: usize>(args: &[&[u8]]) -> Option<MultiCall<N>> {
    let (&first, rest) = args.split_first()?;
    let n = usize::try_from(parse_num(first, Arg::NumKeys.min())?).ok()?;
    if n > N || n > MAX_LIMITS {
        return None;
    }
    let (keys, mut rest) = (rest.get(..n)?, rest.get(n..)?);
    let spec = LimitSpec { kind: Kind::TokenBucket, nums: [0; 3], weight: 1 };
    let mut call = MultiCall { n, limits: [spec; N], cost: 1, partial: false, dryrun: false, refund: 0 };
    for limit in call.limits.iter_mut().take(n) {
        let (&word, r) = rest.split_first()?;
        limit.kind = Kind::from_word(word)?;
        let want = limit.kind.args();
        let (nums, r) = (r.get(..want.len())?, r.get(want.len()..)?);
        for ((&a, &arg), slot) in nums.iter().zip(want).zip(limit.nums.iter_mut()) {
            *slot = parse_num(a, arg.min())?;
        }
        rest = r;
    }
    if !rest.is_empty() {
        return None;
    }
    for (i, k) in keys.iter().enumerate() {
        if keys.iter().take(i).any(|prev| prev == k) {
            return None;
        }
    }
    Some(call)
}

/// A limit of the commonest RL.MULTI call: a word-state algorithm (token
/// bucket or sliding counter) of weight 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordLimit {
    TokenBucket(crate::tokenbucket::Params),
    SlidingCounter(crate::slidingcounter::Params),
}

/// [`parse_multi_n`] of the commonest call: token buckets and sliding
/// counters only, no WEIGHT, no options, distinct keys; `args` is every
/// argument after `RL.MULTI`, each read once through `bytes` (the keys only
/// to compare them, when there are two or more). Returns numkeys and the
/// limits, the same as `parse_multi_n` (weights 1, COST 1, no options); for
/// any other input (an error, a sliding log, a WEIGHT, an option) None, and
/// the caller parses it in full, so errors keep their one definition there.
#[inline(always)]
pub fn parse_multi_words<'a, A: Copy, const N: usize>(
    args: &[A],
    bytes: impl Fn(A) -> &'a [u8] + Copy,
) -> Option<(usize, [WordLimit; N])> {
    let (n, limits) = parse_multi_words_unchecked::<A, N>(args, bytes)?;
    distinct_keys(args.get(1..=n)?, bytes).then_some((n, limits))
}

/// [`parse_multi_words`] without the check that the keys are distinct
/// (the keys are not read): the module checks that itself, where the
/// opened keys can tell it without reading their names
/// ([`distinct_keys`] otherwise, before anything is decided).
#[inline(always)]
pub fn parse_multi_words_unchecked<'a, A: Copy, const N: usize>(
    args: &[A],
    bytes: impl Fn(A) -> &'a [u8],
) -> Option<(usize, [WordLimit; N])> {
    use crate::{slidingcounter as sc, tokenbucket as tb};
    let (&first, rest) = args.split_first()?;
    let n = usize::try_from(parse_num(bytes(first), Arg::NumKeys.min())?).ok()?;
    if n > N || n > MAX_LIMITS {
        return None;
    }
    let mut rest = rest.get(n..)?;
    let mut limits = [WordLimit::SlidingCounter(sc::Params { limit: 1, window_ms: 1 }); N];
    for limit in limits.iter_mut().take(n) {
        let (&word, r) = rest.split_first()?;
        let w = bytes(word);
        (*limit, rest) = if w.len() == 11 && eq_upper_letters(w, b"TOKENBUCKET") {
            let [capacity, rate, period_ms, ref r @ ..] = *r else { return None };
            let p = tb::Params {
                capacity: parse_num(bytes(capacity), Arg::Capacity.min())?,
                rate: parse_num(bytes(rate), Arg::Rate.min())?,
                period_ms: parse_num(bytes(period_ms), Arg::PeriodMs.min())?,
            };
            (WordLimit::TokenBucket(p), r)
        } else if w.len() == 14 && eq_upper_letters(w, b"SLIDINGCOUNTER") {
            let [limit, window_ms, ref r @ ..] = *r else { return None };
            let p = sc::Params {
                limit: parse_num(bytes(limit), Arg::Limit.min())?,
                window_ms: parse_num(bytes(window_ms), Arg::WindowMs.min())?,
            };
            (WordLimit::SlidingCounter(p), r)
        } else {
            return None;
        };
    }
    if !rest.is_empty() {
        return None;
    }
    Some((n, limits))
}

/// No key is named twice in `keys` (each read through `bytes`).
#[inline]
pub fn distinct_keys<'a, A: Copy>(keys: &[A], bytes: impl Fn(A) -> &'a [u8]) -> bool {
    match *keys {
        [] | [_] => true,
        [a, b] => bytes(a) != bytes(b),
        _ => keys.iter().enumerate().all(|(i, &k)| {
            let kb = bytes(k);
            keys.iter().take(i).all(|&prev| bytes(prev) != kb)
        }),
    }
}

/// [`parse_multi`] with room for `N` limits: the same result for every
/// input whose numkeys is at most `N`; a larger numkeys (which the caller
/// rules out by reading it first) is `Number(NumKeys)`.
#[inline]
pub fn parse_multi_n<'a, const N: usize>(args: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<MultiCall<N>, ArgError> {
    if args.len() < 5 {
        return Err(ArgError::Arity);
    }
    let mut args = args.peekable();
    let n = args
        .next()
        .and_then(|a| parse_num(a, Arg::NumKeys.min()))
        .filter(|&n| n <= MAX_LIMITS as u64)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= N)
        .ok_or(ArgError::Number(Arg::NumKeys))?;
    let mut keys: [&[u8]; N] = [&[]; N];
    for k in keys.iter_mut().take(n) {
        *k = args.next().ok_or(ArgError::LimitCount)?;
    }
    let spec = LimitSpec { kind: Kind::TokenBucket, nums: [0; 3], weight: 1 };
    let mut call = MultiCall { n, limits: [spec; N], cost: 1, partial: false, dryrun: false, refund: 0 };
    for limit in call.limits.iter_mut().take(n) {
        let word = args.next().ok_or(ArgError::LimitCount)?;
        let kind = match Kind::from_word(word) {
            Some(k) => k,
            None if is_option(word) => return Err(ArgError::LimitCount),
            None => return Err(ArgError::Syntax),
        };
        limit.kind = kind;
        for (&arg, slot) in kind.args().iter().zip(limit.nums.iter_mut()) {
            let a = args.next().ok_or(ArgError::Syntax)?;
            *slot = parse_num(a, arg.min()).ok_or(ArgError::Number(arg))?;
        }
        if args.peek().is_some_and(|w| eq_upper_letters(w, b"WEIGHT")) {
            args.next();
            let a = args.next().ok_or(ArgError::Syntax)?;
            limit.weight = parse_num(a, Arg::Weight.min()).ok_or(ArgError::Number(Arg::Weight))?;
        }
    }
    let mut opts = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false, refund: 0 };
    let mut seen_cost = false;
    while let Some(opt) = args.next() {
        if !option(opt, &mut args, &mut opts, &mut seen_cost)? {
            return Err(if Kind::from_word(opt).is_some() { ArgError::LimitCount } else { ArgError::Syntax });
        }
    }
    (call.cost, call.partial, call.dryrun, call.refund) = (opts.cost, opts.partial, opts.dryrun, opts.refund);
    for (i, k) in keys.iter().enumerate().take(n) {
        if keys.iter().take(i).any(|prev| prev == k) {
            return Err(ArgError::DuplicateKey);
        }
    }
    let (units, which) = if call.refund > 0 { (call.refund, Arg::Refund) } else { (call.cost, Arg::Cost) };
    if call.limits.iter().take(n).any(|l| units.checked_mul(l.weight).is_none_or(|u| u > MAX_ARG)) {
        return Err(ArgError::Product(which));
    }
    Ok(call)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str], pos: &[Arg]) -> Result<Call, ArgError> {
        parse(args.iter().map(|s| s.as_bytes()), pos)
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_num(b"1", 1), Some(1));
        assert_eq!(parse_num(b"0", 1), None);
        assert_eq!(parse_num(b"0", 0), Some(0));
        assert_eq!(parse_num(b"9007199254740991", 1), Some(MAX_ARG));
        assert_eq!(parse_num(b"9007199254740992", 1), None);
        assert_eq!(parse_num(b"99999999999999999999", 1), None);
        for bad in ["", "-1", "+1", " 1", "1 ", "1.0", "1e3", "0x10", "abc", "١"] {
            assert_eq!(parse_num(bad.as_bytes(), 0), None, "{bad}");
        }
        assert_eq!(parse_num(b"0000000000000001", 1), Some(1));
    }

    /// The plain digit loop `parse_num` was: the eight-at-once path must
    /// agree with it on every input.
    fn plain_num(s: &[u8], min: u64) -> Option<u64> {
        if s.is_empty() || s.len() > 16 || !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let v = s.iter().fold(0u64, |v, &b| v * 10 + u64::from(b - b'0'));
        (min..=MAX_ARG).contains(&v).then_some(v)
    }

    #[test]
    fn eight_digits_at_once_agrees_with_the_digit_loop() {
        let bases: [&[u8]; 11] = [
            b"12345678",
            b"9007199254740991",
            b"9007199254740992",
            b"1000000000",
            b"0000000000000000",
            b"99999999",
            b"3600000",
            b"9999",
            b"12345",
            b"123456789012",
            b"900719925474099",
        ];
        for base in bases {
            assert_eq!(parse_num(base, 0), plain_num(base, 0));
            for i in 0..base.len() {
                for b in 0..=255u8 {
                    let mut w = base.to_vec();
                    w[i] = b;
                    assert_eq!(parse_num(&w, 1), plain_num(&w, 1), "{w:?}");
                }
            }
        }
        // Every length, and a pseudo-random sweep of digit strings.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 18) as usize;
            let w: Vec<u8> = (0..len).map(|i| b'0' + ((x >> (i * 3)) % 10) as u8).collect();
            assert_eq!(parse_num(&w, 1), plain_num(&w, 1), "{w:?}");
        }
    }

    /// `parse_multi_exact` (the module's path for RL.MULTI calls without
    /// WEIGHT or options) either declines or answers what `parse_multi_n`
    /// does, and it declines no call of that common shape.
    #[test]
    fn parse_multi_exact_agrees_with_parse_multi() {
        // Calls of the common shape, perturbed: a wrong word or number, a
        // WEIGHT or an option, a duplicate key, a missing or extra word.
        let kinds: [&[u8]; 4] = [b"TOKENBUCKET", b"slidinglog", b"SlidingCounter", b"x"];
        let nums: [&[u8]; 5] = [b"1", b"1000", b"9007199254740991", b"0", b"x"];
        let extra: [&[u8]; 4] = [b"WEIGHT", b"2", b"COST", b"DRYRUN"];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut taken = 0;
        for _ in 0..200_000 {
            let n = 1 + next(2) as usize;
            let mut args: Vec<&[u8]> =
                vec![[&b"1"[..], b"2", b"3", b"0"][if next(8) == 0 { next(4) as usize } else { n - 1 }]];
            for i in 0..n {
                args.push([&b"a"[..], b"b", b"c"][if next(8) == 0 { 0 } else { i }]);
            }
            for _ in 0..n {
                let k = if next(10) == 0 { next(4) } else { next(3) } as usize;
                args.push(kinds[k]);
                for _ in 0..(if k == 0 { 3 } else { 2 }) {
                    args.push(nums[if next(10) == 0 { next(5) } else { next(3) } as usize]);
                }
                if next(10) == 0 {
                    args.push(extra[next(4) as usize]);
                }
            }
            match next(10) {
                0 => {
                    args.pop();
                }
                1 => args.push(extra[next(4) as usize]),
                _ => {}
            }
            let full = parse_multi_n::<2>(args.iter().copied());
            match parse_multi_exact::<2>(&args) {
                Some(c) => {
                    taken += 1;
                    assert_eq!(Ok(c), full, "{args:?}");
                }
                None => {
                    let common = full.is_ok_and(|c| {
                        c.limits[..c.n].iter().all(|l| l.weight == 1)
                            && !args.iter().any(|w| w.eq_ignore_ascii_case(b"WEIGHT") || is_option(w))
                    });
                    assert!(!common, "declined a common call {args:?}");
                }
            }
        }
        assert!(taken > 20_000, "only {taken} calls took the exact path");
        let call: [&[u8]; 6] = [b"1", b"k", b"TOKENBUCKET", b"10", b"1", b"1000"];
        assert_eq!(parse_multi_exact::<1>(&call).map(|c| c.limits[0].nums), Some([10, 1, 1000]));
    }

    /// `parse_multi_words` (the module's fast path for RL.MULTI calls of
    /// token buckets and sliding counters without WEIGHT or options) either
    /// declines or answers what `parse_multi_n` does, and it declines no
    /// call of that shape.
    #[test]
    fn parse_multi_words_agrees_with_parse_multi() {
        use crate::{slidingcounter as sc, tokenbucket as tb};
        let kinds: [&[u8]; 4] = [b"TOKENBUCKET", b"slidingcounter", b"SlidingLog", b"x"];
        let nums: [&[u8]; 5] = [b"1", b"1000", b"9007199254740991", b"0", b"x"];
        let extra: [&[u8]; 4] = [b"WEIGHT", b"2", b"COST", b"DRYRUN"];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut taken = 0;
        for _ in 0..300_000 {
            let n = 1 + next(4) as usize;
            let mut args: Vec<&[u8]> =
                vec![[&b"1"[..], b"2", b"3", b"4", b"0"][if next(8) == 0 { next(5) as usize } else { n - 1 }]];
            for i in 0..n {
                args.push([&b"a"[..], b"b", b"c", b"d"][if next(6) == 0 { next(4) as usize } else { i }]);
            }
            for _ in 0..n {
                let k = if next(10) == 0 { next(4) } else { next(2) } as usize;
                args.push(kinds[k]);
                for _ in 0..(if k == 0 { 3 } else { 2 }) {
                    args.push(nums[if next(10) == 0 { next(5) } else { next(3) } as usize]);
                }
                if next(10) == 0 {
                    args.push(extra[next(4) as usize]);
                }
            }
            match next(10) {
                0 => {
                    args.pop();
                }
                1 => args.push(extra[next(4) as usize]),
                _ => {}
            }
            let full = parse_multi_n::<4>(args.iter().copied());
            let unchecked = parse_multi_words_unchecked::<&[u8], 4>(&args, |a| a);
            let checked = parse_multi_words::<&[u8], 4>(&args, |a| a);
            assert_eq!(checked, unchecked.filter(|&(n, _)| distinct_keys(&args[1..=n], |a| a)), "{args:?}");
            match checked {
                Some((n, limits)) => {
                    taken += 1;
                    let c = full.unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
                    assert_eq!((c.n, c.cost, c.partial, c.dryrun, c.refund), (n, 1, false, false, 0), "{args:?}");
                    for (l, w) in c.limits[..n].iter().zip(&limits[..n]) {
                        let want = match l.kind {
                            Kind::TokenBucket => WordLimit::TokenBucket(tb::Params::from_nums(l.nums)),
                            Kind::SlidingCounter => WordLimit::SlidingCounter(sc::Params::from_nums(l.nums)),
                            Kind::SlidingLog => panic!("a sliding log on the word path {args:?}"),
                        };
                        assert_eq!((l.weight, *w), (1, want), "{args:?}");
                    }
                }
                None => {
                    let common = full.is_ok_and(|c| {
                        c.limits[..c.n].iter().all(|l| l.weight == 1 && l.kind != Kind::SlidingLog)
                            && !args.iter().any(|w| w.eq_ignore_ascii_case(b"WEIGHT") || is_option(w))
                    });
                    assert!(!common, "declined a common call {args:?}");
                }
            }
        }
        assert!(taken > 20_000, "only {taken} calls took the word path");
    }

    /// `parse_exact` (the module's path for a call of numbers only) answers
    /// what `parse` does, the argument an error names included, for every
    /// mix of good and bad numbers; other lengths go to `parse` itself.
    #[test]
    fn parse_exact_agrees_with_parse() {
        let words: [&[u8]; 9] =
            [b"1", b"0", b"1000000000", b"9007199254740991", b"9007199254740992", b"x", b"", b"COST", b"07"];
        for pos in [TOKENBUCKET_ARGS, WINDOW_ARGS] {
            for n in 0..=4usize {
                let combos = words.len().pow(n as u32);
                for mut c in 0..combos {
                    let args: Vec<&[u8]> = (0..n)
                        .map(|_| {
                            let w = words[c % words.len()];
                            c /= words.len();
                            w
                        })
                        .collect();
                    assert_eq!(parse_exact(&args, pos), parse(args.iter().copied(), pos), "{args:?}");
                }
            }
        }
    }

    #[test]
    fn options_any_order_case_insensitive() {
        let c = p(&["10", "1", "1000", "dryrun", "Cost", "5", "PARTIAL"], TOKENBUCKET_ARGS).unwrap();
        assert_eq!(c, Call { nums: [10, 1, 1000], cost: 5, partial: true, dryrun: true, refund: 0 });
        let c = p(&["10", "1000"], WINDOW_ARGS).unwrap();
        assert_eq!(c, Call { nums: [10, 1000, 0], cost: 1, partial: false, dryrun: false, refund: 0 });
    }

    #[test]
    fn errors() {
        assert_eq!(p(&["10", "1"], TOKENBUCKET_ARGS), Err(ArgError::Arity));
        assert_eq!(p(&[], WINDOW_ARGS), Err(ArgError::Arity));
        assert_eq!(p(&["0", "1", "1"], TOKENBUCKET_ARGS), Err(ArgError::Number(Arg::Capacity)));
        assert_eq!(p(&["1", "x", "1"], TOKENBUCKET_ARGS), Err(ArgError::Number(Arg::Rate)));
        assert_eq!(p(&["1", "1", "-5"], TOKENBUCKET_ARGS), Err(ArgError::Number(Arg::PeriodMs)));
        assert_eq!(p(&["1", "1", "COST"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "COST", "1", "COST", "2"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "PARTIAL", "partial"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "DRYRUN", "DRYRUN"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "FOO"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "COST", "9007199254740992"], WINDOW_ARGS), Err(ArgError::Number(Arg::Cost)));
        assert_eq!(p(&["1", "1", "COST", "0"], WINDOW_ARGS).map(|c| c.cost), Ok(0));
    }

    #[test]
    fn refund_excludes_the_other_options() {
        assert_eq!(p(&["1", "1", "refund", "3"], WINDOW_ARGS).map(|c| (c.refund, c.cost)), Ok((3, 1)));
        for bad in [
            &["REFUND", "1", "COST", "1"][..],
            &["COST", "1", "REFUND", "1"],
            &["PARTIAL", "REFUND", "1"],
            &["REFUND", "1", "DRYRUN"],
            &["REFUND", "1", "REFUND", "1"],
            &["REFUND"],
        ] {
            let args: Vec<&str> = ["1", "1"].iter().chain(bad).copied().collect();
            assert_eq!(p(&args, WINDOW_ARGS), Err(ArgError::Syntax), "{bad:?}");
        }
        assert_eq!(p(&["1", "1", "REFUND", "0"], WINDOW_ARGS), Err(ArgError::Number(Arg::Refund)));
        assert_eq!(p(&["1", "1", "REFUND", "9007199254740992"], WINDOW_ARGS), Err(ArgError::Number(Arg::Refund)));
    }

    fn m(args: &str) -> Result<MultiCall, ArgError> {
        let v: Vec<&[u8]> = args.split(' ').filter(|s| !s.is_empty()).map(str::as_bytes).collect();
        parse_multi(v.into_iter())
    }

    #[test]
    fn multi_parses_limits_and_options() {
        let c = m("2 a b TOKENBUCKET 10 1 1000 slidinglog 5 60000 weight 3 cost 2 PARTIAL").unwrap();
        assert_eq!((c.n, c.cost, c.partial, c.dryrun, c.refund), (2, 2, true, false, 0));
        assert_eq!(c.limits[0], LimitSpec { kind: Kind::TokenBucket, nums: [10, 1, 1000], weight: 1 });
        assert_eq!(c.limits[1], LimitSpec { kind: Kind::SlidingLog, nums: [5, 60000, 0], weight: 3 });
        let c = m("1 k SLIDINGCOUNTER 5 1000 REFUND 4").unwrap();
        assert_eq!((c.n, c.refund, c.limits[0].kind), (1, 4, Kind::SlidingCounter));
        // A key may be named like a keyword: keys are positional.
        assert_eq!(m("1 TOKENBUCKET TOKENBUCKET 1 1 1").map(|c| c.n), Ok(1));
        let sixteen: String = (0..16).map(|i| format!("k{i} ")).collect::<String>() + &"SLIDINGLOG 1 1 ".repeat(16);
        assert_eq!(m(&format!("16 {sixteen}")).map(|c| c.n), Ok(16));
    }

    /// The word compare is `eq_ignore_ascii_case` for every byte at every
    /// position, and the sized parser answers what the full one does.
    #[test]
    fn fast_word_compare_and_sized_parse_agree_with_the_plain_ones() {
        for name in [&b"TOKENBUCKET"[..], b"SLIDINGLOG", b"SLIDINGCOUNTER", b"WEIGHT"] {
            for i in 0..name.len() {
                for b in 0..=255u8 {
                    let mut w = name.to_vec();
                    w[i] = b;
                    assert_eq!(eq_upper_letters(&w, name), w.eq_ignore_ascii_case(name), "{w:?}");
                }
            }
            assert!(!eq_upper_letters(&name[1..], name));
        }
        for args in [
            "1 a tokenbucket 1 1 1",
            "2 a b TOKENBUCKET 10 1 1000 slidinglog 5 60000 weight 3 cost 2 PARTIAL",
            "2 a b SLIDINGCOUNTER 1 1 SLIDINGLOG 1 1 REFUND 2",
            "2 a a SLIDINGLOG 1 1 SLIDINGLOG 1 1",
            "2 a b SLIDINGLOG 1 1 SLIDINGLOG 1 0",
        ] {
            let v: Vec<&[u8]> = args.split(' ').map(str::as_bytes).collect();
            let full = parse_multi(v.iter().copied());
            let two = parse_multi_n::<2>(v.iter().copied());
            assert_eq!(
                full.map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund)),
                two.map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund)),
                "{args}"
            );
        }
        let v: Vec<&[u8]> = "3 a b c SLIDINGLOG 1 1 SLIDINGLOG 1 1 SLIDINGLOG 1 1".split(' ').map(str::as_bytes).collect();
        assert_eq!(parse_multi_n::<2>(v.iter().copied()).map(|c| c.n), Err(ArgError::Number(Arg::NumKeys)));
        assert_eq!(parse_multi(v.iter().copied()).map(|c| c.n), Ok(3));
    }

    #[test]
    fn multi_errors() {
        use ArgError::*;
        let cases: &[(&str, ArgError)] = &[
            ("1 k TOKENBUCKET 1", Arity),
            ("0 k TOKENBUCKET 1 1 1", Number(Arg::NumKeys)),
            ("17 k TOKENBUCKET 1 1 1", Number(Arg::NumKeys)),
            ("x k TOKENBUCKET 1 1 1", Number(Arg::NumKeys)),
            ("2 a b TOKENBUCKET 1 1 1", LimitCount),
            ("2 a b TOKENBUCKET 1 1 1 COST 1", LimitCount),
            ("1 a TOKENBUCKET 1 1 1 SLIDINGLOG 1 1", LimitCount),
            ("3 a b c TOKENBUCKET", Syntax),
            ("4 a b c TOKENBUCKET", LimitCount),
            ("1 a LEAKY 1 1 1", Syntax),
            ("1 a TOKENBUCKET 1 1", Syntax),
            ("1 a TOKENBUCKET 1 1 1 WEIGHT", Syntax),
            ("1 a TOKENBUCKET 1 1 1 WEIGHT 2 WEIGHT 2", Syntax),
            ("1 a TOKENBUCKET 1 1 1 COST 1 WEIGHT 2", Syntax),
            ("1 a TOKENBUCKET 1 1 1 REFUND 1 COST 1", Syntax),
            ("1 a TOKENBUCKET 1 1 1 DRYRUN REFUND 1", Syntax),
            ("1 a TOKENBUCKET 0 1 1", Number(Arg::Capacity)),
            ("1 a SLIDINGLOG 1 0", Number(Arg::WindowMs)),
            ("1 a SLIDINGCOUNTER x 1", Number(Arg::Limit)),
            ("1 a SLIDINGLOG 1 1 WEIGHT 0", Number(Arg::Weight)),
            ("1 a SLIDINGLOG 1 1 COST -1", Number(Arg::Cost)),
            ("1 a SLIDINGLOG 1 1 REFUND 0", Number(Arg::Refund)),
            ("2 a a SLIDINGLOG 1 1 SLIDINGLOG 1 1", DuplicateKey),
            ("1 a SLIDINGLOG 1 1 WEIGHT 134217728 COST 67108864", Product(Arg::Cost)),
            ("1 a SLIDINGLOG 1 1 WEIGHT 9007199254740991 REFUND 2", Product(Arg::Refund)),
        ];
        for (args, want) in cases {
            assert_eq!(m(args), Err(*want), "{args}");
        }
        // The product at the edge is accepted.
        assert!(m("1 a SLIDINGLOG 1 1 WEIGHT 9007199254740991 COST 1").is_ok());
        assert!(m("1 a SLIDINGLOG 1 1 WEIGHT 9007199254740991 COST 0").is_ok());
    }
}
