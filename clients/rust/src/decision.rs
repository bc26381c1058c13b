//! Decisions: what a limiter answers.

use std::sync::Arc;

use crate::policy::Rule;

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The module's RL.* commands.
    Module,
    /// The Lua twins (EVALSHA).
    Lua,
    /// A leased reservoir, no I/O.
    Local,
    /// The panic limits (Redis unavailable or the breaker open).
    Panic,
}

impl Source {
    /// `"module"`, `"lua"`, `"local"` or `"panic"`, as the other libraries name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Module => "module",
            Source::Lua => "lua",
            Source::Local => "local",
            Source::Panic => "panic",
        }
    }
}

/// One policy's share of an `all_of` decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The part's policy name.
    pub policy: String,
    /// Units this part took (cost × weight when granted).
    pub granted: u64,
    /// The part's limit.
    pub limit: u64,
    /// Whole units left in the part.
    pub remaining: u64,
    /// 0 when this part could take its units, −1 never, else ms.
    pub retry_after_ms: i64,
    /// ms until the part is fresh again.
    pub reset_after_ms: u64,
}

/// A decision (immutable), with the fields of clients/DESIGN.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// All `cost` units were granted (`granted == cost`).
    pub allowed: bool,
    /// Units granted (with `partial`: 0…cost); for a refund: units given back.
    pub granted: u64,
    /// Limit of the binding policy (panic: the panic limit).
    pub limit: u64,
    /// Whole units left in the binding policy right after the call.
    pub remaining: u64,
    /// 0 when granted; else ms until the same call could be granted (≥ 1);
    /// −1 when it never can (cost > limit).
    pub retry_after_ms: i64,
    /// ms until the binding policy is fresh again.
    pub reset_after_ms: u64,
    /// Name of the policy (for `all_of`: its own name).
    pub policy: String,
    /// Name of the binding policy (= `policy` for a single policy).
    pub binding: String,
    /// Where it came from.
    pub source: Source,
    /// `all_of` only: one [`Part`] per policy, in order; empty otherwise.
    pub parts: Vec<Part>,
    /// The rule the decision was made for (used by [`crate::headers`]).
    pub rule: Arc<Rule>,
}

impl Part {
    /// Part `name`'s share, from the core's figures.
    pub(crate) fn of(name: &str, d: &ratelimit_core::Decision) -> Part {
        Part {
            policy: name.to_owned(),
            granted: d.granted,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.retry_after_ms,
            reset_after_ms: d.reset_after_ms,
        }
    }
}

impl Decision {
    /// The one place a decision is made: the core's figures of the binding
    /// policy `binding` (for a single policy, the rule itself), with where
    /// they came from and, for `all_of`, its parts.
    pub(crate) fn of(
        rule: &Arc<Rule>,
        d: ratelimit_core::Decision,
        allowed: bool,
        binding: &str,
        source: Source,
        parts: Vec<Part>,
    ) -> Decision {
        Decision {
            allowed,
            granted: d.granted,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.retry_after_ms,
            reset_after_ms: d.reset_after_ms,
            policy: rule.name().to_owned(),
            binding: binding.to_owned(),
            source,
            parts,
            rule: rule.clone(),
        }
    }
}
