#![no_main]
//! See fuzz/src/lib.rs (`args_multi`) for the input layout and what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_ratelimit_fuzz::args_multi(data));
redis_ratelimit_fuzz::coverage_hooks!();
