//! Reactors: one thread per selected core, pinned, each with its own mio
//! `Poll` (epoll), its own `SO_REUSEPORT` listeners and its own connections.
//! Run to completion: a readable socket is read into its connection's receive
//! buffer, every complete PDU is processed, and all responses leave in one
//! vectored write. The thread sleeps in epoll when idle; a 100 ms tick drives
//! keep-alive, async events and deferred completions (`QueuePair::poll`),
//! and in each `Connection::poll` the H2CData timeout, freeing idle slot
//! buffers under memory pressure and retrying commands waiting for one.
//! The thread's io_uring (file bdevs) signals an eventfd in the same epoll
//! set: on it, completions are reaped and the connections with commands in
//! flight are polled and written at once.
//!
//! Queue placement (`placement.rs`): when a connection's Fabrics Connect
//! succeeds, an I/O queue may be handed to another reactor: deregistered
//! here and sent whole (`ReactorCmd::Adopt`) over that reactor's command
//! channel; the receiver registers it and serves it at once. Only a queue
//! with nothing executing in a backend moves (io_uring operations complete
//! on the submitting thread's ring).
//!
//! Handshake limits: a connection that sends no ICReq within
//! `icreq_timeout`, or whose queue is not connected (Fabrics Connect)
//! within `connect_timeout` of being accepted, is closed on a tick, so
//! idle or half-open sockets cannot pile up (the kernel target and SPDK
//! bound these too).
//!
//! QoS (docs/QOS.md): while commands of this thread's queues wait for their
//! bdev's rate-limit tokens, or for a bdev's write gate during a fused
//! Compare and Write (`nvmf_core::qos::parked_here` counts both), the epoll
//! timeout is at most the next 1 ms time slice, and then every connection
//! with executing commands (parked ones count) is polled, NVMe/RDMA too.
//!
//! Adaptive polling (`poll_window.rs`): after a loop turn that did work,
//! the reactor polls epoll with a zero timeout for up to its current
//! window before it blocks again, so a loaded reactor answers the next PDU
//! without a wake-up of a halted CPU. It does not poll when all it holds
//! is commands executing in backends (their completions wake it), and the
//! window follows the gaps between events, up to `poll_window`
//! (`--poll-us`): long gaps shrink it to nothing. An idle reactor blocks
//! in epoll (no timer without connections), so it costs no CPU.
//!
//! NVMe/RDMA (`rdma.rs`): each reactor has an RDMA side (its own port,
//! created on first use) whose CM channel and completion channels sit in
//! this epoll set; reactor 0 listens and routes I/O queues to the reactor
//! the placement picks before they are accepted. Busy polling covers them:
//! in the poll window unarmed CQs are polled each turn; before blocking
//! they are armed and polled once more.
//!
//! Limits and liveness (`limits.rs`): every accepted connection is first
//! admitted against the connection caps shared by all reactors (over the
//! cap: closed at once with RST), then gets TCP keepalive and
//! TCP_USER_TIMEOUT, so a peer that vanished without FIN/RST makes its
//! socket fail in bounded time and the connection (with its controller,
//! for an admin queue) is torn down, even with KATO 0. Per-connection log
//! lines (accepted, refused, closed) go through a per-reactor rate limit;
//! the teardown of a controller's admin queue is always logged. The log
//! writer itself is non-blocking (main.rs). A listener accepts at most
//! `ACCEPT_BUDGET` connections per loop turn, so a connection flood cannot
//! keep the reactor from its other sockets.
//!
//! Lost wake-ups: sockets are edge-triggered, so every path that stops
//! reading with bytes possibly left (round budget, output backpressure)
//! either queues the connection on the `again` list (next turn polls with
//! a zero timeout) or waits for an event that must come (EPOLLOUT while
//! output is queued). As a safety net, the 100 ms tick re-arms reading and
//! writing of every connection, so a missed edge costs at most one tick.

use crate::limits::{ConnLimits, ConnTicket, Keepalive, LogLimiter};
use crate::listen::{self, ListenAddr};
use crate::live::ReactorHandle;
use crate::numa;
use crate::paths::{GoneHosts, PathTable};
use crate::placement::{Placed, Placement};
use crate::poll_window::{Holding, PollWindow};
use crate::rdma::{cq_turn, CqTurn, RdmaCmd, RdmaSetup, RdmaSide};
use crate::zerocopy::{DrainState, Draining};
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use nvmf_core::backend::{uring, wake};
use nvmf_core::controller::QueueStats;
use nvmf_core::queue::{PortInfo, QueuePair};
use nvmf_core::target::Target;
use nvmf_tcp::{Connection, TcpParams};
use nvmf_tls::{Handshake, ServerHandshake, TlsStream};
use openssl::ssl::SslContext;
use slab::Slab;
use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Wakes the reactor (shutdown, or a command from the control plane).
pub const WAKER_TOKEN: Token = Token(0);
const LISTENER_BASE: usize = 1;
const CONN_BASE: usize = 1 << 16;
/// The thread's backend wake-up eventfd (io_uring completions and posts from
/// other threads).
const URING_TOKEN: Token = Token(CONN_BASE - 1);
/// Timer tick: keep-alive, AER and async completion polling.
const TICK: Duration = Duration::from_millis(100);

/// The tick period: [`TICK`], or in debug builds `NVMFD_DEBUG_TICK_MS`, so
/// that a test can take the tick's safety net (every connection polled,
/// every socket tried) out of the way: a completion whose wake-up the
/// reactor missed then hangs instead of arriving on the next tick.
fn tick_period() -> Duration {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("NVMFD_DEBUG_TICK_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return Duration::from_millis(ms.max(1));
    }
    TICK
}
/// A connection whose peer does not take its last bytes (e.g. the
/// termination request) within this time is dropped anyway.
const CLOSE_LINGER: Duration = Duration::from_secs(2);
/// Read/process/write rounds per connection before other sockets get a turn.
const MAX_ROUNDS: usize = 8;
/// iovecs per writev.
const IOV_BATCH: usize = 64;
/// Connections one listener accepts per loop turn before the other
/// sockets get their turn (a connection flood cannot hold the reactor in
/// its accept loop).
const ACCEPT_BUDGET: usize = 64;

/// How an accept round on one listener ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accepted {
    /// The listen queue is empty.
    Drained,
    /// The per-turn budget is spent; more may be waiting.
    More,
    /// accept failed in a way that needs a retry later (e.g. EMFILE).
    Failed,
}

