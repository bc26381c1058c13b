//! Argument parsing for the commands. Pure: works on byte slices, so it is
//! unit-tested and fuzzed without a server. Errors name the argument
//! ([`Arg`]); the module maps each to its static reply text.
//!
//! ```text
//! RL.TOKENBUCKET    key capacity rate period_ms [COST n] [PARTIAL] [DRYRUN] [FORCE] [REFUND n]
//! RL.SLIDINGLOG     key limit    window_ms      [COST n] [PARTIAL] [DRYRUN] [FORCE] [REFUND n]
//! RL.SLIDINGCOUNTER key limit    window_ms      [COST n] [PARTIAL] [DRYRUN] [FORCE] [REFUND n]
//! RL.FIXEDWINDOW    key limit    window_ms      [COST n] [PARTIAL] [DRYRUN] [FORCE] [REFUND n] [FROMFIRST]
//! RL.MULTI numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL] [DRYRUN] [FORCE] [REFUND n]
//!   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
//!          | SLIDINGLOG limit window_ms [WEIGHT w]
//!          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
//!          | FIXEDWINDOW limit window_ms [WEIGHT w] [FROMFIRST]
//!          | CONCURRENCY limit lease_ms id [WEIGHT w]
//! ```
//!
//! `REFUND n` excludes COST, PARTIAL and DRYRUN (a syntax error).
//! `FROMFIRST` (RL.FIXEDWINDOW only) goes with either; it is carried in
//! `Call::nums[2]` as [`crate::fixedwindow::FROMFIRST`]. In RL.MULTI it
//! belongs to a FIXEDWINDOW limit, after its WEIGHT (`fixedwindow::Params::from_first`).

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
    /// `FORCE`: take all COST units even when fewer are left, leaving a
    /// debt (never with PARTIAL or REFUND).
    pub force: bool,
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
    /// RL.CONCURRENCY's lease.
    LeaseMs,
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
            Arg::LeaseMs => "lease_ms",
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
/// RL.CONCURRENCY's numbers (its action and id follow them:
/// `crate::concurrency::parse`).
pub const CONCURRENCY_ARGS: &[Arg] = &[Arg::Limit, Arg::LeaseMs];

/// Parse a decimal integer in `min..=MAX_ARG`: ASCII digits only (no sign,
/// no spaces, no leading `+`), at most 16 digits so it cannot overflow.
/// Eight digits at a time, whatever the length: a lone digit (numkeys, a
/// rate of 1) and three (a limit of 100) directly; up to eight as one
/// padded word ([`short_digits`]); nine to sixteen as the leading ones and
/// the last eight. Up to eight digits are below 10^8, within `MAX_ARG`:
/// only `min` bounds them.
#[inline(always)]
pub fn parse_num(s: &[u8], min: u64) -> Option<u64> {
    const _: () = assert!(MAX_ARG >= 100_000_000);
    let at_least_min = |v: u64| if v < min { None } else { Some(v) };
    match *s {
        [d] => {
            let d = d.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            at_least_min(u64::from(d))
        }
        // Three digits (a limit of 100, the typical one) at once.
        [a, b, c] => {
            let (a, b, c) = (a.wrapping_sub(b'0'), b.wrapping_sub(b'0'), c.wrapping_sub(b'0'));
            if a > 9 || b > 9 || c > 9 {
                return None;
            }
            at_least_min(u64::from(a) * 100 + u64::from(b) * 10 + u64::from(c))
        }
        _ if s.len() <= 8 => at_least_min(short_digits(s)?),
        _ => {
            // 9..=16 digits: `hi` (1..=8 of them) below 10^8, so the
            // sum stays below 10^16 < 2^64 (the wrapping never wraps).
            let (hi, lo) = s.split_last_chunk::<8>()?;
            if hi.len() > 8 {
                return None;
            }
            let v = short_digits(hi)?.wrapping_mul(100_000_000).wrapping_add(eight_digits(*lo)?);
            if v < min || v > MAX_ARG {
                None
            } else {
                Some(v)
            }
        }
    }
}

