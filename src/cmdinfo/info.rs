//! The `ratelimit_module` INFO section: the version and which optional
//! APIs the server offered at load (set by `register`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::api::InfoCtx;

use super::version::{MODULE_VERSION, VERSION_TEXT};

pub(super) static DOCS_SET: AtomicBool = AtomicBool::new(false);
pub(super) static ACL_SET: AtomicBool = AtomicBool::new(false);
pub(super) static CATEGORY_SET: AtomicBool = AtomicBool::new(false);

/// The `ratelimit_module` INFO section: version and which of the optional
/// APIs the server offered at load.
pub fn info_section(ctx: InfoCtx) {
    ctx.section(c"module");
    ctx.field_text(c"version", VERSION_TEXT);
    ctx.field_u64(c"version_num", MODULE_VERSION as u64);
    ctx.field_u64(c"command_docs", u64::from(DOCS_SET.load(Relaxed)));
    ctx.field_u64(c"acl_categories", u64::from(ACL_SET.load(Relaxed)));
    ctx.field_u64(c"acl_category_ratelimit", u64::from(CATEGORY_SET.load(Relaxed)));
}
