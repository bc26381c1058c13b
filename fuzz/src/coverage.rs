//! Coverage report support (feature "coverage", used by coverage.sh).

/// Describes `pc` in the format language libFuzzer's coverage printer asks
/// for: `%s` file, `%l` line, `%F` "in function", `%L` file:line, `%p` pc.
#[cfg(feature = "coverage")]
pub fn describe_pc(pc: usize, fmt: &str) -> String {
    let (mut name, mut file, mut line) = (String::new(), String::new(), 0u32);
    backtrace::resolve(pc as *mut std::ffi::c_void, |sym| {
        if name.is_empty() {
            if let Some(n) = sym.name() {
                name = format!("{n:#}");
            }
        }
        if file.is_empty() {
            if let Some(f) = sym.filename() {
                file = f.display().to_string();
                line = sym.lineno().unwrap_or(0);
            }
        }
    });
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('s') => out.push_str(if file.is_empty() { "<null>" } else { &file }),
            Some('l') => out.push_str(&line.to_string()),
            Some('F') => out.push_str(&format!("in {name}")),
            Some('L') => out.push_str(&format!("{file}:{line}")),
            Some('p') => out.push_str(&format!("{pc:#x}")),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// Defines the two sanitizer-runtime entry points libFuzzer looks up
/// (weakly) to print coverage. Expanded in each target binary, so the
/// linker keeps them.
#[macro_export]
macro_rules! coverage_hooks {
    () => {
        #[cfg(feature = "coverage")]
        #[no_mangle]
        pub unsafe extern "C" fn __sanitizer_symbolize_pc(
            pc: *mut std::ffi::c_void,
            fmt: *const std::ffi::c_char,
            out: *mut std::ffi::c_char,
            out_size: usize,
        ) {
            if fmt.is_null() || out.is_null() || out_size == 0 {
                return;
            }
            let fmt = std::ffi::CStr::from_ptr(fmt).to_string_lossy();
            let s = $crate::describe_pc(pc as usize, &fmt);
            let n = s.len().min(out_size - 1);
            std::ptr::copy_nonoverlapping(s.as_ptr(), out.cast::<u8>(), n);
            *out.add(n) = 0;
        }

        #[cfg(feature = "coverage")]
        #[no_mangle]
        pub unsafe extern "C" fn __sanitizer_get_module_and_offset_for_pc(
            pc: *mut std::ffi::c_void,
            module: *mut std::ffi::c_char,
            module_len: usize,
            offset: *mut *mut std::ffi::c_void,
        ) -> std::ffi::c_int {
            if !module.is_null() && module_len > 1 {
                *module = b'?' as std::ffi::c_char;
                *module.add(1) = 0;
            }
            if !offset.is_null() {
                *offset = pc;
            }
            1
        }
    };
}