/// The value of 1..=8 ASCII digits (None for an empty slice, a longer one
/// or a non-digit), as [`eight_digits`] of the digits left-padded with `0`:
/// the bytes are gathered into one word by two overlapping four-byte loads
/// (four or more digits) or three single-byte loads (fewer), which write
/// equal bytes where they overlap.
#[inline(always)]
fn short_digits(s: &[u8]) -> Option<u64> {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    let n = s.len();
    let x = if let (Some(a), Some(b)) = (s.first_chunk::<4>(), s.last_chunk::<4>()) {
        // 4 <= n: `b` starts at byte n - 4 (n above 8 is refused below;
        // the shift stays below 64 for any n).
        u64::from(u32::from_le_bytes(*a)) | u64::from(u32::from_le_bytes(*b)) << (8 * (n.min(8) - 4))
    } else {
        let (Some(&a), Some(&b), Some(&c)) = (s.first(), s.get(n / 2), s.last()) else { return None };
        u64::from(a) | u64::from(b) << (8 * (n / 2)) | u64::from(c) << (8 * (n - 1))
    };
    if n > 8 {
        return None;
    }
    // The n digits to the top bytes (the first digit at byte 8 - n), the
    // 8 - n bytes below them `0`.
    let pad = 8 * (8 - n) as u32; // 0..=56
    let v = x << pad | ZEROS & !(u64::MAX << pad);
    eight_digits(v.to_le_bytes())
}

/// The value of eight ASCII digits (the first the most significant), or
/// None when any byte is not one, computed on the eight bytes at once: a
/// byte is a digit exactly when it XOR `0` is at most 9, that is when
/// neither it nor it plus 0x76 has its top bit set (a byte at 0x8A or
/// above, already flagged, is the only one whose addition carries into the
/// next); then pairs, quads and the halves are combined, every lane
/// staying below its width (99, 9999, 99999999), so nothing carries.
#[inline(always)]
fn eight_digits(chunk: [u8; 8]) -> Option<u64> {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    const TOPS: u64 = 0x8080_8080_8080_8080;
    let x = u64::from_le_bytes(chunk) ^ ZEROS;
    if (x | x.wrapping_add(0x7676_7676_7676_7676)) & TOPS != 0 {
        return None;
    }
    let x = (x.wrapping_mul(10) + (x >> 8)) & 0x00FF_00FF_00FF_00FF;
    let x = (x.wrapping_mul(100) + (x >> 16)) & 0x0000_FFFF_0000_FFFF;
    Some((x.wrapping_mul(10_000) + (x >> 32)) & 0xFFFF_FFFF)
}

/// Parse `args` = every argument after the key. `positional` lists the
/// numeric arguments the command takes (2 or 3).
pub fn parse<'a>(args: impl ExactSizeIterator<Item = &'a [u8]>, positional: &[Arg]) -> Result<Call, ArgError> {
    parse_with(args, positional, false)
}

/// [`parse`] of RL.FIXEDWINDOW (`limit window_ms` and the options): it also
/// takes `FROMFIRST`, at most once, anywhere among the options and with a
/// grant or a refund; then `nums[2]` is [`crate::fixedwindow::FROMFIRST`]
/// (else 0).
pub fn parse_fixedwindow<'a>(args: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<Call, ArgError> {
    parse_with(args, WINDOW_ARGS, true)
}

/// [`parse`], with the `FROMFIRST` option when `from_first` says so.
#[inline]
fn parse_with<'a>(
    args: impl ExactSizeIterator<Item = &'a [u8]>,
    positional: &[Arg],
    from_first: bool,
) -> Result<Call, ArgError> {
    let mut args = args;
    if args.len() < positional.len() {
        return Err(ArgError::Arity);
    }
    let mut call = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false, refund: 0, force: false };
    for (i, &arg) in positional.iter().enumerate() {
        let a = args.next().ok_or(ArgError::Arity)?;
        let v = parse_num(a, arg.min()).ok_or(ArgError::Number(arg))?;
        if let Some(slot) = call.nums.get_mut(i) {
            *slot = v;
        }
    }
    let mut seen_cost = false;
    while let Some(opt) = args.next() {
        if from_first && call.nums[2] == 0 && opt.eq_ignore_ascii_case(b"FROMFIRST") {
            call.nums[2] = crate::fixedwindow::FROMFIRST;
            continue;
        }
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
    let mut call = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false, refund: 0, force: false };
    for ((s, &arg), slot) in nums.iter().zip(positional).zip(call.nums.iter_mut()) {
        *slot = parse_num(s, arg.min()).ok_or(ArgError::Number(arg))?;
    }
    Ok(call)
}

