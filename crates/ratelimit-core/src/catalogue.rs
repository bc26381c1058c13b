//! The catalogue: every kind of limit, and every command that counts in
//! `INFO ratelimit`, declared once.
//!
//! A [`Kind`] is a limit algorithm with its own command, its RL.MULTI word,
//! its data type and its effect payload. Its [`Spec`] holds what the module,
//! the clients and the service would otherwise each write out again: the
//! names, the positional arguments, whether it takes `FROMFIRST`, its
//! keyspace event, its registered data type, its RL.STATE kind byte and its
//! INFO counters. RL.MULTI and CL.THROTTLE are commands without a kind of
//! their own: [`MULTI`] and [`THROTTLE`] hold their event and counters.
//!
//! Adding a kind: add the variant, its [`Spec`] in [`Kind::spec`] and its
//! place in [`KINDS`], then follow the compiler (every `match` on a kind is
//! exhaustive) and the catalogue tests, which name what no compiler
//! reaches: the exported `catalogue.json` beside this crate, the Lua twins
//! and the Python and Node clients (docs/architecture.md, "Adding a kind").
//! Nothing here runs on the request path except constant lookups.

use core::ffi::CStr;

use crate::args::{Arg, CONCURRENCY_ARGS, TOKENBUCKET_ARGS, WINDOW_ARGS};
use crate::codec;

/// A limit algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    TokenBucket,
    SlidingLog,
    SlidingCounter,
    FixedWindow,
    Concurrency,
}

/// Every kind, in the catalogue's order (the order of the exported data).
pub const KINDS: [Kind; 5] =
    [Kind::TokenBucket, Kind::SlidingLog, Kind::SlidingCounter, Kind::FixedWindow, Kind::Concurrency];

/// What counts in INFO for a command: its keyspace event, whether it has
/// PARTIAL and REFUND (INFO shows those counters only then), and its row
/// in `INFO ratelimit`. The counters are named after the command
/// ([`counted_rows`]: `tokenbucket_granted`, ..., `throttle_denied`).
#[derive(Debug)]
pub struct Counted {
    /// The keyspace event of a write (module class; a REFUND that gave
    /// units back emits [`REFUND_EVENT`] instead).
    pub event: &'static CStr,
    /// It takes PARTIAL and REFUND (every command but CL.THROTTLE).
    pub partial_and_refunds: bool,
    /// The row of the counters in `INFO ratelimit` (their order there).
    pub slot: usize,
}

/// One kind, declared once.
#[derive(Debug)]
pub struct Spec {
    /// Its lowercase name (`tokenbucket`): the Lua twin's file, the
    /// clients' and the service's name of it.
    pub name: &'static str,
    /// Its command (`RL.TOKENBUCKET`).
    pub command: &'static CStr,
    /// Its word in RL.MULTI's limit grammar (`TOKENBUCKET`).
    pub word: &'static str,
    /// Its positional numeric arguments after the key.
    pub args: &'static [Arg],
    /// Whether it takes the `FROMFIRST` option.
    pub from_first: bool,
    /// Its registered data type (9 characters).
    pub data_type: &'static str,
    /// Its state's kind byte in the RL.STATE payload (`codec`).
    pub effect_kind: u8,
    /// Its event and INFO counters.
    pub counted: Counted,
}

/// The keyspace event of a REFUND that gave units back (stored or deleted).
pub const REFUND_EVENT: &CStr = c"rl.refund";

static TOKENBUCKET: Spec = Spec {
    name: "tokenbucket",
    command: c"RL.TOKENBUCKET",
    word: "TOKENBUCKET",
    args: TOKENBUCKET_ARGS,
    from_first: false,
    data_type: "rl-tokbkt",
    effect_kind: codec::KIND_TOKENBUCKET,
    counted: Counted { event: c"rl.tokenbucket", partial_and_refunds: true, slot: 0 },
};