/// Everything a reactor thread needs; built on the main thread.
pub struct Reactor {
    pub id: usize,
    pub cpu: Option<usize>,
    pub poll: Poll,
    /// Listen sockets by slot (token `LISTENER_BASE + slot`); `None` once
    /// dropped at run time.
    pub listeners: Vec<Option<(TcpListener, Arc<ListenAddr>)>>,
    pub target: Arc<Target>,
    pub params: TcpParams,
    /// The same without zero-copy sends (TLS connections, sockets that
    /// refuse `SO_ZEROCOPY`).
    pub params_copy: TcpParams,
    /// Closed connections whose zero-copy sends the kernel has not all
    /// reported (`zerocopy.rs`).
    pub draining: Vec<Draining<TcpStream, Arc<nvmf_core::backend::CompletionSink>, ConnTicket>>,
    pub shutdown: Arc<AtomicBool>,
    /// Control-plane commands; the sender wakes the reactor's `Waker` after
    /// sending. The data path never waits on the control plane.
    pub commands: Receiver<ReactorCmd>,
    /// Counters of connections already closed.
    pub closed: ClosedTotals,
    /// Busy-poll window after a loop turn that did work (zero: block in
    /// epoll as soon as there is nothing to do).
    pub poll_window: Duration,
    /// Close a connection that sent no ICReq this long after it was accepted.
    pub icreq_timeout: Duration,
    /// Close a connection not connected to a controller this long after it
    /// was accepted.
    pub connect_timeout: Duration,
    /// Connection caps shared by every reactor.
    pub conn_limits: Arc<ConnLimits>,
    /// TCP keepalive / TCP_USER_TIMEOUT of accepted sockets.
    pub keepalive: Keepalive,
    /// Rate limit of per-connection log lines.
    pub log: LogLimiter,
    /// Time spent doing work (for `thread_get_stats`).
    pub busy: BusyTime,
    /// Queue placement shared by all reactors (`--queue-placement
    /// balanced`); None: every queue stays where it was accepted.
    pub placement: Option<Arc<Placement>>,
    /// Every reactor's command channel, by reactor id (hand-over target).
    pub peers: Arc<Vec<ReactorHandle>>,
    /// NUMA node of the network device of each local address seen
    /// (sysfs is read once per address).
    pub nic_nodes: HashMap<IpAddr, Option<u32>>,
    /// TLS 1.3 PSK server context (identity lookup in the target's TLS
    /// table) for connections on listeners that require TLS.
    pub tls: Arc<SslContext>,
    /// What an RDMA port needs (created on this reactor's thread when it
    /// first gets an RDMA listener or queue).
    pub rdma: Option<Arc<RdmaSetup>>,
}

/// Where a reactor's time goes, as SPDK's `thread_get_stats` reports it:
/// "busy" is the wall time of loop turns that had something to do (from the
/// return of epoll_wait to the end of the turn), everything else (blocked
/// in epoll, or polling it with nothing to do) is idle. Measured with the
/// clock reads the loop does anyway, so it costs nothing per I/O.
#[derive(Debug, Default, Clone, Copy)]
pub struct BusyTime {
    pub busy_ns: u64,
    /// The adaptive polling window now (`poll_window.rs`), in nanoseconds.
    pub poll_window_ns: u64,
    /// Working turns after which the reactor slept at once because all it
    /// held was backend work.
    pub backend_skips: u64,
    /// When the reactor thread started.
    pub since: Option<Instant>,
}

/// Default of `icreq_timeout`.
pub const ICREQ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Totals of the connections a reactor has closed (for `nvmf_get_stats`).
#[derive(Debug, Default, Clone)]
pub struct ClosedTotals {
    pub admin_qpairs: u64,
    pub io_qpairs: u64,
    pub stats: QueueStats,
    /// The same by path (`nvmf_get_path_stats`, `--metrics`).
    pub paths: PathTable,
    /// Which hosts keep their gone controllers apart (one for the daemon).
    pub gone: Arc<GoneHosts>,
    /// Zero-copy send calls, and those the kernel reported it copied.
    pub zc_calls: u64,
    pub zc_copied: u64,
}

/// A message from the control plane (the RPC thread) to a reactor.
pub enum ReactorCmd {
    /// Bind `addr` with SO_REUSEPORT in this reactor and accept on it.
    Listen {
        addr: Arc<ListenAddr>,
        reply: Sender<Result<(), String>>,
    },
    /// Close the connections that came in on `addr` (all of them, or only
    /// those whose controller belongs to subsystem `only_nqn`), and with
    /// `unbind` stop listening on it.
    Drop {
        addr: SocketAddr,
        only_nqn: Option<String>,
        unbind: bool,
        reply: Sender<usize>,
    },
    /// Close every connection whose controller was torn down (subsystem
    /// deleted, host removed) now, instead of on the next tick: each sends
    /// the completions it already has, then closes.
    CloseDead { reply: Sender<usize> },
    /// Report the connections and counters.
    Snapshot { reply: Sender<ReactorSnapshot> },
    /// Take over a connected I/O queue that another reactor accepted
    /// (queue placement): register its socket here and serve it at once.
    Adopt(MovedConn),
    /// NVMe/RDMA: listeners, removals, and connect requests placed here.
    Rdma(RdmaCmd),
    /// The watchdog's liveness check (`service_manager.rs`): answer with
    /// this reactor's id and its connected queues.
    Ping {
        reactor: usize,
        reply: Sender<(usize, crate::service_manager::Liveness)>,
    },
}

/// A connection on its way from one reactor to another: the socket, the
/// nvmf-tcp state machine (buffered input and queued output included) and
/// its bookkeeping (connection-cap ticket, placement ticket, counters).
pub struct MovedConn(Box<Conn>);

// Everything a connection owns crosses threads when it is handed over.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Conn>();
};

/// One connection as `nvmf_subsystem_get_qpairs` reports it.
#[derive(Debug, Clone)]
pub struct QpairSnapshot {
    pub subnqn: Option<String>,
    pub cntlid: Option<u16>,
    pub qid: u16,
    pub connected: bool,
    /// Going away (NVMe/RDMA: disconnect requested, not yet destroyed).
    pub closing: bool,
    /// The listener it came in on (its `trtype` is the queue's transport).
    pub listen: nvmf_config::ListenerConfig,
    pub peer: SocketAddr,
    /// This queue's counters, and its commands received and not answered.
    pub stats: QueueStats,
    pub in_flight: usize,
}

/// What an open queue is, for the counts the transports keep apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    /// Fabrics Connect not done yet.
    Pending,
    Admin,
    Io,
}

/// One open queue as its transport sees it (the rest comes from its `QueuePair`).
pub struct OpenQueue {
    pub in_flight: usize,
    /// Commands executing in a backend.
    pub executing: usize,
    pub closing: bool,
    pub listen: nvmf_config::ListenerConfig,
    pub peer: SocketAddr,
}

impl ReactorSnapshot {
    /// Counts one open queue of either transport (paths, backend work,
    /// connected admin/I/O queues) and lists it; returns what it is, so the
    /// caller can count pending queues and transport totals its own way.
    pub fn add_open_queue(&mut self, q: &QueuePair, open: OpenQueue) -> QueueKind {
        self.paths.add_open(q, open.in_flight);
        self.pending_bdev_io += open.executing as u64;
        let kind = if !q.is_connected() {
            QueueKind::Pending
        } else if q.is_admin() {
            self.current_admin_qpairs += 1;
            self.admin_qpairs += 1;
            QueueKind::Admin
        } else {
            self.current_io_qpairs += 1;
            self.io_qpairs += 1;
            QueueKind::Io
        };
        let ctrl = q.controller();
        self.qpairs.push(QpairSnapshot {
            subnqn: ctrl.map(|c| c.subsystem().nqn().to_string()),
            cntlid: ctrl.map(|c| c.cntlid()),
            qid: q.qid(),
            connected: q.is_connected(),
            closing: open.closing,
            listen: open.listen,
            peer: open.peer,
            stats: *q.stats(),
            in_flight: open.in_flight,
        });
        kind
    }
}

/// A reactor's NVMe/RDMA side as `nvmf_get_stats` and `/metrics` report
/// it (present once the reactor has an RDMA port).
#[derive(Debug, Clone, Default)]
pub struct RdmaSnapshot {
    /// The port's completion-polling counters since it was created.
    pub poll: nvmf_rdma::PollStats,
    /// RDMA queues open now (connected or not).
    pub qpairs: u64,
    /// Of those, not (yet) connected to a controller.
    pub pending_qpairs: u64,
    /// Counters of its queues, closed and open.
    pub stats: QueueStats,
    /// Commands received and not answered on its open I/O queues.
    pub in_flight: u64,
}

