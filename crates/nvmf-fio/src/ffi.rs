//! ffi.rs — the C ABI the fio shim (csrc/nvmf_fio.c) calls: probe a
//! filename, create/free a job, open/close a file, queue, commit,
//! getevents. Every entry point catches panics (none may unwind into fio)
//! and reports failures as a return code plus a message written into the
//! caller's buffer, which the shim prints with fio's log_err.
//!
//! Return conventions: 0 = success and -1 = failure (message set), except
//! `nvmf_fio_open` (file index ≥ 0), `nvmf_fio_queue` (QUEUED / BUSY /
//! COMPLETED) and `nvmf_fio_getevents` (number of events).

use crate::engine::{self, Job, Queued};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// `nvmf_fio_queue` results (the shim maps them to fio's FIO_Q_*).
pub const Q_QUEUED: c_int = 0;
pub const Q_BUSY: c_int = 1;
pub const Q_COMPLETED: c_int = 2;

/// Copy `msg` into the caller's `buf` of `len` bytes, NUL-terminated.
unsafe fn set_msg(buf: *mut c_char, len: usize, msg: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let mut n = msg.len().min(len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, n);
    *buf.add(n) = 0;
}

/// Run `f`; a panic becomes `on_panic` with a message.
unsafe fn guard<T>(
    msg: *mut c_char,
    msglen: usize,
    on_panic: T,
    f: impl FnOnce() -> Result<T, String>,
) -> (T, bool) {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => (v, true),
        Ok(Err(e)) => {
            set_msg(msg, msglen, &e);
            (on_panic, false)
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            set_msg(msg, msglen, &format!("internal error (panic): {what}"));
            (on_panic, false)
        }
    }
}

unsafe fn name_arg<'a>(name: *const c_char) -> Result<&'a str, String> {
    if name.is_null() {
        return Err("no filename".into());
    }
    CStr::from_ptr(name)
        .to_str()
        .map_err(|_| "filename is not UTF-8".into())
}

unsafe fn job_arg<'a>(job: *mut c_void) -> Result<&'a mut Job, String> {
    if job.is_null() {
        return Err("no job state (init failed?)".into());
    }
    Ok(&mut *(job as *mut Job))
}

/// Connect to the filename's namespace and report its size in bytes and
/// its block size; disconnect again.
///
/// # Safety
/// `name` is a C string; `size`, `bs` are writable; `msg` has `msglen` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_probe(
    name: *const c_char,
    size: *mut u64,
    bs: *mut u32,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    guard(msg, msglen, -1, || {
        let info = engine::probe(name_arg(name)?)?;
        if !size.is_null() {
            *size = info.size_bytes;
        }
        if !bs.is_null() {
            *bs = info.block_size;
        }
        Ok(0)
    })
    .0
}

/// State for one fio job: `depth` = iodepth, `min_bs` = the smallest
/// block size of the job, `max_bs` = its largest read or write (the size
/// of the queue's data buffers), `poll_us` = busy-poll time before
/// sleeping (the `nvmf_poll_us` option). NULL on failure.
///
/// # Safety
/// `msg` has `msglen` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_new(
    depth: u32,
    min_bs: u32,
    max_bs: u32,
    poll_us: u32,
    msg: *mut c_char,
    msglen: usize,
) -> *mut c_void {
    guard(msg, msglen, std::ptr::null_mut(), || {
        let job = Job::new(depth, min_bs, max_bs, poll_us)?;
        Ok(Box::into_raw(Box::new(job)) as *mut c_void)
    })
    .0
}

/// Free a job (closing its files).
///
/// # Safety
/// `job` came from `nvmf_fio_job_new` (or is NULL) and is not used after.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_free(job: *mut c_void) {
    if job.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(job as *mut Job))));
}

/// Open a file of the job; returns its index (≥ 0) or -1.
///
/// # Safety
/// `job` from `nvmf_fio_job_new`; `name` a C string; `msg` has `msglen` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_open(
    job: *mut c_void,
    name: *const c_char,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    guard(msg, msglen, -1, || {
        let job = job_arg(job)?;
        let idx = job.open(name_arg(name)?)?;
        c_int::try_from(idx).map_err(|_| "too many files".into())
    })
    .0
}

