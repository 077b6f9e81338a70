//! The NVMe/RDMA target port: RDMA CM listeners, connection set-up and
//! teardown, and the verbs glue that runs each connection's [`RdmaQueue`].
//!
//! Owns [`RdmaPort`]: one CM event channel, the listening ids, and every
//! connection accepted on them (its `CmId` with the RC queue pair, the
//! completion queue and its channel, the memory registrations of the
//! queue's buffers, the queue state machine). One reactor thread owns a
//! port and everything in it for its life; the thread's epoll waits on the
//! event channel's fd and each connection's completion channel fd (the
//! port says which to add and remove through [`FdChange`]). Each nvmfd
//! reactor has its own port: the listening one routes a checked connect
//! request to another reactor's port as a [`PendingConn`] (queue
//! placement), which migrates the id to its own event channel and accepts
//! it there, so a connection lives on one reactor from its accept on.
//!
//! Completion polling: with busy polling on ([`RdmaPort::set_busy_poll`]) a
//! completion queue that delivered work is left unarmed and polled by the
//! reactor's spin turns ([`RdmaPort::poll_unarmed`]); when the reactor is
//! about to sleep it arms them all and polls each once more
//! ([`RdmaPort::arm_unarmed`]), so a completion that raced the arm is not
//! left for an event that never comes. [`PollStats`] counts wake-ups
//! against completions.
//!
//! Connection set-up: a CONNECT_REQUEST's private data is checked
//! (`nvmf_wire::rdma::parse_connect_request`: RECFMT, QID, HSQSIZE,
//! HRQSIZE); a bad one is rejected with the NVMe/RDMA status in the reject's
//! private data and a log line naming the peer and the reason. A good one
//! gets a completion queue, an RC queue pair sized for the queue (receives:
//! one per entry; sends: a WRITE and a SEND per slot, twice the entries
//! (a response's slot is busy until its SEND completed, and the host may
//! already have sent the next command), plus slack), its
//! receive and response buffers registered once, every receive posted, and
//! an accept with CRQSIZE; the READ depth is the smallest of the host's
//! grant, the device's limit and [`MAX_READ_DEPTH`].
//!
//! Receives: by default (SPDK's `no_srq` false) each device whose
//! attributes offer shared receive queues (`max_srq` > 0) gets one SRQ of
//! `max_srq_depth` entries (clamped to the device's `max_srq_wr`) with a
//! [`RecvPool`] of capsule buffers (64 + in-capsule data size each)
//! registered once and all posted; every queue pair on that device is
//! created with it and posts no receive of its own. A receive completion
//! arrives on the completion queue of the queue pair it was consumed by
//! (one CQ per connection), its `wr_id` names the pool buffer and its
//! `qp_num` is checked against that connection's; the queue parses the
//! capsule in place and gives the buffer back, and the pool's idle buffers
//! are reposted as one list per reactor turn. A connection destroyed with
//! receive completions still on its CQ gives those buffers back first.
//! With `no_srq`, or on a device without SRQs (or whose SRQ could not be
//! set up), each queue owns and posts one receive buffer per entry.
//!
//! Memory registration: receive and response buffers once per connection;
//! a slot's data buffer when the slot first needs it and again only if that
//! buffer is a new allocation (it grows rarely and is reused across
//! commands): no registration per I/O. A registration is keyed by the
//! buffer's allocation ID, not its address (a buffer freed under budget
//! pressure may come back at the same address, and a registration of the
//! freed pages would take RDMA READ data away from it), and the tick drops
//! the registrations of buffers freed since, so they pin nothing. The
//! shared zero buffer (null reads) once per protection domain.
//!
//! Teardown: a queue that must close (protocol error, keep-alive, a failed
//! or flushed work request) is disconnected; on DISCONNECTED (host-initiated
//! or ours), or DEVICE_REMOVAL, the connection is destroyed: queue pair
//! first, so the device no longer touches any buffer, then the
//! registrations, then the buffers (backend I/O still in flight keeps them
//! alive through the core's hand-over). A peer that is gone never answers
//! our disconnect request (the CM would retry it for tens of seconds): a
//! connection still closing [`DISCONNECT_GRACE`] after we disconnected it is
//! destroyed by the tick. DEVICE_REMOVAL on a listener destroys every
//! connection on that device, drops the device's resources and the
//! listening id (that listener no longer accepts; nvmfd logs it).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use nvmf_config::{AddressFamily, ListenerConfig, RdmaOptions, TransportType};
use nvmf_core::request::RequestParams;
use nvmf_core::{PortInfo, Target};
use nvmf_wire::rdma::{negotiate_read_depth, parse_connect_request, RdmaQueueLimits};
use nvmf_wire::zerocopy::IntoBytes;
use tracing::{debug, error, info, warn};

use crate::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel};
use crate::queue::{RdmaQueue, RdmaQueueParams, Region, WorkCompletion, WorkRequest};
use crate::srq::{RecvPool, RecvPost};
use crate::verbs::{
    Access, AsyncEvent, AsyncEventKind, Completion, CompletionQueue, Device, MemoryRegion,
    ProtectionDomain, QpCaps, RecvWr, SendOp, SendWr, Sge, SharedReceiveQueue,
};

/// RDMA READs a queue keeps in flight at most (the device and the host
/// may allow fewer).
pub const MAX_READ_DEPTH: u8 = 16;
/// Token of listener `i` in CM events: `LISTENER_TOKEN + i`.
const LISTENER_TOKEN: u64 = 1 << 48;
/// Token of an id parked for another reactor (its events are ignored here).
const PARKED_TOKEN: u64 = u64::MAX;
/// Connect requests one call of [`RdmaPort::on_cm_events`] handles at
/// most (each may set up a queue pair).
pub const CM_SETUPS_PER_TURN: usize = 8;
/// Completions taken from a CQ per poll call.
const POLL_BATCH: usize = 32;
/// Send-queue entries beyond two per queue entry (responses without a slot).
const SEND_SLACK: u32 = 16;
/// A connection we disconnected is destroyed at the latest this long after
/// (a dead peer never answers the disconnect request).
pub const DISCONNECT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A file descriptor the reactor adds to or removes from its epoll set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdChange {
    /// A device's asynchronous-event fd: call [`RdmaPort::on_async`].
    AddAsync {
        fd: RawFd,
    },
    /// That fd is no longer read here (its device went away).
    RemoveAsync {
        fd: RawFd,
    },
    /// Connection `key`'s completion channel: call [`RdmaPort::on_cq`].
    Add {
        fd: RawFd,
        key: usize,
    },
    Remove {
        fd: RawFd,
        key: usize,
    },
}

/// A connect request checked on the listening port and bound for another
/// reactor's port: [`RdmaPort::accept_pending`] there migrates the id to
/// that port's event channel and accepts it. The CONNECT_REQUEST event is
/// already acknowledged (so the id can migrate). Send: the id is (librdmacm
/// ids are used from one thread at a time, and this one is only in transit).
pub struct PendingConn {
    id: CmId,
    req: nvmf_wire::rdma::ConnectRequest,
    initiator_depth: u8,
    cfg: ListenerConfig,
    listen: SocketAddr,
    peer: SocketAddr,
    /// Held while the connection lives (the daemon's placement ticket).
    pub ticket: Option<Box<dyn std::any::Any + Send>>,
}

impl PendingConn {
    /// Marks the id as in transit: an event this port still sees for it
    /// is ignored. Call before sending it to another reactor.
    pub fn park(&mut self) {
        self.id.set_token(PARKED_TOKEN);
    }
    /// The queue ID the host asked for (0: admin).
    pub fn qid(&self) -> u16 {
        self.req.qid
    }
    /// The controller ID the host named (I/O queues; 0: none).
    pub fn cntlid(&self) -> u16 {
        self.req.cntlid
    }
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
    /// The local address the request came in on, when known.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Refuses the request without NVMe/RDMA private data (the daemon's
    /// admission: over a connection cap). The host sees a plain reject and
    /// retries later, as after a refused TCP connection.
    pub fn refuse(self) {
        if let Err(e) = self.id.reject(&[]) {
            debug!(peer = %self.peer, "reject failed: {e}");
        }
    }
}