/// What a reactor reports for `nvmf_get_stats` / `nvmf_subsystem_get_qpairs`.
/// `qpairs`, the queue-pair counts, `pending_bdev_io` and `paths` cover
/// both transports; `stats` and `pending_qpairs` are NVMe/TCP's, `rdma`
/// NVMe/RDMA's own.
#[derive(Debug, Clone, Default)]
pub struct ReactorSnapshot {
    pub id: usize,
    pub qpairs: Vec<QpairSnapshot>,
    /// Admin / I/O queue pairs ever connected on this reactor.
    pub admin_qpairs: u64,
    pub io_qpairs: u64,
    pub current_admin_qpairs: u64,
    pub current_io_qpairs: u64,
    /// Connections not (yet) connected to a controller.
    pub pending_qpairs: u64,
    /// I/O commands executing in a backend now (SPDK's `pending_bdev_io`).
    pub pending_bdev_io: u64,
    pub stats: QueueStats,
    /// Counters by path: this reactor's closed queues and open ones.
    pub paths: PathTable,
    /// CPU the reactor is pinned to, if any.
    pub cpu: Option<usize>,
    /// Nanoseconds busy / idle since the reactor started.
    pub busy_ns: u64,
    pub idle_ns: u64,
    /// The adaptive polling window now, and the working turns after which
    /// the reactor slept at once holding only backend work.
    pub poll_window_ns: u64,
    pub backend_skips: u64,
    /// Zero-copy send calls, and those the kernel reported it copied.
    pub zc_calls: u64,
    pub zc_copied: u64,
    /// NVMe/RDMA (None: this reactor has no RDMA port).
    pub rdma: Option<RdmaSnapshot>,
}

/// A reactor's view of one TCP connection.
struct Conn {
    sock: TcpStream,
    peer: SocketAddr,
    /// The listener it came in on.
    laddr: Arc<ListenAddr>,
    sm: Connection,
    /// The socket may have unread bytes (edge-triggered epoll).
    rx_ready: bool,
    /// The socket may accept more bytes.
    tx_ready: bool,
    /// WRITABLE interest is registered.
    want_writable: bool,
    /// epoll reported the peer's FIN (or an error): read until EOF, a short
    /// read does not mean the socket is drained of events.
    read_closed: bool,
    /// When the state machine asked to close while output was still queued.
    closing_since: Option<Instant>,
    /// When it was accepted (handshake limits).
    accepted: Instant,
    /// Connected to a controller once (the Connect limit no longer applies).
    connected: bool,
    /// Its place under the connection caps (given back on drop).
    _ticket: ConnTicket,
    /// Its place in the queue placement (I/O queues under `balanced`;
    /// given back on drop).
    placed: Option<Placed>,
    /// Clear text, or where its TLS session stands.
    tls: ConnTls,
    /// Zero-copy sends are on for this socket (`zerocopy.rs`).
    zc: bool,
    /// The kernel refused a zero-copy call (ENOBUFS: too many reports
    /// pending): copy until it reports again.
    zc_backoff: bool,
}

/// The TLS side of a connection (docs/TLS.md). A listener that requires
/// TLS starts its connections in `Await`: the first byte must open a TLS
/// handshake record, anything else (a clear-text ICReq) closes the
/// connection with that reason. The handshake is stepped on this reactor
/// as the socket becomes ready (PSK binder check plus at most one X25519 /
/// P-256 / P-384 key exchange: tens of microseconds, no finite-field
/// groups); then the session decrypts into the connection's receive buffer
/// and encrypts its output through a staging buffer.
enum ConnTls {
    Clear,
    Await,
    Handshake(ServerHandshake),
    /// Taken out while a handshake step runs.
    Stepping,
    Up(Box<TlsStream>),
}

impl ConnTls {
    /// A handshake step stopped because the socket's send buffer was full:
    /// the connection must be woken when it is writable again (not by the
    /// next tick).
    fn wants_write(&self) -> bool {
        matches!(self, ConnTls::Handshake(p) if p.wants_write())
    }
}

/// First byte of a TLS handshake record (ContentType handshake).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

enum Outcome {
    Keep,
    Close(String),
}

impl Reactor {
    /// Creates the poll instance and the waker main uses to stop it.
    pub fn new_poll() -> io::Result<(Poll, Arc<Waker>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        Ok((poll, waker))
    }