/// Close a file of the job.
///
/// # Safety
/// `job` from `nvmf_fio_job_new`.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_close(job: *mut c_void, idx: c_int) {
    let _ = guard(std::ptr::null_mut(), 0, (), || {
        job_arg(job)?.close(idx.max(0) as usize);
        Ok(())
    });
}

/// Queue one I/O (`op`: 0 read, 1 write, 2 trim, 3 flush). Returns
/// Q_QUEUED, Q_BUSY (no free slot), Q_COMPLETED (failed at once; errno in
/// `*err`) or -1 (message set).
///
/// # Safety
/// `buf` valid for `len` bytes until reaped; `err` writable; `msg` has `msglen` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvmf_fio_queue(
    job: *mut c_void,
    idx: c_int,
    op: u32,
    offset: u64,
    len: u64,
    buf: *mut c_void,
    tag: *mut c_void,
    err: *mut c_int,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    guard(msg, msglen, -1, || {
        let job = job_arg(job)?;
        let r = job.queue(idx.max(0) as usize, op, offset, len, buf as *mut u8, tag)?;
        Ok(match r {
            Queued::Queued => Q_QUEUED,
            Queued::Busy => Q_BUSY,
            Queued::Failed(e) => {
                if !err.is_null() {
                    *err = e;
                }
                Q_COMPLETED
            }
        })
    })
    .0
}

/// Send what was queued.
///
/// # Safety
/// `job` from `nvmf_fio_job_new`; `msg` has `msglen` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_commit(
    job: *mut c_void,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    guard(msg, msglen, -1, || {
        job_arg(job)?.commit()?;
        Ok(0)
    })
    .0
}

/// Reap between `min` and `max` completions into `tags`/`errs` (errno per
/// event, 0 = success), waiting at most `timeout_ns` (< 0: no limit).
/// Returns the count, or -1 (message set).
///
/// # Safety
/// `tags` and `errs` have `max` writable entries; `msg` has `msglen` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvmf_fio_getevents(
    job: *mut c_void,
    min: u32,
    max: u32,
    timeout_ns: i64,
    tags: *mut *mut c_void,
    errs: *mut c_int,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    guard(msg, msglen, -1, || {
        let job = job_arg(job)?;
        if tags.is_null() || errs.is_null() {
            return Err("no event arrays".into());
        }
        let tags = std::slice::from_raw_parts_mut(tags, max as usize);
        let errs = std::slice::from_raw_parts_mut(errs, max as usize);
        let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
        let n = job.getevents(min as usize, timeout, tags, errs)?;
        Ok(n as c_int)
    })
    .0
}

#[cfg(all(nvmf_fio_shim, not(test)))]
mod shim {
    use std::ffi::c_void;
    extern "C" {
        /// The engine's `struct ioengine_ops` (csrc/nvmf_fio.c).
        fn nvmf_fio_shim_ops() -> *mut c_void;
    }

    /// What fio looks up in an external engine when it finds no `ioengine`
    /// symbol: hands out the engine's `struct ioengine_ops`. (The C object
    /// holding the ops would not be exported from a Rust cdylib by itself.)
    ///
    /// # Safety
    /// `ops` is writable.
    #[no_mangle]
    pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
        if !ops.is_null() {
            *ops = nvmf_fio_shim_ops();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_truncated_and_terminated() {
        let mut buf = [0x55 as c_char; 8];
        unsafe { set_msg(buf.as_mut_ptr(), buf.len(), "abcdefghijk") };
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(s.to_str().unwrap(), "abcdefg");
    }

    #[test]
    fn panics_become_errors() {
        let mut buf = [0 as c_char; 64];
        let (v, ok) = unsafe {
            guard(
                buf.as_mut_ptr(),
                buf.len(),
                -1,
                || -> Result<c_int, String> { panic!("boom") },
            )
        };
        assert_eq!((v, ok), (-1, false));
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert!(s.contains("panic") && s.contains("boom"), "{s}");
    }

    #[test]
    fn bad_filename_is_an_error_not_a_panic() {
        let mut buf = [0 as c_char; 256];
        let name = c"/dev/nvme0n1";
        let mut size = 0u64;
        let r = unsafe {
            nvmf_fio_probe(
                name.as_ptr(),
                &mut size,
                std::ptr::null_mut(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        assert_eq!(r, -1);
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert!(s.contains("is not key=value"), "{s}");
    }
}
