//! The RADOS primitives a gateway group is built on (issue 25,
//! docs/GATEWAY-GROUPS.md; the group itself is not built yet).
//!
//! Owns [`GroupObjects`]: on one librados connection and pool, a member's
//! lease (a `cls_lock` exclusive lock with a duration, renewed by its
//! holder and free for another once it expired on the OSD), fencing of a
//! member by its client address (`rados_blocklist_add`, then waiting for
//! the OSD map that carries it, so that nothing the fenced client sent can
//! land after our own next write), and objects read and written whole
//! with a version guard (a write computed from version v applies only if
//! the object is still at v). Every call blocks on the cluster: control
//! plane only, never a reactor.
//!
//! The entry points are loaded apart from the RBD backend's (`GroupLib`),
//! so a librados without them (older than Ceph 16) still serves RBD bdevs.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libloading::Library;

use super::conn::Conn;
use super::ffi::{self, Ioctx, Rados};

type WriteOp = *mut c_void;

/// `struct timeval`.
#[repr(C)]
struct Timeval {
    tv_sec: i64,
    tv_usec: i64,
}

/// `LIBRADOS_LOCK_FLAG_RENEW` (Ceph 16's name; later `MAY_RENEW`).
const LOCK_FLAG_RENEW: u8 = 0x1;
/// `LIBRADOS_CREATE_EXCLUSIVE`.
const CREATE_EXCLUSIVE: c_int = 1;

struct GroupLib {
    _rados: Library,
    rados_lock_exclusive: unsafe extern "C" fn(
        Ioctx,
        *const c_char,
        *const c_char,
        *const c_char,
        *const c_char,
        *mut Timeval,
        u8,
    ) -> c_int,
    rados_unlock: unsafe extern "C" fn(Ioctx, *const c_char, *const c_char, *const c_char) -> c_int,
    rados_blocklist_add: unsafe extern "C" fn(Rados, *mut c_char, u32) -> c_int,
    rados_getaddrs: unsafe extern "C" fn(Rados, *mut *mut c_char) -> c_int,
    rados_buffer_free: unsafe extern "C" fn(*mut c_char),
    rados_wait_for_latest_osdmap: unsafe extern "C" fn(Rados) -> c_int,
    rados_stat: unsafe extern "C" fn(Ioctx, *const c_char, *mut u64, *mut i64) -> c_int,
    rados_read: unsafe extern "C" fn(Ioctx, *const c_char, *mut c_char, usize, u64) -> c_int,
    rados_get_last_version: unsafe extern "C" fn(Ioctx) -> u64,
    rados_create_write_op: unsafe extern "C" fn() -> WriteOp,
    rados_release_write_op: unsafe extern "C" fn(WriteOp),
    rados_write_op_assert_version: unsafe extern "C" fn(WriteOp, u64),
    rados_write_op_create: unsafe extern "C" fn(WriteOp, c_int, *const c_char),
    rados_write_op_write_full: unsafe extern "C" fn(WriteOp, *const c_char, usize),
    rados_write_op_operate:
        unsafe extern "C" fn(WriteOp, Ioctx, *const c_char, *mut i64, c_int) -> c_int,
    rados_watch2: unsafe extern "C" fn(
        Ioctx,
        *const c_char,
        *mut u64,
        WatchCb,
        WatchErrCb,
        *mut c_void,
    ) -> c_int,
    rados_unwatch2: unsafe extern "C" fn(Ioctx, u64) -> c_int,
    rados_watch_flush: unsafe extern "C" fn(Rados) -> c_int,
    rados_watch_check: unsafe extern "C" fn(Ioctx, u64) -> c_int,
    rados_notify_ack:
        unsafe extern "C" fn(Ioctx, *const c_char, u64, u64, *const c_char, c_int) -> c_int,
    rados_notify2: unsafe extern "C" fn(
        Ioctx,
        *const c_char,
        *const c_char,
        c_int,
        u64,
        *mut *mut c_char,
        *mut usize,
    ) -> c_int,
}