/// Completion-polling counters of one port (the effect of busy polling:
/// completions per wake-up).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PollStats {
    /// Completion-channel events handled (the reactor woke for a CQ).
    pub cq_wakeups: u64,
    /// Busy polls of unarmed CQs (no wake-up, no system call to sleep).
    pub busy_polls: u64,
    /// Work completions reaped, all ways.
    pub completions: u64,
    /// Of those, reaped by busy polls.
    pub polled_completions: u64,
    /// Device asynchronous events read (QP errors, last WQE reached, port
    /// and device events).
    pub async_events: u64,
    /// Queue pairs on a shared receive queue destroyed without their
    /// last-WQE-reached event within [`LAST_WQE_WAIT`]: a receive buffer
    /// the queue pair had taken may be lost from the pool with each.
    pub srq_unconfirmed_teardowns: u64,
}

/// How long a queue pair on a shared receive queue waits, once in the
/// error state, for its last-WQE-reached event before it is destroyed
/// anyway (the event says every receive it took from the SRQ was flushed
/// to its CQ, so none is lost with it).
pub const LAST_WQE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Devices whose asynchronous events some port reads (one reader per
/// device: the context, and so its event fd, is shared by every port).
static ASYNC_READERS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// A listening id and what it was configured as.
struct Listener {
    /// Listening while it lives (a listener whose device was removed is
    /// dropped from the port).
    id: CmId,
    cfg: ListenerConfig,
}

/// A device's shared receive queue and its buffers. Field order is drop
/// order: the SRQ (destroyed once no queue pair holds it), then the
/// registration, then the buffers.
struct SrqRes {
    srq: Arc<SharedReceiveQueue>,
    mr: MemoryRegion,
    pool: RecvPool,
    /// Queue entries (host queue depths) of the connections using it now.
    entries: usize,
    /// Those exceed the pool (logged once per crossing).
    oversubscribed: bool,
}

/// Per-device resources shared by its connections. The SRQ goes before the
/// protection domain.
struct DeviceRes {
    srq: Option<SrqRes>,
    pd: Arc<ProtectionDomain>,
    /// The shared zero buffer, registered for local reads (RDMA WRITE source).
    zeroes: Option<MemoryRegion>,
    max_read: u8,
}

/// One accepted connection. Field order is drop order: the queue pair (in
/// `id`) goes first, the buffers (in `queue`) last.
struct Conn {
    id: CmId,
    /// Slot `i`'s data buffer registration, with the ID of the buffer
    /// allocation it was made for (`Slot::buffer_id`).
    slot_mrs: Vec<Option<(MemoryRegion, u64)>>,
    /// The queue's own receive buffers (none with a shared receive queue).
    recv_mr: Option<MemoryRegion>,
    resp_mr: MemoryRegion,
    zero_lkey: Option<u32>,
    cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
    queue: RdmaQueue,
    /// Disconnect requested (when): destroyed on DISCONNECTED, or by the
    /// tick after [`DISCONNECT_GRACE`].
    closing: Option<Instant>,
    /// When the connection was accepted (it must see a Fabrics Connect
    /// within the port's connect timeout).
    accepted_at: Instant,
    established: bool,
    peer: SocketAddr,
    /// The listen address the connection came in on (possibly on another
    /// reactor's port).
    listen: SocketAddr,
    /// Held while the connection lives (the daemon's placement ticket).
    _ticket: Option<Box<dyn std::any::Any + Send>>,
    /// Its device (key of `RdmaPort::devices`).
    dev: usize,
    /// Its queue pair's number (receive completions of a shared receive
    /// queue must name it).
    qp_num: u32,
    /// Queue entries (the host's queue depth).
    entries: u16,
    /// Its queue panicked: destroyed at once, never run again.
    poisoned: bool,
    /// The device reported the last-WQE-reached event for its queue pair.
    last_wqe: bool,
    /// Retired while on a shared receive queue: waiting (since then) for
    /// the last-WQE event before it is destroyed (see [`LAST_WQE_WAIT`]).
    draining: Option<Instant>,
}

/// The RDMA target port of one reactor (see the module documentation).
pub struct RdmaPort {
    target: Arc<Target>,
    channel: EventChannel,
    /// Index `i` is listener token `LISTENER_TOKEN + i`; a removed
    /// listener leaves `None` (its slot is reused by the next one).
    listeners: Vec<Option<Listener>>,
    conns: Vec<Option<Conn>>,
    devices: HashMap<usize, DeviceRes>,
    requests: RequestParams,
    /// A queue not connected (Fabrics Connect) this long after it was
    /// accepted is disconnected (zero: never).
    connect_timeout: std::time::Duration,
    wcs: Vec<Completion>,
    scratch: PostScratch,
    /// Leave a CQ that delivered work unarmed for the reactor's busy polls.
    busy_poll: bool,
    /// Connections whose CQ is not armed (busy polling).
    unarmed: Vec<usize>,
    stats: PollStats,
    /// The reactor that owns the port (log lines).
    reactor: usize,
    /// Shared receive queues: `max_srq_depth` and `no_srq`.
    rdma: RdmaOptions,
    srq_posts: Vec<RecvPost>,
    srq_wrs: Vec<RecvWr>,
    /// Sees each connection's queue as it is destroyed (the daemon folds
    /// the counters of closed queues into its statistics).
    on_destroy: Option<OnDestroy>,
    /// Devices whose asynchronous events this port reads.
    async_devs: Vec<Device>,
}

/// See [`RdmaPort::set_on_destroy`].
pub type OnDestroy = Box<dyn FnMut(&nvmf_core::queue::QueuePair) + Send>;

/// One connection as the daemon's statistics and queue listings see it
/// (read only; [`RdmaPort::conn_views`]).
pub struct ConnView<'a> {
    /// The queue (controller, QID, counters).
    pub queue: &'a nvmf_core::queue::QueuePair,
    pub peer: SocketAddr,
    /// The listen address it came in on.
    pub listen: SocketAddr,
    /// Commands received and not answered.
    pub in_flight: usize,
    /// Commands executing in a backend now.
    pub executing: usize,
    /// Disconnect requested (going away).
    pub closing: bool,
}

impl RdmaPort {
    /// A port with no listener yet. Fails (with what is missing) where
    /// rdma-core or an RDMA device is not there.
    pub fn new(
        target: Arc<Target>,
        requests: RequestParams,
        connect_timeout: std::time::Duration,
    ) -> Result<RdmaPort, String> {
        crate::available()?;
        let channel = EventChannel::new().map_err(|e| format!("RDMA CM event channel: {e}"))?;
        Ok(RdmaPort {
            target,
            channel,
            listeners: Vec::new(),
            conns: Vec::new(),
            devices: HashMap::new(),
            requests,
            connect_timeout,
            wcs: Vec::with_capacity(POLL_BATCH),
            scratch: PostScratch::default(),
            busy_poll: false,
            unarmed: Vec::new(),
            stats: PollStats::default(),
            reactor: 0,
            rdma: RdmaOptions::default(),
            srq_posts: Vec::new(),
            srq_wrs: Vec::new(),
            on_destroy: None,
            async_devs: Vec::new(),
        })
    }

    /// Names the owning reactor in log lines.
    pub fn set_reactor(&mut self, id: usize) {
        self.reactor = id;
    }

    /// Busy polling on: a CQ that delivered work stays unarmed until
    /// [`RdmaPort::arm_unarmed`].
    pub fn set_busy_poll(&mut self, on: bool) {
        self.busy_poll = on;
    }

    /// Completion-polling counters so far.
    pub fn poll_stats(&self) -> PollStats {
        self.stats
    }

    /// The connections alive, for statistics (read only).
    pub fn conn_views(&self) -> impl Iterator<Item = ConnView<'_>> + '_ {
        self.conns.iter().flatten().map(|c| ConnView {
            queue: c.queue.queue(),
            peer: c.peer,
            listen: c.listen,
            in_flight: c.queue.in_flight(),
            executing: c.queue.executing(),
            closing: c.closing.is_some(),
        })
    }

    /// `f` sees each connection's queue as the connection is destroyed.
    pub fn set_on_destroy(&mut self, f: OnDestroy) {
        self.on_destroy = Some(f);
    }

    /// Whether a CQ is left unarmed (the reactor must not sleep without
    /// [`RdmaPort::arm_unarmed`]).
    pub fn has_unarmed(&self) -> bool {
        !self.unarmed.is_empty()
    }

