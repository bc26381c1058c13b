//! The calls one decision sends, encoded without I/O: the module's RL.*
//! commands, or the Lua twins by EVALSHA (the transport answers NOSCRIPT
//! with EVAL once, which caches the script on that server); what the
//! detection's `COMMAND INFO` reply says a server has, and what a module
//! that lacks a command refuses before any call.

use std::borrow::Cow;
use std::sync::OnceLock;

use redis::{Cmd, Value};

use ratelimit_core::catalogue::{Kind, KINDS};

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

/// The Lua twin of `kind` (`None`: RL.MULTI's, `lua/multi.lua`).
fn script_text(kind: Option<Kind>) -> &'static str {
    match kind {
        Some(Kind::TokenBucket) => include_str!("../../../lua/tokenbucket.lua"),
        Some(Kind::SlidingLog) => include_str!("../../../lua/slidinglog.lua"),
        Some(Kind::SlidingCounter) => include_str!("../../../lua/slidingcounter.lua"),
        Some(Kind::FixedWindow) => include_str!("../../../lua/fixedwindow.lua"),
        Some(Kind::Concurrency) => include_str!("../../../lua/concurrency.lua"),
        None => include_str!("../../../lua/multi.lua"),
    }
}

/// The script for a name (a kind's [`Kind::name`], or `multi`; any other
/// name is `multi`).
pub(crate) fn script(name: &'static str) -> &'static Script {
    static S: OnceLock<Vec<(&'static str, Script)>> = OnceLock::new();
    let all = S.get_or_init(|| {
        KINDS
            .into_iter()
            .map(|k| (k.name(), Some(k)))
            .chain([(MULTI_SCRIPT, None)])
            .map(|(n, k)| {
                let text = script_text(k);
                (n, Script { text, sha: sha1_smol::Sha1::from(text).digest().to_string() })
            })
            .collect()
    });
    let multi = &all[all.len() - 1];
    &all.iter().find(|(n, _)| *n == name).unwrap_or(multi).1
}

/// RL.MULTI's command and its Lua twin's name.
const MULTI_COMMAND: &str = "RL.MULTI";
const MULTI_SCRIPT: &str = "multi";

/// The options of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Units asked for (default 1; 0 asks without taking).
    pub cost: u64,
    /// Take what is available (0…cost) instead of all or nothing.
    pub partial: bool,
    /// Decide without taking anything.
    pub dry_run: bool,
    /// `FORCE`: a debit, all `cost` units taken even past the limit
    /// (docs/contract.md, "Debits (FORCE)"); not with `partial`.
    pub force: bool,
}

impl Default for Call {
    fn default() -> Call {
        Call { cost: 1, partial: false, dry_run: false, force: false }
    }
}

impl Call {
    /// A call of `cost` units, all or nothing.
    pub fn cost(cost: u64) -> Call {
        Call { cost, ..Call::default() }
    }

    /// A debit of `cost` units (`COST n FORCE`): taken even past the limit,
    /// leaving a debt later calls wait out. Redis unavailable: the panic
    /// limits decide it as a plain call.
    pub fn debit(cost: u64) -> Call {
        Call { cost, force: true, ..Call::default() }
    }
}

/// The options after the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    Call { cost: u64, partial: bool, dry_run: bool, force: bool },
    Refund(u64),
}

impl Tail {
    fn grants(self) -> bool {
        matches!(self, Tail::Call { dry_run: false, .. })
    }

    fn push(self, v: &mut Vec<Arg>) {
        match self {
            Tail::Refund(n) => {
                v.push(Arg::Word("REFUND"));
                v.push(Arg::Num(n));
            }
            Tail::Call { cost, partial, dry_run, force } => {
                if cost != 1 {
                    v.push(Arg::Word("COST"));
                    v.push(Arg::Num(cost));
                }
                if partial {
                    v.push(Arg::Word("PARTIAL"));
                }
                if force {
                    v.push(Arg::Word("FORCE"));
                }
                if dry_run {
                    v.push(Arg::Word("DRYRUN"));
                }
            }
        }
    }

    /// The most arguments [`Tail::push`] adds.
    const MAX_ARGS: usize = 5;
}

/// What an RL.CONCURRENCY call does with a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    Acquire,
    Renew,
    Release,
}

impl Hold {
    fn word(self) -> &'static str {
        match self {
            Hold::Acquire => "ACQUIRE",
            Hold::Renew => "RENEW",
            Hold::Release => "RELEASE",
        }
    }
}

/// One argument after the keys: a word of the protocol or a number,
/// written straight into the command (no string per argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arg {
    Word(&'static str),
    Num(u64),
    /// An in-flight hold's id: 128 bits, sent as 32 lowercase hex digits
    /// (written from the stack: the enum stays the size of a word).
    Id([u8; 16]),
}