/// `rados_watchcb2_t`.
type WatchCb = unsafe extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
/// `rados_watcherrcb_t`.
type WatchErrCb = unsafe extern "C" fn(*mut c_void, u64, c_int);

fn group_lib() -> Result<&'static GroupLib, String> {
    static LIB: OnceLock<Result<GroupLib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: loading librados runs its initialisers, which have no
        // preconditions; it is already loaded when an RBD bdev exists.
        let r = unsafe { Library::new(ffi::RADOS_LIB) }.map_err(|e| {
            format!(
                "cannot load {}: {e} ({})",
                ffi::RADOS_LIB,
                ffi::PACKAGE_HINT
            )
        })?;
        macro_rules! sym {
            ($name:ident) => {{
                // SAFETY: the declared type is the prototype in Ceph 16's
                // librados.h; used only while `_rados` lives (a static).
                let s =
                    unsafe { r.get(concat!(stringify!($name), "\0").as_bytes()) }.map_err(|e| {
                        format!(
                            "{} lacks {} (gateway groups need Ceph 16 or later): {e}",
                            ffi::RADOS_LIB,
                            stringify!($name)
                        )
                    })?;
                *s
            }};
        }
        Ok(GroupLib {
            rados_lock_exclusive: sym!(rados_lock_exclusive),
            rados_unlock: sym!(rados_unlock),
            rados_blocklist_add: sym!(rados_blocklist_add),
            rados_getaddrs: sym!(rados_getaddrs),
            rados_buffer_free: sym!(rados_buffer_free),
            rados_wait_for_latest_osdmap: sym!(rados_wait_for_latest_osdmap),
            rados_stat: sym!(rados_stat),
            rados_read: sym!(rados_read),
            rados_get_last_version: sym!(rados_get_last_version),
            rados_create_write_op: sym!(rados_create_write_op),
            rados_release_write_op: sym!(rados_release_write_op),
            rados_write_op_assert_version: sym!(rados_write_op_assert_version),
            rados_write_op_create: sym!(rados_write_op_create),
            rados_write_op_write_full: sym!(rados_write_op_write_full),
            rados_write_op_operate: sym!(rados_write_op_operate),
            rados_watch2: sym!(rados_watch2),
            rados_unwatch2: sym!(rados_unwatch2),
            rados_watch_flush: sym!(rados_watch_flush),
            rados_watch_check: sym!(rados_watch_check),
            rados_notify_ack: sym!(rados_notify_ack),
            rados_notify2: sym!(rados_notify2),
            _rados: r,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Why a lease was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseError {
    /// Another member holds it and it has not expired.
    Held,
    Failed(String),
}

/// Why a guarded write did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// The object is not at the expected version (or, for a create,
    /// exists already): read it again and recompute.
    Conflict,
    Failed(String),
}

/// One member's view of the group's pool (see the module documentation).
pub struct GroupObjects {
    lib: &'static GroupLib,
    conn: Arc<Conn>,
    io: Ioctx,
    /// Held across an operation and `rados_get_last_version`: the version
    /// is the ioctx's, so two threads' operations must not interleave.
    versioned: std::sync::Mutex<()>,
    /// A second ioctx for watch, notify and acknowledgements, which never
    /// take `versioned` (a notify waits for this process's own
    /// acknowledgement, sent from a librados thread).
    wio: Ioctx,
}

// SAFETY: librados handles may be used from any thread; the ioctx is
// destroyed only in Drop.
unsafe impl Send for GroupObjects {}
// SAFETY: as above; every call taking the ioctx is thread-safe.
unsafe impl Sync for GroupObjects {}

impl std::fmt::Debug for GroupObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupObjects").finish_non_exhaustive()
    }
}