    pub fn run(mut self) {
        self.busy.since = Some(Instant::now());
        if let Some(cpu) = self.cpu {
            match crate::cpus::pin_current_thread(cpu) {
                Ok(()) => debug!(reactor = self.id, cpu, "reactor pinned"),
                Err(e) => warn!(reactor = self.id, cpu, "cannot pin reactor thread: {e}"),
            }
        }
        for (i, slot) in self.listeners.iter_mut().enumerate() {
            let Some((l, _)) = slot else { continue };
            if let Err(e) =
                self.poll
                    .registry()
                    .register(l, Token(LISTENER_BASE + i), Interest::READABLE)
            {
                warn!(reactor = self.id, "cannot register listener: {e}");
            }
        }
        // This thread's io_uring (batched submissions) and its wake-up
        // eventfd: the ring signals completions on it, and backends post
        // from other threads (helpers, library callbacks) and write it, so
        // it is in the epoll set whether or not io_uring works here.
        uring::set_batching(true);
        if let Err(e) = uring::available() {
            debug!(reactor = self.id, "no io_uring on this thread: {e}");
        }
        match wake::fd() {
            Ok(fd) => {
                if let Err(e) = self.poll.registry().register(
                    &mut SourceFd(&fd),
                    URING_TOKEN,
                    Interest::READABLE,
                ) {
                    warn!(
                        reactor = self.id,
                        "cannot register the backend wake-up eventfd: {e}"
                    );
                }
            }
            Err(e) => warn!(
                reactor = self.id,
                "no backend wake-up eventfd (completions from other threads wait for the tick): {e}"
            ),
        }
        let mut rdma = RdmaSide::new(
            self.rdma.clone(),
            self.closed.gone.clone(),
            self.poll.registry(),
            self.id,
            !self.poll_window.is_zero(),
        );
        let mut uring_ready = false;
        let mut events = Events::with_capacity(1024);
        let mut conns: Slab<Conn> = Slab::with_capacity(64);
        let mut again: Vec<usize> = Vec::with_capacity(64);
        let mut again_next: Vec<usize> = Vec::with_capacity(64);
        let mut tick_keys: Vec<usize> = Vec::with_capacity(64);
        let mut retry_accept = false;
        // RDMA CM events left when the per-turn set-up budget ran out.
        let mut cm_again = false;
        // Listeners whose accept budget ran out: accepted again next turn.
        let mut accept_again: Vec<usize> = Vec::with_capacity(4);
        let mut accept_now: Vec<usize> = Vec::with_capacity(4);
        let tick = tick_period();
        let mut next_tick = Instant::now() + tick;
        // QoS: while commands of this thread's queues wait for their bdev's
        // tokens, the queues with executing commands are polled every time
        // slice (nothing else wakes the reactor when tokens come back).
        let mut next_qos = Instant::now();
        // Until when to keep polling without sleeping (set after work).
        let mut spin_until: Option<Instant> = None;
        // The adaptive window, and when the current idle stretch began.
        let mut window = PollWindow::new(self.poll_window);
        let mut idle_since: Option<Instant> = None;

        while !self.shutdown.load(Ordering::Relaxed) {
            let mut now = Instant::now();
            // RDMA CQs left unarmed by busy polling: before blocking, arm
            // them and poll once more (a completion that raced the arm
            // keeps the reactor polling).
            if cq_turn(rdma.has_unarmed(), now, spin_until) == CqTurn::Arm {
                if rdma.arm_unarmed() > 0 {
                    spin_until = Some(now + self.poll_window);
                }
                now = Instant::now();
            }
            // No connection and nothing to retry: sleep until an accept or
            // a wake-up, no timer. Otherwise wake for the next tick.
            let timeout = if !again.is_empty()
                || !accept_again.is_empty()
                || cm_again
                || spin_until.is_some_and(|t| now < t)
            {
                Some(Duration::ZERO)
            } else if conns.is_empty() && rdma.connections() == 0 && !retry_accept {
                None
            } else {
                Some(next_tick.saturating_duration_since(now))
            };
            let timeout = if nvmf_core::qos::parked_here() > 0 {
                let q = next_qos.saturating_duration_since(now);
                Some(timeout.map_or(q, |t| t.min(q)))
            } else {
                timeout
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!(reactor = self.id, "epoll failed: {e}");
                }
                continue;
            }
            if self.shutdown.load(Ordering::Relaxed) {
                break;
            }
            // Busy poll of the unarmed RDMA CQs in the window.
            let polled = if cq_turn(rdma.has_unarmed(), now, spin_until) == CqTurn::Poll {
                rdma.poll_unarmed()
            } else {
                0
            };
            let woke = (!events.is_empty()
                || !again.is_empty()
                || !accept_again.is_empty()
                || cm_again
                || polled > 0)
                .then(Instant::now);
            let mut cm_done = false;
            if let (Some(w), Some(s)) = (woke, idle_since) {
                // An idle stretch ended: the window follows the gaps.
                window.idle_ended(w.saturating_duration_since(s));
                idle_since = None;
            }
            for ev in events.iter() {
                let t = ev.token().0;
                if t == WAKER_TOKEN.0 {
                    self.commands(&mut conns, &mut again_next, &mut rdma);
                    continue;
                } else if t == crate::rdma::ASYNC_TOKEN {
                    // Events about other reactors' queue pairs go to them
                    // (each port ignores those it does not have).
                    for ev in rdma.on_async() {
                        for (i, p) in self.peers.iter().enumerate() {
                            if i != self.id {
                                p.send(ReactorCmd::Rdma(crate::rdma::RdmaCmd::Async(ev)));
                            }
                        }
                    }
                    continue;
                } else if t == crate::rdma::CM_TOKEN {
                    cm_again = self.rdma_cm(&mut rdma);
                    cm_done = true;
                    continue;
                } else if t >= crate::rdma::CQ_BASE {
                    rdma.on_cq(t);
                    continue;
                } else if t == URING_TOKEN.0 {
                    wake::clear();
                    uring_ready = true;
                } else if t < CONN_BASE {
                    let i = t - LISTENER_BASE;
                    match self.accept_all(i, &mut conns) {
                        Accepted::Drained => {}
                        Accepted::More => accept_again.push(i),
                        Accepted::Failed => retry_accept = true,
                    }
                } else {
                    let key = t - CONN_BASE;
                    let Some(c) = conns.get_mut(key) else {
                        continue;
                    };
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        c.rx_ready = true;
                    }
                    // On a zero-copy socket EPOLLERR also means "reports on
                    // the error queue" (`service` reads them); a real error
                    // shows in the next read or write.
                    if ev.is_read_closed() || (ev.is_error() && !c.zc) {
                        c.read_closed = true;
                    }
                    if ev.is_writable() || ev.is_write_closed() {
                        c.tx_ready = true;
                    }
                    self.service_key(key, &mut conns, &mut again_next);
                }
            }
            // RDMA connect requests left by the last turn's set-up budget.
            if cm_again && !cm_done {
                cm_again = self.rdma_cm(&mut rdma);
            }
            // Listeners that still had connections waiting after their turn.
            std::mem::swap(&mut accept_now, &mut accept_again);
            accept_now.sort_unstable();
            accept_now.dedup();
            for i in accept_now.drain(..) {
                match self.accept_all(i, &mut conns) {
                    Accepted::Drained => {}
                    Accepted::More => accept_again.push(i),
                    Accepted::Failed => retry_accept = true,
                }
            }
            // Connections that still had readable bytes after their turn.
            for key in again.drain(..) {
                if conns.contains(key) {
                    self.service_key(key, &mut conns, &mut again_next);
                }
            }
            std::mem::swap(&mut again, &mut again_next);
            again.sort_unstable();
            again.dedup();

            // File bdev completions: deliver them now, not on the next tick.
            if uring::flush() > 0 || std::mem::take(&mut uring_ready) {
                self.poll_executing(&mut conns, &mut again, &mut tick_keys);
                rdma.poll_executing();
                uring::flush();
            }

            // QoS: a new time slice for commands waiting for tokens.
            if nvmf_core::qos::parked_here() > 0 {
                let now = Instant::now();
                if now >= next_qos {
                    next_qos = now + nvmf_core::qos::TIMESLICE;
                    self.poll_executing(&mut conns, &mut again, &mut tick_keys);
                    rdma.poll_executing();
                    // Commands that ran now (resumed for QoS, a
                    // compare-and-write past its write gate) may have
                    // queued io_uring operations: submit them before the
                    // reactor sleeps.
                    uring::flush();
                }
            }

