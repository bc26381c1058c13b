//! The `ratelimit_module` INFO section: the version and which optional
//! APIs the server offered at load (set by `register`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleInfoCtx};

use super::version::{MODULE_VERSION, VERSION_TEXT};

pub(super) static DOCS_SET: AtomicBool = AtomicBool::new(false);
pub(super) static ACL_SET: AtomicBool = AtomicBool::new(false);
pub(super) static CATEGORY_SET: AtomicBool = AtomicBool::new(false);

/// The `ratelimit_module` INFO section: version and which of the optional
/// APIs the server offered at load.
///
/// # Safety
///
/// `ctx` is the valid INFO context the server passed to the INFO callback
/// that is running now.
pub unsafe fn info_section(ctx: *mut RedisModuleInfoCtx) {
    // SAFETY: the API pointers are set at load and never change afterwards,
    // so reading them races with no write.
    let api = unsafe {
        (raw::RedisModule_InfoAddSection, raw::RedisModule_InfoAddFieldULongLong, raw::RedisModule_InfoAddFieldCString)
    };
    let (Some(section), Some(num), Some(text)) = api else {
        return;
    };
    // SAFETY: the caller passes the valid INFO ctx of the running callback;
    // the names and VERSION_TEXT are NUL-terminated statics, which the server
    // only reads (the C API takes the value as `char *` but copies it).
    unsafe {
        section(ctx, c"module".as_ptr());
        text(ctx, c"version".as_ptr(), VERSION_TEXT.as_ptr().cast_mut());
        num(ctx, c"version_num".as_ptr(), MODULE_VERSION as u64);
        num(ctx, c"command_docs".as_ptr(), u64::from(DOCS_SET.load(Relaxed)));
        num(ctx, c"acl_categories".as_ptr(), u64::from(ACL_SET.load(Relaxed)));
        num(ctx, c"acl_category_ratelimit".as_ptr(), u64::from(CATEGORY_SET.load(Relaxed)));
    }
}