impl Drop for GroupObjects {
    fn drop(&mut self) {
        // SAFETY: our ioctxs, created in `open`; every `Watch` holds an Arc
        // of us, so none is left.
        unsafe {
            (self.conn.lib.rados_ioctx_destroy)(self.io);
            (self.conn.lib.rados_ioctx_destroy)(self.wio);
        }
    }
}

fn cstr(what: &str, s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} {s:?} contains a NUL byte"))
}

impl GroupObjects {
    /// The pool `pool` on connection `conn`.
    pub fn open(conn: &Arc<Conn>, pool: &str) -> Result<GroupObjects, String> {
        let lib = group_lib()?;
        let p = cstr("pool", pool)?;
        let mut io: Ioctx = std::ptr::null_mut();
        // SAFETY: a connected handle, a NUL-terminated name, an out pointer.
        let rc = unsafe { (conn.lib.rados_ioctx_create)(conn.raw, p.as_ptr(), &mut io) };
        if rc < 0 {
            return Err(format!("pool {pool}: {}", ffi::describe(rc.into())));
        }
        let mut wio: Ioctx = std::ptr::null_mut();
        // SAFETY: as above.
        let rc = unsafe { (conn.lib.rados_ioctx_create)(conn.raw, p.as_ptr(), &mut wio) };
        if rc < 0 {
            // SAFETY: created above, not shared yet.
            unsafe { (conn.lib.rados_ioctx_destroy)(io) };
            return Err(format!("pool {pool}: {}", ffi::describe(rc.into())));
        }
        Ok(GroupObjects {
            lib,
            conn: conn.clone(),
            io,
            versioned: std::sync::Mutex::new(()),
            wio,
        })
    }

    /// Takes (or, with `renew`, keeps) the exclusive lease `name` on object
    /// `oid` for `member` for `duration`: it stays this member's until it
    /// expires on the OSD `duration` after the OSD granted it.
    pub fn lease(
        &self,
        oid: &str,
        name: &str,
        member: &str,
        duration: Duration,
        renew: bool,
    ) -> Result<(), LeaseError> {
        let fail = LeaseError::Failed;
        let (o, n, m) = (
            cstr("object", oid).map_err(fail)?,
            cstr("lock", name).map_err(LeaseError::Failed)?,
            cstr("member", member).map_err(LeaseError::Failed)?,
        );
        let desc = c"nvmfd gateway lease";
        let mut tv = Timeval {
            tv_sec: duration.as_secs() as i64,
            tv_usec: i64::from(duration.subsec_micros()),
        };
        let flags = if renew { LOCK_FLAG_RENEW } else { 0 };
        // SAFETY: NUL-terminated strings and a timeval that outlive the call.
        let _v = self.versioned.lock().unwrap_or_else(|e| e.into_inner());
        let rc = unsafe {
            (self.lib.rados_lock_exclusive)(
                self.io,
                o.as_ptr(),
                n.as_ptr(),
                m.as_ptr(),
                desc.as_ptr(),
                &mut tv,
                flags,
            )
        };
        match rc {
            0 => Ok(()),
            rc if rc == -libc::EBUSY || rc == -libc::EEXIST => Err(LeaseError::Held),
            rc => Err(LeaseError::Failed(format!(
                "lock {name} on {oid}: {}",
                ffi::describe(rc.into())
            ))),
        }
    }

    /// Gives the lease up (a clean shutdown or a planned move).
    pub fn release(&self, oid: &str, name: &str, member: &str) -> Result<(), String> {
        let (o, n, m) = (
            cstr("object", oid)?,
            cstr("lock", name)?,
            cstr("member", member)?,
        );
        // SAFETY: NUL-terminated strings that outlive the call.
        let _v = self.versioned.lock().unwrap_or_else(|e| e.into_inner());
        let rc = unsafe { (self.lib.rados_unlock)(self.io, o.as_ptr(), n.as_ptr(), m.as_ptr()) };
        if rc < 0 && rc != -libc::ENOENT {
            return Err(format!(
                "unlock {name} on {oid}: {}",
                ffi::describe(rc.into())
            ));
        }
        Ok(())
    }

