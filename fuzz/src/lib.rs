//! Shared pieces of the fuzz targets: the input layout (input.rs), an
//! independent argument-parser oracle (oracle.rs), reply invariants
//! (invariants.rs), one argument harness for the four single-limit
//! commands (harness.rs, driving tokenbucket.rs, slidinglog.rs,
//! slidingcounter.rs and fixedwindow.rs), RL.MULTI (multi.rs), the decoder targets (decode.rs,
//! and concurrency.rs for RL.CONCURRENCY's),
//! and the comparison of every call with the core crate's reference models
//! (`ratelimit_core::reference`, the same models its own tests use; a
//! sliding log is read back from its canonical encoding, log.rs).
//!
//! Input layout of the `args_*` targets (short inputs read as zero-padded):
//!
//! ```text
//! [0..8)    now_us, u64 LE: the clock of the call
//! [8..16)   now2_us, u64 LE: the clock of a follow-up call (may step back)
//! [16]      state mode: 0 fresh, 1 decode the state bytes, 2 synthesize
//!           a valid state from them, 3 = 1 falling back to 2
//! [17..19)  state_len, u16 LE
//! [19..19+state_len)  state bytes
//! rest      the arguments after the key, separated by NUL bytes
//! ```
//!
//! Nothing here panics on any input: the only panics are the assertions,
//! which are the findings.

// The code under test is the pure core crate (linking the cdylib would also
// build redis-module and bindgen with coverage flags: minutes of compilation
// on a fresh machine for no extra fuzzed code).
pub use crate::core::{fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb};
pub use ratelimit_core as core;
pub use ratelimit_core::{args, codec};

pub mod concurrency;
mod coverage;
pub mod decode;
pub mod fixedwindow;
pub mod harness;
pub mod input;
pub mod invariants;
pub mod log;
pub mod multi;
pub mod oracle;
pub mod slidingcounter;
pub mod slidinglog;
pub mod tokenbucket;

pub use concurrency::decode_concurrency;
#[cfg(feature = "coverage")]
pub use coverage::describe_pc;
pub use decode::{decode_codec, decode_fixedwindow, decode_slidingcounter, decode_slidinglog, decode_tokenbucket};
pub use fixedwindow::{fw_call, fw_refund, synth_fw, FixedWindow};
pub use harness::{run_args, Algorithm};
pub use input::{words, Input};
pub use invariants::{check_decision, check_remaining_exact, check_retry_exact};
pub use log::{log_entries, sl_encode};
pub use multi::args_multi;
pub use oracle::{oracle_multi, oracle_parse, oracle_parse_with, parse_checked, parse_checked_with};
pub use slidingcounter::{sc_call, sc_refund, synth_sc, SlidingCounter};
pub use slidinglog::{sl_call, sl_refund, synth_sl, SlidingLog};
pub use tokenbucket::{synth_tb, tb_call, tb_refund, TokenBucket};

/// The `args_*` target of RL.TOKENBUCKET.
pub fn args_tokenbucket(data: &[u8]) {
    run_args::<TokenBucket>(data)
}

/// The `args_*` target of RL.SLIDINGLOG.
pub fn args_slidinglog(data: &[u8]) {
    run_args::<SlidingLog>(data)
}

/// The `args_*` target of RL.FIXEDWINDOW.
pub fn args_fixedwindow(data: &[u8]) {
    run_args::<FixedWindow>(data)
}

/// The `args_*` target of RL.SLIDINGCOUNTER.
pub fn args_slidingcounter(data: &[u8]) {
    run_args::<SlidingCounter>(data)
}
