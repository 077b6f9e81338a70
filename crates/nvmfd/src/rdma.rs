//! NVMe/RDMA on the reactors: each reactor thread owns an RDMA port
//! (`nvmf_rdma::RdmaPort`: its own CM event channel and the queue pairs it
//! serves), created on that thread when it first needs one, with the CM
//! channel and every connection's completion channel in the reactor's own
//! epoll (`RdmaSide`, a local of the reactor loop: the port never crosses
//! threads).
//!
//! Listeners live on reactor 0's port. A checked connect request is routed
//! there ([`route`]): the admin queue stays on reactor 0; an I/O queue is
//! placed by the shared queue placement (`placement.rs`: fewest queues of
//! its controller, then fewest in total, the NIC's NUMA node) before it is
//! accepted, using the QID and CNTLID of the request's private data (the
//! controller is named by CNTLID; see [`ctrl_key`]), and sent to its
//! reactor as `ReactorCmd::Rdma(RdmaCmd::Adopt)`; that reactor migrates the
//! id to its own event channel and accepts it, so the queue pair, its CQ
//! and its completion channel belong to one reactor for their whole life
//! and nothing established ever moves.
//!
//! Busy polling (`--poll-us`): a CQ that delivered work is left unarmed
//! and polled on the reactor's spin turns; when the poll window passes
//! without work the reactor arms every such CQ, polls each once more (the
//! arm race) and only then sleeps in epoll, so an idle reactor costs no CPU.
//!
//! Statistics: a snapshot (`ReactorCmd::Snapshot`) lists the port's queues
//! next to the TCP ones (`nvmf_subsystem_get_qpairs`, per-path counters)
//! with its completion-polling counters (`nvmf_get_stats`, `/metrics`);
//! the counters of destroyed queues are folded in as the port destroys
//! them (`RdmaClosed`), as the reactor does for TCP connections.
//!
//! [`RdmaControl`] is the control plane's handle: listeners go to reactor
//! 0 (its first one creates the port), removals to every reactor (each
//! disconnects its queues that came in on the address), answered within a
//! bounded wait.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use nvmf_config::{ListenerConfig, RdmaOptions, TransportType};
use nvmf_core::controller::QueueStats;
use nvmf_core::queue::QueuePair;
use nvmf_core::request::RequestParams;
use nvmf_core::Target;
use nvmf_rdma::{FdChange, PendingConn, RdmaPort};
use tracing::{debug, info, warn};

use crate::limits::{ConnLimits, LogLimiter};
use crate::live::ReactorHandle;
use crate::paths::{GoneHosts, PathTable};
use crate::placement::{CtrlKey, Placement};
use crate::reactor::{OpenQueue, QueueKind, RdmaSnapshot, ReactorCmd, ReactorSnapshot};

/// Token of the reactor's RDMA CM event channel.
pub const CM_TOKEN: usize = CQ_BASE - 1;
/// Token of the RDMA devices' asynchronous-event fds this reactor reads.
pub const ASYNC_TOKEN: usize = CQ_BASE - 2;
/// Token of RDMA connection `key`'s completion channel: `CQ_BASE + key`
/// (far above the TCP connection tokens).
pub const CQ_BASE: usize = 1 << 40;

/// How long the control plane waits for a reactor's answer.
const REPLY_WAIT: Duration = Duration::from_secs(5);
/// The reactor whose port holds the CM listeners.
const LISTENING_REACTOR: usize = 0;

/// What every reactor needs to create its RDMA port.
pub struct RdmaSetup {
    pub target: Arc<Target>,
    pub params: RequestParams,
    pub connect_timeout: Duration,
    /// The RDMA transport's own options (`nvmf_create_transport -t RDMA`:
    /// shared receive queues or not, their depth).
    pub options: RdmaOptions,
}

impl RdmaSetup {
    /// `fetch_timeout` and `max_fetch_bytes` are the daemon's data-transfer
    /// limits (`--h2c-timeout-ms`, `--max-r2t-bytes`), `connect_timeout`
    /// its `--connect-timeout-ms`, `options` the RDMA transport's; the RDMA
    /// transport's limits are taken now.
    pub fn new(
        target: Arc<Target>,
        fetch_timeout: Duration,
        max_fetch_bytes: u32,
        connect_timeout: Duration,
        options: RdmaOptions,
    ) -> RdmaSetup {
        let params = nvmf_rdma::request_params(&target, fetch_timeout, max_fetch_bytes);
        RdmaSetup {
            target,
            params,
            connect_timeout,
            options,
        }
    }
}

