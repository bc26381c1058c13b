//! The one argument harness of the four single-limit targets: parse the
//! arguments (checked against the oracle), then run the pure core on the
//! parsed call against an arbitrary stored state, at arbitrary times. What
//! differs between the algorithms is the `Algorithm` each one implements.

use crate::args::{Arg, Call};
use crate::core::DecodeError;
use crate::input::Input;
use crate::oracle::parse_checked_with;

/// One algorithm as the harness drives it. An impl names its pieces with
/// `pieces!` and builds its parameters in `params`.
pub trait Algorithm {
    /// A key that does not exist holds `State::default()`.
    type State: Default;
    type Params;
    /// The positional arguments after the key.
    const ARGS: &'static [Arg];
    /// The command takes FROMFIRST (RL.FIXEDWINDOW).
    const FROMFIRST: bool = false;
    /// The stored state from its RDB / DUMP bytes.
    fn decode(b: &[u8]) -> Result<Self::State, DecodeError>;
    /// A valid state built from arbitrary bytes.
    fn synth(b: &[u8]) -> Self::State;
    /// The parameters of a parsed call (its positional numbers).
    fn params(nums: &[u64; 3]) -> Self::Params;
    /// `REFUND n` and everything that must hold after it.
    fn refund(cur: &Self::State, p: &Self::Params, n: u64, now: u64);
    /// One call and everything that must hold after it.
    fn call(cur: &Self::State, p: &Self::Params, call: &Call, now: u64, now2: u64);
    /// `COST n FORCE` (a debit) and everything that must hold after it.
    fn force(cur: &Self::State, p: &Self::Params, cost: u64, now: u64);
}

/// The items of an `Algorithm` impl that only name things: the core module
/// `$m` (its `State`, `Params` and decoder), the positional arguments, and
/// the functions that synthesize a state and check a refund and a call.
macro_rules! pieces {
    ($m:ident, $args:expr, synth: $synth:path, refund: $refund:path, call: $call:path, force: $force:path) => {
        type State = $m::State;
        type Params = $m::Params;
        const ARGS: &'static [$crate::args::Arg] = $args;
        fn decode(b: &[u8]) -> Result<$m::State, $crate::core::DecodeError> {
            $m::State::decode(b)
        }
        fn synth(b: &[u8]) -> $m::State {
            $synth(b)
        }
        fn refund(cur: &$m::State, p: &$m::Params, n: u64, now: u64) {
            $refund(cur, p, n, now)
        }
        fn call(cur: &$m::State, p: &$m::Params, call: &$crate::args::Call, now: u64, now2: u64) {
            $call(cur, p, call, now, now2)
        }
        fn force(cur: &$m::State, p: &$m::Params, cost: u64, now: u64) {
            $force(cur, p, cost, now)
        }
    };
}
pub(crate) use pieces;

/// The stored state an input asks for (its mode byte: see lib.rs).
fn state_of<A: Algorithm>(inp: &Input) -> A::State {
    match inp.mode {
        0 => A::State::default(),
        1 => A::decode(inp.state).unwrap_or_default(),
        2 => A::synth(inp.state),
        _ => A::decode(inp.state).unwrap_or_else(|_| A::synth(inp.state)),
    }
}

/// An `args_*` target: one input, one parsed call, its checks.
pub fn run_args<A: Algorithm>(data: &[u8]) {
    let inp = Input::parse(data);
    let Some(call) = parse_checked_with(&inp.args, A::ARGS, A::FROMFIRST) else { return };
    let cur = state_of::<A>(&inp);
    let p = A::params(&call.nums);
    if call.refund > 0 {
        return A::refund(&cur, &p, call.refund, inp.now);
    }
    if call.force {
        return A::force(&cur, &p, call.cost, inp.now);
    }
    A::call(&cur, &p, &call, inp.now, inp.now2);
}
