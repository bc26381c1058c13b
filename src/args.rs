//! Argument parsing for the three commands. Pure: works on byte slices, so
//! it is unit-tested and fuzzed without a server.
//!
//! ```text
//! RL.TOKENBUCKET    key capacity rate period_ms [COST n] [PARTIAL] [DRYRUN]
//! RL.SLIDINGLOG     key limit    window_ms      [COST n] [PARTIAL] [DRYRUN]
//! RL.SLIDINGCOUNTER key limit    window_ms      [COST n] [PARTIAL] [DRYRUN]
//! ```

use std::ffi::CStr;

use crate::core::MAX_ARG;

/// The parsed arguments after the key. `nums` holds the positional numbers
/// (`capacity rate period_ms`, or `limit window_ms` and a 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub nums: [u64; 3],
    pub cost: u64,
    pub partial: bool,
    pub dryrun: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// Too few arguments: Redis's standard arity error.
    Arity,
    /// A number out of range or not an integer: the message names it.
    Number(&'static CStr),
    /// Unknown or repeated option, or COST without a value.
    Syntax,
}

pub const SYNTAX_ERROR: &CStr = c"ERR syntax error";

/// Positional numeric arguments of each command, with their error texts
/// (static, so an error costs no formatting).
pub const TOKENBUCKET_ARGS: &[(&str, &CStr)] = &[
    ("capacity", c"ERR capacity must be an integer between 1 and 9007199254740991"),
    ("rate", c"ERR rate must be an integer between 1 and 9007199254740991"),
    ("period_ms", c"ERR period_ms must be an integer between 1 and 9007199254740991"),
];
pub const WINDOW_ARGS: &[(&str, &CStr)] = &[
    ("limit", c"ERR limit must be an integer between 1 and 9007199254740991"),
    ("window_ms", c"ERR window_ms must be an integer between 1 and 9007199254740991"),
];
const COST_ERROR: &CStr = c"ERR COST must be an integer between 0 and 9007199254740991";

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
pub fn parse<'a>(args: impl ExactSizeIterator<Item = &'a [u8]>, positional: &[(&str, &'static CStr)]) -> Result<Call, ArgError> {
    let mut args = args;
    if args.len() < positional.len() {
        return Err(ArgError::Arity);
    }
    let mut call = Call { nums: [0; 3], cost: 1, partial: false, dryrun: false };
    for (i, (_, err)) in positional.iter().enumerate() {
        let a = args.next().ok_or(ArgError::Arity)?;
        let v = parse_num(a, 1).ok_or(ArgError::Number(err))?;
        if let Some(slot) = call.nums.get_mut(i) {
            *slot = v;
        }
    }
    let mut seen_cost = false;
    while let Some(opt) = args.next() {
        if opt.eq_ignore_ascii_case(b"COST") && !seen_cost {
            seen_cost = true;
            let v = args.next().ok_or(ArgError::Syntax)?;
            call.cost = parse_num(v, 0).ok_or(ArgError::Number(COST_ERROR))?;
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

    fn p(args: &[&str], pos: &[(&str, &'static CStr)]) -> Result<Call, ArgError> {
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
        assert_eq!(p(&["0", "1", "1"], TOKENBUCKET_ARGS), Err(ArgError::Number(TOKENBUCKET_ARGS[0].1)));
        assert_eq!(p(&["1", "x", "1"], TOKENBUCKET_ARGS), Err(ArgError::Number(TOKENBUCKET_ARGS[1].1)));
        assert_eq!(p(&["1", "1", "-5"], TOKENBUCKET_ARGS), Err(ArgError::Number(TOKENBUCKET_ARGS[2].1)));
        assert_eq!(p(&["1", "1", "COST"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "COST", "1", "COST", "2"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "PARTIAL", "partial"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "DRYRUN", "DRYRUN"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "FOO"], WINDOW_ARGS), Err(ArgError::Syntax));
        assert_eq!(p(&["1", "1", "COST", "9007199254740992"], WINDOW_ARGS), Err(ArgError::Number(COST_ERROR)));
        assert_eq!(p(&["1", "1", "COST", "0"], WINDOW_ARGS).map(|c| c.cost), Ok(0));
    }

    #[test]
    fn error_texts_name_the_argument() {
        for (name, err) in TOKENBUCKET_ARGS.iter().chain(WINDOW_ARGS) {
            let e = err.to_str().unwrap();
            assert!(e.starts_with(&format!("ERR {name} ")), "{e}");
        }
    }
}