/// An NVMe/RDMA message from the control plane or another reactor.
pub enum RdmaCmd {
    /// Listen on one more address (reactor 0).
    Listen {
        cfg: ListenerConfig,
        reply: Sender<Result<(), String>>,
    },
    /// Disconnect the queues that came in on `addr` (of subsystem
    /// `only_nqn` only, when given); with `unlisten`, stop listening there.
    /// Answers how many queues were disconnected.
    Drop {
        addr: SocketAddr,
        only_nqn: Option<String>,
        unlisten: bool,
        reply: Sender<usize>,
    },
    /// Accept a connection request the listening reactor placed here.
    Adopt(Box<PendingConn>),
    /// A device event about a queue pair another reactor's port read.
    Async(nvmf_rdma::AsyncEvent),
}

/// The control plane's handle on NVMe/RDMA (through the reactors' command
/// channels).
pub struct RdmaControl {
    reactors: Arc<Vec<ReactorHandle>>,
}

impl RdmaControl {
    pub fn new(reactors: Arc<Vec<ReactorHandle>>) -> RdmaControl {
        RdmaControl { reactors }
    }

    /// Listens on `l` (an NVMe/RDMA listener) on the listening reactor;
    /// the first one creates its RDMA port. Fails with the reason when RDMA
    /// cannot be used here (no rdma-core, no device, an address no RDMA
    /// device has).
    pub fn listen(&self, l: &ListenerConfig) -> Result<(), String> {
        let Some(r) = self.reactors.get(LISTENING_REACTOR) else {
            return Err("no reactor to serve NVMe/RDMA".into());
        };
        let (tx, rx) = channel();
        let cmd = ReactorCmd::Rdma(RdmaCmd::Listen {
            cfg: l.clone(),
            reply: tx,
        });
        if !r.send(cmd) {
            return Err("the reactors are not running".into());
        }
        rx.recv_timeout(REPLY_WAIT).unwrap_or_else(|_| {
            Err(format!(
                "NVMe/RDMA listener {}:{}: the reactor did not answer within {:?}",
                l.traddr, l.trsvcid, REPLY_WAIT
            ))
        })
    }

    /// See [`RdmaCmd::Drop`], summed over the reactors.
    pub fn drop_listener(&self, addr: SocketAddr, only_nqn: Option<&str>, unlisten: bool) -> usize {
        let mut rxs = Vec::new();
        for r in self.reactors.iter() {
            let (tx, rx) = channel();
            let cmd = ReactorCmd::Rdma(RdmaCmd::Drop {
                addr,
                only_nqn: only_nqn.map(str::to_string),
                unlisten,
                reply: tx,
            });
            if r.send(cmd) {
                rxs.push(rx);
            }
        }
        let deadline = Instant::now() + REPLY_WAIT;
        rxs.iter()
            .map(|rx| {
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .unwrap_or(0)
            })
            .sum()
    }
}

/// The placement key of an RDMA I/O queue's controller before its Fabrics
/// Connect: the host's address and the CNTLID of the connect request's
/// private data (the Linux host and `nvmf` send it on I/O queues). Odd, so
/// it never equals a TCP queue's key (the address of its controller, an
/// aligned pointer). A host that sends CNTLID 0 has all its queues counted
/// as one controller's, which still spreads them.
pub fn ctrl_key(peer: IpAddr, cntlid: u16) -> CtrlKey {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    peer.hash(&mut h);
    cntlid.hash(&mut h);
    (h.finish() as usize) | 1
}