    /// The RDMA transport's options (`nvmf_create_transport -t RDMA`):
    /// shared receive queues (`no_srq`, `max_srq_depth`). Before the first
    /// listener; defaults to SPDK's (SRQ where the device has them, 4096).
    pub fn set_options(&mut self, o: &RdmaOptions) {
        self.rdma = *o;
    }

    /// The CM event channel's fd (readable: call [`RdmaPort::on_cm_events`]).
    pub fn channel_fd(&self) -> RawFd {
        self.channel.fd()
    }

    /// Listens on `cfg` (an RDMA listener: IPv4 or IPv6 address, port).
    /// Listening again on an address already listened on does nothing.
    pub fn listen(&mut self, cfg: &ListenerConfig) -> Result<(), String> {
        let what = format!("NVMe/RDMA listener {}:{}", cfg.traddr, cfg.trsvcid);
        let addr = listen_addr(cfg)?;
        if self.listener_index(addr).is_some() {
            return Ok(());
        }
        let index = self
            .listeners
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.listeners.len());
        let id = self
            .channel
            .create_id(LISTENER_TOKEN + index as u64)
            .map_err(|e| format!("{what}: {e}"))?;
        id.listen(addr, 128)
            .map_err(|e| format!("{what}: {e} (is an RDMA device bound to that address?)"))?;
        info!(traddr = %cfg.traddr, trsvcid = %cfg.trsvcid, "listening (NVMe/RDMA)");
        // A listener on a device's address knows its device: set up its
        // receives now, so the log says at once whether an SRQ is used.
        match id.device() {
            Some(dev) => {
                if let Err(e) = self.device_res(dev) {
                    warn!(traddr = %cfg.traddr, "RDMA device resources: {e} (retried at the first connection)");
                }
            }
            None => info!(
                traddr = %cfg.traddr,
                "NVMe/RDMA receives: chosen per device at its first connection (wildcard listener)"
            ),
        }
        let l = Some(Listener {
            id,
            cfg: cfg.clone(),
        });
        if index == self.listeners.len() {
            self.listeners.push(l);
        } else {
            self.listeners[index] = l;
        }
        Ok(())
    }

    fn listener_index(&self, addr: SocketAddr) -> Option<usize> {
        self.listeners.iter().position(|l| {
            l.as_ref()
                .is_some_and(|l| listen_addr(&l.cfg).is_ok_and(|a| a == addr))
        })
    }

    /// The listen addresses served now.
    pub fn listening(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .flatten()
            .filter_map(|l| listen_addr(&l.cfg).ok())
            .collect()
    }

    /// Disconnects the queues that came in on listen address `addr` (only
    /// those of subsystem `only_nqn`, when given); with `unlisten`, the
    /// listener goes too (no new connection is accepted on it). Returns how
    /// many queues were told to disconnect; they are destroyed as their
    /// DISCONNECTED events arrive.
    pub fn drop_listener(
        &mut self,
        addr: SocketAddr,
        only_nqn: Option<&str>,
        unlisten: bool,
        fds: &mut dyn FnMut(FdChange),
    ) -> usize {
        let index = self.listener_index(addr);
        let mut n = 0;
        for key in 0..self.conns.len() {
            let Some(c) = self.conns[key].as_mut() else {
                continue;
            };
            if c.listen != addr || c.closing.is_some() {
                continue;
            }
            let of_nqn = |nqn: &str| {
                c.queue
                    .queue()
                    .controller()
                    .is_some_and(|ctrl| ctrl.subsystem().nqn() == nqn)
            };
            if only_nqn.is_some_and(|nqn| !of_nqn(nqn)) {
                continue;
            }
            c.queue.close_now("listener removed");
            self.after_work(key, fds);
            n += 1;
        }
        if let (true, Some(index)) = (unlisten, index) {
            if let Some(l) = self.listeners[index].take() {
                info!(traddr = %l.cfg.traddr, trsvcid = %l.cfg.trsvcid, "stopped listening (NVMe/RDMA)");
            }
        }
        n
    }

    /// Connections alive.
    pub fn connections(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    /// Handles every pending CM event.
    /// `route` sees every checked connect request: it returns it to accept
    /// it on this port, or takes it (sends it to another reactor's port,
    /// after [`PendingConn::park`]) and returns None.
    /// Returns true when it stopped at its budget with events possibly left
    /// in the channel: the caller calls again on its next turn (the
    /// channel's fd will not become readable again for those).
    pub fn on_cm_events(
        &mut self,
        fds: &mut dyn FnMut(FdChange),
        route: &mut dyn FnMut(PendingConn) -> Option<PendingConn>,
    ) -> bool {
        // Bounded: each call takes at most this many events, and sets up at
        // most CM_SETUPS_PER_TURN connections (a completion queue, a queue
        // pair and registrations each), so a flood of connect requests
        // costs the reactor's other queues one bounded slice per turn.
        let mut setups = 0;
        for _ in 0..256 {
            if setups >= CM_SETUPS_PER_TURN {
                return true;
            }
            match self.channel.next_event() {
                Ok(Some(ev)) => {
                    if ev.kind == CmEventKind::ConnectRequest {
                        setups += 1;
                    }
                    // A bug costs this event (its id is dropped), not the
                    // reactor and every queue on it.
                    let kind = ev.kind;
                    if catch_unwind(AssertUnwindSafe(|| self.on_cm_event(ev, fds, route))).is_err()
                    {
                        error!(
                            reactor = self.reactor,
                            ?kind,
                            "internal error (panic) handling an RDMA CM event: event dropped"
                        );
                    }
                }
                Ok(None) => return false,
                Err(e) => {
                    warn!("RDMA CM event channel: {e}");
                    return false;
                }
            }
        }
        true
    }

    fn on_cm_event(
        &mut self,
        ev: CmEvent,
        fds: &mut dyn FnMut(FdChange),
        route: &mut dyn FnMut(PendingConn) -> Option<PendingConn>,
    ) {
        if ev.token == PARKED_TOKEN {
            // An id on its way to another reactor's port.
            debug!(kind = ?ev.kind, "RDMA CM event of a connection in transit ignored");
            return;
        }
        match ev.kind {
            CmEventKind::ConnectRequest => self.on_connect_request(ev, fds, route),
            CmEventKind::Established => {
                if let Some(c) = self.conn_mut(ev.token) {
                    c.established = true;
                    debug!(peer = %c.peer, "NVMe/RDMA connection established");
                }
            }
            CmEventKind::Disconnected
            | CmEventKind::TimewaitExit
            | CmEventKind::ConnectError
            | CmEventKind::Unreachable
            | CmEventKind::Rejected => self.retire(ev.token as usize, "disconnected", fds),
            CmEventKind::DeviceRemoval => {
                if let Some(i) = ev.token.checked_sub(LISTENER_TOKEN) {
                    self.listener_device_removed(i as usize, fds);
                } else {
                    self.destroy(ev.token as usize, "RDMA device removed", fds);
                }
            }
            other => debug!(?other, token = ev.token, "RDMA CM event ignored"),
        }
    }

    /// The device under listener `i` went away: every connection on it is
    /// destroyed, its protection domain released, and the listening id
    /// dropped (the kernel waits for that to finish the removal).
    fn listener_device_removed(&mut self, i: usize, fds: &mut dyn FnMut(FdChange)) {
        let Some(Listener { id, cfg }) = self.listeners.get_mut(i).and_then(Option::take) else {
            return;
        };
        let (traddr, trsvcid) = (cfg.traddr, cfg.trsvcid);
        let dev = id.device().map(|d| d.key());
        let mut gone = 0;
        if let Some(dev) = dev {
            for key in 0..self.conns.len() {
                let on_dev = self.conns[key]
                    .as_ref()
                    .is_some_and(|c| c.pd.device().key() == dev);
                if on_dev {
                    self.destroy(key, "RDMA device removed", fds);
                    gone += 1;
                }
            }
            self.devices.remove(&dev);
            self.unwatch_async(dev, fds);
        }
        warn!(
            %traddr,
            %trsvcid,
            connections = gone,
            "RDMA device removed under an NVMe/RDMA listener: its connections are closed and it no longer accepts"
        );
        drop(id);
    }

    fn conn_mut(&mut self, token: u64) -> Option<&mut Conn> {
        self.conns.get_mut(token as usize).and_then(|c| c.as_mut())
    }

    fn on_connect_request(
        &mut self,
        mut ev: CmEvent,
        fds: &mut dyn FnMut(FdChange),
        route: &mut dyn FnMut(PendingConn) -> Option<PendingConn>,
    ) {
        let Some(id) = ev.request.take() else {
            return;
        };
        let Some((_, l)) = ev
            .token
            .checked_sub(LISTENER_TOKEN)
            .and_then(|i| Some((i as usize, self.listeners.get(i as usize)?.as_ref()?)))
        else {
            return;
        };
        let cfg = l.cfg.clone();
        let peer = id
            .peer_addr()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let limits = *self.target.limits_for(TransportType::Rdma);
        let ql = RdmaQueueLimits {
            max_admin_entries: u32::from(limits.max_aq_depth),
            max_io_entries: u32::from(limits.max_queue_depth),
            max_io_queues: limits.max_io_qpairs_per_ctrlr,
        };
        let req = match parse_connect_request(&ev.private_data, &ql) {
            Ok(r) => r,
            Err(st) => {
                self.target.refusal_log(
                    || warn!(%peer, reason = %st, "NVMe/RDMA connect request rejected"),
                );
                if let Err(e) = id.reject(st.reject().as_bytes()) {
                    debug!(%peer, "reject failed: {e}");
                }
                return;
            }
        };
        let listen = match listen_addr(&cfg) {
            Ok(a) => a,
            Err(e) => {
                self.target.refusal_log(
                    || warn!(%peer, "NVMe/RDMA connect request on a bad listener: {e}"),
                );
                return;
            }
        };
        let p = PendingConn {
            id,
            req,
            initiator_depth: ev.initiator_depth,
            cfg,
            listen,
            peer,
            ticket: None,
        };
        if let Some(p) = route(p) {
            self.accept_here(p, fds);
        }
    }

    /// Accepts a connection request the listening port (possibly another
    /// reactor's) checked and routed here: its id moves to this port's
    /// event channel first.
    pub fn accept_pending(&mut self, mut p: PendingConn, fds: &mut dyn FnMut(FdChange)) {
        if let Err(e) = p.id.migrate(&self.channel) {
            let (peer, qid, me) = (p.peer, p.req.qid, self.reactor);
            self.target.refusal_log(
                || warn!(%peer, qid, "NVMe/RDMA connection not moved to reactor {me}: {e}"),
            );
            return;
        }
        self.accept_here(p, fds);
    }

    fn accept_here(&mut self, p: PendingConn, fds: &mut dyn FnMut(FdChange)) {
        let (peer, qid) = (p.peer, p.req.qid);
        match self.accept(p, fds) {
            Ok(()) => {}
            Err(e) => self
                .target
                .refusal_log(|| warn!(%peer, qid, "NVMe/RDMA connection not set up: {e}")),
        }
    }

    fn device(&mut self, id: &CmId) -> Result<&mut DeviceRes, String> {
        let dev = id.device().ok_or("the connection has no RDMA device")?;
        self.device_res(dev)
    }

    /// The resources of `dev`, set up on first use: protection domain, the
    /// zero buffer's registration, and (unless `no_srq`, where the device
    /// has them) the shared receive queue with its buffers all posted.
    fn device_res(&mut self, dev: Device) -> Result<&mut DeviceRes, String> {
        if !self.devices.contains_key(&dev.key()) {
            let pd = ProtectionDomain::new(dev).map_err(|e| e.to_string())?;
            let zeroes = nvmf_core::backend::zeroes(nvmf_core::backend::ZEROES_LEN).and_then(|z| {
                // SAFETY: the zero buffer is static and never written.
                unsafe { MemoryRegion::new(&pd, z.as_ptr() as *mut u8, z.len(), Access::default()) }
                    .ok()
            });
            let limits = dev.limits().ok();
            let max_read = limits
                .as_ref()
                .map(|l| l.max_qp_init_rd_atom.min(255) as u8)
                .unwrap_or(1);
            let srq = self.shared_receives(&pd, limits.as_ref());
            self.devices.insert(
                dev.key(),
                DeviceRes {
                    srq,
                    pd,
                    zeroes,
                    max_read,
                },
            );
            self.post_shared(dev.key());
        }
        self.devices
            .get_mut(&dev.key())
            .ok_or_else(|| "RDMA device resources missing".to_string())
    }

    /// A shared receive queue for the device of `pd`, or `None` (logged:
    /// why not) where queues post their own receives.
    fn shared_receives(
        &self,
        pd: &Arc<ProtectionDomain>,
        limits: Option<&crate::verbs::DeviceLimits>,
    ) -> Option<SrqRes> {
        let why_not = if self.rdma.no_srq {
            Some("no_srq is set".to_string())
        } else {
            match limits {
                None => Some("the device's attributes could not be read".to_string()),
                Some(l) if l.max_srq == 0 || l.max_srq_wr == 0 => {
                    Some("the device has no shared receive queues".to_string())
                }
                Some(_) => None,
            }
        };
        if let Some(why) = why_not {
            info!(reason = %why, "NVMe/RDMA receives: per queue (one buffer per queue entry)");
            return None;
        }
        let max_wr = limits.map(|l| l.max_srq_wr).unwrap_or(0);
        let depth = self.rdma.max_srq_depth.min(max_wr).max(1);
        let icd = self
            .requests
            .in_capsule_data_size
            .max(self.requests.admin_in_capsule_data_size);
        let capsule = 64 + icd as usize;
        let set_up = || -> Result<SrqRes, String> {
            let srq = SharedReceiveQueue::new(pd, depth).map_err(|e| e.to_string())?;
            let mut pool = RecvPool::new(depth, capsule);
            let mem = pool.memory();
            // SAFETY: the pool's memory is one allocation never resized,
            // dropped after the registration and the SRQ (field order in
            // SrqRes).
            let mr =
                unsafe { MemoryRegion::new(pd, mem.as_mut_ptr(), mem.len(), Access::LOCAL_WRITE) }
                    .map_err(|e| e.to_string())?;
            Ok(SrqRes {
                srq,
                mr,
                pool,
                entries: 0,
                oversubscribed: false,
            })
        };
        match set_up() {
            Ok(r) => {
                let qd = self
                    .target
                    .limits_for(TransportType::Rdma)
                    .max_queue_depth
                    .max(1);
                info!(
                    depth,
                    requested = self.rdma.max_srq_depth,
                    device_max = max_wr,
                    capsule_bytes = capsule,
                    full_depth_io_queues = depth as usize / usize::from(qd),
                    "NVMe/RDMA receives: shared receive queue (SRQ)"
                );
                Some(r)
            }
            Err(e) => {
                warn!("NVMe/RDMA receives: per queue (the shared receive queue could not be set up: {e})");
                None
            }
        }
    }

    /// Posts the idle buffers of device `dev`'s shared receive queue as one
    /// list (a failed post leaves the rest idle, tried again next turn).
    fn post_shared(&mut self, dev: usize) {
        let Some(s) = self.devices.get_mut(&dev).and_then(|d| d.srq.as_mut()) else {
            return;
        };
        self.srq_posts.clear();
        s.pool.take_posts(&mut self.srq_posts);
        if self.srq_posts.is_empty() {
            return;
        }
        let (base, lkey) = (s.mr.addr(), s.mr.lkey());
        self.srq_wrs.clear();
        self.srq_wrs.extend(self.srq_posts.iter().map(|p| RecvWr {
            wr_id: p.wr_id,
            sge: Sge {
                addr: base + p.offset as u64,
                len: p.len,
                lkey,
            },
        }));
        if let Err(e) = s.srq.post_recv(&self.srq_wrs) {
            warn!("posting shared receive buffers failed: {e}");
            s.pool
                .not_posted(&self.srq_posts[e.posted.min(self.srq_posts.len())..]);
        }
    }

    fn accept(&mut self, p: PendingConn, fds: &mut dyn FnMut(FdChange)) -> Result<(), String> {
        let PendingConn {
            mut id,
            req,
            initiator_depth,
            cfg,
            listen,
            peer,
            ticket,
        } = p;
        let cfg = &cfg;
        if let Some(dev) = id.device() {
            self.watch_async(dev, fds);
        }
        let (pd, zero_lkey, max_read, srq) = {
            let d = self.device(&id)?;
            (
                d.pd.clone(),
                d.zeroes.as_ref().map(|m| m.lkey()),
                d.max_read,
                d.srq.as_ref().map(|s| s.srq.clone()),
            )
        };
        let read_depth = match negotiate_read_depth(initiator_depth, max_read, MAX_READ_DEPTH) {
            Ok(d) => d,
            Err(st) => {
                self.target.refusal_log(
                    || warn!(%peer, reason = %st, "NVMe/RDMA connect request rejected"),
                );
                let _ = id.reject(st.reject().as_bytes());
                return Ok(());
            }
        };
        let entries = req.entries().min(u32::from(u16::MAX)) as u16;
        let dev = pd.device();
        // The queue keeps up to twice `entries` slots (responses whose SEND
        // has not completed, and as many new commands): each with a READ,
        // or a WRITE and a SEND, in flight; plus its receives.
        let cq_depth = 5 * u32::from(entries) + SEND_SLACK;
        let cq = CompletionQueue::new(dev, cq_depth).map_err(|e| e.to_string())?;
        id.create_qp_with(
            &pd,
            &cq,
            &cq,
            srq.as_ref(),
            QpCaps {
                send_depth: 4 * u32::from(entries) + SEND_SLACK,
                recv_depth: u32::from(entries),
                send_sge: 1,
                recv_sge: 1,
                max_inline: 0,
            },
        )
        .map_err(|e| e.to_string())?;
        let qp_num = id.qp_num().unwrap_or(0);
        let local = id.local_addr();
        let port = Arc::new(PortInfo {
            trtype: TransportType::Rdma,
            adrfam: cfg.adrfam,
            traddr: match local {
                Some(a) if is_wildcard(&cfg.traddr) => a.ip().to_string(),
                _ => cfg.traddr.clone(),
            },
            trsvcid: cfg.trsvcid.clone(),
            peer,
            tls: None,
            caps: crate::CAPS,
        });
        let mut queue = RdmaQueue::new(
            self.target.clone(),
            port,
            &RdmaQueueParams {
                requests: self.requests.clone(),
                entries,
                read_depth,
                shared_receives: srq.is_some(),
                connect: Some(req),
            },
        );
        let rb = queue.recv_buffers();
        // SAFETY: the receive and response buffers are owned by `queue`,
        // never resized, and outlive the registrations (field order in Conn).
        let recv_mr = if srq.is_some() {
            None
        } else {
            Some(
                unsafe { MemoryRegion::new(&pd, rb.as_mut_ptr(), rb.len(), Access::LOCAL_WRITE) }
                    .map_err(|e| e.to_string())?,
            )
        };
        let sb = queue.response_buffers();
        let resp_mr =
            unsafe { MemoryRegion::new(&pd, sb.as_mut_ptr(), sb.len(), Access::default()) }
                .map_err(|e| e.to_string())?;
        cq.arm().map_err(|e| e.to_string())?;
        queue.start();
        let key = match self.conns.iter().position(Option::is_none) {
            Some(k) => k,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        id.set_token(key as u64);
        let accept = req.accept();
        let mut c = Conn {
            id,
            slot_mrs: Vec::new(),
            recv_mr,
            resp_mr,
            zero_lkey,
            cq: cq.clone(),
            pd,
            queue,
            closing: None,
            accepted_at: Instant::now(),
            established: false,
            peer,
            listen,
            _ticket: ticket,
            dev: dev.key(),
            qp_num,
            entries,
            poisoned: false,
            last_wqe: false,
            draining: None,
        };
        post(&mut c, &mut self.scratch)?;
        if srq.is_some() {
            self.post_shared(c.dev);
        }
        c.id.accept(&ConnParam {
            private_data: accept.as_bytes(),
            responder_resources: 0,
            initiator_depth: read_depth,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .map_err(|e| e.to_string())?;
        debug!(%peer, qid = req.qid, entries, read_depth, reactor = self.reactor, "NVMe/RDMA connection accepted");
        fds(FdChange::Add { fd: cq.fd(), key });
        if srq.is_some() {
            // Counted from here; destroy() takes it off again.
            self.shared_attach(c.dev, usize::from(entries), true);
        }
        self.conns[key] = Some(c);
        Ok(())
    }

    /// Connection `key`'s completion channel is readable: takes every
    /// completion, runs the queue, posts what it asks for. The CQ is armed
    /// again (poll, arm, poll: a completion that arrived between the last
    /// poll and the arm would otherwise wait for the next one), unless busy
    /// polling is on and this poll found work: then it stays unarmed for
    /// [`RdmaPort::poll_unarmed`].
    pub fn on_cq(&mut self, key: usize, fds: &mut dyn FnMut(FdChange)) {
        let Some(c) = self.conns.get_mut(key).and_then(|c| c.as_mut()) else {
            return;
        };
        let _ = c.cq.drain_events();
        self.stats.cq_wakeups += 1;
        let n = self.reap(key);
        if self.busy_poll && n > 0 {
            if !self.unarmed.contains(&key) {
                self.unarmed.push(key);
            }
        } else if !self.unarmed.contains(&key) {
            self.arm_and_reap(key);
        }
        self.after_work(key, fds);
    }

    /// Busy poll: every unarmed CQ is polled once (no system call beyond
    /// ibv_poll_cq). Returns the completions reaped.
    pub fn poll_unarmed(&mut self, fds: &mut dyn FnMut(FdChange)) -> usize {
        let mut total = 0;
        // Taken out while the queues run: a connection destroyed meanwhile
        // (after_work) is left out when the list is put back.
        let mut keys = std::mem::take(&mut self.unarmed);
        for &key in &keys {
            let n = self.reap(key);
            self.stats.busy_polls += 1;
            self.stats.polled_completions += n as u64;
            total += n;
            if n > 0 {
                self.after_work(key, fds);
            }
        }
        keys.retain(|&k| self.conns.get(k).is_some_and(Option::is_some));
        self.unarmed = keys;
        total
    }

    /// Before the reactor sleeps: every unarmed CQ is armed and polled once
    /// more (the re-arm race). Returns the completions that last poll found
    /// (non-zero: do not sleep yet).
    pub fn arm_unarmed(&mut self, fds: &mut dyn FnMut(FdChange)) -> usize {
        let mut total = 0;
        let keys = std::mem::take(&mut self.unarmed);
        for &key in &keys {
            let n = self.arm_and_reap(key);
            total += n;
            if n > 0 {
                self.after_work(key, fds);
            }
        }
        self.unarmed = keys;
        self.unarmed.clear();
        total
    }

    /// Arms connection `key`'s CQ and polls it once more.
    fn arm_and_reap(&mut self, key: usize) -> usize {
        let Some(c) = self.conns.get_mut(key).and_then(|c| c.as_mut()) else {
            return 0;
        };
        if let Err(e) = c.cq.arm() {
            warn!(peer = %c.peer, "arming the completion queue failed: {e}");
            c.queue_close();
            return 0;
        }
        self.reap(key)
    }

    /// Takes every completion of connection `key`'s CQ into its queue.
    fn reap(&mut self, key: usize) -> usize {
        let Some(c) = self.conns.get_mut(key).and_then(|c| c.as_mut()) else {
            return 0;
        };
        let now_ns = nvmf_core::stats::now_ns();
        let mut total = 0;
        // Bounded: a CQ holds at most its depth; stop after that many batches.
        for _ in 0..1024 {
            self.wcs.clear();
            self.wcs.resize_with(POLL_BATCH, Completion::default);
            let n = match c.cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => {
                    warn!(peer = %c.peer, "polling the completion queue failed: {e}");
                    c.queue_close();
                    break;
                }
            };
            total += n;
            for wc in &self.wcs[..n] {
                if !wc.is_ok() && c.closing.is_none() {
                    debug!(peer = %c.peer, status = %wc.status_str(), wr_id = wc.wr_id(), "RDMA work request failed");
                }
                let w = WorkCompletion {
                    wr_id: wc.wr_id(),
                    ok: wc.is_ok(),
                    byte_len: wc.byte_len(),
                };
                if RecvPool::owns(w.wr_id) {
                    let Some(s) = self.devices.get_mut(&c.dev).and_then(|d| d.srq.as_mut()) else {
                        continue;
                    };
                    if wc.qp_num() == c.qp_num {
                        let q = &mut c.queue;
                        if catch_unwind(AssertUnwindSafe(|| {
                            q.on_shared_recv(&mut s.pool, &w, now_ns)
                        }))
                        .is_err()
                        {
                            c.poisoned = true;
                        }
                    } else if let Some(i) = s.pool.complete(w.wr_id) {
                        // Cannot happen with one CQ per connection; the
                        // buffer goes back rather than being lost.
                        warn!(peer = %c.peer, qp_num = wc.qp_num(), "shared receive completion for another queue pair: dropped");
                        s.pool.give_back(i);
                    }
                    continue;
                }
                let q = &mut c.queue;
                if catch_unwind(AssertUnwindSafe(|| q.on_completion(&w, now_ns))).is_err() {
                    c.poisoned = true;
                }
            }
            if n < POLL_BATCH || c.poisoned {
                break;
            }
        }
        let dev = c.dev;
        self.stats.completions += total as u64;
        self.post_shared(dev);
        total
    }

    /// Counts `entries` queue entries (a connection's queue depth) on or off
    /// device `dev`'s shared receive queue, and logs when they come to
    /// exceed its buffers: the hosts' queue depths are then not all backed,
    /// and a host may see receiver-not-ready retries (the RC transport
    /// retries them: `rnr_retry_count` 7, no error) under full load.
    fn shared_attach(&mut self, dev: usize, entries: usize, on: bool) {
        let Some(s) = self.devices.get_mut(&dev).and_then(|d| d.srq.as_mut()) else {
            return;
        };
        if on {
            s.entries += entries;
        } else {
            s.entries = s.entries.saturating_sub(entries);
        }
        let over = s.entries > s.pool.count();
        if over && !s.oversubscribed {
            info!(
                queue_entries = s.entries,
                srq_buffers = s.pool.count(),
                "NVMe/RDMA queue depths now exceed the shared receive queue (hosts may be told receiver-not-ready under full load; raise max_srq_depth)"
            );
        }
        s.oversubscribed = over;
    }

    /// Posts what connection `key` asked for and disconnects it if it must close.
    fn after_work(&mut self, key: usize, fds: &mut dyn FnMut(FdChange)) {
        let Some(c) = self.conns.get_mut(key).and_then(|c| c.as_mut()) else {
            return;
        };
        if !c.poisoned {
            let scratch = &mut self.scratch;
            match catch_unwind(AssertUnwindSafe(|| post(c, scratch))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(peer = %c.peer, "posting work requests failed: {e}");
                    c.queue_close();
                }
                Err(_) => c.poisoned = true,
            }
        }
        if c.poisoned {
            // A bug must cost one queue, not the reactor: the queue is not
            // run again, its queue pair goes at once (nothing it posted is
            // trusted) and the host sees the connection end.
            error!(peer = %c.peer, reactor = self.reactor, "internal error (panic) while serving an NVMe/RDMA queue: connection destroyed");
            self.destroy(key, "internal error (panic)", fds);
            return;
        }
        if let Some(reason) = c.queue.close_reason() {
            if c.closing.is_none() {
                c.closing = Some(Instant::now());
                let (peer, qid) = (c.peer, c.queue.queue().qid());
                self.target
                    .refusal_log(|| info!(%peer, qid, reason, "NVMe/RDMA queue closing"));
                if c.id.disconnect().is_err() {
                    self.destroy(key, reason, fds);
                }
            }
        }
    }

    /// Timer tick and backend completions: every connection's queue polls
    /// (keep-alive, asynchronous events, deferred completions).
    pub fn tick(&mut self, now: Instant, fds: &mut dyn FnMut(FdChange)) {
        let devs: Vec<usize> = self.devices.keys().copied().collect();
        for dev in devs {
            self.post_shared(dev);
        }
        for key in 0..self.conns.len() {
            if let Some(since) = self.conns[key].as_ref().and_then(|c| c.draining) {
                // Retired on a shared receive queue: its flushed receives
                // give their buffers back; destroyed once the last-WQE
                // event came (or it waited long enough).
                self.reap(key);
                let confirmed = self.conns[key].as_ref().is_some_and(|c| c.last_wqe);
                if confirmed || now.saturating_duration_since(since) >= LAST_WQE_WAIT {
                    if !confirmed {
                        self.stats.srq_unconfirmed_teardowns += 1;
                        debug!(
                            reactor = self.reactor,
                            "no last-WQE event within {} ms: queue pair destroyed anyway",
                            LAST_WQE_WAIT.as_millis()
                        );
                    }
                    self.destroy(key, "disconnected", fds);
                }
                continue;
            }
            if let Some(c) = self.conns[key].as_mut() {
                let q = &mut c.queue;
                if !c.poisoned && catch_unwind(AssertUnwindSafe(|| q.poll(now))).is_err() {
                    c.poisoned = true;
                }
                c.release_stale_registrations();
                if !self.connect_timeout.is_zero()
                    && !c.queue.queue().is_connected()
                    && now.saturating_duration_since(c.accepted_at) > self.connect_timeout
                {
                    let (peer, ms) = (c.peer, self.connect_timeout.as_millis());
                    self.target.refusal_log(|| {
                        warn!(%peer, "NVMe/RDMA queue without a Fabrics Connect for {ms} ms: disconnecting")
                    });
                    c.queue.close_now("no Fabrics Connect in time");
                }
                if c.closing
                    .is_some_and(|t| now.saturating_duration_since(t) > DISCONNECT_GRACE)
                {
                    let (peer, qid) = (c.peer, c.queue.queue().qid());
                    self.target.refusal_log(|| {
                        warn!(
                            %peer,
                            qid,
                            "NVMe/RDMA peer did not answer the disconnect within {} ms: destroying the connection",
                            DISCONNECT_GRACE.as_millis()
                        )
                    });
                    self.retire(key, "no disconnect reply (peer gone)", fds);
                    continue;
                }
                self.after_work(key, fds);
            }
        }
    }

    /// Backend completions arrived: queues with commands executing poll.
    pub fn poll_executing(&mut self, fds: &mut dyn FnMut(FdChange)) {
        let now = Instant::now();
        for key in 0..self.conns.len() {
            if let Some(c) = self.conns[key].as_mut() {
                if c.queue.has_executing() {
                    let q = &mut c.queue;
                    if !c.poisoned && catch_unwind(AssertUnwindSafe(|| q.poll(now))).is_err() {
                        c.poisoned = true;
                    }
                    self.after_work(key, fds);
                }
            }
        }
    }

    /// The connection is over (disconnected, or its peer gone): destroyed
    /// now, or, when its queue pair takes receives from a shared receive
    /// queue, once the device confirmed (last WQE reached) that every
    /// receive it took was flushed to its CQ, so none is lost with it.
    fn retire(&mut self, key: usize, why: &str, fds: &mut dyn FnMut(FdChange)) {
        let Some(c) = self.conns.get_mut(key).and_then(|c| c.as_mut()) else {
            return;
        };
        if c.draining.is_some() {
            return;
        }
        if c.queue.owns_receives() || c.last_wqe || c.poisoned {
            self.destroy(key, why, fds);
            return;
        }
        // librdmacm moved the queue pair to the error state when it
        // reported the disconnect; ours makes sure of it (peer gone).
        let _ = c.id.disconnect();
        c.queue.close_now("disconnected");
        c.draining = Some(Instant::now());
    }

    /// Reads the asynchronous events of the devices this port watches.
    /// Events about queue pairs of other ports come back (the daemon
    /// hands them to the other reactors: [`RdmaPort::async_event`]).
    pub fn on_async(&mut self, fds: &mut dyn FnMut(FdChange)) -> Vec<AsyncEvent> {
        let mut others = Vec::new();
        for i in 0..self.async_devs.len() {
            let dev = self.async_devs[i];
            // Bounded per call: the fd stays readable while more wait, and
            // the reactor comes back.
            for _ in 0..64 {
                match dev.next_async_event() {
                    Ok(Some(ev)) => {
                        self.stats.async_events += 1;
                        if !self.handle_async(ev, Some(dev), fds) && ev.qp_num.is_some() {
                            others.push(ev);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        warn!(
                            reactor = self.reactor,
                            "reading RDMA device events failed: {e}"
                        );
                        break;
                    }
                }
            }
        }
        others
    }

    /// An asynchronous event another port read (ignored unless it names
    /// one of this port's queue pairs).
    pub fn async_event(&mut self, ev: AsyncEvent, fds: &mut dyn FnMut(FdChange)) {
        self.handle_async(ev, None, fds);
    }

    /// Acts on one device event; false when it names a queue pair this port
    /// does not have.
    fn handle_async(
        &mut self,
        ev: AsyncEvent,
        dev: Option<Device>,
        fds: &mut dyn FnMut(FdChange),
    ) -> bool {
        let reactor = self.reactor;
        if let Some(qp) = ev.qp_num {
            let Some(key) = self
                .conns
                .iter()
                .position(|c| c.as_ref().is_some_and(|c| c.qp_num == qp))
            else {
                return false;
            };
            let Some(c) = self.conns[key].as_mut() else {
                return false;
            };
            match ev.kind {
                AsyncEventKind::QpLastWqeReached => {
                    c.last_wqe = true;
                    debug!(peer = %c.peer, qp, "last WQE reached");
                    if c.draining.is_some() {
                        // Every receive it took is on its CQ now.
                        self.reap(key);
                        self.destroy(key, "disconnected", fds);
                    }
                }
                AsyncEventKind::QpFatal
                | AsyncEventKind::QpRequestError
                | AsyncEventKind::QpAccessError => {
                    let peer = c.peer;
                    self.target.refusal_log(|| {
                        warn!(reactor, %peer, qp, kind = ?ev.kind, "RDMA queue pair error reported by the device: closing the queue")
                    });
                    c.queue.close_now("RDMA queue pair error (device event)");
                    self.after_work(key, fds);
                }
                _ => debug!(peer = %c.peer, qp, kind = ?ev.kind, "RDMA queue pair event"),
            }
            return true;
        }
        match ev.kind {
            AsyncEventKind::DeviceFatal => {
                error!(
                    reactor,
                    "RDMA device fatal error: closing every queue on it"
                );
                if let Some(dev) = dev {
                    for key in 0..self.conns.len() {
                        if let Some(c) = self.conns[key].as_mut() {
                            if c.pd.device().key() == dev.key() {
                                c.queue.close_now("RDMA device fatal error");
                                self.after_work(key, fds);
                            }
                        }
                    }
                }
            }
            AsyncEventKind::PortActive | AsyncEventKind::PortError => {
                info!(reactor, port = ?ev.port, kind = ?ev.kind, "RDMA port event")
            }
            other => self
                .target
                .refusal_log(|| warn!(reactor, kind = ?other, "RDMA device event")),
        }
        true
    }

    /// Stops reading the events of the device with key `dev` (removed).
    fn unwatch_async(&mut self, dev: usize, fds: &mut dyn FnMut(FdChange)) {
        let Some(i) = self.async_devs.iter().position(|d| d.key() == dev) else {
            return;
        };
        let d = self.async_devs.swap_remove(i);
        if let Ok(fd) = d.async_fd() {
            fds(FdChange::RemoveAsync { fd });
        }
        ASYNC_READERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&k| k != dev);
    }

    /// Reads `dev`'s asynchronous events here unless another port does.
    fn watch_async(&mut self, dev: Device, fds: &mut dyn FnMut(FdChange)) {
        if self.async_devs.contains(&dev) {
            return;
        }
        let mut readers = ASYNC_READERS.lock().unwrap_or_else(|e| e.into_inner());
        if readers.contains(&dev.key()) {
            return;
        }
        match dev.async_fd() {
            Ok(fd) => {
                readers.push(dev.key());
                self.async_devs.push(dev);
                fds(FdChange::AddAsync { fd });
            }
            Err(e) => warn!(
                reactor = self.reactor,
                "RDMA device events cannot be read: {e}"
            ),
        }
    }

    fn destroy(&mut self, key: usize, why: &str, fds: &mut dyn FnMut(FdChange)) {
        let Some(c) = self.conns.get_mut(key).and_then(|c| c.take()) else {
            return;
        };
        fds(FdChange::Remove { fd: c.cq.fd(), key });
        if let Some(f) = self.on_destroy.as_mut() {
            let q = c.queue.queue();
            if catch_unwind(AssertUnwindSafe(|| f(q))).is_err() {
                error!(peer = %c.peer, "internal error (panic) folding a closed NVMe/RDMA queue's counters");
            }
        }
        self.unarmed.retain(|&k| k != key);
        let st = self.stats;
        if !c.queue.owns_receives() {
            self.shared_detach(&c);
        }
        let (peer, qid, connected, reactor) =
            (c.peer, c.queue.queue().qid(), c.established, self.reactor);
        self.target.refusal_log(|| {
            info!(
                %peer,
                qid,
                connected,
                why,
                reactor,
                cq_wakeups = st.cq_wakeups,
                busy_polls = st.busy_polls,
                completions = st.completions,
                polled_completions = st.polled_completions,
                "NVMe/RDMA connection closed"
            )
        });
        let peer = c.peer;
        if catch_unwind(AssertUnwindSafe(move || drop(c))).is_err() {
            error!(%peer, "internal error (panic) while destroying an NVMe/RDMA connection");
        }
    }
}

impl Drop for RdmaPort {
    fn drop(&mut self) {
        // Another port (a later one) may read these devices' events.
        let mine: Vec<usize> = self.async_devs.iter().map(|d| d.key()).collect();
        ASYNC_READERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k| !mine.contains(k));
    }
}