            let now = Instant::now();
            if let Some(w) = woke {
                self.busy.busy_ns += now.saturating_duration_since(w).as_nanos() as u64;
                // Work was done: poll for more instead of sleeping, if
                // polling finds any (poll_window.rs).
                idle_since = Some(now);
                spin_until = if window.current().is_zero() {
                    None
                } else {
                    let held = holding(&conns, rdma.connections() > 0);
                    window.after_work(held).map(|d| now + d)
                };
                self.busy.poll_window_ns = window.current().as_nanos() as u64;
                self.busy.backend_skips = window.skipped_backend();
            }
            if conns.is_empty() && rdma.connections() == 0 && !retry_accept {
                next_tick = now + tick;
            } else if now >= next_tick {
                next_tick = now + tick;
                rdma.tick(now);
                if !self.draining.is_empty() {
                    self.poll_draining(now);
                }
                let id = self.id;
                self.log.roll(now, |k| {
                    info!(reactor = id, "suppressed {k} similar messages")
                });
                if retry_accept {
                    retry_accept = false;
                    for i in 0..self.listeners.len() {
                        match self.accept_all(i, &mut conns) {
                            Accepted::Drained => {}
                            Accepted::More => accept_again.push(i),
                            Accepted::Failed => retry_accept = true,
                        }
                    }
                }
                tick_keys.clear();
                tick_keys.extend(conns.iter().map(|(k, _)| k));
                for &key in &tick_keys {
                    if let Some(c) = conns.get_mut(key) {
                        // Safety net against a missed edge (ours or the
                        // kernel's): try the socket once per tick.
                        c.rx_ready = true;
                        c.tx_ready = true;
                        let polled = catch_unwind(AssertUnwindSafe(|| c.sm.poll(now)));
                        if polled.is_err() {
                            self.close(key, &mut conns, "internal error (panic) in poll".into());
                            continue;
                        }
                        // (`connected` is set by `service_key`, which also
                        // places the queue.)
                        if !c.connected && !c.sm.queue().is_connected() {
                            if let Some(why) =
                                handshake_expired(c, now, self.icreq_timeout, self.connect_timeout)
                            {
                                self.close(key, &mut conns, why);
                                continue;
                            }
                        }
                        if let Some(since) = c.closing_since {
                            if now.duration_since(since) > CLOSE_LINGER {
                                let reason = c.sm.close_reason().unwrap_or("closing").to_string();
                                self.close(
                                    key,
                                    &mut conns,
                                    format!("{reason} (peer stopped reading)"),
                                );
                                continue;
                            }
                        }
                    }
                    self.service_key(key, &mut conns, &mut again);
                }
            }
        }
        let n = conns.len();
        for (_, c) in conns.iter_mut() {
            let _ = self.poll.registry().deregister(&mut c.sock);
        }
        drop(conns);
        rdma.shut_down();
        debug!(reactor = self.id, connections = n, "reactor stopped");
    }

    /// Accepts until the listen queue is empty or `ACCEPT_BUDGET`
    /// connections (admitted or refused) were taken this turn.
    fn accept_all(&mut self, i: usize, conns: &mut Slab<Conn>) -> Accepted {
        for _ in 0..ACCEPT_BUDGET {
            let Some(Some((listener, laddr))) = self.listeners.get(i) else {
                return Accepted::Drained;
            };
            let laddr = laddr.clone();
            let (mut sock, peer) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Accepted::Drained,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    let id = self.id;
                    self.conn_log(|| warn!(reactor = id, "accept on {} failed: {e}", laddr.addr));
                    return Accepted::Failed;
                }
            };
            let ticket = match self.conn_limits.admit(peer.ip()) {
                Ok(t) => t,
                Err(why) => {
                    // Close at once, with RST: no TIME_WAIT left here, and
                    // the peer learns right away.
                    let _ = socket2::SockRef::from(&sock).set_linger(Some(Duration::ZERO));
                    drop(sock);
                    let id = self.id;
                    self.conn_log(|| {
                        warn!(
                            reactor = id,
                            "connection from {peer} on {} refused: limit of {why} reached",
                            laddr.addr
                        )
                    });
                    continue;
                }
            };
            // Debug builds only: the supervision test kills a reactor the
            // way a bug outside every connection's guard would.
            #[cfg(debug_assertions)]
            if std::env::var("NVMFD_DEBUG_PANIC_REACTOR").is_ok_and(|v| v == self.id.to_string()) {
                panic!("injected by NVMFD_DEBUG_PANIC_REACTOR on an accept");
            }
            if let Err(e) = sock.set_nodelay(true) {
                debug!("TCP_NODELAY failed for {peer}: {e}");
            }
            if let Err(e) = self.keepalive.apply(&sock) {
                debug!("TCP keepalive setup failed for {peer}: {e}");
            }
            let secure = self
                .target
                .tls()
                .is_secure(&laddr.cfg.traddr, &laddr.cfg.trsvcid);
            let port = Arc::new(PortInfo {
                trtype: laddr.cfg.trtype,
                adrfam: laddr.cfg.adrfam,
                traddr: laddr.cfg.traddr.clone(),
                trsvcid: laddr.cfg.trsvcid.clone(),
                peer,
                tls: None,
                caps: nvmf_tcp::CAPS,
            });
            // Zero-copy sends: clear-text connections only (a TLS record is
            // built from a copy anyway), and only if the socket takes them.
            let zc = self.params.zerocopy_threshold.is_some()
                && !secure
                && match crate::zerocopy::enable(sock.as_raw_fd()) {
                    Ok(()) => true,
                    Err(e) => {
                        debug!("SO_ZEROCOPY refused for {peer}: {e}");
                        false
                    }
                };
            let sm = if zc {
                Connection::new(self.target.clone(), port, &self.params)
            } else {
                Connection::new(self.target.clone(), port, &self.params_copy)
            };
            let entry = conns.vacant_entry();
            let key = entry.key();
            if let Err(e) =
                self.poll
                    .registry()
                    .register(&mut sock, Token(CONN_BASE + key), Interest::READABLE)
            {
                warn!("cannot register connection from {peer}: {e}");
                continue;
            }
            let id = self.id;
            self.conn_log(|| {
                info!(
                    reactor = id,
                    "connection accepted from {peer} on {} ({})",
                    laddr.addr,
                    if secure { "tcp, TLS required" } else { "tcp" }
                )
            });
            entry.insert(Conn {
                sock,
                peer,
                laddr,
                sm,
                rx_ready: true,
                tx_ready: true,
                want_writable: false,
                read_closed: false,
                closing_since: None,
                accepted: Instant::now(),
                connected: false,
                _ticket: ticket,
                placed: None,
                tls: if secure {
                    ConnTls::Await
                } else {
                    ConnTls::Clear
                },
                zc,
                zc_backoff: false,
            });
        }
        Accepted::More
    }

    /// Polls (delivers late completions) and services every connection
    /// with commands waiting for an asynchronous backend.
    fn poll_executing(
        &mut self,
        conns: &mut Slab<Conn>,
        again: &mut Vec<usize>,
        keys: &mut Vec<usize>,
    ) {
        let now = Instant::now();
        keys.clear();
        keys.extend(
            conns
                .iter()
                .filter(|(_, c)| c.sm.has_executing())
                .map(|(k, _)| k),
        );
        for &key in keys.iter() {
            let Some(c) = conns.get_mut(key) else {
                continue;
            };
            if catch_unwind(AssertUnwindSafe(|| c.sm.poll(now))).is_err() {
                self.close(key, conns, "internal error (panic) in poll".into());
                continue;
            }
            self.service_key(key, conns, again);
        }
    }

    fn service_key(&mut self, key: usize, conns: &mut Slab<Conn>, again: &mut Vec<usize>) {
        let Some(c) = conns.get_mut(key) else { return };
        let id = self.id;
        let ctx = &self.tls;
        let target = &self.target;
        // TLS connections never use zero-copy sends.
        let params = &self.params_copy;
        // A bug must cost one connection, not the reactor and all of its
        // connections: a panic closes just this one.
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            match tls_step(c, ctx, target, params, id) {
                Outcome::Keep if matches!(c.tls, ConnTls::Clear | ConnTls::Up(_)) => service(c),
                other => other,
            }
        }))
        .unwrap_or_else(|_| Outcome::Close("internal error (panic) while serving".into()));
        match outcome {
            Outcome::Keep => {
                if !c.connected && c.sm.queue().is_connected() {
                    c.connected = true;
                    if let Some(to) = self.place(c) {
                        self.hand_over(key, to, conns);
                        return;
                    }
                }
                if c.rx_ready && c.sm.wants_read() && c.closing_since.is_none() {
                    again.push(key);
                }
                let want_w = c.sm.has_output() || c.tls.wants_write();
                if want_w != c.want_writable {
                    let interest = if want_w {
                        Interest::READABLE | Interest::WRITABLE
                    } else {
                        Interest::READABLE
                    };
                    if let Err(e) = self.poll.registry().reregister(
                        &mut c.sock,
                        Token(CONN_BASE + key),
                        interest,
                    ) {
                        self.close(key, conns, format!("epoll reregister failed: {e}"));
                        return;
                    }
                    c.want_writable = want_w;
                }
            }
            Outcome::Close(reason) => self.close(key, conns, reason),
        }
    }

    /// Where a queue whose Connect just succeeded should live: None to stay
    /// here (admin queues, `--queue-placement kernel`, or placed here),
    /// else the reactor to hand it to. Counts it in the placement.
    fn place(&mut self, c: &mut Conn) -> Option<usize> {
        let placement = self.placement.clone()?;
        let q = c.sm.queue();
        if q.is_admin() || c.sm.close_reason().is_some() {
            return None;
        }
        let ctrl = q.controller()?;
        let key = Arc::as_ptr(ctrl) as usize;
        let (cntlid, qid) = (ctrl.cntlid(), q.qid());
        let placed = if c.sm.movable() {
            let node = self.nic_node(&c.sock);
            placement.place(key, node)
        } else {
            // A command pipelined behind the Connect is already executing
            // in this thread's backend: the queue stays here.
            debug!(
                reactor = self.id,
                cntlid, qid, "I/O queue stays: a command pipelined behind its Connect is executing"
            );
            placement.place_at(key, self.id)
        };
        let to = placed.reactor();
        c.placed = Some(placed);
        debug!(
            reactor = self.id,
            cntlid,
            qid,
            peer = %c.peer,
            io_queues = ?placement.io_queues(),
            "I/O queue placed on reactor {to}"
        );
        (to != self.id).then_some(to)
    }

    /// NUMA node of the network device carrying `sock`'s local address.
    fn nic_node(&mut self, sock: &TcpStream) -> Option<u32> {
        let ip = sock.local_addr().ok()?.ip();
        *self
            .nic_nodes
            .entry(ip)
            .or_insert_with(|| numa::nic_node(ip))
    }

    /// Sends connection `key` to reactor `to` (it stops being served here).
    fn hand_over(&mut self, key: usize, to: usize, conns: &mut Slab<Conn>) {
        let Some(mut c) = conns.try_remove(key) else {
            return;
        };
        let id = self.id;
        if let Err(e) = self.poll.registry().deregister(&mut c.sock) {
            warn!(
                reactor = id,
                "cannot hand a connection from {} over: {e}; closed", c.peer
            );
            return;
        }
        let peer = c.peer;
        debug!(
            reactor = id,
            "handing the I/O queue from {peer} to reactor {to} with {} bytes of output queued",
            c.sm.output_len()
        );
        let Some(handle) = self.peers.get(to) else {
            warn!(
                reactor = id,
                "no reactor {to} to hand the connection from {peer} to; closed"
            );
            return;
        };
        if !handle.send(ReactorCmd::Adopt(MovedConn(Box::new(c)))) {
            // Only at shutdown: the connection was dropped with the message.
            debug!(
                reactor = id,
                "reactor {to} is gone; connection from {peer} closed"
            );
        }
    }

    /// Takes over a connection another reactor handed to this one.
    fn adopt(&mut self, mut c: Conn, conns: &mut Slab<Conn>, again: &mut Vec<usize>) {
        let id = self.id;
        let peer = c.peer;
        if !self
            .listeners
            .iter()
            .flatten()
            .any(|(_, a)| a.addr == c.laddr.addr)
        {
            // Its listen address was removed while it was on its way.
            self.closed.io_qpairs += 1;
            self.closed.stats.add(c.sm.queue().stats());
            self.closed
                .paths
                .fold_closed(c.sm.queue(), &self.closed.gone);
            self.conn_log(|| {
                info!(
                    reactor = id,
                    "connection from {peer} closed: listener removed"
                )
            });
            return;
        }
        if !c.sm.adopt_current_thread() {
            // `place` only moves queues with nothing executing.
            debug!(
                reactor = id,
                "connection from {peer} moved with commands executing"
            );
        }
        let entry = conns.vacant_entry();
        let key = entry.key();
        let want_w = c.sm.has_output();
        let interest = if want_w {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut c.sock, Token(CONN_BASE + key), interest)
        {
            warn!(
                reactor = id,
                "cannot register connection from {peer}: {e}; closed"
            );
            return;
        }
        // The host may have sent more already (the socket was not watched
        // on its way here): try reading and writing at once.
        c.rx_ready = true;
        c.tx_ready = true;
        c.want_writable = want_w;
        debug!(
            reactor = id,
            qid = c.sm.queue().qid(),
            "I/O queue from {peer} taken over"
        );
        entry.insert(c);
        self.service_key(key, conns, again);
    }

    /// Runs the control-plane commands waiting in the channel.
    fn commands(&mut self, conns: &mut Slab<Conn>, again: &mut Vec<usize>, rdma: &mut RdmaSide) {
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                ReactorCmd::Listen { addr, reply } => {
                    let _ = reply.send(self.listen(addr));
                }
                ReactorCmd::Drop {
                    addr,
                    only_nqn,
                    unbind,
                    reply,
                } => {
                    let keys: Vec<usize> = conns
                        .iter()
                        .filter(|(_, c)| c.laddr.addr == addr)
                        .filter(|(_, c)| match &only_nqn {
                            None => true,
                            Some(n) => {
                                c.sm.queue()
                                    .controller()
                                    .is_some_and(|ctrl| ctrl.subsystem().nqn() == n)
                            }
                        })
                        .map(|(k, _)| k)
                        .collect();
                    for &k in &keys {
                        self.close(k, conns, "listener removed".into());
                    }
                    if unbind {
                        for slot in self.listeners.iter_mut() {
                            if slot.as_ref().is_some_and(|(_, a)| a.addr == addr) {
                                if let Some((mut l, _)) = slot.take() {
                                    let _ = self.poll.registry().deregister(&mut l);
                                }
                            }
                        }
                    }
                    let _ = reply.send(keys.len());
                }
                ReactorCmd::CloseDead { reply } => {
                    // What the tick does, now: the queue reports Close, the
                    // connection sends what it has already answered and
                    // closes (at once when nothing is queued; CLOSE_LINGER
                    // bounds a peer that stopped reading).
                    let keys: Vec<usize> = conns
                        .iter()
                        .filter(|(_, c)| c.sm.queue().controller().is_some_and(|x| x.is_dead()))
                        .map(|(k, _)| k)
                        .collect();
                    let now = Instant::now();
                    for &k in &keys {
                        let Some(c) = conns.get_mut(k) else { continue };
                        c.tx_ready = true;
                        if catch_unwind(AssertUnwindSafe(|| c.sm.poll(now))).is_err() {
                            self.close(k, conns, "internal error (panic) in poll".into());
                            continue;
                        }
                        self.service_key(k, conns, again);
                    }
                    let _ = reply.send(keys.len());
                }
                ReactorCmd::Snapshot { reply } => {
                    let mut s = self.snapshot(conns);
                    rdma.add_to_snapshot(&mut s);
                    let _ = reply.send(s);
                }
                ReactorCmd::Ping { reactor, reply } => {
                    #[cfg(debug_assertions)]
                    debug_hang_on_ping(self.id);
                    let mut l = crate::service_manager::Liveness::default();
                    for (_, c) in conns.iter() {
                        let q = c.sm.queue();
                        if !q.is_connected() {
                            continue;
                        }
                        if q.is_admin() {
                            l.admin_queues += 1;
                        } else {
                            l.io_queues += 1;
                        }
                    }
                    rdma.count_queues(&mut l);
                    let _ = reply.send((reactor, l));
                }
                ReactorCmd::Adopt(m) => self.adopt(*m.0, conns, again),
                ReactorCmd::Rdma(cmd) => rdma.command(cmd),
            }
        }
    }

    fn listen(&mut self, addr: Arc<ListenAddr>) -> Result<(), String> {
        if self
            .listeners
            .iter()
            .flatten()
            .any(|(_, a)| a.addr == addr.addr)
        {
            return Ok(());
        }
        let l = listen::bind_reuseport(addr.addr)
            .map_err(|e| format!("cannot listen on {} (tcp): {e}", addr.addr))?;
        let mut l = TcpListener::from_std(l);
        let slot = match self.listeners.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.listeners.push(None);
                self.listeners.len() - 1
            }
        };
        if LISTENER_BASE + slot >= URING_TOKEN.0 {
            return Err("too many listen addresses".into());
        }
        self.poll
            .registry()
            .register(&mut l, Token(LISTENER_BASE + slot), Interest::READABLE)
            .map_err(|e| format!("cannot register listener {}: {e}", addr.addr))?;
        debug!(reactor = self.id, "listening on {}", addr.addr);
        self.listeners[slot] = Some((l, addr));
        Ok(())
    }

    fn snapshot(&self, conns: &Slab<Conn>) -> ReactorSnapshot {
        let mut s = ReactorSnapshot {
            id: self.id,
            admin_qpairs: self.closed.admin_qpairs,
            io_qpairs: self.closed.io_qpairs,
            stats: self.closed.stats,
            paths: self.closed.paths.clone(),
            cpu: self.cpu,
            busy_ns: self.busy.busy_ns,
            poll_window_ns: self.busy.poll_window_ns,
            backend_skips: self.busy.backend_skips,
            zc_calls: self.closed.zc_calls,
            zc_copied: self.closed.zc_copied,
            ..Default::default()
        };
        for (_, c) in conns.iter() {
            let zs = c.sm.stats();
            s.zc_calls += zs.zc_calls;
            s.zc_copied += zs.zc_copied;
        }
        let up = self.busy.since.map_or(0, |t| t.elapsed().as_nanos() as u64);
        s.idle_ns = up.saturating_sub(s.busy_ns);
        for (_, c) in conns.iter() {
            let q = c.sm.queue();
            s.stats.add(q.stats());
            let open = OpenQueue {
                in_flight: c.sm.in_flight(),
                executing: c.sm.backend_pending(),
                closing: false,
                listen: c.laddr.cfg.clone(),
                peer: c.peer,
            };
            if s.add_open_queue(q, open) == QueueKind::Pending {
                s.pending_qpairs += 1;
            }
        }
        s
    }

    /// Runs `log` unless this reactor's per-connection line budget for the
    /// current second is spent.
    /// The RDMA CM channel's events: connect requests are admitted
    /// (connection caps), placed and accepted here or sent to their
    /// reactor. True when the set-up budget left events for the next turn.
    fn rdma_cm(&mut self, rdma: &mut RdmaSide) -> bool {
        let (me, placement, peers) = (self.id, self.placement.as_ref(), &self.peers);
        let (limits, log, nics) = (&self.conn_limits, &mut self.log, &mut self.nic_nodes);
        rdma.on_cm(&mut |p| crate::rdma::route(me, placement, peers, nics, limits, log, p))
    }

    fn conn_log(&mut self, log: impl FnOnce()) {
        let id = self.id;
        if self.log.allow(Instant::now(), |k| {
            info!(reactor = id, "suppressed {k} similar messages")
        }) {
            log();
        }
    }

    fn close(&mut self, key: usize, conns: &mut Slab<Conn>, reason: String) {
        if let Some(mut c) = conns.try_remove(key) {
            let q = c.sm.queue();
            if q.is_connected() {
                if q.is_admin() {
                    self.closed.admin_qpairs += 1;
                } else {
                    self.closed.io_qpairs += 1;
                }
            }
            self.closed.stats.add(q.stats());
            self.closed.paths.fold_closed(q, &self.closed.gone);
            let zs = c.sm.stats();
            self.closed.zc_calls += zs.zc_calls;
            self.closed.zc_copied += zs.zc_copied;
            let _ = self.poll.registry().deregister(&mut c.sock);
            let id = self.id;
            let peer = c.peer;
            match q.controller().filter(|_| q.is_admin()) {
                // A controller goes away with this queue: always logged.
                Some(ctrl) => info!(
                    reactor = id,
                    cntlid = ctrl.cntlid(),
                    hostnqn = %ctrl.hostnqn(),
                    "connection from {peer} closed (admin queue, controller torn down): {reason}"
                ),
                None => {
                    self.conn_log(|| info!(reactor = id, "connection from {peer} closed: {reason}"))
                }
            }
            // Zero-copy calls the kernel has not reported: the socket stays
            // open (shut down) and the buffers parked until it has.
            if c.zc && c.sm.zc_outstanding() > 0 {
                let hold = c.sm.queue().buffer_hold();
                let calls = c.sm.take_zc_calls();
                let Conn {
                    sock,
                    sm,
                    _ticket: ticket,
                    ..
                } = c;
                // The engine's teardown parks the slots: `hold` counts as
                // an operation in flight.
                drop(sm);
                self.draining.push(Draining::new(sock, hold, ticket, calls));
            }
            // Dropping `c` drops its QueuePair (controller teardown for an
            // admin queue) and closes the socket.
        }
    }

    /// Closed connections waiting for the kernel's zero-copy reports.
    fn poll_draining(&mut self, now: Instant) {
        let id = self.id;
        self.draining.retain_mut(|d| match d.poll(now) {
            DrainState::Waiting(_) => true,
            DrainState::Done => false,
            DrainState::GaveUp(n) => {
                warn!(
                    reactor = id,
                    "a closed connection's {n} zero-copy sends were never reported done by the \
                     kernel within {:?}: their buffers are kept for good",
                    crate::zerocopy::DRAIN_LIMIT
                );
                false
            }
        });
    }
}