/// Where reactor `me` serves a connect request it received: returns it to
/// accept here (admin queues; no placement; placed here), or sends it to
/// the reactor the placement chose and returns None.
#[allow(clippy::too_many_arguments)]
pub fn route(
    me: usize,
    placement: Option<&Arc<Placement>>,
    peers: &[ReactorHandle],
    nic_nodes: &mut HashMap<IpAddr, Option<u32>>,
    limits: &Arc<ConnLimits>,
    log: &mut LogLimiter,
    mut p: PendingConn,
) -> Option<PendingConn> {
    // Admission first, as for a TCP connection at accept: the same caps
    // (--max-connections, --max-connections-per-host) count both
    // transports' connections, before any queue pair is set up.
    let admitted = match limits.admit(p.peer().ip()) {
        Ok(t) => t,
        Err(why) => {
            let peer = p.peer();
            if log.allow(std::time::Instant::now(), |k| {
                info!(reactor = me, "suppressed {k} similar messages")
            }) {
                warn!(reactor = me, %peer, "NVMe/RDMA connect request refused: limit of {why} reached");
            }
            p.refuse();
            return None;
        }
    };
    let Some(placement) = placement else {
        p.ticket = Some(Box::new(admitted));
        return Some(p);
    };
    if p.qid() == 0 {
        p.ticket = Some(Box::new(admitted));
        return Some(p);
    }
    let node = p.local_addr().and_then(|a| {
        *nic_nodes
            .entry(a.ip())
            .or_insert_with(|| crate::numa::nic_node(a.ip()))
    });
    let placed = placement.place(ctrl_key(p.peer().ip(), p.cntlid()), node);
    let to = placed.reactor();
    if log.allow(std::time::Instant::now(), |k| {
        info!(reactor = me, "suppressed {k} similar messages")
    }) {
        info!(
            reactor = me,
            peer = %p.peer(),
            qid = p.qid(),
            cntlid = p.cntlid(),
            "NVMe/RDMA I/O queue placed on reactor {to}"
        );
    }
    p.ticket = Some(Box::new((admitted, placed)));
    if to == me {
        return Some(p);
    }
    let Some(peer) = peers.get(to) else {
        warn!(
            reactor = me,
            "no reactor {to} for an NVMe/RDMA queue; served here"
        );
        return Some(p);
    };
    p.park();
    if !peer.send(ReactorCmd::Rdma(RdmaCmd::Adopt(Box::new(p)))) {
        // Only at shutdown: the request was dropped (rejected) with the message.
        debug!(
            reactor = me,
            "reactor {to} is gone; NVMe/RDMA connect request dropped"
        );
    }
    None
}

/// What a reactor turn does with the RDMA CQs busy polling left unarmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqTurn {
    /// None is unarmed: nothing to do.
    Nothing,
    /// In the poll window: poll them (no sleep this turn).
    Poll,
    /// The window has passed: arm them and poll each once more before
    /// sleeping (a completion found then keeps the reactor polling).
    Arm,
}

/// The busy-polling policy of one turn (pure, see the tests).
pub fn cq_turn(has_unarmed: bool, now: Instant, spin_until: Option<Instant>) -> CqTurn {
    if !has_unarmed {
        CqTurn::Nothing
    } else if spin_until.is_some_and(|t| now < t) {
        CqTurn::Poll
    } else {
        CqTurn::Arm
    }
}

/// The counters of a reactor's destroyed RDMA queues (folded in by the
/// port's destroy hook, read by snapshots).
#[derive(Debug, Default)]
struct RdmaClosed {
    admin_qpairs: u64,
    io_qpairs: u64,
    stats: QueueStats,
    paths: PathTable,
    gone: Arc<GoneHosts>,
}

impl RdmaClosed {
    fn fold(&mut self, q: &QueuePair) {
        if q.is_connected() {
            if q.is_admin() {
                self.admin_qpairs += 1;
            } else {
                self.io_qpairs += 1;
            }
        }
        self.stats.add(q.stats());
        self.paths.fold_closed(q, &self.gone);
    }
}

/// The listener an RDMA queue came in on, as the queue listings show it.
fn rdma_listener(a: SocketAddr) -> ListenerConfig {
    ListenerConfig {
        trtype: TransportType::Rdma,
        adrfam: nvmf_rdma::port::adrfam_of(&a),
        traddr: a.ip().to_string(),
        trsvcid: a.port().to_string(),
    }
}

