//! nvmf-rdma: nvmfd's NVMe/RDMA transport (issue 13). The verbs layer is a small, safe API over
//! Debian's libibverbs and librdmacm, shaped for a target that serves queues from an epoll
//! reactor thread. The libraries are opened with `dlopen` on first use, so programs linking this
//! crate build and run (TCP only) where rdma-core is absent; [`available`] says why RDMA cannot
//! be used there.
//!
//! * [`cm`]: connection management — an [`EventChannel`] (non-blocking fd for epoll), listening
//!   [`CmId`]s, connection events with their private data, accept / reject / disconnect, and
//!   the initiator side (address and route resolution, connect).
//! * [`client`]: waiting for CM events and resolving a peer, for one-connection tools.
//! * [`queue`]: [`RdmaQueue`], one NVMe/RDMA queue as a sans-I/O state machine over the core's
//!   request engine (capsules from RECVs in, RDMA READ / WRITE / SEND work requests out).
//! * [`srq`]: [`RecvPool`], the receive buffers of a device's shared receive queue (sans-I/O:
//!   posted / held / idle per buffer).
//! * [`port`]: [`RdmaPort`], the target side: CM listeners, connect-request checks, accept /
//!   reject, the verbs glue that runs each connection's queue, teardown.
//! * [`verbs`]: per-connection resources — [`ProtectionDomain`] (one per device, shared),
//!   [`CompletionQueue`] with its completion channel (fd for epoll, arm / drain), optional
//!   [`SharedReceiveQueue`]s, the RC queue pair on a [`CmId`], [`MemoryRegion`] over
//!   caller-owned memory, [`MemoryWindow`] (type 2, for the initiator), work requests posted in
//!   batches (one doorbell per batch) and [`Completion`]s polled into a caller's array.
//!
//! Nothing here waits for the network: every call is one system call or a user-space queue
//! operation that returns at once; what completes later (address/route resolution, connection
//! setup, teardown) is reported as a [`CmEvent`] on the channel.

pub mod client;
pub mod cm;
mod ffi;
pub mod port;
pub mod queue;
pub mod srq;
pub mod verbs;

use std::io;
use std::sync::OnceLock;

pub use port::{ConnView, FdChange, OnDestroy, PendingConn, PollStats, RdmaPort, DISCONNECT_GRACE};
pub use queue::{
    request_params, Liveness, Local, RdmaQueue, RdmaQueueParams, Region, WorkCompletion,
    WorkRequest,
};
pub use srq::{RecvPool, RecvPost};

/// What NVMe/RDMA states about its capsules (each connection's `PortInfo::caps`): host memory
/// is reached through Keyed SGL Data Block descriptors, one per command.
pub const CAPS: nvmf_core::TransportCaps = nvmf_core::TransportCaps {
    keyed_sgls: true,
    msdbd: 1,
};

pub use cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel};
pub use verbs::{
    next_rkey, Access, AsyncEvent, AsyncEventKind, Completion, CompletionQueue, Device,
    DeviceLimits, MemoryRegion, MemoryWindow, PostError, ProtectionDomain, QpCaps, RecvWr, SendOp,
    SendWr, Sge, SharedReceiveQueue, WcOpcode,
};

/// A failed RDMA call: which C function, and the `errno` it left.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct Error {
    /// The rdma-core function (or this crate's check) that failed.
    pub op: &'static str,
    /// Its error.
    #[source]
    pub source: io::Error,
}

impl Error {
    fn last(op: &'static str) -> Error {
        Error {
            op,
            source: io::Error::last_os_error(),
        }
    }
    fn errno(op: &'static str, errno: i32) -> Error {
        Error {
            op,
            source: io::Error::from_raw_os_error(errno),
        }
    }
    fn invalid(op: &'static str, what: String) -> Error {
        Error {
            op,
            source: io::Error::new(io::ErrorKind::InvalidInput, what),
        }
    }
    fn unavailable(why: &str) -> Error {
        Error {
            op: "nvmf-rdma",
            source: io::Error::new(io::ErrorKind::Unsupported, why.to_string()),
        }
    }
}

/// Result of this crate's calls.
pub type Result<T> = std::result::Result<T, Error>;

const IBVERBS: &str = "libibverbs.so.1";
const RDMACM: &str = "librdmacm.so.1";

static LIB: OnceLock<std::result::Result<ffi::Lib, String>> = OnceLock::new();

