//! RDMA connection management (librdmacm): the event channel a reactor polls, communication
//! identifiers ([`CmId`]: a listener, a passive-side connection, or an initiator's connection)
//! and the events they produce, copied out of the library (and acknowledged) at once so no
//! library memory outlives [`EventChannel::next_event`] and destroying an identifier never waits
//! on an unacknowledged event.
//!
//! Passive side: `create_id` → [`CmId::listen`] → [`CmEventKind::ConnectRequest`] (with the new
//! connection's [`CmId`] and the initiator's private data) → create the QP on it
//! (`verbs`) → [`CmId::accept`] or [`CmId::reject`] → `Established` … `Disconnected`.
//! Active side: `create_id` → [`CmId::resolve_addr`] → `AddrResolved` →
//! [`CmId::resolve_route`] → `RouteResolved` → QP → [`CmId::connect`] → `Established` (with
//! the target's accept private data) or `Rejected` (with its reject private data).

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::Duration;

use crate::ffi::{self, rdma_cm_id, rdma_event_channel};
use crate::verbs::QpResources;
use crate::{lib, Error, Result};

pub(crate) struct ChannelInner {
    raw: *mut rdma_event_channel,
}

// SAFETY: librdmacm's channel is a file descriptor plus a heap struct; calls on it are
// thread-safe, and it is destroyed only when the last owner (channel or id) drops.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        if let Ok(l) = lib() {
            // SAFETY: every CmId on this channel holds an Arc to it, so none is left, and
            // every event was acknowledged in next_event.
            unsafe { (l.rdma_destroy_event_channel)(self.raw) };
        }
    }
}

/// An rdma_cm event channel: events of every [`CmId`] created on (or migrated to) it. Its
/// [`fd`](EventChannel::fd) is non-blocking; register it with epoll for readability and call
/// [`next_event`](EventChannel::next_event) until it returns `Ok(None)`.
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

impl EventChannel {
    /// A new channel with a non-blocking fd.
    pub fn new() -> Result<EventChannel> {
        let l = lib()?;
        // SAFETY: plain librdmacm call.
        let raw = unsafe { (l.rdma_create_event_channel)() };
        if raw.is_null() {
            return Err(Error::last("rdma_create_event_channel"));
        }
        let ch = EventChannel {
            inner: Arc::new(ChannelInner { raw }),
        };
        set_nonblocking(ch.fd(), "rdma_create_event_channel: O_NONBLOCK")?;
        Ok(ch)
    }

    /// The channel's file descriptor (readable when an event is pending).
    pub fn fd(&self) -> RawFd {
        // SAFETY: `raw` is live while self is.
        unsafe { (*self.inner.raw).fd }
    }

    /// A new identifier on this channel (TCP port space, reliable connections). `token` comes
    /// back in every [`CmEvent`] of this id (and of connection requests to it, if it listens).
    pub fn create_id(&self, token: u64) -> Result<CmId> {
        let l = lib()?;
        let mut id: *mut rdma_cm_id = null_mut();
        // SAFETY: `raw` is live; `id` receives the new identifier.
        let r = unsafe {
            (l.rdma_create_id)(
                self.inner.raw,
                &mut id,
                token as usize as *mut c_void,
                ffi::RDMA_PS_TCP,
            )
        };
        if r != 0 || id.is_null() {
            return Err(Error::last("rdma_create_id"));
        }
        Ok(CmId::from_raw(id, self.inner.clone()))
    }