/// 32 lowercase hex digits of `id`.
pub(crate) fn hex(id: &[u8; 16]) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in id.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 15)];
    }
    out
}

impl Arg {
    /// The most bytes it writes (a u64 has at most 20 digits).
    fn max_len(self) -> usize {
        match self {
            Arg::Word(w) => w.len(),
            Arg::Num(_) => 20,
            Arg::Id(_) => 32,
        }
    }
}

impl redis::ToRedisArgs for Arg {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        match *self {
            Arg::Word(w) => w.write_redis_args(out),
            Arg::Num(n) => n.write_redis_args(out),
            Arg::Id(id) => out.write_arg(&hex(&id)),
        }
    }
}

/// For the tests, which compare the arguments as text.
#[cfg(test)]
impl std::fmt::Display for Arg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arg::Word(w) => f.write_str(w),
            Arg::Num(n) => write!(f, "{n}"),
            Arg::Id(id) => f.write_str(std::str::from_utf8(&hex(id)).unwrap_or("?")),
        }
    }
}

/// What to send, on either backend: the module's command, or the script
/// name with its keys and arguments.
#[derive(Debug, Clone)]
pub(crate) struct Request<'k> {
    pub command: &'static str,
    /// The Lua twin's name (`lua/<script>.lua`).
    pub script: &'static str,
    /// The keys: the caller's own, borrowed, or made for the call (`all_of`'s `key:part`).
    pub keys: Vec<Cow<'k, str>>,
    pub args: Vec<Arg>,
    multi: bool,
    /// A fixed window in it: the module must have `RL.FIXEDWINDOW`.
    pub fixed: bool,
    /// It can grant (not a refund, not a dry run): strict mode waits for it.
    pub grants: bool,
}

