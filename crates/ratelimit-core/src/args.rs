//! Argument parsing for the three commands. Pure: works on byte slices, so
//! it is unit-tested and fuzzed without a server. Errors name the argument
//! ([`Arg`]); the module maps each to its static reply text.
//!
//! ```text
//! RL.TOKENBUCKET    key capacity rate period_ms [COST n] [PARTIAL] [DRYRUN]
//! RL.SLIDINGLOG     key limit    window_ms      [COST n] [PARTIAL] [DRYRUN]
//! RL.SLIDINGCOUNTER key limit    window_ms      [COST n] [PARTIAL] [DRYRUN]
//! ```

use crate::MAX_ARG;

/// The parsed arguments after the key. `nums` holds the positional numbers
/// (`capacity rate period_ms`, or `limit window_ms` and a 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub nums: [u64; 3],
    pub cost: u64,
    pub partial: bool,
    pub dryrun: bool,
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
        }
    }
    /// Smallest accepted value (the largest is [`MAX_ARG`] for all).
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
}

/// Positional numeric arguments of each command.
pub const TOKENBUCKET_ARGS: &[Arg] = &[Arg::Capacity, Arg::Rate, Arg::PeriodMs];
pub const WINDOW_ARGS: &[Arg] = &[Arg::Limit, Arg::WindowMs];

/// Parse a decimal integer in `min..=MAX_ARG`: ASCII digits only (no sign,
/// no spaces, no leading `+`), at most 16 digits so it cannot overflow.
#[inline]
pub fn parse_num(s: &[u8], min: u64) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(b - b'0'); // ≤ 16 digits < 2^64: no overflow
    }
    if v < min || v > MAX_ARG {
        None
    } else {
        Some(v)
    }
}

/// Parse `args` = every argument after the key. `positional` lists the
/// numeric arguments the command takes (2 or 3).
pub fn parse<'a>(args: impl ExactSizeIterator<Item = &'a [u8]>, positional: &[Arg]) -> Result<Call, ArgError> {
    let mut args = args;
    if args.len() < positional.len() {
        return Err(ArgError::Arity);
    }
    let mut call = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false };
    for (i, &arg) in positional.iter().enumerate() {
        let a = args.next().ok_or(ArgError::Arity)?;
        let v = parse_num(a, arg.min()).ok_or(ArgError::Number(arg))?;
        if let Some(slot) = call.nums.get_mut(i) {
            *slot = v;
        }
    }
    let mut seen_cost = false;
    while let Some(opt) = args.next() {
        if opt.eq_ignore_ascii_case(b"COST") && !seen_cost {
            seen_cost = true;
            let v = args.next().ok_or(ArgError::Syntax)?;
            call.cost = parse_num(v, Arg::Cost.min()).ok_or(ArgError::Number(Arg::Cost))?;
        } else if opt.eq_ignore_ascii_case(b"PARTIAL") && !call.partial {
            call.partial = true;
        } else if opt.eq_ignore_ascii_case(b"DRYRUN") && !call.dryrun {
            call.dryrun = true;
        } else {
            return Err(ArgError::Syntax);
        }
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

    #[test]
    fn options_any_order_case_insensitive() {
        let c = p(&["10", "1", "1000", "dryrun", "Cost", "5", "PARTIAL"], TOKENBUCKET_ARGS).unwrap();
        assert_eq!(c, Call { nums: [10, 1, 1000], cost: 5, partial: true, dryrun: true });
        let c = p(&["10", "1000"], WINDOW_ARGS).unwrap();
        assert_eq!(c, Call { nums: [10, 1000, 0], cost: 1, partial: false, dryrun: false });
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
}