    /// This connection's client address, as a survivor would fence it.
    pub fn client_address(&self) -> Result<String, String> {
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: a connected handle and an out pointer; librados allocates
        // the string, freed below with rados_buffer_free.
        let rc = unsafe { (self.lib.rados_getaddrs)(self.conn.raw, &mut out) };
        if rc < 0 || out.is_null() {
            return Err(format!("rados_getaddrs: {}", ffi::describe(rc.into())));
        }
        // SAFETY: librados returned a NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated by librados for us.
        unsafe { (self.lib.rados_buffer_free)(out) };
        Ok(s)
    }

    /// Fences the client at `address` for `expire`: the monitors add it
    /// to the OSD blocklist, and this returns once our own connection has
    /// the OSD map that carries it. Every later operation of ours carries
    /// that map's epoch, so the OSD it reaches takes the map first and from
    /// then on refuses the fenced client; an operation of the fenced client
    /// that the OSD processed before ours is ordered before it.
    pub fn fence(&self, address: &str, expire: Duration) -> Result<(), String> {
        let a = cstr("address", address)?;
        let secs = u32::try_from(expire.as_secs()).unwrap_or(u32::MAX).max(1);
        // SAFETY: a connected handle and a NUL-terminated string librados
        // only reads (the prototype is not const).
        let rc =
            unsafe { (self.lib.rados_blocklist_add)(self.conn.raw, a.as_ptr().cast_mut(), secs) };
        if rc < 0 {
            return Err(format!("blocklist {address}: {}", ffi::describe(rc.into())));
        }
        // SAFETY: a connected handle.
        let rc = unsafe { (self.lib.rados_wait_for_latest_osdmap)(self.conn.raw) };
        if rc < 0 {
            return Err(format!(
                "waiting for the OSD map after blocklisting {address}: {}",
                ffi::describe(rc.into())
            ));
        }
        Ok(())
    }

    /// The whole object `oid` and its version; `None` when it does not exist.
    pub fn read(&self, oid: &str) -> Result<Option<(Vec<u8>, u64)>, String> {
        let o = cstr("object", oid)?;
        let _v = self.versioned.lock().unwrap_or_else(|e| e.into_inner());
        let (mut size, mut mtime) = (0u64, 0i64);
        // SAFETY: NUL-terminated name, out pointers.
        let rc = unsafe { (self.lib.rados_stat)(self.io, o.as_ptr(), &mut size, &mut mtime) };
        if rc == -libc::ENOENT {
            return Ok(None);
        }
        if rc < 0 {
            return Err(format!("stat {oid}: {}", ffi::describe(rc.into())));
        }
        // Room for growth between stat and read: a longer object is read again.
        for _ in 0..8 {
            let mut buf = vec![0u8; size as usize + 4096];
            // SAFETY: the buffer has buf.len() writable bytes.
            let rc = unsafe {
                (self.lib.rados_read)(self.io, o.as_ptr(), buf.as_mut_ptr().cast(), buf.len(), 0)
            };
            if rc == -libc::ENOENT {
                return Ok(None);
            }
            if rc < 0 {
                return Err(format!("read {oid}: {}", ffi::describe(rc.into())));
            }
            // SAFETY: the ioctx's last operation was that read.
            let version = unsafe { (self.lib.rados_get_last_version)(self.io) };
            let n = rc as usize;
            if n < buf.len() {
                buf.truncate(n);
                return Ok(Some((buf, version)));
            }
            size = (size * 2).max(n as u64);
        }
        Err(format!("read {oid}: it keeps growing"))
    }