impl RdmaPort {
    /// A connection on a shared receive queue goes: receive completions
    /// still on its CQ (capsules it will never run, flushes) give their
    /// buffers back, so none is lost to the pool; its entries no longer
    /// count against the SRQ. The queue pair is destroyed after this (by
    /// the caller dropping the connection); the buffers are reposted with
    /// the next batch.
    fn shared_detach(&mut self, c: &Conn) {
        let Some(s) = self.devices.get_mut(&c.dev).and_then(|d| d.srq.as_mut()) else {
            return;
        };
        // Bounded: the CQ holds at most its depth.
        let rounds = c.cq.depth() as usize / POLL_BATCH + 2;
        let mut back = 0usize;
        for _ in 0..rounds {
            self.wcs.clear();
            self.wcs.resize_with(POLL_BATCH, Completion::default);
            let n = c.cq.poll(&mut self.wcs).unwrap_or(0);
            for wc in &self.wcs[..n] {
                if RecvPool::owns(wc.wr_id()) {
                    if let Some(i) = s.pool.complete(wc.wr_id()) {
                        s.pool.give_back(i);
                        back += 1;
                    }
                }
            }
            if n < POLL_BATCH {
                break;
            }
        }
        if back > 0 {
            debug!(peer = %c.peer, buffers = back, "shared receive buffers of a closed queue pair given back");
        }
        self.shared_attach(c.dev, usize::from(c.entries), false);
    }
}