/// One reactor's NVMe/RDMA side: its port (created on first use, on the
/// reactor's thread) and the epoll registrations it asks for.
pub struct RdmaSide {
    setup: Option<Arc<RdmaSetup>>,
    port: Option<RdmaPort>,
    closed: Arc<Mutex<RdmaClosed>>,
    registry: Option<Registry>,
    reactor: usize,
    busy_poll: bool,
    changes: Vec<FdChange>,
}

impl RdmaSide {
    /// `setup` None: RDMA is not configured for this daemon (every RDMA
    /// message is answered with an error). `busy_poll`: `--poll-us` > 0.
    pub fn new(
        setup: Option<Arc<RdmaSetup>>,
        gone: Arc<GoneHosts>,
        registry: &Registry,
        reactor: usize,
        busy_poll: bool,
    ) -> RdmaSide {
        RdmaSide {
            setup,
            port: None,
            closed: Arc::new(Mutex::new(RdmaClosed {
                gone,
                ..Default::default()
            })),
            registry: registry.try_clone().ok(),
            reactor,
            busy_poll,
            changes: Vec::new(),
        }
    }

    /// The port, created (and its CM channel registered) on first use.
    fn port(&mut self) -> Result<&mut RdmaPort, String> {
        if self.port.is_none() {
            let setup = self
                .setup
                .as_ref()
                .ok_or("NVMe/RDMA is not set up in this daemon")?;
            let reg = self
                .registry
                .as_ref()
                .ok_or("the reactor's epoll registry cannot be shared")?;
            let mut port = RdmaPort::new(
                setup.target.clone(),
                setup.params.clone(),
                setup.connect_timeout,
            )?;
            port.set_reactor(self.reactor);
            port.set_options(&setup.options);
            port.set_busy_poll(self.busy_poll);
            let closed = self.closed.clone();
            port.set_on_destroy(Box::new(move |q| {
                closed.lock().unwrap_or_else(|e| e.into_inner()).fold(q)
            }));
            reg.register(
                &mut SourceFd(&port.channel_fd()),
                Token(CM_TOKEN),
                Interest::READABLE,
            )
            .map_err(|e| format!("cannot watch the RDMA CM event channel: {e}"))?;
            info!(
                reactor = self.reactor,
                busy_poll = self.busy_poll,
                "NVMe/RDMA port ready"
            );
            self.port = Some(port);
        }
        Ok(self.port.as_mut().expect("just created"))
    }

    /// RDMA connections served here.
    pub fn connections(&self) -> usize {
        self.port.as_ref().map_or(0, RdmaPort::connections)
    }

    /// Adds this reactor's RDMA queues and counters to its snapshot (see
    /// [`ReactorSnapshot`]); nothing without a port.
    /// Adds this reactor's connected NVMe/RDMA queues to `l` (the watchdog's ping).
    pub fn count_queues(&self, l: &mut crate::service_manager::Liveness) {
        let Some(port) = self.port.as_ref() else {
            return;
        };
        for v in port.conn_views() {
            if !v.queue.is_connected() {
                continue;
            }
            if v.queue.is_admin() {
                l.admin_queues += 1;
            } else {
                l.io_queues += 1;
            }
        }
    }

    pub fn add_to_snapshot(&self, s: &mut ReactorSnapshot) {
        let Some(port) = self.port.as_ref() else {
            return;
        };
        let mut r = RdmaSnapshot {
            poll: port.poll_stats(),
            ..Default::default()
        };
        {
            let closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
            r.stats = closed.stats;
            s.admin_qpairs += closed.admin_qpairs;
            s.io_qpairs += closed.io_qpairs;
            s.paths.merge(&closed.paths);
        }
        for v in port.conn_views() {
            let q = v.queue;
            r.qpairs += 1;
            r.stats.add(q.stats());
            let open = OpenQueue {
                in_flight: v.in_flight,
                executing: v.executing,
                closing: v.closing,
                listen: rdma_listener(v.listen),
                peer: v.peer,
            };
            match s.add_open_queue(q, open) {
                QueueKind::Pending => r.pending_qpairs += 1,
                QueueKind::Admin => {}
                QueueKind::Io => r.in_flight += v.in_flight as u64,
            }
        }
        s.rdma = Some(r);
    }

