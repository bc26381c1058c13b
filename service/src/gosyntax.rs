//! How envoyproxy/ratelimit's settings library reads a value: Go's
//! `time.ParseDuration` and `strconv.ParseBool`.

use std::time::Duration;

/// Parses a Go `time.ParseDuration` string: a sequence of decimal numbers
/// with units `ns`, `us` (`µs`), `ms`, `s`, `m`, `h`, e.g. `50ms`, `1m30s`,
/// `1.5s`; `0` alone. Negative durations are refused.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (Go syntax, e.g. 50ms, 1.5s, 1m30s)");
    let t = s.strip_prefix('+').unwrap_or(s);
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() || t.starts_with('-') {
        return Err(bad());
    }
    let mut nanos: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let n_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (num, tail) = rest.split_at(n_end);
        if num.is_empty() || num == "." {
            return Err(bad());
        }
        let u_end = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(u_end);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(bad()),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if frac.contains('.') {
            return Err(bad());
        }
        let int: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| bad())? };
        let mut v = int.checked_mul(scale).ok_or_else(bad)?;
        let mut div = 1u128;
        for c in frac.chars().take(18) {
            div *= 10;
            v = v.checked_add(u128::from(c.to_digit(10).ok_or_else(bad)?) * scale / div).ok_or_else(bad)?;
        }
        nanos = nanos.checked_add(v).ok_or_else(bad)?;
        rest = tail;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| bad())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Go's `strconv.ParseBool`; the error names the variable.
pub fn parse_bool(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{name}={v:?}: not a boolean")),
    }
}

/// Unset, empty, or false as Go's strconv.ParseBool reads it.
pub const FALSE: &[&str] = &["", "false", "0", "f", "F", "FALSE", "False"];