/// Parse one of the options COST n, PARTIAL, DRYRUN, REFUND n, FORCE into
/// `call`; `Ok(false)` when `opt` is none of them, repeated, REFUND combined
/// with the others, or FORCE with PARTIAL or REFUND (a syntax error).
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
    } else if opt.eq_ignore_ascii_case(b"PARTIAL") && !call.partial && !refund && !call.force {
        call.partial = true;
    } else if opt.eq_ignore_ascii_case(b"DRYRUN") && !call.dryrun && !refund {
        call.dryrun = true;
    } else if opt.eq_ignore_ascii_case(b"REFUND") && !refund && !*seen_cost && !call.partial && !call.dryrun && !call.force {
        let v = args.next().ok_or(ArgError::Syntax)?;
        call.refund = parse_num(v, Arg::Refund.min()).ok_or(ArgError::Number(Arg::Refund))?;
    } else if opt.eq_ignore_ascii_case(b"FORCE") && !call.force && !refund && !call.partial {
        call.force = true;
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// The algorithm a limit of RL.MULTI names: the catalogue's kind.
pub use crate::catalogue::Kind;

/// One limit of RL.MULTI: its algorithm's parameters (the kind is the
/// variant: a FIXEDWINDOW limit's FROMFIRST is `fw::Params::from_first`)
/// and its WEIGHT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub params: crate::multi::Params,
    pub weight: u64,
}