    /// Whether a CQ is unarmed (busy polling): arm before sleeping.
    pub fn has_unarmed(&self) -> bool {
        self.port.as_ref().is_some_and(RdmaPort::has_unarmed)
    }

    fn apply(&mut self) {
        let Some(reg) = self.registry.as_ref() else {
            self.changes.clear();
            return;
        };
        for ch in self.changes.drain(..) {
            match ch {
                FdChange::Add { fd, key } => {
                    if let Err(e) =
                        reg.register(&mut SourceFd(&fd), Token(CQ_BASE + key), Interest::READABLE)
                    {
                        warn!("cannot watch an RDMA completion channel: {e}");
                    }
                }
                FdChange::Remove { fd, .. } | FdChange::RemoveAsync { fd } => {
                    let _ = reg.deregister(&mut SourceFd(&fd));
                }
                FdChange::AddAsync { fd } => {
                    if let Err(e) =
                        reg.register(&mut SourceFd(&fd), Token(ASYNC_TOKEN), Interest::READABLE)
                    {
                        warn!("cannot watch an RDMA device's events: {e}");
                    }
                }
            }
        }
    }

    /// The CM channel is readable; `route` decides where connect requests
    /// go. True when events may be left (the per-turn budget ran out): call
    /// again next turn.
    pub fn on_cm(&mut self, route: &mut dyn FnMut(PendingConn) -> Option<PendingConn>) -> bool {
        let Some(port) = self.port.as_mut() else {
            return false;
        };
        let changes = &mut self.changes;
        let more = port.on_cm_events(&mut |c| changes.push(c), route);
        self.apply();
        more
    }

    /// A device's event fd is readable: events about queue pairs of other
    /// reactors come back, for them.
    pub fn on_async(&mut self) -> Vec<nvmf_rdma::AsyncEvent> {
        let Some(port) = self.port.as_mut() else {
            return Vec::new();
        };
        let changes = &mut self.changes;
        let others = port.on_async(&mut |c| changes.push(c));
        self.apply();
        others
    }

    /// Token `t` (at or above [`CQ_BASE`]) is readable.
    pub fn on_cq(&mut self, t: usize) {
        let Some(port) = self.port.as_mut() else {
            return;
        };
        let changes = &mut self.changes;
        port.on_cq(t - CQ_BASE, &mut |c| changes.push(c));
        self.apply();
    }

    /// A busy-poll turn: the unarmed CQs are polled. Completions reaped.
    pub fn poll_unarmed(&mut self) -> usize {
        let Some(port) = self.port.as_mut() else {
            return 0;
        };
        let changes = &mut self.changes;
        let n = port.poll_unarmed(&mut |c| changes.push(c));
        self.apply();
        n
    }

    /// Before sleeping: arm every unarmed CQ and poll it once more.
    /// Completions that last poll found (non-zero: do not sleep yet).
    pub fn arm_unarmed(&mut self) -> usize {
        let Some(port) = self.port.as_mut() else {
            return 0;
        };
        let changes = &mut self.changes;
        let n = port.arm_unarmed(&mut |c| changes.push(c));
        self.apply();
        n
    }

    /// Backend completions arrived.
    pub fn poll_executing(&mut self) {
        let Some(port) = self.port.as_mut() else {
            return;
        };
        let changes = &mut self.changes;
        port.poll_executing(&mut |c| changes.push(c));
        self.apply();
    }

    /// The reactor's tick (keep-alive, connect timeout, disconnect grace).
    pub fn tick(&mut self, now: Instant) {
        let Some(port) = self.port.as_mut() else {
            return;
        };
        let changes = &mut self.changes;
        port.tick(now, &mut |c| changes.push(c));
        self.apply();
    }

