#![no_main]
//! See fuzz/src/lib.rs for the input layout and what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_ratelimit_fuzz::args_fixedwindow(data));
redis_ratelimit_fuzz::coverage_hooks!();