/// The loaded libraries, or why they could not be loaded (message of [`available`] style).
fn lib() -> Result<&'static ffi::Lib> {
    LIB.get_or_init(|| ffi::Lib::load(IBVERBS, RDMACM).map_err(|e| needs(&e)))
        .as_ref()
        .map_err(|e| Error::unavailable(e))
}

fn needs(detail: &str) -> String {
    format!(
        "NVMe/RDMA needs librdmacm and libibverbs (Debian: librdmacm1, libibverbs1, \
         ibverbs-providers) and an RDMA device; none found: {detail}"
    )
}

/// Whether RDMA can be used here: both libraries load and libibverbs lists at least one
/// device. Err is a message for the operator naming the Debian packages and what was missing.
pub fn available() -> std::result::Result<(), String> {
    let lib = lib().map_err(|e| e.source.to_string())?;
    device_count(lib).map_err(|e| needs(&e)).and_then(|n| {
        if n == 0 {
            Err(needs(
                "libibverbs lists no RDMA device (for soft-RoCE: `rdma link add rxe0 type rxe \
                 netdev IFACE`)",
            ))
        } else {
            Ok(())
        }
    })
}

fn device_count(lib: &ffi::Lib) -> std::result::Result<usize, String> {
    let mut n: i32 = 0;
    // SAFETY: plain libibverbs call; the list is freed right after.
    let list = unsafe { (lib.ibv_get_device_list)(&mut n) };
    if list.is_null() {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::ENOSYS) {
            format!("ibv_get_device_list: {e} (no RDMA devices or ib_uverbs in this kernel)")
        } else {
            format!("ibv_get_device_list: {e}")
        });
    }
    // SAFETY: `list` came from ibv_get_device_list.
    unsafe { (lib.ibv_free_device_list)(list) };
    Ok(n.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_has_rdma_device() -> bool {
        std::fs::read_dir("/sys/class/infiniband")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    }

    #[test]
    fn available_says_what_is_missing() {
        let r = available();
        if host_has_rdma_device() {
            // a machine with RDMA (or soft-RoCE): the libraries must find it
            assert_eq!(r, Ok(()), "an RDMA device is in /sys/class/infiniband");
        } else {
            let e = r.expect_err("no device in /sys/class/infiniband, yet available() is Ok");
            assert!(
                e.starts_with(
                    "NVMe/RDMA needs librdmacm and libibverbs (Debian: librdmacm1, \
                               libibverbs1, ibverbs-providers) and an RDMA device; none found: "
                ),
                "{e}"
            );
            // calling again gives the same answer (the load is cached, nothing panics)
            assert_eq!(available().unwrap_err(), e);
        }
    }

    /// The libraries are opened at run time only: nothing linking this crate needs them to
    /// start (the test executable links what any user of the crate links).
    #[test]
    fn rdma_core_is_not_linked() {
        let exe = std::env::current_exe().expect("current_exe");
        let out = match std::process::Command::new("ldd").arg(&exe).output() {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            // ldd is part of libc-bin (always installed on Debian): without it this
            // test cannot tell, so it fails rather than pass unseen.
            other => panic!(
                "ldd {} did not run (install libc-bin): {other:?}",
                exe.display()
            ),
        };
        assert!(out.contains("libc.so"), "unexpected ldd output:\n{out}");
        assert!(
            !out.contains("libibverbs") && !out.contains("librdmacm"),
            "{} links rdma-core:\n{out}",
            exe.display()
        );
    }

    #[test]
    fn missing_library_is_named() {
        let e = ffi::Lib::load("libibverbs-not-here.so.1", RDMACM)
            .err()
            .expect("a library that does not exist loaded");
        assert!(e.contains("cannot load libibverbs-not-here.so.1"), "{e}");
        let e = needs(&e);
        assert!(
            e.contains("Debian: librdmacm1, libibverbs1, ibverbs-providers"),
            "{e}"
        );
    }

    #[test]
    fn objects_cannot_be_made_without_a_device() {
        if host_has_rdma_device() {
            return;
        }
        // the event channel may open (librdmacm present) or not; a listener must fail cleanly
        match EventChannel::new() {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(ch) => {
                let id = ch.create_id(7);
                if let Ok(id) = id {
                    let r = id.listen("127.0.0.1:0".parse().unwrap(), 8);
                    assert!(r.is_err(), "listening without an RDMA device succeeded");
                }
            }
        }
    }
}
