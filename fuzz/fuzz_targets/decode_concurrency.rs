#![no_main]
//! See fuzz/src/concurrency.rs for what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_ratelimit_fuzz::decode_concurrency(data));
redis_ratelimit_fuzz::coverage_hooks!();