    /// Replaces object `oid` with `data` if it is still at version
    /// `expect` (`None`: only if it does not exist yet). Returns its new
    /// version.
    pub fn write(&self, oid: &str, data: &[u8], expect: Option<u64>) -> Result<u64, WriteError> {
        let o = cstr("object", oid).map_err(WriteError::Failed)?;
        // SAFETY: a fresh write op, released below on every path.
        let op = unsafe { (self.lib.rados_create_write_op)() };
        if op.is_null() {
            return Err(WriteError::Failed("rados_create_write_op failed".into()));
        }
        let _v = self.versioned.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `op` is ours; `data` and `o` outlive `operate`.
        let rc = unsafe {
            match expect {
                Some(v) => (self.lib.rados_write_op_assert_version)(op, v),
                None => (self.lib.rados_write_op_create)(op, CREATE_EXCLUSIVE, std::ptr::null()),
            }
            (self.lib.rados_write_op_write_full)(op, data.as_ptr().cast(), data.len());
            let rc =
                (self.lib.rados_write_op_operate)(op, self.io, o.as_ptr(), std::ptr::null_mut(), 0);
            (self.lib.rados_release_write_op)(op);
            rc
        };
        match rc {
            0 => {
                // SAFETY: the ioctx's last operation was that write.
                Ok(unsafe { (self.lib.rados_get_last_version)(self.io) })
            }
            rc if rc == -libc::ERANGE || rc == -libc::EOVERFLOW || rc == -libc::EEXIST => {
                Err(WriteError::Conflict)
            }
            rc => Err(WriteError::Failed(format!(
                "write {oid}: {}",
                ffi::describe(rc.into())
            ))),
        }
    }

    /// Writes `data` as the whole of object `oid`, unguarded (a member's
    /// own status object, which only it writes).
    pub fn put(&self, oid: &str, data: &[u8]) -> Result<(), String> {
        let o = cstr("object", oid)?;
        // SAFETY: a fresh write op, released below on every path.
        let op = unsafe { (self.lib.rados_create_write_op)() };
        if op.is_null() {
            return Err("rados_create_write_op failed".into());
        }
        let _v = self.versioned.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `op` is ours; `data` and `o` outlive `operate`.
        let rc = unsafe {
            (self.lib.rados_write_op_write_full)(op, data.as_ptr().cast(), data.len());
            let rc =
                (self.lib.rados_write_op_operate)(op, self.io, o.as_ptr(), std::ptr::null_mut(), 0);
            (self.lib.rados_release_write_op)(op);
            rc
        };
        if rc < 0 {
            return Err(format!("write {oid}: {}", ffi::describe(rc.into())));
        }
        Ok(())
    }

    /// Watches object `oid`: every notify on it (and every watch error:
    /// the watch may have been lost, so re-read) raises `wake`. The watch
    /// ends when the returned [`Watch`] is dropped.
    pub fn watch(self: &Arc<Self>, oid: &str, wake: Arc<Wake>) -> Result<Watch, String> {
        let o = cstr("object", oid)?;
        let ctx = Box::new(WatchCtx {
            objs: self.clone(),
            oid: o,
            wake,
        });
        let ctx = Box::into_raw(ctx);
        let mut cookie = 0u64;
        // SAFETY: `ctx` stays allocated until `Watch::drop` unwatched and
        // flushed the callbacks; the callbacks match librados' prototypes.
        let rc = unsafe {
            (self.lib.rados_watch2)(
                self.wio,
                (*ctx).oid.as_ptr(),
                &mut cookie,
                watch_cb,
                watch_err_cb,
                ctx.cast(),
            )
        };
        if rc < 0 {
            // SAFETY: not registered: ours again.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(format!("watch {oid}: {}", ffi::describe(rc.into())));
        }
        Ok(Watch { ctx, cookie })
    }