    /// The next pending event, copied and acknowledged; `Ok(None)` when none is pending.
    pub fn next_event(&self) -> Result<Option<CmEvent>> {
        let l = lib()?;
        let mut ev: *mut ffi::rdma_cm_event = null_mut();
        // SAFETY: `raw` is live; on success `ev` is the library's event until acknowledged.
        let r = unsafe { (l.rdma_get_cm_event)(self.inner.raw, &mut ev) };
        if r != 0 || ev.is_null() {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(Error {
                op: "rdma_get_cm_event",
                source: e,
            });
        }
        // SAFETY: `ev` is valid until rdma_ack_cm_event below; everything needed is copied.
        let out = unsafe {
            let e = &*ev;
            let kind = CmEventKind::from_raw(e.event);
            let private_data = if e.conn.private_data.is_null() || e.conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    e.conn.private_data as *const u8,
                    e.conn.private_data_len as usize,
                )
                .to_vec()
            };
            let token_of = |id: *mut rdma_cm_id| {
                if id.is_null() {
                    0
                } else {
                    (*id).context as usize as u64
                }
            };
            let (token, request) = if kind == CmEventKind::ConnectRequest {
                // the new id is the caller's from here on (destroyed when it drops)
                (
                    token_of(e.listen_id),
                    Some(CmId::from_raw(e.id, self.inner.clone())),
                )
            } else {
                (token_of(e.id), None)
            };
            CmEvent {
                kind,
                status: e.status,
                token,
                private_data,
                responder_resources: e.conn.responder_resources,
                initiator_depth: e.conn.initiator_depth,
                request,
            }
        };
        // SAFETY: `ev` came from rdma_get_cm_event and is acknowledged once.
        if unsafe { (l.rdma_ack_cm_event)(ev) } != 0 {
            let e = Error::last("rdma_ack_cm_event");
            // destroying an id with an unacknowledged event would wait for the ack forever:
            // leak the new id rather than hang
            std::mem::forget(out.request);
            return Err(e);
        }
        Ok(Some(out))
    }
}

/// What happened (`enum rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    /// A new connection to a listener: [`CmEvent::request`] is its id.
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    /// The peer refused the connection; [`CmEvent::private_data`] is its reason.
    Rejected,
    Established,
    Disconnected,
    /// The device went away: destroy every object of it.
    DeviceRemoval,
    AddrChange,
    TimewaitExit,
    /// Any other (multicast) event number.
    Other(u32),
}

impl CmEventKind {
    fn from_raw(v: u32) -> CmEventKind {
        use CmEventKind::*;
        match v {
            0 => AddrResolved,
            1 => AddrError,
            2 => RouteResolved,
            3 => RouteError,
            4 => ConnectRequest,
            5 => ConnectResponse,
            6 => ConnectError,
            7 => Unreachable,
            8 => Rejected,
            9 => Established,
            10 => Disconnected,
            11 => DeviceRemoval,
            14 => AddrChange,
            15 => TimewaitExit,
            n => Other(n),
        }
    }
}

/// One connection-management event, owned (the library's copy is already acknowledged).
#[derive(Debug)]
pub struct CmEvent {
    pub kind: CmEventKind,
    /// The event's status (0, or a negative errno / the peer's reject reason).
    pub status: i32,
    /// The token of the id the event is about; for `ConnectRequest`, the listener's.
    pub token: u64,
    /// The peer's private data (connect request, accept or reject), as the transport delivered
    /// it: RoCE/IB pads it with zeros to the message's full size.
    pub private_data: Vec<u8>,
    /// Requested by the peer (`ConnectRequest`) / granted (`Established`).
    pub responder_resources: u8,
    /// As `responder_resources`.
    pub initiator_depth: u8,
    /// `ConnectRequest` only: the new connection (accept or reject it; dropping it rejects).
    pub request: Option<CmId>,
}