    /// Carries out an NVMe/RDMA message.
    pub fn command(&mut self, cmd: RdmaCmd) {
        match cmd {
            RdmaCmd::Listen { cfg, reply } => {
                let r = self
                    .port()
                    .map_err(|e| format!("NVMe/RDMA listener {}:{}: {e}", cfg.traddr, cfg.trsvcid))
                    .and_then(|p| p.listen(&cfg));
                let _ = reply.send(r);
            }
            RdmaCmd::Drop {
                addr,
                only_nqn,
                unlisten,
                reply,
            } => {
                let n = match self.port.as_mut() {
                    Some(port) => {
                        let changes = &mut self.changes;
                        port.drop_listener(addr, only_nqn.as_deref(), unlisten, &mut |c| {
                            changes.push(c)
                        })
                    }
                    None => 0,
                };
                self.apply();
                let _ = reply.send(n);
            }
            RdmaCmd::Adopt(p) => match self.port().map(|_| ()) {
                Ok(()) => {
                    let changes = &mut self.changes;
                    if let Some(port) = self.port.as_mut() {
                        port.accept_pending(*p, &mut |c| changes.push(c));
                    }
                    self.apply();
                }
                Err(e) => warn!(
                    reactor = self.reactor,
                    peer = %p.peer(),
                    "NVMe/RDMA queue not accepted: {e}"
                ),
            },
            RdmaCmd::Async(ev) => {
                if let Some(port) = self.port.as_mut() {
                    let changes = &mut self.changes;
                    port.async_event(ev, &mut |c| changes.push(c));
                }
                self.apply();
            }
        }
    }

    /// At reactor shutdown: every RDMA connection is destroyed (queue pair
    /// first) with the port; the completion counters are logged.
    pub fn shut_down(&mut self) {
        if let Some(port) = self.port.take() {
            let st = port.poll_stats();
            info!(
                reactor = self.reactor,
                connections = port.connections(),
                cq_wakeups = st.cq_wakeups,
                busy_polls = st.busy_polls,
                completions = st.completions,
                polled_completions = st.polled_completions,
                async_events = st.async_events,
                srq_unconfirmed_teardowns = st.srq_unconfirmed_teardowns,
                "NVMe/RDMA port closed"
            );
            drop(port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unarmed_cqs_are_polled_in_the_window_and_armed_after_it() {
        let now = Instant::now();
        let later = now + Duration::from_micros(50);
        assert_eq!(cq_turn(false, now, Some(later)), CqTurn::Nothing);
        assert_eq!(cq_turn(false, now, None), CqTurn::Nothing);
        assert_eq!(cq_turn(true, now, Some(later)), CqTurn::Poll);
        // window over, or never opened (--poll-us 0 leaves none unarmed,
        // but arming is the safe answer): never sleep with a CQ unarmed
        assert_eq!(cq_turn(true, later, Some(later)), CqTurn::Arm);
        assert_eq!(cq_turn(true, now, Some(now)), CqTurn::Arm);
        assert_eq!(cq_turn(true, now, None), CqTurn::Arm);
    }

    #[test]
    fn rdma_controller_keys_are_odd_and_per_host_and_cntlid() {
        let a: IpAddr = "10.0.0.2".parse().unwrap();
        let b: IpAddr = "10.0.0.3".parse().unwrap();
        assert_eq!(ctrl_key(a, 1), ctrl_key(a, 1));
        assert_ne!(ctrl_key(a, 1), ctrl_key(a, 2));
        assert_ne!(ctrl_key(a, 1), ctrl_key(b, 1));
        for k in [ctrl_key(a, 0), ctrl_key(a, 1), ctrl_key(b, 7)] {
            assert_eq!(k & 1, 1, "never an aligned controller pointer");
        }
    }

    #[test]
    fn rdma_io_queues_of_one_controller_spread_over_reactors() {
        // The placement the listening reactor applies to RDMA I/O queues
        // (keyed before Connect): 4 I/O queues of one controller on 2
        // reactors land 2 and 2; a second controller's first queue goes to
        // the reactor with fewer queues in total.
        let p = Placement::new(vec![None, None]);
        let host: IpAddr = "10.0.0.2".parse().unwrap();
        let k1 = ctrl_key(host, 1);
        let placed: Vec<_> = (0..4).map(|_| p.place(k1, None)).collect();
        let on0 = placed.iter().filter(|x| x.reactor() == 0).count();
        assert_eq!(
            on0,
            2,
            "{:?}",
            placed.iter().map(|x| x.reactor()).collect::<Vec<_>>()
        );
        let extra = p.place(k1, None);
        let k2 = ctrl_key(host, 2);
        let other = p.place(k2, None);
        assert_ne!(extra.reactor(), other.reactor());
    }
}