/// Reads the zero-copy reports on `c`'s error queue and releases the slots
/// the kernel is done with; zero-copy goes off for the connection when the
/// kernel copies everything anyway (loopback, no scatter-gather), unless
/// `--zerocopy-send always` (`c.zc` stays: the calls already made are
/// still reported here).
fn zc_reports(c: &mut Conn) {
    let sm = &mut c.sm;
    let mut turned_off = false;
    let mut any = false;
    let r = crate::zerocopy::drain(c.sock.as_raw_fd(), |lo, hi, copied| {
        turned_off |= sm.zc_completed(lo, hi, copied);
        any = true;
    });
    if let Err(e) = r {
        debug!(peer = %c.peer, "reading the zero-copy reports failed: {e}");
    }
    if any {
        c.zc_backoff = false;
    }
    if turned_off {
        debug!(
            peer = %c.peer,
            "the kernel copies this connection's zero-copy sends (loopback, or a device \
             without scatter-gather): sending by copy from now on"
        );
    }
}

/// What the reactor's TCP connections hold, for the polling decision
/// (`poll_window.rs`, rule 1). Admin queues do not count (their long-lived
/// commands are Asynchronous Event Requests); NVMe/RDMA queues count as
/// "other" (their CQs are what polling polls).
fn holding(conns: &Slab<Conn>, rdma: bool) -> Holding {
    let mut h = Holding {
        in_backends: 0,
        other: rdma,
    };
    for (_, c) in conns.iter() {
        if c.sm.queue().qid() == 0 {
            continue;
        }
        h.add(
            c.sm.in_flight(),
            c.sm.backend_pending(),
            c.sm.has_partial_input(),
        );
        if h.other {
            break;
        }
    }
    h
}