impl<'k> Request<'k> {
    pub fn single(p: &Policy, key: &'k str, tail: Tail) -> Request<'k> {
        Request::single_of(p, vec![Cow::Borrowed(key)], tail)
    }

    /// [`Request::single`] with its key given as the one of `keys`.
    pub fn single_of(p: &Policy, keys: Vec<Cow<'k, str>>, tail: Tail) -> Request<'k> {
        let mut args = Vec::with_capacity(p.params().len() + Tail::MAX_ARGS + 1);
        args.extend(p.params().iter().map(|&n| Arg::Num(n)));
        tail.push(&mut args);
        if p.from_first() {
            args.push(Arg::Word("FROMFIRST"));
        }
        let (command, script, fixed) = (p.kind().command(), p.kind().name(), p.kind() == Kind::FixedWindow);
        let grants = tail.grants();
        Request { command, script, keys, args, multi: false, fixed, grants }
    }

    /// `RL.CONCURRENCY key limit lease_ms ACQUIRE|RENEW|RELEASE id [COST n]`
    /// (twin `concurrency.lua`) of the concurrency policy `p`; only an
    /// ACQUIRE can grant (strict mode waits for it).
    pub fn concurrency(p: &Policy, key: &'k str, action: Hold, id: [u8; 16], cost: u64) -> Request<'k> {
        let mut args = Vec::with_capacity(p.params().len() + 4);
        args.extend(p.params().iter().map(|&n| Arg::Num(n)));
        args.push(Arg::Word(action.word()));
        args.push(Arg::Id(id));
        if cost != 1 {
            args.push(Arg::Word("COST"));
            args.push(Arg::Num(cost));
        }
        let (command, script) = (p.kind().command(), p.kind().name());
        let grants = action == Hold::Acquire;
        Request { command, script, keys: vec![Cow::Borrowed(key)], args, multi: false, fixed: false, grants }
    }

    pub fn multi(parts: &[Policy], keys: Vec<Cow<'k, str>>, tail: Tail) -> Request<'k> {
        let mut args = Vec::with_capacity(parts.iter().map(|p| p.params().len() + 4).sum::<usize>() + Tail::MAX_ARGS);
        for p in parts {
            args.push(Arg::Word(p.kind().word()));
            args.extend(p.params().iter().map(|&n| Arg::Num(n)));
            if p.weight() != 1 {
                args.push(Arg::Word("WEIGHT"));
                args.push(Arg::Num(p.weight()));
            }
            // after the limit's WEIGHT, as RL.MULTI and multi.lua take it
            if p.from_first() {
                args.push(Arg::Word("FROMFIRST"));
            }
            if p.check() {
                args.push(Arg::Word("CHECK"));
            }
            if p.shadow() {
                args.push(Arg::Word("SHADOW"));
            }
        }
        tail.push(&mut args);
        let fixed = parts.iter().any(|p| p.kind() == Kind::FixedWindow);
        Request { command: MULTI_COMMAND, script: MULTI_SCRIPT, keys, args, multi: true, fixed, grants: tail.grants() }
    }

    pub fn is_multi(&self) -> bool {
        self.multi
    }

    /// A command of `head` (its name and the arguments before the keys),
    /// the key count, the keys and the arguments, its buffers sized once.
    fn cmd(&self, head: &[&str], count: bool) -> Cmd {
        let data = head.iter().map(|h| h.len()).sum::<usize>()
            + 20
            + self.keys.iter().map(|k| k.len()).sum::<usize>()
            + self.args.iter().map(|a| a.max_len()).sum::<usize>();
        let mut c = Cmd::with_capacity(head.len() + 1 + self.keys.len() + self.args.len(), data);
        for h in head {
            c.arg(*h);
        }
        if count {
            c.arg(self.keys.len());
        }
        for k in &self.keys {
            c.arg(k.as_ref());
        }
        c.arg(&self.args);
        c
    }

    /// The same request owning its keys (a call sent in the background).
    pub fn into_owned(self) -> Request<'static> {
        let keys = self.keys.into_iter().map(|k| Cow::Owned(k.into_owned())).collect();
        Request { keys, ..self }
    }

    pub fn module_cmd(&self) -> Cmd {
        self.cmd(&[self.command], self.multi)
    }

    /// The EVALSHA (or EVAL) of its Lua twin.
    pub fn lua_cmd(&self, eval: bool) -> Cmd {
        let s = script(self.script);
        if eval {
            self.cmd(&["EVAL", s.text], true)
        } else {
            self.cmd(&["EVALSHA", s.sha.as_str()], true)
        }
    }
}

/// What the detection asks: `COMMAND INFO` of these, in this order (the
/// module itself, RL.MULTI, RL.FIXEDWINDOW).
pub(crate) fn detect() -> [&'static str; 3] {
    [Kind::TokenBucket.command(), MULTI_COMMAND, Kind::FixedWindow.command()]
}

/// The module's commands a server has, from its `COMMAND INFO` of [`detect`].
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
    if a.len() != detect().len() {
        return None;
    }
    let has = |x: &Value| !matches!(x, Value::Nil);
    Some(Found { module: has(&a[0]), multi: has(&a[1]), fixed: has(&a[2]) })
}

/// Why a module that lacks what `req` needs refuses it before any call
/// (a module older than `RL.MULTI` or `RL.FIXEDWINDOW`): an unknown
/// command would otherwise look like a failover to a server without it.
pub(crate) fn lacks(found: Option<Found>, req: &Request<'_>) -> Option<&'static str> {
    let f = found?;
    if req.is_multi() && !f.multi {
        Some("this server's redis-ratelimit module has no RL.MULTI (all_of needs it)")
    } else if req.fixed && !f.fixed {
        Some(
            "this server's redis-ratelimit module has no RL.FIXEDWINDOW (fixed_window needs it: \
             upgrade the module, or use Backend::Lua)",
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{fixed_window, sliding_log, token_bucket};

    #[test]
    fn a_fixed_window_limit_takes_fromfirst_after_its_weight() {
        let fw = fixed_window("f", 5, 1000, true).unwrap().weighted(2).unwrap();
        let tb = token_bucket("t", 3, 1, 10).unwrap();
        let r = Request::multi(&[tb.clone(), fw.clone()], vec!["a".into(), "b".into()], Tail::Refund(1));
        assert_eq!(
            r.args.iter().map(Arg::to_string).collect::<Vec<_>>(),
            ["TOKENBUCKET", "3", "1", "10", "FIXEDWINDOW", "5", "1000", "WEIGHT", "2", "FROMFIRST", "REFUND", "1"]
        );
        assert!(r.fixed && r.is_multi() && r.script == "multi");
        assert!(!Request::multi(std::slice::from_ref(&tb), vec!["a".into()], Tail::Refund(1)).fixed);
        let one = Request::single(&fw, "k", Tail::Call { cost: 2, partial: true, dry_run: false, force: false });
        assert_eq!((one.command, one.script, one.fixed), ("RL.FIXEDWINDOW", "fixedwindow", true));
        assert_eq!(
            one.args.iter().map(Arg::to_string).collect::<Vec<_>>(),
            ["5", "1000", "COST", "2", "PARTIAL", "FROMFIRST"]
        );
        // a debit: COST n FORCE, then the window's FROMFIRST; with DRYRUN all five words
        let debit = Request::single(&fw, "k", Tail::Call { cost: 7, partial: false, dry_run: true, force: true });
        assert_eq!(
            debit.args.iter().map(Arg::to_string).collect::<Vec<_>>(),
            ["5", "1000", "COST", "7", "FORCE", "DRYRUN", "FROMFIRST"]
        );
        // the command as sent: the same words and numbers, in order
        let packed = String::from_utf8(one.module_cmd().get_packed_command()).unwrap();
        assert_eq!(
            packed,
            "*8\r\n$14\r\nRL.FIXEDWINDOW\r\n$1\r\nk\r\n$1\r\n5\r\n$4\r\n1000\r\n$4\r\nCOST\r\n$1\r\n2\r\n\
             $7\r\nPARTIAL\r\n$9\r\nFROMFIRST\r\n"
        );
        let packed = String::from_utf8(r.lua_cmd(false).get_packed_command()).unwrap();
        assert!(packed.starts_with(&format!(
            "*17\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n2\r\n$1\r\na\r\n$1\r\nb\r\n$11\r\nTOKENBUCKET\r\n",
            script("multi").sha
        )));
        assert!(String::from_utf8(r.module_cmd().get_packed_command())
            .unwrap()
            .starts_with("*16\r\n$8\r\nRL.MULTI\r\n$1\r\n2\r\n$1\r\na\r\n"));
        assert!(script("fixedwindow").text.contains("RL.FIXEDWINDOW as a Lua script"));
        assert!(!Request::single(&tb, "k", Tail::Refund(1)).fixed);
    }

    #[test]
    fn a_hold_sends_its_action_and_id_as_32_hex_digits() {
        let c = crate::policy::concurrency("n", 10, 30_000).unwrap();
        let id = [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0, 0xff, 0x10, 0x0f, 0xa0, 0x0a, 0x55, 0xaa];
        assert_eq!(&hex(&id), b"0123456789abcdef00ff100fa00a55aa");
        let r = Request::concurrency(&c, "k", Hold::Acquire, id, 3);
        assert_eq!(
            (r.command, r.script, r.grants, r.is_multi(), r.fixed),
            ("RL.CONCURRENCY", "concurrency", true, false, false)
        );
        let packed = String::from_utf8(r.module_cmd().get_packed_command()).unwrap();
        assert_eq!(
            packed,
            "*8\r\n$14\r\nRL.CONCURRENCY\r\n$1\r\nk\r\n$2\r\n10\r\n$5\r\n30000\r\n$7\r\nACQUIRE\r\n\
             $32\r\n0123456789abcdef00ff100fa00a55aa\r\n$4\r\nCOST\r\n$1\r\n3\r\n"
        );
        for (h, w) in [(Hold::Renew, "RENEW"), (Hold::Release, "RELEASE")] {
            let r = Request::concurrency(&c, "k", h, id, 1);
            assert_eq!(
                r.args.iter().map(Arg::to_string).collect::<Vec<_>>(),
                ["10", "30000", w, "0123456789abcdef00ff100fa00a55aa"]
            );
            assert!(!r.grants);
        }
        let lua = String::from_utf8(Request::concurrency(&c, "k", Hold::Acquire, id, 1).lua_cmd(false).get_packed_command())
            .unwrap();
        assert!(lua
            .starts_with(&format!("*8\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n1\r\n$1\r\nk\r\n", script("concurrency").sha)));
        assert_eq!(std::mem::size_of::<Arg>(), 24, "an id makes no argument larger");
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

    #[test]
    fn an_older_module_refuses_what_it_lacks_before_any_call() {
        let fw = fixed_window("f", 5, 1000, false).unwrap();
        let sl = sliding_log("s", 5, 1000).unwrap();
        let single_fw = Request::single(&fw, "k", Tail::Refund(1));
        let multi_fw = Request::multi(&[sl.clone(), fw], vec!["a".into(), "b".into()], Tail::Refund(1));
        let multi_sl = Request::multi(std::slice::from_ref(&sl), vec!["a".into()], Tail::Refund(1));
        let single_sl = Request::single(&sl, "k", Tail::Refund(1));
        let all = Some(Found { module: true, multi: true, fixed: true });
        let no_fixed = Some(Found { module: true, multi: true, fixed: false });
        let no_multi = Some(Found { module: true, multi: false, fixed: false });
        for r in [&single_fw, &multi_fw, &multi_sl, &single_sl] {
            assert_eq!(lacks(all, r), None);
            assert_eq!(lacks(None, r), None);
        }
        assert!(lacks(no_fixed, &single_fw).unwrap().contains("RL.FIXEDWINDOW"));
        assert!(lacks(no_fixed, &multi_fw).unwrap().contains("RL.FIXEDWINDOW"));
        assert_eq!(lacks(no_fixed, &multi_sl), None);
        assert!(lacks(no_multi, &multi_sl).unwrap().contains("RL.MULTI"));
        assert_eq!(lacks(no_multi, &single_sl), None);
    }
}