/// Whether a slot buffer must be registered (again) before a work request
/// names it: `registered` is the registration's (address, length, buffer
/// ID), `now` the buffer's. Address and length are not enough: a buffer
/// freed under budget pressure and allocated again may come back at the
/// same address, and a registration of the old allocation then names the
/// old pages (an RDMA READ would land there, not in the buffer).
fn needs_registration(registered: Option<(u64, usize, u64)>, now: (u64, usize, u64)) -> bool {
    registered != Some(now)
}

impl Conn {
    /// Drops the registrations of slot buffers that were freed or
    /// reallocated since (they pin memory the slot no longer owns). Control
    /// path: the port's tick.
    fn release_stale_registrations(&mut self) {
        for (i, r) in self.slot_mrs.iter_mut().enumerate() {
            if let Some((_, id)) = r {
                if self.queue.slot_buffer_id(i as u16) != *id {
                    *r = None;
                }
            }
        }
    }

    fn queue_close(&mut self) {
        self.queue.close_now("RDMA completion queue failed");
    }

    /// The local scatter/gather entry of `l`, registering a slot buffer
    /// when it is new or was reallocated.
    fn sge(&mut self, l: &crate::queue::Local) -> Result<Sge, String> {
        let region = self.queue.region_mut(l.region);
        let (ptr, cap) = (region.as_mut_ptr(), region.len());
        let lkey = match l.region {
            Region::Recv(_) => self
                .recv_mr
                .as_ref()
                .map(|m| m.lkey())
                .ok_or("no receive buffers of its own (shared receive queue)")?,
            Region::Response(_) => self.resp_mr.lkey(),
            Region::Zeroes => {
                let z =
                    nvmf_core::backend::zeroes(l.len as usize).ok_or("zero buffer too short")?;
                return Ok(Sge {
                    addr: z.as_ptr() as u64 + u64::from(l.offset),
                    len: l.len,
                    lkey: self.zero_lkey.ok_or("zero buffer not registered")?,
                });
            }
            Region::Slot(i) => {
                let buf_id = self.queue.slot_buffer_id(i);
                let i = usize::from(i);
                if self.slot_mrs.len() <= i {
                    self.slot_mrs.resize_with(i + 1, || None);
                }
                let registered = self.slot_mrs[i]
                    .as_ref()
                    .map(|(mr, id)| (mr.addr(), mr.len(), *id));
                if needs_registration(registered, (ptr as u64, cap, buf_id)) {
                    // The old registration (if any) names memory that was
                    // freed: dropped (unpinned) before the new one is made.
                    self.slot_mrs[i] = None;
                    // SAFETY: the slot buffer stays allocated while a work
                    // request uses it (the slot is busy until its SEND
                    // completed); a new allocation (even at the same
                    // address) has a new ID and is registered anew before
                    // use, and a freed one's registration is dropped by
                    // `release_stale_registrations`.
                    let mr = unsafe { MemoryRegion::new(&self.pd, ptr, cap, Access::LOCAL_WRITE) }
                        .map_err(|e| e.to_string())?;
                    self.slot_mrs[i] = Some((mr, buf_id));
                }
                self.slot_mrs[i]
                    .as_ref()
                    .map(|(m, _)| m.lkey())
                    .unwrap_or(0)
            }
        };
        Ok(Sge {
            addr: ptr as u64 + u64::from(l.offset),
            len: l.len,
            lkey,
        })
    }
}