    /// Tells every watcher of `oid` that it changed; waits at most
    /// `timeout` for their acknowledgements (a dead watcher is not waited
    /// for longer).
    pub fn notify(&self, oid: &str, timeout: Duration) -> Result<(), String> {
        let o = cstr("object", oid)?;
        // SAFETY: NUL-terminated name; no payload; no reply buffer asked for.
        let rc = unsafe {
            (self.lib.rados_notify2)(
                self.wio,
                o.as_ptr(),
                std::ptr::null(),
                0,
                timeout.as_millis() as u64,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if rc < 0 && rc != -libc::ETIMEDOUT {
            return Err(format!("notify {oid}: {}", ffi::describe(rc.into())));
        }
        Ok(())
    }
}

/// What a watch callback raises: a flag and a condition variable the
/// watching thread waits on.
#[derive(Debug, Default)]
pub struct Wake {
    raised: std::sync::Mutex<bool>,
    cond: std::sync::Condvar,
    /// Notifies received (for the metrics).
    notifies: std::sync::atomic::AtomicU64,
}

impl Wake {
    pub fn raise(&self) {
        *self.raised.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_all();
    }

    /// Notifies received so far.
    pub fn notifies(&self) -> u64 {
        self.notifies.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until raised or `timeout`; clears the flag. True when raised.
    pub fn wait(&self, timeout: Duration) -> bool {
        let g = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        let (mut g, _) = self
            .cond
            .wait_timeout_while(g, timeout, |r| !*r)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *g)
    }
}

struct WatchCtx {
    objs: Arc<GroupObjects>,
    oid: CString,
    wake: Arc<Wake>,
}

/// A watch on one object (see [`GroupObjects::watch`]).
pub struct Watch {
    ctx: *mut WatchCtx,
    cookie: u64,
}

// SAFETY: the context is only read by librados' callbacks and freed in
// Drop after they are flushed.
unsafe impl Send for Watch {}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("cookie", &self.cookie)
            .finish()
    }
}

impl Watch {
    /// Whether the watch still stands (`rados_watch_check`): false once
    /// librados gave it up; drop it and watch again.
    pub fn healthy(&self) -> bool {
        // SAFETY: `ctx` is alive while `self` is.
        let objs = unsafe { &(*self.ctx).objs };
        // SAFETY: our ioctx and this watch's cookie.
        unsafe { (objs.lib.rados_watch_check)(objs.wio, self.cookie) >= 0 }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: `ctx` is alive until the end of this function; after
        // unwatch and a flush no callback can still run with it.
        unsafe {
            let objs = &(*self.ctx).objs;
            (objs.lib.rados_unwatch2)(objs.wio, self.cookie);
            (objs.lib.rados_watch_flush)(objs.conn.raw);
            drop(Box::from_raw(self.ctx));
        }
    }
}

/// A notify arrived: raise the watcher's wake, then acknowledge (the
/// notifier waits for every acknowledgement).
unsafe extern "C" fn watch_cb(
    arg: *mut c_void,
    notify_id: u64,
    handle: u64,
    _notifier: u64,
    _data: *mut c_void,
    _len: usize,
) {
    // Never unwind into librados.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `arg` is the `WatchCtx` registered with this watch, alive
        // until the watch is dropped (which flushes callbacks first).
        let ctx = unsafe { &*(arg as *const WatchCtx) };
        ctx.wake
            .notifies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ctx.wake.raise();
        // SAFETY: the ioctx and the name outlive the watch.
        unsafe {
            (ctx.objs.lib.rados_notify_ack)(
                ctx.objs.wio,
                ctx.oid.as_ptr(),
                notify_id,
                handle,
                std::ptr::null(),
                0,
            );
        }
    });
}

/// The watch failed (e.g. the connection was reset): raise, so the
/// watcher re-reads and may watch again.
unsafe extern "C" fn watch_err_cb(arg: *mut c_void, _cookie: u64, _err: c_int) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: as in `watch_cb`.
        let ctx = unsafe { &*(arg as *const WatchCtx) };
        ctx.wake.raise();
    });
}
