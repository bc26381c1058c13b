//! The module version: packed for `MODULE LIST`, as text for INFO.

use std::ffi::{c_int, CStr};

/// `major * 10000 + minor * 100 + patch` of the crate version, as
/// `MODULE LIST` shows it (0.2.0 → 200).
pub const MODULE_VERSION: c_int = {
    let v = parse_u32(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
        + parse_u32(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + parse_u32(env!("CARGO_PKG_VERSION_PATCH"));
    assert!(v <= i32::MAX as u32);
    v as c_int
};

/// The crate version as text, for INFO.
pub const VERSION_TEXT: &CStr = {
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("crate version contains a NUL"),
    }
};

/// A decimal number at compile time; each version part is below 100 so the
/// packed number stays unambiguous.
const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    assert!(!b.is_empty());
    let mut v = 0u32;
    let mut i = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit());
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    assert!(v < 100);
    v
}