/// Parameters of [`CmId::connect`] and [`CmId::accept`].
#[derive(Clone, Copy, Debug)]
pub struct ConnParam<'a> {
    /// Sent to the peer (at most 56 bytes on connect, 196 on accept over IB/RoCE).
    pub private_data: &'a [u8],
    /// Outstanding RDMA READs the peer may have against us.
    pub responder_resources: u8,
    /// Outstanding RDMA READs we may have against the peer.
    pub initiator_depth: u8,
    /// Transport retries (connect only).
    pub retry_count: u8,
    /// Receiver-not-ready retries (7: forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam {
            private_data: &[],
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam<'_> {
    fn raw(&self, op: &'static str) -> Result<ffi::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len()).map_err(|_| {
            Error::invalid(
                op,
                format!(
                    "{} bytes of private data (255 at most)",
                    self.private_data.len()
                ),
            )
        })?;
        Ok(ffi::rdma_conn_param {
            private_data: if len == 0 {
                std::ptr::null()
            } else {
                self.private_data.as_ptr() as *const c_void
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 0,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }
}

/// An rdma_cm communication identifier, and the RC queue pair on it once created
/// (`verbs`). Destroyed (QP first) when dropped.
pub struct CmId {
    pub(crate) raw: *mut rdma_cm_id,
    chan: Arc<ChannelInner>,
    pub(crate) qp: Option<QpResources>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("token", &self.token())
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

// SAFETY: librdmacm/libibverbs calls on one id may be made from any thread; CmId is not Sync
// (posting uses its scratch space through &mut self).
unsafe impl Send for CmId {}

impl CmId {
    fn from_raw(raw: *mut rdma_cm_id, chan: Arc<ChannelInner>) -> CmId {
        CmId {
            raw,
            chan,
            qp: None,
        }
    }

    /// The token events of this id carry.
    pub fn token(&self) -> u64 {
        // SAFETY: `raw` is live.
        unsafe { (*self.raw).context as usize as u64 }
    }

    /// Sets the token (e.g. on a new connection: it starts with its listener's).
    pub fn set_token(&mut self, token: u64) {
        // SAFETY: `raw` is live; the context is ours to set.
        unsafe { (*self.raw).context = token as usize as *mut c_void };
    }

    /// Binds to `addr` (IPv4 or IPv6; port 0 picks one) and listens with `backlog`.
    pub fn listen(&self, addr: SocketAddr, backlog: i32) -> Result<()> {
        let l = lib()?;
        let (sa, _) = sockaddr(addr);
        // SAFETY: `sa` is a valid sockaddr of its family.
        if unsafe { (l.rdma_bind_addr)(self.raw, &sa as *const _ as *const libc::sockaddr) } != 0 {
            return Err(Error::last("rdma_bind_addr"));
        }
        // SAFETY: bound id.
        if unsafe { (l.rdma_listen)(self.raw, backlog) } != 0 {
            return Err(Error::last("rdma_listen"));
        }
        Ok(())
    }

    /// The local address (after `listen`, address resolution, or on a connection request's
    /// id); `None` while unbound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: `raw` is live; the library keeps the route's addresses in place.
        from_storage(unsafe { &(*self.raw).src_addr })
    }

    /// The peer's address (the initiator's on a connection request's id, the target's after
    /// address resolution); `None` when there is none.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in local_addr.
        from_storage(unsafe { &(*self.raw).dst_addr })
    }

    /// The local port (after `listen` or connection setup).
    pub fn local_port(&self) -> Result<u16> {
        let l = lib()?;
        // SAFETY: `raw` is live; the library returns the port in network byte order.
        Ok(u16::from_be(unsafe { (l.rdma_get_src_port)(self.raw) }))
    }

    /// Starts resolving `dst` to a local device (initiator); `AddrResolved` or `AddrError`
    /// follows on the channel.
    pub fn resolve_addr(&self, dst: SocketAddr, timeout: Duration) -> Result<()> {
        let l = lib()?;
        let (sa, _) = sockaddr(dst);
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `sa` is a valid sockaddr; no source address.
        let r = unsafe {
            (l.rdma_resolve_addr)(
                self.raw,
                std::ptr::null(),
                &sa as *const _ as *const libc::sockaddr,
                ms,
            )
        };
        if r != 0 {
            return Err(Error::last("rdma_resolve_addr"));
        }
        Ok(())
    }

    /// Starts resolving the route (after `AddrResolved`); `RouteResolved` or `RouteError`
    /// follows.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let l = lib()?;
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `raw` is live.
        if unsafe { (l.rdma_resolve_route)(self.raw, ms) } != 0 {
            return Err(Error::last("rdma_resolve_route"));
        }
        Ok(())
    }

    /// Sends the connection request (QP created first); `Established` or `Rejected` /
    /// `Unreachable` / `ConnectError` follows.
    pub fn connect(&self, p: &ConnParam) -> Result<()> {
        let l = lib()?;
        let mut raw = p.raw("rdma_connect")?;
        // SAFETY: `raw` borrows `p.private_data`, which outlives the call (the library copies).
        if unsafe { (l.rdma_connect)(self.raw, &mut raw) } != 0 {
            return Err(Error::last("rdma_connect"));
        }
        Ok(())
    }

    /// Accepts a connection request (QP created first); `Established` follows.
    pub fn accept(&self, p: &ConnParam) -> Result<()> {
        let l = lib()?;
        let mut raw = p.raw("rdma_accept")?;
        // SAFETY: as in connect.
        if unsafe { (l.rdma_accept)(self.raw, &mut raw) } != 0 {
            return Err(Error::last("rdma_accept"));
        }
        Ok(())
    }

    /// Refuses a connection request, sending `private_data` (at most 148 bytes over IB/RoCE).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let l = lib()?;
        let len = u8::try_from(private_data.len()).map_err(|_| {
            Error::invalid(
                "rdma_reject",
                format!("{} bytes of private data (255 at most)", private_data.len()),
            )
        })?;
        let ptr = if len == 0 {
            std::ptr::null()
        } else {
            private_data.as_ptr() as *const c_void
        };
        // SAFETY: `ptr`/`len` describe `private_data` (copied by the library).
        if unsafe { (l.rdma_reject)(self.raw, ptr, len) } != 0 {
            return Err(Error::last("rdma_reject"));
        }
        Ok(())
    }

    /// Starts tearing the connection down (the QP goes to the error state, flushing posted
    /// work requests); `Disconnected` follows on both sides.
    pub fn disconnect(&self) -> Result<()> {
        let l = lib()?;
        // SAFETY: `raw` is live.
        if unsafe { (l.rdma_disconnect)(self.raw) } != 0 {
            return Err(Error::last("rdma_disconnect"));
        }
        Ok(())
    }

    /// Moves this id's events to `channel` (e.g. a connection handed from the listener's
    /// thread to the reactor that will own it).
    pub fn migrate(&mut self, channel: &EventChannel) -> Result<()> {
        let l = lib()?;
        // SAFETY: both live; every event of this id was acknowledged, so this does not wait.
        if unsafe { (l.rdma_migrate_id)(self.raw, channel.inner.raw) } != 0 {
            return Err(Error::last("rdma_migrate_id"));
        }
        self.chan = channel.inner.clone();
        Ok(())
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        let Ok(l) = lib() else { return };
        if let Some(res) = self.qp.take() {
            // SAFETY: the QP was created on this id by rdma_create_qp; its CQs and PD are
            // still held by `res`, released only after the QP is gone.
            unsafe { (l.rdma_destroy_qp)(self.raw) };
            drop(res);
        }
        // SAFETY: `raw` is live and destroyed once; its events are all acknowledged.
        unsafe { (l.rdma_destroy_id)(self.raw) };
        let _ = &self.chan; // the channel is released after the id (field drop order)
    }
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::from((
                sin.sin_addr.s_addr.to_ne_bytes(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

pub(crate) fn set_nonblocking(fd: RawFd, op: &'static str) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::last(op));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddrs_are_in_network_order() {
        let (ss, len) = sockaddr("10.77.0.1:4420".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: written as sockaddr_in above.
        let sin = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_family as i32, libc::AF_INET);
        assert_eq!(u16::from_be(sin.sin_port), 4420);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 77, 0, 1]);
        let (ss, len) = sockaddr("[fe80::1%3]:4420".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in6>());
        // SAFETY: written as sockaddr_in6 above.
        let sin6 = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in6) };
        assert_eq!(sin6.sin6_family as i32, libc::AF_INET6);
        assert_eq!(sin6.sin6_scope_id, 3);
        assert_eq!(sin6.sin6_addr.s6_addr[0], 0xfe);
    }

    #[test]
    fn sockaddrs_round_trip() {
        for a in ["10.77.0.1:4420", "[fe80::1%3]:4420", "[::]:0"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_storage(&sockaddr(a).0), Some(a));
        }
        // SAFETY: all-zero is a valid (AF_UNSPEC) sockaddr_storage.
        let none: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_storage(&none), None);
    }

    #[test]
    fn private_data_is_bounded() {
        let big = [0u8; 300];
        let p = ConnParam {
            private_data: &big,
            ..ConnParam::default()
        };
        let e = p.raw("rdma_connect").err().expect("300 bytes accepted");
        assert!(e.to_string().contains("300 bytes of private data"), "{e}");
        let p = ConnParam {
            private_data: &big[..32],
            ..ConnParam::default()
        };
        let raw = p.raw("rdma_connect").unwrap();
        assert_eq!(raw.private_data_len, 32);
    }

    #[test]
    fn event_kinds_follow_the_c_enum() {
        assert_eq!(CmEventKind::from_raw(4), CmEventKind::ConnectRequest);
        assert_eq!(CmEventKind::from_raw(9), CmEventKind::Established);
        assert_eq!(CmEventKind::from_raw(10), CmEventKind::Disconnected);
        assert_eq!(CmEventKind::from_raw(11), CmEventKind::DeviceRemoval);
        assert_eq!(CmEventKind::from_raw(12), CmEventKind::Other(12));
    }
}
