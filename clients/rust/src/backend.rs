//! The calls one decision sends: the module's RL.* commands, or the Lua
//! twins by EVALSHA (NOSCRIPT answered with EVAL once, which caches the
//! script on that server).

use std::sync::OnceLock;

use redis::{Cmd, Value};

use crate::policy::Policy;

/// Which backend a `RateLimit` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// The module when the server has `RL.TOKENBUCKET`, else the Lua twins
    /// (one `COMMAND INFO` on first use).
    #[default]
    Auto,
    /// The module's commands; an error if the server lacks them.
    Module,
    /// The Lua twins; nothing is asked.
    Lua,
}

/// A Lua twin: its text (built into the crate from the repository's
/// `lua/` directory) and its SHA-1.
#[derive(Debug)]
pub(crate) struct Script {
    pub text: &'static str,
    pub sha: String,
}

fn script_text(name: &str) -> &'static str {
    match name {
        "tokenbucket" => include_str!("../../../lua/tokenbucket.lua"),
        "slidinglog" => include_str!("../../../lua/slidinglog.lua"),
        "slidingcounter" => include_str!("../../../lua/slidingcounter.lua"),
        _ => include_str!("../../../lua/multi.lua"),
    }
}

/// The script for a name (`tokenbucket`, `slidinglog`, `slidingcounter`, `multi`).
pub(crate) fn script(name: &'static str) -> &'static Script {
    static S: OnceLock<Vec<(&'static str, Script)>> = OnceLock::new();
    let all = S.get_or_init(|| {
        ["tokenbucket", "slidinglog", "slidingcounter", "multi"]
            .into_iter()
            .map(|n| {
                let text = script_text(n);
                (n, Script { text, sha: sha1_smol::Sha1::from(text).digest().to_string() })
            })
            .collect()
    });
    &all.iter().find(|(n, _)| *n == name).unwrap_or(&all[3]).1
}

/// The options after the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    Call { cost: u64, partial: bool, dry_run: bool },
    Refund(u64),
}

impl Tail {
    fn push(self, v: &mut Vec<String>) {
        match self {
            Tail::Refund(n) => {
                v.push("REFUND".into());
                v.push(n.to_string());
            }
            Tail::Call { cost, partial, dry_run } => {
                if cost != 1 {
                    v.push("COST".into());
                    v.push(cost.to_string());
                }
                if partial {
                    v.push("PARTIAL".into());
                }
                if dry_run {
                    v.push("DRYRUN".into());
                }
            }
        }
    }
}

/// What to send, on either backend: the module's command, or the script
/// name with its keys and arguments.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub command: &'static str,
    /// The Lua twin; `None`: the module only (a fixed window).
    pub script: Option<&'static str>,
    pub keys: Vec<String>,
    pub args: Vec<String>,
    multi: bool,
}

impl Request {
    pub fn single(p: &Policy, key: &str, tail: Tail) -> Request {
        let mut args: Vec<String> = p.params().iter().map(u64::to_string).collect();
        tail.push(&mut args);
        if p.from_first() {
            args.push("FROMFIRST".into());
        }
        Request { command: p.kind().command(), script: p.kind().script(), keys: vec![key.to_owned()], args, multi: false }
    }

    pub fn multi(parts: &[Policy], keys: Vec<String>, tail: Tail) -> Request {
        let mut args = Vec::new();
        for p in parts {
            // all_of refuses a policy RL.MULTI does not take
            args.push(p.kind().multi_name().unwrap_or("?").to_owned());
            args.extend(p.params().iter().map(u64::to_string));
            if p.weight() != 1 {
                args.push("WEIGHT".into());
                args.push(p.weight().to_string());
            }
        }
        tail.push(&mut args);
        Request { command: "RL.MULTI", script: Some("multi"), keys, args, multi: true }
    }

    pub fn is_multi(&self) -> bool {
        self.multi
    }

    pub fn module_cmd(&self) -> Cmd {
        let mut c = redis::cmd(self.command);
        if self.multi {
            c.arg(self.keys.len());
        }
        c.arg(&self.keys).arg(&self.args);
        c
    }

    /// The EVALSHA (or EVAL) of its Lua twin; `script` must be `Some`.
    pub fn lua_cmd(&self, eval: bool) -> Cmd {
        let s = script(self.script.unwrap_or("multi"));
        let mut c = if eval { redis::cmd("EVAL") } else { redis::cmd("EVALSHA") };
        c.arg(if eval { s.text } else { s.sha.as_str() }).arg(self.keys.len()).arg(&self.keys).arg(&self.args);
        c
    }
}

/// `COMMAND INFO RL.TOKENBUCKET RL.MULTI` → (has the module, has RL.MULTI).
pub(crate) fn detect_reply(v: &Value) -> Option<(bool, bool)> {
    let Value::Array(a) = v else { return None };
    if a.len() != 2 {
        return None;
    }
    let has = |x: &Value| !matches!(x, Value::Nil);
    Some((has(&a[0]), has(&a[1])))
}