static SLIDINGLOG: Spec = Spec {
    name: "slidinglog",
    command: c"RL.SLIDINGLOG",
    word: "SLIDINGLOG",
    args: WINDOW_ARGS,
    from_first: false,
    data_type: "rl-slilog",
    effect_kind: codec::KIND_SLIDINGLOG,
    counted: Counted { event: c"rl.slidinglog", partial_and_refunds: true, slot: 1 },
};

static SLIDINGCOUNTER: Spec = Spec {
    name: "slidingcounter",
    command: c"RL.SLIDINGCOUNTER",
    word: "SLIDINGCOUNTER",
    args: WINDOW_ARGS,
    from_first: false,
    data_type: "rl-slicnt",
    effect_kind: codec::KIND_SLIDINGCOUNTER,
    counted: Counted { event: c"rl.slidingcounter", partial_and_refunds: true, slot: 2 },
};

static FIXEDWINDOW: Spec = Spec {
    name: "fixedwindow",
    command: c"RL.FIXEDWINDOW",
    word: "FIXEDWINDOW",
    args: WINDOW_ARGS,
    from_first: true,
    data_type: "rl-fixwin",
    effect_kind: codec::KIND_FIXEDWINDOW,
    counted: Counted { event: c"rl.fixedwindow", partial_and_refunds: true, slot: 4 },
};

static CONCURRENCY: Spec = Spec {
    name: "concurrency",
    command: c"RL.CONCURRENCY",
    word: "CONCURRENCY",
    args: CONCURRENCY_ARGS,
    from_first: false,
    data_type: "rl-concur",
    effect_kind: codec::KIND_CONCURRENCY,
    counted: Counted { event: c"rl.concurrency", partial_and_refunds: true, slot: 6 },
};

/// RL.MULTI: counted once per call, whatever the number of its limits.
pub static MULTI: Counted = Counted { event: c"rl.multi", partial_and_refunds: true, slot: 3 };

/// CL.THROTTLE (redis-cell's GCRA, `crate::gcra`): granted or denied; it has
/// neither PARTIAL nor REFUND.
pub static THROTTLE: Counted = Counted { event: c"cl.throttle", partial_and_refunds: false, slot: 5 };

/// The rows of `INFO ratelimit`'s counters: the kinds, RL.MULTI and CL.THROTTLE.
pub const COUNTED_ROWS: usize = KINDS.len() + 2;

/// Every counted command with the name its INFO counters carry: the kinds
/// by their names, then `multi` and `throttle`.
pub fn counted_rows() -> impl Iterator<Item = (&'static str, &'static Counted)> {
    KINDS.into_iter().map(|k| (k.name(), &k.spec().counted)).chain([("multi", &MULTI), ("throttle", &THROTTLE)])
}

impl Kind {
    /// Its declaration.
    #[inline(always)]
    pub const fn spec(self) -> &'static Spec {
        match self {
            Kind::TokenBucket => &TOKENBUCKET,
            Kind::SlidingLog => &SLIDINGLOG,
            Kind::SlidingCounter => &SLIDINGCOUNTER,
            Kind::FixedWindow => &FIXEDWINDOW,
            Kind::Concurrency => &CONCURRENCY,
        }
    }
    /// Its lowercase name (`tokenbucket`).
    pub const fn name(self) -> &'static str {
        self.spec().name
    }
    /// Its RL.MULTI word (`TOKENBUCKET`).
    pub const fn word(self) -> &'static str {
        self.spec().word
    }
    /// Its command (`RL.TOKENBUCKET`).
    pub fn command(self) -> &'static str {
        self.spec().command.to_str().unwrap_or("")
    }
    /// Its positional numeric arguments.
    pub const fn args(self) -> &'static [Arg] {
        self.spec().args
    }
    /// The kind whose lowercase name is `name`.
    pub fn from_name(name: &str) -> Option<Kind> {
        KINDS.into_iter().find(|k| k.name() == name)
    }
    /// The algorithm RL.MULTI's word `w` names, case-insensitively: one
    /// comparison, picked by the length (the words of 10 and 14 letters
    /// are one each; the three of 11 letters differ in their first). The
    /// catalogue test checks it against every [`Spec::word`].
    #[inline]
    pub fn from_word(w: &[u8]) -> Option<Kind> {
        let kind = match (w.len(), w.first().map(|b| b & 0xDF)) {
            (11, Some(b'T')) => Kind::TokenBucket,
            (11, Some(b'C')) => Kind::Concurrency,
            (11, _) => Kind::FixedWindow,
            (10, _) => Kind::SlidingLog,
            (14, _) => Kind::SlidingCounter,
            _ => return None,
        };
        crate::args::eq_upper_letters(w, kind.word().as_bytes()).then_some(kind)
    }
}

