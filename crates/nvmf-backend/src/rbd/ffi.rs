//! The librados / librbd binding: the C calls the RBD backend uses, found
//! at run time.
//!
//! Owns our own minimal `extern "C"` declarations (checked against
//! Debian 12's `librados.h` / `librbd.h`, Ceph 16.2) and loading them with
//! `libloading` from `librados.so.2` and `librbd.so.1`, once per process
//! ([`lib`]). nvmfd links neither library: a machine without them builds
//! and runs every other backend, and [`lib`] answers an error naming the
//! missing library and the Debian package that has it.
//!
//! Every function here is a raw C call: callers keep to librbd's rules
//! (handles live until closed, buffers until the completion callback ran).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

/// `rados_t`.
pub type Rados = *mut c_void;
/// `rados_ioctx_t`.
pub type Ioctx = *mut c_void;
/// `rbd_image_t`.
pub type Image = *mut c_void;
/// `rbd_completion_t`.
pub type Completion = *mut c_void;
/// `rbd_callback_t`: called on a librbd thread when an aio op ends.
pub type Callback = extern "C" fn(c: Completion, arg: *mut c_void);
/// `rbd_update_callback_t`: called on a librbd thread when the image's
/// header changed (size, features, snapshots...).
pub type UpdateCallback = extern "C" fn(arg: *mut c_void);

/// `RBD_FEATURE_EXCLUSIVE_LOCK` (rbd/features.h).
pub const RBD_FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;
/// `LIBRADOS_OP_FLAG_FADVISE_FUA` (rados/librados.h).
pub const LIBRADOS_OP_FLAG_FADVISE_FUA: c_int = 0x80;

/// The librados library file.
pub const RADOS_LIB: &str = "librados.so.2";
/// The librbd library file.
pub const RBD_LIB: &str = "librbd.so.1";
/// What to install when either is missing (Debian's librbd1 depends on
/// librados2).
pub const PACKAGE_HINT: &str =
    "on Debian/Ubuntu: apt-get install librbd1, which also brings librados2";

