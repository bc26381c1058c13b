#![no_main]
//! See fuzz/src/lib.rs for the input layout, fuzz/src/multi.rs for what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_ratelimit_fuzz::args_multi(data));
redis_ratelimit_fuzz::coverage_hooks!();