impl LimitSpec {
    /// The algorithm it names.
    #[inline]
    pub const fn kind(&self) -> Kind {
        use crate::multi::Params;
        match self.params {
            Params::TokenBucket(_) => Kind::TokenBucket,
            Params::SlidingLog(_) => Kind::SlidingLog,
            Params::SlidingCounter(_) => Kind::SlidingCounter,
            Params::FixedWindow(_) => Kind::FixedWindow,
            Params::Concurrency(_) => Kind::Concurrency,
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
    /// `FORCE`: every limit takes its `COST × WEIGHT` units, past its limit
    /// if need be; no limit denies (never with PARTIAL, REFUND, CHECK,
    /// SHADOW or a CONCURRENCY limit).
    pub force: bool,
    /// The commonest call, the module's fast path: word-state limits only
    /// (token buckets, sliding counters, fixed windows), no WEIGHT and no
    /// option (so COST 1). A call that spells out `WEIGHT 1` or `COST 1`,
    /// the same meaning, is not plain: it takes the general path, which
    /// the tests compare the fast path with.
    pub plain: bool,
    /// Each limit's `CHECK` and `SHADOW` words ([`crate::multi::CHECK`],
    /// [`crate::multi::SHADOW`]), 0 for none.
    pub flags: [u8; N],
    /// Some limit has a flag: the call is decided by [`crate::multi::run_flagged`].
    pub flagged: bool,
}

impl<const N: usize> MultiCall<N> {
    /// The call's limits.
    #[inline]
    pub fn limits(&self) -> &[LimitSpec] {
        self.limits.get(..self.n).unwrap_or(&self.limits)
    }

    /// The checks that read the keys, last of the parse (a call that fails
    /// them failed nothing else): a repeated key → `DuplicateKey`, then
    /// COST × WEIGHT (or REFUND × WEIGHT) above 2^53 − 1 → `Product`.
    /// `keys` are arguments `1..=n` after the command name.
    #[inline]
    pub fn check<'a, A: Copy>(&self, keys: &[A], bytes: impl Fn(A) -> &'a [u8] + Copy) -> Result<(), ArgError> {
        if !distinct_keys(keys, bytes) {
            return Err(ArgError::DuplicateKey);
        }
        let (units, which) = if self.refund > 0 { (self.refund, Arg::Refund) } else { (self.cost, Arg::Cost) };
        if self.limits().iter().any(|l| units.checked_mul(l.weight).is_none_or(|u| u > MAX_ARG)) {
            return Err(ArgError::Product(which));
        }
        Ok(())
    }
}

/// `w` equals `upper` (ASCII capital letters only) ignoring case: a byte
/// with bit 5 cleared is a capital letter exactly when it is that letter in
/// either case, so this is `eq_ignore_ascii_case` for such names, eight
/// bytes at a time.
#[inline]
pub(crate) fn eq_upper_letters(w: &[u8], upper: &[u8]) -> bool {
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
    // Four to seven bytes (COST, RENEW, DRYRUN, PARTIAL, ACQUIRE, ...): the
    // first four and the last four, overlapping.
    if let (Some((x0, _)), Some((_, x1)), Some((y0, _)), Some((_, y1))) = (
        w.split_first_chunk::<4>(),
        w.split_last_chunk::<4>(),
        upper.split_first_chunk::<4>(),
        upper.split_last_chunk::<4>(),
    ) {
        if w.len() < 8 {
            const CASE: u32 = 0xDFDF_DFDF;
            return u32::from_le_bytes(*x0) & CASE == u32::from_le_bytes(*y0)
                && u32::from_le_bytes(*x1) & CASE == u32::from_le_bytes(*y1);
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
    [&b"COST"[..], b"PARTIAL", b"DRYRUN", b"REFUND", b"FORCE"].iter().any(|o| w.eq_ignore_ascii_case(o))
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

/// Parse `args` = every argument after `RL.MULTI`:
///
/// ```text
/// numkeys key [key ...] limit [limit ...] [COST n] [PARTIAL] [DRYRUN] [FORCE] [REFUND n]
///   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
///          | SLIDINGLOG limit window_ms [WEIGHT w]
///          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
///          | FIXEDWINDOW limit window_ms [WEIGHT w] [FROMFIRST]
///   each limit then [CHECK] [SHADOW] (not with REFUND)
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
pub fn parse_multi(args: &[&[u8]]) -> Result<MultiCall, ArgError> {
    let call = parse_multi_n::<&[u8], MAX_LIMITS>(args, |a| a)?;
    call.check(args.get(1..=call.n).unwrap_or_default(), |a| a)?;
    Ok(call)
}

/// The one parser of RL.MULTI ([`parse_multi`], whose errors it answers
/// in the same order), with room for `N` limits and every argument after
/// `RL.MULTI` read once through `bytes`, but for the keys: the checks that
/// read them are [`MultiCall::check`], the caller's last step (the module
/// can tell distinct keys from their opened values). A numkeys above `N`
/// is parsed through, its limits past `N` not kept, and answers the same
/// error (a call of more than `N` limits must have more arguments).
/// The argument at `i`, read through `bytes`.
#[inline(always)]
fn word_at<'a, A: Copy>(args: &[A], bytes: impl Fn(A) -> &'a [u8], i: usize) -> Option<&'a [u8]> {
    args.get(i).map(|&a| bytes(a))
}

/// What may follow one limit of RL.MULTI, `next` at `at` (the word there):
/// its `WEIGHT w` (the call is then not `plain`), then a fixed window's
/// `FROMFIRST`, then `CHECK`, then `SHADOW` (into `flags`; the call is then
/// not `plain`); `at` and `next` move past them.
#[inline(always)]
fn after_limit<'a, A: Copy>(
    limit: &mut LimitSpec,
    flags: &mut u8,
    plain: &mut bool,
    args: &[A],
    bytes: impl Fn(A) -> &'a [u8] + Copy,
    at: &mut usize,
    next: &mut Option<&'a [u8]>,
) -> Result<(), ArgError> {
    use crate::multi::Params;
    let Some(w) = *next else { return Ok(()) };
    if eq_upper_letters(w, b"WEIGHT") {
        limit.weight = number(word_at(args, bytes, *at + 1), Arg::Weight)?;
        *plain = false;
        *at += 2;
        *next = word_at(args, bytes, *at);
    }
    if let Params::FixedWindow(p) = &mut limit.params {
        if next.is_some_and(|w| eq_upper_letters(w, b"FROMFIRST")) {
            p.from_first = true;
            *at += 1;
            *next = word_at(args, bytes, *at);
        }
    }
    if next.is_some() {
        after_flags(flags, plain, args, bytes, at, next);
    }
    Ok(())
}

/// A limit's `[CHECK] [SHADOW]`, in that order (out of line: the plain
/// call has none).
#[inline(never)]
fn after_flags<'a, A: Copy>(
    flags: &mut u8,
    plain: &mut bool,
    args: &[A],
    bytes: impl Fn(A) -> &'a [u8] + Copy,
    at: &mut usize,
    next: &mut Option<&'a [u8]>,
) {
    for (word, flag) in [(&b"CHECK"[..], crate::multi::CHECK), (b"SHADOW", crate::multi::SHADOW)] {
        if next.is_some_and(|w| eq_upper_letters(w, word)) {
            *flags |= flag;
            *plain = false;
            *at += 1;
            *next = word_at(args, bytes, *at);
        }
    }
}