/// Send-queue work requests posted with one call (one doorbell); a turn
/// that produced more posts them in chunks of this size.
const POST_CHUNK: usize = 128;

/// Work-request lists reused across posts (no allocation per I/O or per turn
/// once grown).
#[derive(Default)]
pub(crate) struct PostScratch {
    work: Vec<WorkRequest>,
    recvs: Vec<RecvWr>,
    sges: Vec<Sge>,
    /// Work request ID, operation, signaled, with the SGE at the same index
    /// of `sges` (false: none, a zero-length probe; its `sges` entry is a
    /// placeholder).
    ops: Vec<(u64, SendOp<'static>, bool, bool)>,
}

/// Posts the queue's work requests: receives as one list, sends as one list
/// per [`POST_CHUNK`] (one doorbell each).
fn post(c: &mut Conn, s: &mut PostScratch) -> Result<(), String> {
    s.work.clear();
    c.queue.take_work(&mut s.work);
    if s.work.is_empty() {
        return Ok(());
    }
    s.recvs.clear();
    s.sges.clear();
    s.ops.clear();
    for wr in s.work.iter() {
        match *wr {
            WorkRequest::Recv { wr_id, local } => s.recvs.push(RecvWr {
                wr_id,
                sge: c.sge(&local)?,
            }),
            WorkRequest::Read {
                wr_id,
                local,
                remote_addr,
                rkey,
            } => {
                s.sges.push(c.sge(&local)?);
                s.ops
                    .push((wr_id, SendOp::RdmaRead { remote_addr, rkey }, true, true));
            }
            WorkRequest::Write {
                wr_id,
                local,
                remote_addr,
                rkey,
            } => {
                s.sges.push(c.sge(&local)?);
                s.ops
                    .push((wr_id, SendOp::RdmaWrite { remote_addr, rkey }, false, true));
            }
            WorkRequest::Send {
                wr_id,
                local,
                invalidate,
            } => {
                s.sges.push(c.sge(&local)?);
                let op = match invalidate {
                    Some(rkey) => SendOp::SendWithInvalidate { rkey },
                    None => SendOp::Send,
                };
                s.ops.push((wr_id, op, true, true));
            }
            WorkRequest::Probe { wr_id } => {
                s.sges.push(Sge {
                    addr: 0,
                    len: 0,
                    lkey: 0,
                });
                s.ops.push((
                    wr_id,
                    SendOp::RdmaWrite {
                        remote_addr: 0,
                        rkey: 0,
                    },
                    true,
                    false,
                ));
            }
        }
    }
    if !s.recvs.is_empty() {
        c.id.post_recv(&s.recvs).map_err(|e| e.to_string())?;
    }
    let blank = SendWr {
        wr_id: 0,
        op: SendOp::Send,
        local: &[],
        signaled: false,
        inline: false,
    };
    let mut chunk = [blank; POST_CHUNK];
    for (ops, sges) in s.ops.chunks(POST_CHUNK).zip(s.sges.chunks(POST_CHUNK)) {
        for (k, (&(wr_id, op, signaled, has_sge), sge)) in ops.iter().zip(sges).enumerate() {
            chunk[k] = SendWr {
                wr_id,
                op,
                local: if has_sge {
                    std::slice::from_ref(sge)
                } else {
                    &[]
                },
                signaled,
                inline: false,
            };
        }
        c.id.post_send(&chunk[..ops.len()])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The socket address an RDMA listener binds (RDMA CM binds to the device
/// that has the address), or why `cfg` names none.
pub fn listen_addr(cfg: &ListenerConfig) -> Result<SocketAddr, String> {
    let what = || format!("NVMe/RDMA listener {}:{}", cfg.traddr, cfg.trsvcid);
    let ip: IpAddr = cfg
        .traddr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("{}: {:?} is not an IP address", what(), cfg.traddr))?;
    let port: u16 = cfg
        .trsvcid
        .parse()
        .map_err(|_| format!("{}: trsvcid {:?} is not a port", what(), cfg.trsvcid))?;
    Ok(SocketAddr::new(ip, port))
}

fn is_wildcard(addr: &str) -> bool {
    matches!(addr, "0.0.0.0" | "::" | "[::]" | "")
}

/// The address family of a socket address.
pub fn adrfam_of(a: &SocketAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::Ipv4
    } else {
        AddressFamily::Ipv6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(traddr: &str, trsvcid: &str) -> ListenerConfig {
        ListenerConfig {
            trtype: TransportType::Rdma,
            adrfam: AddressFamily::Ipv4,
            traddr: traddr.into(),
            trsvcid: trsvcid.into(),
        }
    }

    #[test]
    fn a_buffer_allocated_again_at_the_same_address_is_registered_again() {
        use nvmf_core::request::AlignedBuf;
        // Issue 23 finding 2: a slot buffer freed under budget pressure and
        // allocated again. The allocator may well return the same address
        // and length; the old rule (address and length equal: reuse the
        // registration) then kept a registration of the freed pages.
        let mut b = AlignedBuf::new();
        b.grow(65536);
        let first = (b.as_ptr() as u64, b.len(), b.id());
        b.free();
        b.grow(65536);
        let again = (b.as_ptr() as u64, b.len(), b.id());
        assert!(needs_registration(Some(first), again));
        assert!(
            !needs_registration(Some(again), again),
            "same allocation: reused"
        );
        assert!(needs_registration(None, again));
        // Seen with glibc: the same address comes back, which is why the
        // buffer's allocation ID has to be part of the key.
        if first.0 == again.0 {
            assert_ne!(first.2, again.2);
        }
    }

    #[test]
    fn listen_addresses_parse_or_say_why() {
        assert_eq!(
            listen_addr(&cfg("10.0.0.1", "4420")),
            Ok("10.0.0.1:4420".parse().unwrap())
        );
        assert_eq!(
            listen_addr(&cfg("[fe80::1]", "4421")),
            Ok("[fe80::1]:4421".parse().unwrap())
        );
        assert_eq!(
            listen_addr(&cfg("::", "4420")),
            Ok("[::]:4420".parse().unwrap())
        );
        let e = listen_addr(&cfg("rdma-host", "4420")).unwrap_err();
        assert!(e.contains("\"rdma-host\" is not an IP address"), "{e}");
        let e = listen_addr(&cfg("10.0.0.1", "http")).unwrap_err();
        assert!(
            e.contains("NVMe/RDMA listener 10.0.0.1:http: trsvcid \"http\" is not a port"),
            "{e}"
        );
    }
}