/// The loaded libraries and the entry points we use. The function
/// pointers stay valid as long as the `Library` handles, which live in the
/// same struct (in a process-wide static once loaded).
pub struct Lib {
    _rados: Library,
    _rbd: Library,
    pub rados_create: unsafe extern "C" fn(*mut Rados, *const c_char) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(Rados, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(Rados, *const c_char, *const c_char) -> c_int,
    pub rados_conf_get: unsafe extern "C" fn(Rados, *const c_char, *mut c_char, usize) -> c_int,
    pub rados_connect: unsafe extern "C" fn(Rados) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(Rados),
    pub rados_ioctx_create: unsafe extern "C" fn(Rados, *const c_char, *mut Ioctx) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(Ioctx),
    pub rbd_open: unsafe extern "C" fn(Ioctx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_open_read_only:
        unsafe extern "C" fn(Ioctx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(Image) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(Image, *mut u64) -> c_int,
    pub rbd_get_features: unsafe extern "C" fn(Image, *mut u64) -> c_int,
    pub rbd_resize: unsafe extern "C" fn(Image, u64) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, Callback, *mut Completion) -> c_int,
    pub rbd_aio_read: unsafe extern "C" fn(Image, u64, usize, *mut c_char, Completion) -> c_int,
    pub rbd_aio_write2:
        unsafe extern "C" fn(Image, u64, usize, *const c_char, Completion, c_int) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(Image, Completion) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(Image, u64, u64, Completion) -> c_int,
    pub rbd_aio_write_zeroes:
        unsafe extern "C" fn(Image, u64, usize, Completion, c_int, c_int) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(Completion) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(Completion),
    pub rbd_update_watch:
        unsafe extern "C" fn(Image, *mut u64, UpdateCallback, *mut c_void) -> c_int,
    pub rbd_update_unwatch: unsafe extern "C" fn(Image, u64) -> c_int,
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lib(librados, librbd)")
    }
}

static NAMES: OnceLock<(&'static str, &'static str)> = OnceLock::new();
static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// The process-wide binding, loaded on first use (bdev creation, control
/// plane); the error names the missing library and the package to
/// install.
pub fn lib() -> Result<&'static Lib, String> {
    LIB.get_or_init(|| {
        let (rados, rbd) = NAMES.get().copied().unwrap_or((RADOS_LIB, RBD_LIB));
        load(rados, rbd)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Loads other library files than librados.so.2 / librbd.so.1 (tests: a
/// name that does not exist shows what a machine without Ceph says).
/// Only before the first load; returns whether it took effect.
pub fn use_library_names(rados: &'static str, rbd: &'static str) -> bool {
    LIB.get().is_none() && NAMES.set((rados, rbd)).is_ok()
}

fn open(file: &str) -> Result<Library, String> {
    // SAFETY: loading a shared library runs its initialisers; librados and
    // librbd are ordinary C++ libraries whose initialisers only set up
    // their own globals.
    unsafe { Library::new(file) }.map_err(|e| {
        format!(
            "cannot load {file}, Ceph's client library that rbd bdevs need ({PACKAGE_HINT}): {e}"
        )
    })
}

/// Loads the library files `rados` and `rbd` and resolves every entry
/// point.
pub fn load(rados: &str, rbd: &str) -> Result<Lib, String> {
    let r = open(rados)?;
    let b = open(rbd)?;
    macro_rules! sym {
        ($lib:expr, $file:expr, $name:ident) => {{
            // SAFETY: the symbol's type is the prototype from the library's
            // header (see the field declarations above); the pointer is
            // used only while `Lib` (which owns the library) lives.
            let s = unsafe { $lib.get(concat!(stringify!($name), "\0").as_bytes()) }
                .map_err(|e| format!("{} lacks {}: {e}", $file, stringify!($name)))?;
            *s
        }};
    }
    Ok(Lib {
        rados_create: sym!(r, rados, rados_create),
        rados_conf_read_file: sym!(r, rados, rados_conf_read_file),
        rados_conf_set: sym!(r, rados, rados_conf_set),
        rados_conf_get: sym!(r, rados, rados_conf_get),
        rados_connect: sym!(r, rados, rados_connect),
        rados_shutdown: sym!(r, rados, rados_shutdown),
        rados_ioctx_create: sym!(r, rados, rados_ioctx_create),
        rados_ioctx_destroy: sym!(r, rados, rados_ioctx_destroy),
        rbd_open: sym!(b, rbd, rbd_open),
        rbd_open_read_only: sym!(b, rbd, rbd_open_read_only),
        rbd_close: sym!(b, rbd, rbd_close),
        rbd_get_size: sym!(b, rbd, rbd_get_size),
        rbd_get_features: sym!(b, rbd, rbd_get_features),
        rbd_resize: sym!(b, rbd, rbd_resize),
        rbd_aio_create_completion: sym!(b, rbd, rbd_aio_create_completion),
        rbd_aio_read: sym!(b, rbd, rbd_aio_read),
        rbd_aio_write2: sym!(b, rbd, rbd_aio_write2),
        rbd_aio_flush: sym!(b, rbd, rbd_aio_flush),
        rbd_aio_discard: sym!(b, rbd, rbd_aio_discard),
        rbd_aio_write_zeroes: sym!(b, rbd, rbd_aio_write_zeroes),
        rbd_aio_get_return_value: sym!(b, rbd, rbd_aio_get_return_value),
        rbd_aio_release: sym!(b, rbd, rbd_aio_release),
        rbd_update_watch: sym!(b, rbd, rbd_update_watch),
        rbd_update_unwatch: sym!(b, rbd, rbd_update_unwatch),
        _rados: r,
        _rbd: b,
    })
}

/// A negative Ceph return code in words, e.g. "-110 (Connection timed out)".
pub fn describe(rc: i64) -> String {
    let e = std::io::Error::from_raw_os_error(rc.unsigned_abs() as i32).to_string();
    // "Connection timed out (os error 110)" → "Connection timed out".
    let words = e.split(" (os error").next().unwrap_or(&e);
    format!("{rc} ({words})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the library, loading fails with a message that names the
    /// file and the Debian package to install.
    #[test]
    fn missing_library_names_file_and_package() {
        let e = load("libnvmfd-no-such-rados.so.2", RBD_LIB).unwrap_err();
        assert!(e.contains("cannot load libnvmfd-no-such-rados.so.2"), "{e}");
        assert!(e.contains("apt-get install librbd1"), "{e}");
        // Where librados is missing too, the error is about it; else
        // about librbd.
        let e = load(RADOS_LIB, "libnvmfd-no-such-rbd.so.1").unwrap_err();
        assert!(e.contains("no-such-rbd") || e.contains(RADOS_LIB), "{e}");
        assert!(e.contains("apt-get install librbd1"), "{e}");
    }

    #[test]
    fn describe_names_the_errno() {
        assert_eq!(describe(-110), "-110 (Connection timed out)");
    }
}
