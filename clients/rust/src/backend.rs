//! The calls one decision sends: the module's RL.* commands, or the Lua
//! twins by EVALSHA (NOSCRIPT answered with EVAL once, which caches the
//! script on that server).

use std::sync::OnceLock;

use redis::{Cmd, Value};

use crate::policy::{Kind, Policy};

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
        "fixedwindow" => include_str!("../../../lua/fixedwindow.lua"),
        _ => include_str!("../../../lua/multi.lua"),
    }
}

/// The script for a name (`tokenbucket`, `slidinglog`, `slidingcounter`,
/// `fixedwindow`, `multi`; any other name is `multi`).
pub(crate) fn script(name: &'static str) -> &'static Script {
    static S: OnceLock<Vec<(&'static str, Script)>> = OnceLock::new();
    let all = S.get_or_init(|| {
        ["tokenbucket", "slidinglog", "slidingcounter", "fixedwindow", "multi"]
            .into_iter()
            .map(|n| {
                let text = script_text(n);
                (n, Script { text, sha: sha1_smol::Sha1::from(text).digest().to_string() })
            })
            .collect()
    });
    &all.iter().find(|(n, _)| *n == name).unwrap_or(&all[4]).1
}

/// The options after the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    Call { cost: u64, partial: bool, dry_run: bool },
    Refund(u64),
}

impl Tail {
    fn grants(self) -> bool {
        matches!(self, Tail::Call { dry_run: false, .. })
    }

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
    /// The Lua twin's name (`lua/<script>.lua`).
    pub script: &'static str,
    pub keys: Vec<String>,
    pub args: Vec<String>,
    multi: bool,
    /// A fixed window in it: the module must have `RL.FIXEDWINDOW`.
    pub fixed: bool,
    /// It can grant (not a refund, not a dry run): strict mode waits for it.
    pub grants: bool,
}

impl Request {
    pub fn single(p: &Policy, key: &str, tail: Tail) -> Request {
        let mut args: Vec<String> = p.params().iter().map(u64::to_string).collect();
        tail.push(&mut args);
        if p.from_first() {
            args.push("FROMFIRST".into());
        }
        let (command, script, fixed) = (p.kind().command(), p.kind().script(), p.kind() == Kind::FixedWindow);
        let grants = tail.grants();
        Request { command, script, keys: vec![key.to_owned()], args, multi: false, fixed, grants }
    }

    pub fn multi(parts: &[Policy], keys: Vec<String>, tail: Tail) -> Request {
        let mut args = Vec::new();
        for p in parts {
            args.push(p.kind().multi_name().to_owned());
            args.extend(p.params().iter().map(u64::to_string));
            if p.weight() != 1 {
                args.push("WEIGHT".into());
                args.push(p.weight().to_string());
            }
            // after the limit's WEIGHT, as RL.MULTI and multi.lua take it
            if p.from_first() {
                args.push("FROMFIRST".into());
            }
        }
        tail.push(&mut args);
        let fixed = parts.iter().any(|p| p.kind() == Kind::FixedWindow);
        Request { command: "RL.MULTI", script: "multi", keys, args, multi: true, fixed, grants: tail.grants() }
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

    /// The EVALSHA (or EVAL) of its Lua twin.
    pub fn lua_cmd(&self, eval: bool) -> Cmd {
        let s = script(self.script);
        let mut c = if eval { redis::cmd("EVAL") } else { redis::cmd("EVALSHA") };
        c.arg(if eval { s.text } else { s.sha.as_str() }).arg(self.keys.len()).arg(&self.keys).arg(&self.args);
        c
    }
}

/// What the detection asks: `COMMAND INFO` of these, in this order.
pub(crate) const DETECT: [&str; 3] = ["RL.TOKENBUCKET", "RL.MULTI", "RL.FIXEDWINDOW"];

/// The module's commands a server has, from its `COMMAND INFO` of [`DETECT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Found {
    pub module: bool,
    pub multi: bool,
    pub fixed: bool,
}

/// `COMMAND INFO RL.TOKENBUCKET RL.MULTI RL.FIXEDWINDOW` → what it has
/// (a nil entry: that command is unknown).
pub(crate) fn detect_reply(v: &Value) -> Option<Found> {
    let Value::Array(a) = v else { return None };
    if a.len() != DETECT.len() {
        return None;
    }
    let has = |x: &Value| !matches!(x, Value::Nil);
    Some(Found { module: has(&a[0]), multi: has(&a[1]), fixed: has(&a[2]) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{fixed_window, token_bucket};

    #[test]
    fn a_fixed_window_limit_takes_fromfirst_after_its_weight() {
        let fw = fixed_window("f", 5, 1000, true).unwrap().weighted(2).unwrap();
        let tb = token_bucket("t", 3, 1, 10).unwrap();
        let r = Request::multi(&[tb.clone(), fw.clone()], vec!["a".into(), "b".into()], Tail::Refund(1));
        assert_eq!(
            r.args,
            ["TOKENBUCKET", "3", "1", "10", "FIXEDWINDOW", "5", "1000", "WEIGHT", "2", "FROMFIRST", "REFUND", "1"]
        );
        assert!(r.fixed && r.is_multi() && r.script == "multi");
        assert!(!Request::multi(std::slice::from_ref(&tb), vec!["a".into()], Tail::Refund(1)).fixed);
        let one = Request::single(&fw, "k", Tail::Call { cost: 2, partial: true, dry_run: false });
        assert_eq!((one.command, one.script, one.fixed), ("RL.FIXEDWINDOW", "fixedwindow", true));
        assert_eq!(one.args, ["5", "1000", "COST", "2", "PARTIAL", "FROMFIRST"]);
        assert!(script("fixedwindow").text.contains("RL.FIXEDWINDOW as a Lua script"));
        assert!(!Request::single(&tb, "k", Tail::Refund(1)).fixed);
    }

    #[test]
    fn detection_reads_each_command() {
        let info = Value::Array(vec![Value::Int(1)]);
        let v = Value::Array(vec![info.clone(), info.clone(), Value::Nil]);
        assert_eq!(detect_reply(&v), Some(Found { module: true, multi: true, fixed: false }));
        let v = Value::Array(vec![Value::Nil, Value::Nil, Value::Nil]);
        assert_eq!(detect_reply(&v), Some(Found::default()));
        assert_eq!(detect_reply(&Value::Array(vec![info.clone(), info])), None);
    }
}