/// Why a connection still in its handshake must be closed now, if it must.
fn handshake_expired(
    c: &Conn,
    now: Instant,
    icreq_timeout: Duration,
    connect_timeout: Duration,
) -> Option<String> {
    if c.closing_since.is_some() {
        return None; // already closing (CLOSE_LINGER bounds it)
    }
    let age = now.saturating_duration_since(c.accepted);
    if !c.sm.initialized() && !icreq_timeout.is_zero() && age > icreq_timeout {
        return Some(format!("no ICReq within {icreq_timeout:?}"));
    }
    if !connect_timeout.is_zero() && age > connect_timeout {
        return Some(format!("no Fabrics Connect within {connect_timeout:?}"));
    }
    None
}

/// Kernel TLS was wanted (`--ktls auto`) and the kernel did not take a session: said once as a
/// warning (the usual reason, no `tls` module, holds for every connection), then per connection
/// at debug level.
fn ktls_fallback_log(reactor: usize, why: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            reactor,
            "kernel TLS not used, TLS records are built by OpenSSL in user space: {why} \
             (modprobe tls, or --ktls off to silence this)"
        );
    } else {
        tracing::debug!(reactor, "kernel TLS not used: {why}");
    }
}

/// Moves a connection on a TLS listener through its handshake as far as the
/// socket allows. Keep with `c.tls` Clear or Up: serve it; Keep otherwise:
/// wait for the socket.
fn tls_step(
    c: &mut Conn,
    ctx: &SslContext,
    target: &Arc<Target>,
    params: &TcpParams,
    reactor: usize,
) -> Outcome {
    use std::os::fd::AsRawFd;
    let fd = c.sock.as_raw_fd();
    let hs = match std::mem::replace(&mut c.tls, ConnTls::Stepping) {
        ConnTls::Await => {
            let mut b = [0u8; 1];
            // SAFETY: one byte into a valid buffer; the fd is this connection's socket.
            let n = unsafe {
                libc::recv(
                    fd,
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                c.tls = ConnTls::Await;
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                    c.rx_ready = false;
                    return Outcome::Keep;
                }
                return Outcome::Close(format!("read error before the TLS handshake: {e}"));
            }
            if n == 0 {
                return Outcome::Close(
                    "peer closed the connection before the TLS handshake".into(),
                );
            }
            if b[0] != TLS_HANDSHAKE_RECORD {
                let what = if b[0] == 0 {
                    "a clear-text ICReq"
                } else {
                    "not a TLS handshake"
                };
                return Outcome::Close(format!(
                    "refused: {what} (first byte {:#04x}) on a listener that requires TLS \
                     (secure_channel); the host must connect with TLS (nvme connect --tls)",
                    b[0]
                ));
            }
            nvmf_tls::accept(ctx, fd)
        }
        ConnTls::Handshake(p) => p.resume(),
        other => {
            c.tls = other;
            return Outcome::Keep;
        }
    };
    match hs {
        Handshake::Pending(p) => {
            if p.wants_write() {
                c.tx_ready = false;
            } else {
                c.rx_ready = false;
            }
            c.tls = ConnTls::Handshake(p);
            Outcome::Keep
        }
        Handshake::Failed(why) => Outcome::Close(format!("TLS handshake refused or failed: {why}")),
        Handshake::Done(t) => {
            let identity = t.psk_identity().and_then(nvmf_core::tls::parse_identity);
            let Some(identity) = identity else {
                return Outcome::Close("TLS handshake without a PSK identity".into());
            };
            let records = match t.kernel_tls() {
                (true, true) => "records by kernel TLS",
                (true, false) => "records received by kernel TLS, sent by OpenSSL",
                _ => "records by OpenSSL",
            };
            info!(
                reactor,
                peer = %c.peer,
                hostnqn = %identity.hostnqn,
                subnqn = %identity.subnqn,
                "TLS 1.3 session established ({}, identity version {}, {}; {records})",
                t.cipher(),
                identity.version,
                t.psk_labels().unwrap_or("?")
            );
            if let Some(why) = t.ktls_fallback() {
                ktls_fallback_log(reactor, why);
            }
            // A fresh state machine whose port carries the identity
            // (Connect is checked against it); nothing was received yet.
            let port = Arc::new(PortInfo {
                trtype: c.laddr.cfg.trtype,
                adrfam: c.laddr.cfg.adrfam,
                traddr: c.laddr.cfg.traddr.clone(),
                trsvcid: c.laddr.cfg.trsvcid.clone(),
                peer: c.peer,
                tls: Some(identity),
                caps: nvmf_tcp::CAPS,
            });
            c.sm = Connection::new(target.clone(), port, params);
            c.tls = ConnTls::Up(Box::new(t));
            // The host's first records (ICReq) may already be buffered.
            c.rx_ready = true;
            Outcome::Keep
        }
    }
}

