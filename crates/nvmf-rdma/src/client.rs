//! The connecting side's waiting, for tools and tests that run one connection at a time
//! (`rdma_pingpong`, `rdma_connect_probe`): wait for the next CM event with a deadline, and
//! resolve a peer's address and route (retried: soft-RoCE's first ARP may time out). A
//! reactor never calls these; it takes events as the channel's fd becomes readable.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::cm::{CmEvent, CmEventKind, CmId, EventChannel};
use crate::verbs::Device;

/// Waits until `fd` is readable or the deadline passes (`what` names it in the error).
pub fn wait_readable(fd: RawFd, deadline: Instant, what: &str) -> Result<(), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("timed out waiting for {what}"));
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, 1000) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            return Ok(());
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("poll: {}", std::io::Error::last_os_error()));
        }
    }
}

/// The next event of `ch`, waiting at most until `deadline`.
pub fn wait_event(ch: &EventChannel, deadline: Instant, what: &str) -> Result<CmEvent, String> {
    loop {
        if let Some(ev) = ch.next_event().map_err(|e| e.to_string())? {
            return Ok(ev);
        }
        wait_readable(ch.fd(), deadline, what)?;
    }
}

/// Resolves `addr` and the route to it on `id` (up to 5 tries of 2 s each, within
/// `deadline`); the device the connection will use.
pub fn resolve(
    ch: &EventChannel,
    id: &CmId,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<Device, String> {
    let mut tries = 0;
    loop {
        tries += 1;
        id.resolve_addr(addr, Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        let ev = wait_event(ch, deadline, "address resolution")?;
        match ev.kind {
            CmEventKind::AddrResolved => {}
            CmEventKind::AddrError if tries < 5 => continue,
            _ => return Err(format!("address resolution of {addr}: {ev:?}")),
        }
        id.resolve_route(Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        let ev = wait_event(ch, deadline, "route resolution")?;
        match ev.kind {
            CmEventKind::RouteResolved => break,
            CmEventKind::RouteError if tries < 5 => continue,
            _ => return Err(format!("route resolution to {addr}: {ev:?}")),
        }
    }
    id.device()
        .ok_or_else(|| "no device after address resolution".to_string())
}