/// A `CONCURRENCY limit lease_ms id` limit of RL.MULTI whose word is at
/// `at`: its id is the word after its numbers, whatever it spells.
#[inline(never)]
fn concurrency_limit<'a, A: Copy>(
    args: &[A],
    bytes: impl Fn(A) -> &'a [u8] + Copy,
    at: usize,
) -> Result<crate::multi::Params, ArgError> {
    use crate::concurrency as cc;
    let limit = number(word_at(args, bytes, at + 1), Arg::Limit)?;
    let lease_ms = number(word_at(args, bytes, at + 2), Arg::LeaseMs)?;
    let id = word_at(args, bytes, at + 3).ok_or(ArgError::Syntax)?;
    Ok(crate::multi::Params::Concurrency(cc::Params { limit, lease_ms, id_hash: cc::id_hash(id) }))
}

/// The value of `a`, a numeric argument `arg`: its absence is a syntax
/// error.
#[inline(always)]
fn number(a: Option<&[u8]>, arg: Arg) -> Result<u64, ArgError> {
    parse_num(a.ok_or(ArgError::Syntax)?, arg.min()).ok_or(ArgError::Number(arg))
}

#[inline(always)]
pub fn parse_multi_n<'a, A: Copy, const N: usize>(
    args: &[A],
    bytes: impl Fn(A) -> &'a [u8] + Copy,
) -> Result<MultiCall<N>, ArgError> {
    let mut call = MultiCall::new();
    call.parse(args, bytes)?;
    Ok(call)
}

impl<const N: usize> Default for MultiCall<N> {
    #[inline(always)]
    fn default() -> MultiCall<N> {
        MultiCall::new()
    }
}

impl<const N: usize> MultiCall<N> {
    /// A call of no limits yet, to [`parse`](Self::parse) into.
    #[inline(always)]
    pub fn new() -> MultiCall<N> {
        use crate::{multi::Params, tokenbucket as tb};
        let blank = LimitSpec { params: Params::TokenBucket(tb::Params { capacity: 1, rate: 1, period_ms: 1 }), weight: 1 };
        MultiCall {
            n: 0,
            limits: [blank; N],
            cost: 1,
            partial: false,
            dryrun: false,
            refund: 0,
            force: false,
            plain: true,
            flags: [0; N],
            flagged: false,
        }
    }