/// Reads, processes and writes until the socket has nothing more for us (or
/// the round budget is used up). Never blocks.
fn service(c: &mut Conn) -> Outcome {
    // Zero-copy reports first: they free slots the commands read below
    // may need.
    if c.zc && c.sm.zc_outstanding() > 0 {
        zc_reports(c);
    }
    for _ in 0..MAX_ROUNDS {
        // Read everything available (bounded by the receive buffer and by
        // output backpressure); the state machine processes every complete
        // PDU as it arrives.
        let mut read_any = false;
        while c.rx_ready && c.sm.wants_read() {
            let buf = c.sm.recv_buf();
            let want = buf.len();
            let (res, tls) = match &mut c.tls {
                ConnTls::Up(t) => (t.read(buf), true),
                _ => (c.sock.read(buf), false),
            };
            match res {
                Ok(0) => {
                    let why = if c.sm.close_reason().is_some() {
                        c.sm.close_reason().unwrap_or("closed").to_string()
                    } else if c.sm.has_partial_input() {
                        "peer closed the connection in the middle of a PDU".to_string()
                    } else {
                        "peer closed the connection".to_string()
                    };
                    return Outcome::Close(why);
                }
                Ok(n) => {
                    c.sm.on_recv(n);
                    read_any = true;
                    // A short read drained the socket (epoll(7)): no need
                    // for another read() that returns EAGAIN. (Not so over
                    // TLS: one read returns at most one record.)
                    if n < want && !c.read_closed && !tls {
                        c.rx_ready = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.rx_ready = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                    return Outcome::Close(format!(
                        "peer unreachable (TCP keepalive / user timeout expired): {e}"
                    ))
                }
                Err(e) => return Outcome::Close(format!("read error: {e}")),
            }
        }
        // One vectored write carries everything produced this turn.
        while c.tx_ready && c.sm.has_output() {
            let mut zc_call = false;
            let res = {
                let mut iov = [IoSlice::new(&[]); IOV_BATCH];
                match &mut c.tls {
                    ConnTls::Up(t) => {
                        let n = c.sm.output(&mut iov);
                        t.write_gather(&iov[..n])
                    }
                    _ if c.zc && !c.zc_backoff => {
                        let (n, kind) = c.sm.output_split(&mut iov);
                        zc_call = kind == nvmf_tcp::SendKind::ZeroCopy;
                        crate::zerocopy::send(c.sock.as_raw_fd(), &iov[..n], kind)
                    }
                    _ => {
                        let n = c.sm.output(&mut iov);
                        c.sock.write_vectored(&iov[..n])
                    }
                }
            };
            match res {
                Ok(0) => return Outcome::Close("socket accepted no bytes".into()),
                Ok(n) if zc_call => c.sm.consume_output_zc(n),
                Ok(n) => c.sm.consume_output(n),
                // Too many reports pending in the kernel: copy until the
                // next ones are read.
                Err(e) if zc_call && e.raw_os_error() == Some(libc::ENOBUFS) => c.zc_backoff = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.tx_ready = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                    return Outcome::Close(format!(
                        "peer unreachable (TCP keepalive / user timeout expired): {e}"
                    ))
                }
                Err(e) => return Outcome::Close(format!("write error: {e}")),
            }
        }
        if let Some(reason) = c.sm.close_reason() {
            if !c.sm.has_output() {
                return Outcome::Close(reason.to_string());
            }
            if c.closing_since.is_none() {
                c.closing_since = Some(Instant::now());
            }
            return Outcome::Keep;
        }
        if !(read_any && c.rx_ready && c.sm.wants_read()) {
            break;
        }
    }
    Outcome::Keep
}

/// Debug builds only: `NVMFD_DEBUG_HANG_REACTOR=ID` makes reactor ID stop
/// answering at the watchdog's third ping, the way a reactor stuck in a loop
/// or a blocking call would (for the systemd watchdog test). It sleeps ten
/// minutes, then goes on.
#[cfg(debug_assertions)]
fn debug_hang_on_ping(id: usize) {
    use std::cell::Cell;
    thread_local!(static PINGS: Cell<u32> = const { Cell::new(0) });
    if std::env::var("NVMFD_DEBUG_HANG_REACTOR").is_ok_and(|v| v == id.to_string()) {
        let n = PINGS.with(|p| {
            p.set(p.get() + 1);
            p.get()
        });
        if n == 3 {
            tracing::warn!(reactor = id, "NVMFD_DEBUG_HANG_REACTOR: reactor {id} hangs");
            std::thread::sleep(Duration::from_secs(600));
        }
    }
}