/// The catalogue as JSON, for the parts no Rust compiler reaches (the Lua
/// twins, the Python and Node clients): committed as `catalogue.json`
/// beside this crate, compared by a unit test here and by their suites.
pub fn export_json() -> String {
    let mut out = String::from("{\n  \"kinds\": [\n");
    for (i, k) in KINDS.into_iter().enumerate() {
        let s = k.spec();
        let args: Vec<String> = s.args.iter().map(|a| format!("\"{}\"", a.name())).collect();
        out.push_str(&format!(
            "    {{\"name\": \"{}\", \"command\": \"{}\", \"word\": \"{}\", \"args\": [{}], \"from_first\": {}, \
             \"data_type\": \"{}\", \"event\": \"{}\"}}{}\n",
            s.name,
            k.command(),
            s.word,
            args.join(", "),
            s.from_first,
            s.data_type,
            s.counted.event.to_str().unwrap_or(""),
            if i + 1 < KINDS.len() { "," } else { "" }
        ));
    }
    out.push_str("  ]\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed export equals the catalogue. After a change to the
    /// catalogue: `RL_CATALOGUE_WRITE=1 cargo test -p ratelimit-core catalogue`.
    #[test]
    fn the_committed_export_is_the_catalogue() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/catalogue.json");
        let want = export_json();
        if std::env::var_os("RL_CATALOGUE_WRITE").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(
            have, want,
            "{path} is not the catalogue's export: RL_CATALOGUE_WRITE=1 cargo test -p ratelimit-core catalogue"
        );
    }

    #[test]
    fn every_kind_is_found_by_its_word_and_name_only() {
        for k in KINDS {
            assert_eq!(Kind::from_word(k.word().as_bytes()), Some(k), "{k:?}");
            assert_eq!(Kind::from_word(k.word().to_ascii_lowercase().as_bytes()), Some(k));
            assert_eq!(Kind::from_name(k.name()), Some(k));
            assert_eq!(k.command(), format!("RL.{}", k.word()));
            assert_eq!(k.name(), k.word().to_ascii_lowercase());
            assert_eq!(k.spec().data_type.len(), 9, "a module type name is exactly 9 characters");
            assert_eq!(k.spec().counted.event.to_str().unwrap(), format!("rl.{}", k.name()));
        }
        for w in ["TOKENBUCKE", "XOKENBUCKET", "FIXEDWINDOWS", "SLIDINGLOG1", "", "MULTI"] {
            assert_eq!(Kind::from_word(w.as_bytes()), None, "{w}");
        }
    }

    /// Every INFO row is taken once, the kinds' by their slots, RL.MULTI's
    /// and CL.THROTTLE's by theirs; no two effect kinds or types collide.
    #[test]
    fn slots_types_and_effects_are_distinct() {
        let mut slots: Vec<usize> = counted_rows().map(|(_, c)| c.slot).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..COUNTED_ROWS).collect::<Vec<_>>());
        let mut effects: Vec<u8> = KINDS.iter().map(|k| k.spec().effect_kind).collect();
        effects.sort_unstable();
        effects.dedup();
        assert_eq!(effects.len(), KINDS.len());
        let mut types: Vec<&str> = KINDS.iter().map(|k| k.spec().data_type).collect();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), KINDS.len());
    }
}