    /// The branch of [`MultiCall::parse`] for `n = self.n ≤ N` plain
    /// token buckets in `args` (`5n + 1` of them): each limit's four words
    /// at their fixed places. Ok(k), `k ≤ n`: the first `k` limits are
    /// `TOKENBUCKET capacity rate period_ms` with numbers in range, each
    /// then in `limits` (weight 1, no option: the fresh call's), and limit
    /// `k` (when `k < n`) does not start with `TOKENBUCKET`: the loop goes
    /// on from there. Err: a limit is a token bucket with a number out of
    /// range, the loop's error for the call (every limit before it took
    /// four words, so the loop would meet the same number first).
    #[inline(always)]
    fn plain_buckets<'a, A: Copy>(&mut self, args: &[A], bytes: impl Fn(A) -> &'a [u8] + Copy) -> Result<usize, ArgError> {
        use crate::{multi::Params, tokenbucket as tb};
        let (Some(words), Some(limits)) = (args.get(1 + self.n..), self.limits.get_mut(..self.n)) else {
            return Ok(0);
        };
        let n = self.n;
        let bad = ArgError::Number;
        let mut each = limits.iter_mut().zip(words.chunks_exact(4));
        while let Some((limit, w)) = each.next() {
            // This limit's index is counted only when it is needed: a
            // counter kept in the loop cost 17 instructions per two-limit
            // call (callgrind, Valkey 9.1).
            let &[kind, capacity, rate, period_ms] = w else { return Ok(n - 1 - each.len()) };
            let kind = bytes(kind);
            if kind.len() != 11 || !eq_upper_letters(kind, b"TOKENBUCKET") {
                return Ok(n - 1 - each.len());
            }
            let Some(capacity) = parse_num(bytes(capacity), Arg::Capacity.min()) else { return Err(bad(Arg::Capacity)) };
            let Some(rate) = parse_num(bytes(rate), Arg::Rate.min()) else { return Err(bad(Arg::Rate)) };
            let Some(period_ms) = parse_num(bytes(period_ms), Arg::PeriodMs.min()) else {
                return Err(bad(Arg::PeriodMs));
            };
            limit.params = Params::TokenBucket(tb::Params { capacity, rate, period_ms });
        }
        Ok(n)
    }

    /// [`parse_multi_n`] into this fresh call ([`MultiCall::new`]), in place:
    /// the one parser of RL.MULTI.
    #[inline(always)]
    pub fn parse<'a, A: Copy>(&mut self, args: &[A], bytes: impl Fn(A) -> &'a [u8] + Copy) -> Result<(), ArgError> {
        let first = match *args {
            [first, _, _, _, _, ..] => first,
            _ => return Err(ArgError::Arity),
        };
        let n = parse_num(bytes(first), Arg::NumKeys.min())
            .filter(|&n| n <= MAX_LIMITS as u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(ArgError::Number(Arg::NumKeys))?;
        let call = self;
        call.n = n;
        // The commonest call, `n` token buckets and nothing else (`5n + 1`
        // arguments here), read limit by limit at their fixed places, with
        // no look for WEIGHT, FROMFIRST or options between them: the same
        // call as the loop below makes of it. A number out of range is the
        // loop's error; at a limit that does not start with TOKENBUCKET the
        // loop goes on from there, so no argument is read twice (but that
        // limit's first word, told apart again).
        let mut start = 0;
        if args.len() == 1 + 5 * n && n <= N {
            start = call.plain_buckets(args, bytes)?;
            if start == n {
                return Ok(());
            }
        }
        call.parse_from(args, bytes, start)
    }

    /// The rest of [`MultiCall::parse`]: limits `start..n` (`n` read, the
    /// limits before `start` plain token buckets read by
    /// [`MultiCall::plain_buckets`]), each with its WEIGHT and FROMFIRST,
    /// then the options. (Inlined: out of line it cost the plain call 10
    /// instructions more, callgrind, Valkey 9.1.)
    #[inline(always)]
    fn parse_from<'a, A: Copy>(
        &mut self,
        args: &[A],
        bytes: impl Fn(A) -> &'a [u8] + Copy,
        start: usize,
    ) -> Result<(), ArgError> {
        use crate::multi::Params;
        use crate::{fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb};
        let n = self.n;
        let call = self;
        let mut past_n =
            LimitSpec { params: Params::TokenBucket(tb::Params { capacity: 1, rate: 1, period_ms: 1 }), weight: 1 };
        // `at` indexes `args`; `next` is the word there, read ahead once.
        let mut at = 1 + n + 4 * start;
        let mut next = word_at(args, bytes, at);
        // The branch's last limit may be followed by its WEIGHT.
        let mut past_flags = 0u8;
        if let Some(i) = start.checked_sub(1) {
            if let (Some(limit), Some(f)) = (call.limits.get_mut(i), call.flags.get_mut(i)) {
                after_limit(limit, f, &mut call.plain, args, bytes, &mut at, &mut next)?;
            }
        }
        for i in start..n {
            let limit = match call.limits.get_mut(i) {
                Some(l) => l,
                None => &mut past_n,
            };
            let w = next.ok_or(ArgError::LimitCount)?;
            // A token bucket (the commonest limit) told at once.
            let kind = if w.len() == 11 && eq_upper_letters(w, b"TOKENBUCKET") {
                Some(Kind::TokenBucket)
            } else {
                Kind::from_word(w)
            };
            (limit.params, at) = match kind {
                Some(Kind::TokenBucket) => (
                    Params::TokenBucket(tb::Params {
                        capacity: number(word_at(args, bytes, at + 1), Arg::Capacity)?,
                        rate: number(word_at(args, bytes, at + 2), Arg::Rate)?,
                        period_ms: number(word_at(args, bytes, at + 3), Arg::PeriodMs)?,
                    }),
                    at + 4,
                ),
                Some(Kind::Concurrency) => {
                    // limit lease_ms id: not a word state, not the plain call
                    call.plain = false;
                    (concurrency_limit(args, bytes, at)?, at + 4)
                }
                Some(kind) => {
                    // limit window_ms, for the three other kinds
                    let limit = number(word_at(args, bytes, at + 1), Arg::Limit)?;
                    let window_ms = number(word_at(args, bytes, at + 2), Arg::WindowMs)?;
                    let params = match kind {
                        Kind::SlidingLog => {
                            // Not a word state: not the plain call.
                            call.plain = false;
                            Params::SlidingLog(sl::Params { limit, window_ms })
                        }
                        Kind::FixedWindow => Params::FixedWindow(fw::Params { limit, window_ms, from_first: false }),
                        _ => Params::SlidingCounter(sc::Params { limit, window_ms }),
                    };
                    (params, at + 3)
                }
                None if is_option(w) => return Err(ArgError::LimitCount),
                None => return Err(ArgError::Syntax),
            };
            next = word_at(args, bytes, at);
            let f = match call.flags.get_mut(i) {
                Some(f) => f,
                None => &mut past_flags,
            };
            after_limit(limit, f, &mut call.plain, args, bytes, &mut at, &mut next)?;
        }
        call.flagged = call.flags.iter().any(|&f| f != 0);
        if let Some(first) = next {
            let mut opts = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false, refund: 0, force: false };
            let mut seen_cost = false;
            // The first option was read ahead: from there on, the rest.
            let after = args.get(at + 1..).unwrap_or_default().iter().map(|&a| bytes(a));
            let mut rest = std::iter::once(first).chain(after);
            while let Some(opt) = rest.next() {
                if !option(opt, &mut rest, &mut opts, &mut seen_cost)? {
                    return Err(if Kind::from_word(opt).is_some() { ArgError::LimitCount } else { ArgError::Syntax });
                }
            }
            (call.cost, call.partial, call.dryrun, call.refund, call.force) =
                (opts.cost, opts.partial, opts.dryrun, opts.refund, opts.force);
            call.plain = false;
            if call.refund > 0 && call.flagged {
                // a refund gives back what was taken: CHECK and SHADOW do not apply
                return Err(ArgError::Syntax);
            }
            if call.force && (call.flagged || call.limits().iter().any(|l| l.kind() == Kind::Concurrency)) {
                // a debit takes from every limit: a limit that takes nothing
                // (CHECK) or only what fits (SHADOW) has no place in it, and
                // held leases cannot exceed a concurrency limit
                return Err(ArgError::Syntax);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
