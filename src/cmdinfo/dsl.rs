//! The argument-tree DSL of `COMMAND DOCS`: an argument as a `static`
//! (`RedisModuleCommandArg` without the pointers) and its constructors.

use std::ffi::CStr;

#[derive(Clone, Copy)]
pub(super) enum Ty {
    Key,
    Int,
    Str,
    Token,
    /// Exactly one of the sub-arguments.
    OneOf,
    /// The sub-arguments together (after the token, if any).
    Block,
}

/// One argument of a command's tree (`RedisModuleCommandArg` without the
/// pointers, so it can be a `static`).
#[derive(Clone, Copy)]
pub(super) struct Arg {
    pub(super) name: &'static CStr,
    pub(super) ty: Ty,
    /// The keyword before the value (`COST n`), or the whole pure token.
    pub(super) token: Option<&'static CStr>,
    pub(super) summary: Option<&'static CStr>,
    pub(super) since: Option<&'static CStr>,
    /// What `redis-cli` shows for the value (`n` in `[COST n]`).
    pub(super) display: Option<&'static CStr>,
    pub(super) optional: bool,
    pub(super) multiple: bool,
    pub(super) sub: &'static [Arg],
}

pub(super) const fn arg(name: &'static CStr, ty: Ty) -> Arg {
    Arg { name, ty, token: None, summary: None, since: None, display: None, optional: false, multiple: false, sub: &[] }
}
pub(super) const fn key(name: &'static CStr) -> Arg {
    arg(name, Ty::Key)
}
pub(super) const fn int(name: &'static CStr, summary: &'static CStr) -> Arg {
    Arg { summary: Some(summary), ..arg(name, Ty::Int) }
}
/// `[TOKEN display]`: an optional keyword with an integer.
pub(super) const fn opt_int(
    name: &'static CStr,
    token: &'static CStr,
    display: &'static CStr,
    summary: &'static CStr,
) -> Arg {
    Arg { token: Some(token), summary: Some(summary), display: Some(display), optional: true, ..arg(name, Ty::Int) }
}
/// `[TOKEN]`: an optional flag.
pub(super) const fn opt_flag(name: &'static CStr, token: &'static CStr, summary: &'static CStr) -> Arg {
    Arg { token: Some(token), summary: Some(summary), optional: true, ..arg(name, Ty::Token) }
}
