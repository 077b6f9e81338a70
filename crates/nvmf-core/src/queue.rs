//! Queue pairs: what a transport connection talks to.
//!
//! Owns [`QueuePair`] (one per transport connection: unconnected until a
//! Fabrics Connect makes it an admin queue with a new controller, or an I/O
//! queue of an existing one), [`PortInfo`], [`Exec`] and [`QueueState`]. It
//! dispatches each command to fabrics/admin/io handlers, fills completions
//! (CID, SQID, SQHD), keeps per-queue statistics, holds the admin queue's
//! outstanding Asynchronous Event Requests and keep-alive clock, answers
//! `Exec::Throttled` for a Read or Write over its bdev's QoS limit (the
//! request engine parks it and calls `resume`; docs/QOS.md), caches the
//! subsystem's namespace table as the controller's host sees it (per-host
//! visibility: `visibility.rs`) for the lock-free I/O path, and tears the
//! controller down when the admin queue is dropped. A host with a
//! DH-HMAC-CHAP key on the subsystem must authenticate each queue after its
//! Connect (Connect dword 0 AUTHREQ.ATR set; until then every command but
//! Authentication Send/Receive gets Authentication Required; a failure
//! closes the queue after the AUTH_Failure1 went out, with a log line
//! naming the host); the transaction itself is `auth::session`. Teardown never waits
//! for backend I/O in flight: the transport hands its buffers over
//! ([`QueuePair::hand_over`]) and they are freed once the I/O is done
//! (`backend::parked`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{AddressFamily, TransportType};
use nvmf_wire::auth::{AUTHREQ_ATR, FAILURE_INCORRECT_PAYLOAD};
use nvmf_wire::command::Command;
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL;
use nvmf_wire::opcode::{AdminOpcode, FabricsType, IoOpcode};
use nvmf_wire::status::Status;

use crate::admin::{self, AdminCtx, AdminResult};
use crate::auth::session::{Peer, Session, Step};
use crate::backend::{CompletionSink, IoTag, Submitted};
use crate::controller::{
    CloseReason, Controller, QueueStats, AEN_ANA_CHANGE, AEN_DISC_CHANGE, AEN_NS_ATTR,
    AEN_RESERVATION,
};
use crate::error::{Outcome, INVALID_FIELD, INVALID_OPCODE};
use crate::fabrics::{self, Connected};
use crate::io;
use crate::namespace::NamespaceTable;
use crate::stats::NsTable;
use crate::target::Target;

/// Time a queue has to authenticate after its Connect before it is closed.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(60);

/// Outstanding Asynchronous Event Requests a controller accepts (AERL + 1).
pub const AER_LIMIT: usize = 4;

/// The listener a connection came in on, and the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub trtype: TransportType,
    pub adrfam: AddressFamily,
    /// Address the host reached (the listener's address, or better the
    /// connection's local address when the listener is a wildcard).
    pub traddr: String,
    pub trsvcid: String,
    pub peer: SocketAddr,
    /// The PSK identity the connection's TLS handshake accepted (None: clear
    /// text). Connect must name the same host (and subsystem).
    pub tls: Option<crate::tls::Identity>,
    /// What the connection's transport states about its capsules
    /// (reported in Identify Controller).
    pub caps: crate::transport::TransportCaps,
}

/// What the transport does with a command after `execute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// Send this completion (after the C2H data, if any).
    Complete(Completion),
    /// A successful read whose data is all zeroes and was not written to
    /// the buffer: send `backend::zeroes(len)` as its data, then this
    /// completion.
    CompleteZeroData(Completion),
    /// The completion comes later through `poll`; keep the slot and its buffer.
    Pending,
    /// QoS: the command's bdev has no tokens left for it now (`qos.rs`).
    /// Nothing was done; the request engine parks the command (slot and
    /// buffer kept, data in the slot buffer) and offers it again with
    /// `QueuePair::resume` in arrival order once tokens come back.
    Throttled,
    /// The command breaks the queue's command sequence (a command before
    /// Fabrics Connect): the transport ends the connection the way its
    /// binding prescribes (NVMe/TCP: C2HTermReq, PDU Sequence Error).
    Fatal { reason: &'static str },
}

/// Whether the transport keeps the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueState {
    Open,
    Close { reason: &'static str },
}

/// State only the admin queue has.
#[derive(Debug)]
struct AdminQueue {
    /// CIDs of outstanding Asynchronous Event Requests, oldest first.
    aers: Vec<u16>,
    /// AERs an Abort removed from `aers`: completed by `poll` with Command
    /// Aborted by Request.
    aborted: Vec<u16>,
    /// Aborts of I/O commands waiting for their queue's answer (CIDs).
    abort_waits: Vec<u16>,
    /// Last command seen on the admin queue (every admin command counts as
    /// keep-alive traffic).
    last_activity: Instant,
}

#[derive(Debug)]
enum Role {
    Unconnected,
    Admin(AdminQueue),
    Io,
}

/// One queue pair (one per transport connection / queue). Owned by one reactor thread.
#[derive(Debug)]
pub struct QueuePair {
    target: Arc<Target>,
    port: Arc<PortInfo>,
    role: Role,
    qid: u16,
    depth: u16,
    sqhd: u16,
    /// The host disabled SQ flow control at Connect: SQHD is reserved (0).
    sq_flow_disabled: bool,
    ctrl: Option<Arc<Controller>>,
    /// Namespace table snapshot and the subsystem generation it belongs to.
    ns_generation: u64,
    ns: Arc<NamespaceTable>,
    /// `needs_stable_buffers` answered from the current snapshot: the next
    /// I/O command runs against that same snapshot (no refresh), so a
    /// namespace added in between cannot receive a buffer chosen for the
    /// old table.
    ns_pinned: bool,
    max_transfer: u32,
    stats: QueueStats,
    /// Reads and Writes per namespace with their latency (`record_io`).
    ns_stats: NsTable,
    sink: Arc<CompletionSink>,
    /// The transport handed its buffers over (`hand_over`): dropping with
    /// I/O in flight need not wait.
    handed_over: bool,
    /// The DH-HMAC-CHAP transaction (first authentication or a host's
    /// re-authentication); `None` before any.
    auth: Option<Box<Session>>,
    /// The host must still authenticate: commands other than
    /// Authentication Send/Receive get Authentication Required.
    auth_pending: bool,
    /// Authentication failed: the queue closes once the answer is out.
    auth_close: Option<&'static str>,
    /// An unauthenticated queue closes at this time.
    auth_deadline: Option<Instant>,
    /// The host as the I/O path needs it (its host identifier, for
    /// reservations), copied from the controller at Connect.
    host: io::Host,
    /// Compare and Verify reads in flight in an asynchronous backend.
    checks: Vec<io::Check>,
    /// Copies with backend operations in flight.
    copies: Vec<io::CopyOp>,
    /// Fused Compare and Writes being executed (`fused.rs`), and how many
    /// of them this queue counts in `qos::park_here` (those waiting for
    /// the write gate, which need a turn every time slice).
    caws: Vec<crate::fused::CawOp>,
    caws_parked: usize,
    /// Reservation Acquires with Preempt and Abort waiting for the writes
    /// counted before their change (counted in `caws_parked` too).
    preempt_drains: Vec<PreemptDrain>,
    /// Write-group commands counted in write gates still in a backend.
    gated: crate::fused::GatedWrites,
    /// An I/O queue holds its queue ID and the host's I/O queue budget
    /// (claimed at Connect, or after authentication when it must
    /// authenticate: `fabrics::claim_after_auth`).
    io_claimed: bool,
    /// `execute_io` runs for a command parked for QoS (`resume`): it was
    /// counted as throttled already.
    resuming: bool,
}

impl QueuePair {
    /// A queue pair for a new connection on `port`. Nothing is allowed on it
    /// but a Fabrics Connect.
    pub fn new(target: Arc<Target>, port: Arc<PortInfo>) -> QueuePair {
        let max_transfer = target.limits_for(port.trtype).max_transfer();
        let shard = crate::fused::next_shard();
        QueuePair {
            target,
            port,
            role: Role::Unconnected,
            qid: 0,
            depth: 0,
            sqhd: 0,
            sq_flow_disabled: false,
            ctrl: None,
            ns_generation: 0,
            ns: Arc::new(NamespaceTable::new()),
            ns_pinned: false,
            max_transfer,
            stats: QueueStats::default(),
            ns_stats: NsTable::default(),
            sink: CompletionSink::new(),
            handed_over: false,
            auth: None,
            auth_pending: false,
            auth_close: None,
            auth_deadline: None,
            host: io::Host {
                hostid: [0; 16],
                shard,
            },
            checks: Vec::new(),
            copies: Vec::new(),
            caws: Vec::new(),
            caws_parked: 0,
            preempt_drains: Vec::new(),
            gated: crate::fused::GatedWrites::new(shard),
            io_claimed: false,
            resuming: false,
        }
    }

    /// The host still has to authenticate on this queue (DH-HMAC-CHAP).
    pub fn auth_pending(&self) -> bool {
        self.auth_pending
    }

    /// A Connect succeeded on this queue.
    pub fn is_connected(&self) -> bool {
        !matches!(self.role, Role::Unconnected)
    }

    /// Queue ID: 0 for the admin queue (and before Connect).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Negotiated queue size (SQSIZE + 1) after Connect; 0 before.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// True for an admin queue (after Connect).
    pub fn is_admin(&self) -> bool {
        matches!(self.role, Role::Admin(_))
    }

    /// The controller this queue belongs to (after Connect).
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        self.ctrl.as_ref()
    }

    /// This queue's counters.
    pub fn stats(&self) -> &QueueStats {
        &self.stats
    }

    /// This queue's Reads and Writes per namespace, with latency histograms.
    pub fn ns_stats(&self) -> &NsTable {
        &self.ns_stats
    }

    /// The transport queued the response of `cmd` (`ok`: its status was
    /// success), whose capsule it received at `start_ns`
    /// ([`crate::stats::now_ns`]): a Read or Write on an I/O queue is
    /// counted for its namespace (bytes: the SGL transfer length) with its
    /// latency. One clock read; nothing else is touched for other commands.
    #[inline]
    pub fn record_io(&mut self, cmd: &Command, ok: bool, start_ns: u64) {
        if !crate::stats::ENABLED || self.qid == 0 {
            return;
        }
        let write = match cmd.opcode() {
            op if op == IoOpcode::Read as u8 => false,
            op if op == IoOpcode::Write as u8 => true,
            _ => return,
        };
        let latency = crate::stats::now_ns().saturating_sub(start_ns);
        let bytes = u64::from(cmd.sgl().length());
        self.ns_stats.record(cmd.nsid(), write, bytes, ok, latency);
    }

    /// Data buffers handed to `execute` must stay valid and unmoved until
    /// the command completes (an asynchronous backend such as the io_uring
    /// file backend serves a namespace): the transport passes its request
    /// slot buffer, copying in-capsule data there first.
    ///
    /// Answers for the subsystem's current namespace table: a namespace
    /// added at run time (say an io_uring file) must be seen here before the
    /// transport decides where the data of the first command to it lives,
    /// so a changed generation refreshes the cached table first (one atomic
    /// load when nothing changed). The next `execute` on an I/O queue uses
    /// the snapshot this answer came from.
    #[inline]
    pub fn needs_stable_buffers(&mut self) -> bool {
        if let Some(ctrl) = &self.ctrl {
            if ctrl.subsystem().ns_generation() != self.ns_generation {
                self.refresh_namespaces();
            }
        }
        self.ns_pinned = true;
        self.ns.needs_stable_buffers()
    }

    /// Called by a closing transport with what backend operations in flight
    /// may still point into (its request buffers, about `bytes` of memory):
    /// kept alive on this thread until every operation of this queue
    /// finished, however long that takes, then freed (`backend::parked`,
    /// reaped on every reactor turn); dropped at once when nothing is in
    /// flight. After this, dropping the queue pair never waits. Commands
    /// still executing get no completion.
    pub fn hand_over(&mut self, keep: Box<dyn std::any::Any>, bytes: usize) {
        self.handed_over = true;
        // Compare/Verify reads in flight point into their own buffers:
        // those are kept with the transport's. So are compare-and-writes
        // in a backend (they hold their bdev's write gate until then:
        // dropped, they open it), and the write-gate counts of writes still
        // in flight (uncounted when dropped, all operations done). A
        // compare-and-write still waiting for the gate has nothing in
        // flight: it goes now.
        self.caws.retain(|c| !c.waiting());
        self.preempt_drains.clear();
        self.set_caws_parked(0);
        let gated = std::mem::take(&mut self.gated);
        let keep: Box<dyn std::any::Any> =
            if self.checks.is_empty() && self.copies.is_empty() && self.caws.is_empty() {
                Box::new((keep, gated))
            } else {
                Box::new((
                    keep,
                    gated,
                    std::mem::take(&mut self.checks),
                    std::mem::take(&mut self.copies),
                    std::mem::take(&mut self.caws),
                ))
            };
        if self.backend_ops_in_flight() == 0 {
            // Nothing points into the buffers: free them now.
            drop(keep);
            return;
        }
        crate::backend::parked::park(self.sink.clone(), keep, bytes);
    }

    /// The host reused the command ID `cid` of an Asynchronous Event
    /// Request still outstanding on this admin queue: it gave that request
    /// up on its side (SPDK's host cancels its AERs locally when it
    /// detaches, then reuses their IDs for the shutdown commands). Forgets
    /// the request without completing it and returns true; false when
    /// `cid` is not an outstanding AER (a real command ID conflict).
    pub fn abandon_aer(&mut self, cid: u16) -> bool {
        let Role::Admin(aq) = &mut self.role else {
            return false;
        };
        match aq.aers.iter().position(|&c| c == cid) {
            Some(i) => {
                aq.aers.remove(i);
                true
            }
            None => false,
        }
    }

    /// The queue moves to the calling thread (a reactor hands a connected
    /// queue over to another reactor): completions posted from other
    /// threads must wake the new owner, so the completion sink is replaced
    /// by one bound to this thread's wake-up eventfd. Only possible while no backend
    /// operation is in flight (they hold the old sink, and io_uring ops
    /// complete on the ring of the thread that submitted them): returns
    /// false and changes nothing otherwise.
    pub fn adopt_current_thread(&mut self) -> bool {
        if self.backend_ops_in_flight() > 0 || !self.sink.is_empty() {
            return false;
        }
        self.sink = CompletionSink::new();
        true
    }

    /// A hold on this queue's buffers for a reader outside the backends
    /// that still uses them (the kernel, for zero-copy sends): while it
    /// lives it counts as an operation in flight, so the buffers the
    /// transport hands over at teardown stay parked
    /// (`backend::parked`). Drop it once that reader is done.
    pub fn buffer_hold(&self) -> Arc<CompletionSink> {
        self.sink.clone()
    }

    /// Backend operations of this queue still in flight.
    pub fn backend_ops_in_flight(&self) -> usize {
        Arc::strong_count(&self.sink) - 1
    }

    /// The listener this queue came in on.
    pub fn port(&self) -> &Arc<PortInfo> {
        &self.port
    }

    #[inline]
    fn complete(&mut self, cid: u16, out: Outcome) -> Exec {
        if !out.status.is_success() {
            self.stats.count_error(out.status);
        }
        let mut c = Completion::new(cid, self.qid, self.reported_sqhd(), out.status, out.dw0);
        if out.dw1 != 0 {
            c.set_dw1(out.dw1);
        }
        Exec::Complete(c)
    }

    /// A command left the submission queue: count it and move SQHD.
    #[inline]
    fn consume_sq_entry(&mut self) {
        self.stats.commands += 1;
        if self.depth != 0 {
            self.sqhd = if self.sqhd + 1 >= self.depth {
                0
            } else {
                self.sqhd + 1
            };
        }
    }

    /// Completes `cmd` with `status` without executing it: the transport
    /// failed it (bad SGL, data digest error, ...). The command consumed an
    /// SQ entry like any other, so SQHD moves and the completion reports it;
    /// an error status is counted.
    pub fn complete_unexecuted(&mut self, cmd: &Command, status: Status) -> Completion {
        self.consume_sq_entry();
        if !status.is_success() {
            self.stats.count_error(status);
        }
        Completion::new(cmd.cid(), self.qid, self.reported_sqhd(), status, 0)
    }

    /// Completes `cmd`, whose SQ entry was already consumed (a command QoS
    /// parked), with `status` without executing it: an Abort took it.
    pub(crate) fn complete_parked(&mut self, cmd: &Command, status: Status) -> Completion {
        if !status.is_success() {
            self.stats.count_error(status);
        }
        Completion::new(cmd.cid(), self.qid, self.reported_sqhd(), status, 0)
    }

    #[inline]
    fn reported_sqhd(&self) -> u16 {
        if self.sq_flow_disabled {
            0
        } else {
            self.sqhd
        }
    }

    /// QoS: a command that will wait behind commands already parked for
    /// QoS, without being executed now, left the submission queue (SQHD
    /// moves as for any command the target took); `resume` executes it.
    pub(crate) fn take_sq_entry(&mut self, cmd: &Command) {
        self.consume_sq_entry();
        if let Some(ns) = self.ns.get(cmd.nsid()) {
            ns.qos().count_throttled();
        }
        // A snapshot pinned for this command's buffer choice is not needed:
        // a parked command's data is in its slot buffer.
        self.ns_pinned = false;
    }

    /// QoS: executes an I/O command that `execute` answered
    /// [`Exec::Throttled`] (or that `take_sq_entry` took) with its data in
    /// the slot buffer; [`Exec::Throttled`] again while its bdev still has
    /// no tokens for it.
    #[inline(never)]
    pub(crate) fn resume(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        self.resuming = true;
        let r = self.execute_io(cmd, data);
        self.resuming = false;
        r
    }

    /// Execute one command. `data` is exactly the command's transfer length:
    /// input for host→controller commands, output (filled here) for
    /// controller→host commands.
    pub fn execute(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        self.consume_sq_entry();
        match self.role {
            Role::Io => self.execute_io(cmd, data),
            Role::Admin(_) => self.execute_admin(cmd, data),
            Role::Unconnected => self.execute_connect(cmd, data),
        }
    }

    // ---- before Connect ----

    fn execute_connect(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        let is_connect = cmd.opcode() == AdminOpcode::FabricsCommand as u8
            && cmd.fctype() == FabricsType::Connect as u8;
        if !is_connect {
            return Exec::Fatal {
                reason: "command before Fabrics Connect",
            };
        }
        let sq_flow_disabled = cmd.cattr() & CATTR_DISABLE_SQ_FLOW_CONTROL != 0;
        match fabrics::connect(&self.target, &self.port, cmd, data) {
            Ok(Connected::Admin { ctrl, depth }) => {
                self.sq_flow_disabled = sq_flow_disabled;
                self.qid = 0;
                self.depth = depth;
                self.sqhd = 1 % depth;
                let (generation, ns) = ctrl
                    .subsystem()
                    .namespaces_with_generation_for(ctrl.hostnqn());
                self.ns_generation = generation;
                self.ns = ns;
                let cntlid = ctrl.cntlid();
                let active = self.target.controller_created();
                tracing::info!(
                    cntlid,
                    subnqn = %ctrl.subsystem().nqn(),
                    hostnqn = %ctrl.hostnqn(),
                    peer = %self.port.peer,
                    kato_ms = ctrl.kato_ms(),
                    active_controllers = active,
                    "controller created"
                );
                let authreq = self.require_auth(&ctrl);
                self.ctrl = Some(ctrl);
                self.role = Role::Admin(AdminQueue {
                    aers: Vec::with_capacity(AER_LIMIT),
                    aborted: Vec::with_capacity(AER_LIMIT),
                    abort_waits: Vec::new(),
                    last_activity: Instant::now(),
                });
                self.complete(cmd.cid(), Outcome::ok_dw0(cntlid as u32 | authreq))
            }
            Ok(Connected::Io {
                ctrl,
                qid,
                depth,
                claimed,
            }) => {
                self.io_claimed = claimed;
                self.sq_flow_disabled = sq_flow_disabled;
                self.qid = qid;
                self.depth = depth;
                self.sqhd = 1 % depth;
                let (generation, ns) = ctrl
                    .subsystem()
                    .namespaces_with_generation_for(ctrl.hostnqn());
                self.ns_generation = generation;
                self.ns = ns;
                let cntlid = ctrl.cntlid();
                tracing::debug!(cntlid, qid, depth, peer = %self.port.peer, "I/O queue connected");
                let authreq = self.require_auth(&ctrl);
                self.host = io::Host {
                    hostid: *ctrl.hostid(),
                    shard: self.host.shard,
                };
                self.ctrl = Some(ctrl);
                self.role = Role::Io;
                self.complete(cmd.cid(), Outcome::ok_dw0(cntlid as u32 | authreq))
            }
            Err(out) => {
                // The queue stays unconnected; answer on the queue the host named.
                self.stats.count_error(out.status);
                let c = Completion::new(cmd.cid(), cmd.qid(), 0, out.status, out.dw0);
                Exec::Complete(c)
            }
        }
    }

    /// After a Connect: when the host has a DH-HMAC-CHAP key on the
    /// subsystem, the queue must authenticate. Returns the Connect dword 0
    /// AUTHREQ bits.
    fn require_auth(&mut self, ctrl: &Controller) -> u32 {
        if ctrl.subsystem().host_keys(ctrl.hostnqn()).is_none() {
            return 0;
        }
        self.auth_pending = true;
        self.auth_deadline = Some(Instant::now() + AUTH_TIMEOUT);
        AUTHREQ_ATR
    }

    /// Authentication Send / Receive (any connected queue; control path).
    #[cold]
    fn execute_auth(&mut self, ctrl: &Controller, cmd: &Command, data: &mut [u8]) -> Exec {
        if !cmd.is_dhchap_auth() || cmd.auth_len() as usize != data.len() {
            return self.complete(cmd.cid(), Outcome::err(INVALID_FIELD));
        }
        let sub = ctrl.subsystem();
        let session = self.auth.get_or_insert_with(|| Box::new(Session::new()));
        let peer = Peer {
            policy: self.target.auth_policy(),
            hostnqn: ctrl.hostnqn(),
            subnqn: sub.nqn(),
            keys: sub.host_keys(ctrl.hostnqn()),
        };
        let step = if cmd.fctype() == FabricsType::AuthSend as u8 {
            session.send(&peer, data)
        } else {
            let mut out = Vec::with_capacity(16 + 2 * 64 + 1024);
            let mut step = session.recv(&peer, &mut out);
            if out.len() > data.len() {
                // The host's buffer cannot take the message.
                out.clear();
                nvmf_wire::auth::encode_failure1(&mut out, 0, FAILURE_INCORRECT_PAYLOAD);
                step = Step::Failed("Authentication Receive buffer too small");
                if out.len() > data.len() {
                    out.clear();
                }
            }
            data[..out.len()].copy_from_slice(&out);
            data[out.len()..].fill(0);
            step
        };
        match step {
            Step::Continue => {}
            Step::Offload(work) => {
                // FFDHE arithmetic: milliseconds, never on a reactor. The
                // Send completes when the authentication thread is done.
                let tag = IoTag {
                    cid: cmd.cid(),
                    bytes: 0,
                    write: true,
                    nsid: 0,
                };
                // Hosts that have proven themselves (this queue authenticated
                // before, or a host authenticated from this address) go
                // first; the rest are capped (see `auth::pool`).
                let peer = self.port.peer.ip();
                let class = if !self.auth_pending || crate::auth::pool::is_known(peer) {
                    crate::auth::pool::Class::Known
                } else {
                    crate::auth::pool::Class::New
                };
                return match crate::auth::pool::run(&self.sink, tag, work, class, peer) {
                    Ok(Submitted::Done(status)) => self.complete(cmd.cid(), Outcome::err(status)),
                    Ok(_) => Exec::Pending,
                    Err(crate::auth::pool::Busy) => {
                        self.auth_close = Some("authentication busy");
                        let (qid, peer) = (self.qid, self.port.peer);
                        self.target.refusal_log(|| {
                            tracing::warn!(
                                cntlid = ctrl.cntlid(),
                                qid,
                                hostnqn = %ctrl.hostnqn(),
                                peer = %peer,
                                "DH-HMAC-CHAP: too many authentications in progress from new hosts (or from this address); closing the queue"
                            )
                        });
                        self.complete(cmd.cid(), Outcome::err(Status::COMMAND_INTERRUPTED))
                    }
                };
            }
            Step::Authenticated => {
                let (hash_id, dhgroup) = session.negotiated();
                // Only now does the host hold what a real host needs: its
                // controller moves to its host NQN's budget, an I/O queue
                // claims its queue ID.
                let held = match self.role {
                    Role::Admin(_) => ctrl.promote().map_err(|_| "host controller limit reached"),
                    Role::Io if !self.io_claimed => {
                        fabrics::claim_after_auth(ctrl, self.qid).map(|()| self.io_claimed = true)
                    }
                    _ => Ok(()),
                };
                if let Err(why) = held {
                    self.auth_close = Some("authenticated, but refused");
                    let (qid, peer) = (self.qid, self.port.peer);
                    self.target.refusal_log(|| {
                        tracing::warn!(
                            cntlid = ctrl.cntlid(),
                            qid,
                            hostnqn = %ctrl.hostnqn(),
                            peer = %peer,
                            reason = why,
                            "host authenticated, but the queue is refused: closing it"
                        )
                    });
                    return self.complete(cmd.cid(), Outcome::ok());
                }
                self.auth_pending = false;
                self.auth_deadline = None;
                crate::auth::pool::remember(self.port.peer.ip());
                if let Role::Admin(aq) = &mut self.role {
                    aq.last_activity = Instant::now();
                }
                tracing::debug!(
                    cntlid = ctrl.cntlid(),
                    qid = self.qid,
                    hostnqn = %ctrl.hostnqn(),
                    hash_id,
                    dhgroup,
                    "host authenticated"
                );
            }
            Step::Failed(why) => {
                self.auth_close = Some("authentication failed");
                let (qid, peer) = (self.qid, self.port.peer);
                self.target.refusal_log(|| {
                    tracing::warn!(
                        cntlid = ctrl.cntlid(),
                        qid,
                        subnqn = %sub.nqn(),
                        hostnqn = %ctrl.hostnqn(),
                        peer = %peer,
                        reason = why,
                        "DH-HMAC-CHAP authentication failed, closing the queue"
                    )
                });
            }
        }
        self.complete(cmd.cid(), Outcome::ok())
    }

    // ---- admin queue ----

    fn execute_admin(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        let Some(ctrl) = self.ctrl.clone() else {
            return Exec::Fatal {
                reason: "admin queue without controller",
            };
        };
        // Refresh the namespace snapshot (admin path: may lock).
        let generation = ctrl.subsystem().ns_generation();
        if generation != self.ns_generation {
            let (g, ns) = ctrl
                .subsystem()
                .namespaces_with_generation_for(ctrl.hostnqn());
            self.ns_generation = g;
            self.ns = ns;
        }
        let Role::Admin(aq) = &mut self.role else {
            unreachable!("execute_admin on a non-admin queue")
        };
        aq.last_activity = Instant::now();

        if is_auth_command(cmd) {
            return self.execute_auth(&ctrl, cmd, data);
        }
        if self.auth_pending {
            return self.complete(cmd.cid(), Outcome::err(Status::AUTH_REQUIRED.with_dnr()));
        }
        let Role::Admin(aq) = &mut self.role else {
            unreachable!("execute_admin on a non-admin queue")
        };

        if cmd.opcode() == AdminOpcode::FabricsCommand as u8 {
            let out = fabrics::admin_fabrics(&self.target, &self.port, &ctrl, cmd);
            return self.complete(cmd.cid(), out);
        }

        let mut ctx = AdminCtx {
            target: &self.target,
            port: &self.port,
            ctrl: &ctrl,
            ns: &self.ns,
            aers: &mut aq.aers,
            aborted: &mut aq.aborted,
            sink: &self.sink,
            abort_waits: &mut aq.abort_waits,
        };
        match admin::execute(&mut ctx, cmd, data) {
            AdminResult::Done(out) => self.complete(cmd.cid(), out),
            AdminResult::Queued => Exec::Pending,
        }
    }

    // ---- I/O queue (data path: no locks, no allocation) ----

    // Always inlined into `execute` (the data path); `resume` (QoS, rare)
    // gets its own copy.
    #[inline(always)]
    fn execute_io(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        if self.auth_pending {
            return self.io_auth_pending(cmd, data);
        }
        if cmd.opcode() == AdminOpcode::FabricsCommand as u8 {
            if is_auth_command(cmd) {
                // Re-authentication on a live I/O queue.
                if let Some(ctrl) = self.ctrl.clone() {
                    return self.execute_auth(&ctrl, cmd, data);
                }
            }
            let status = if cmd.fctype() == FabricsType::Connect as u8 {
                Status::COMMAND_SEQUENCE_ERROR.with_dnr()
            } else {
                INVALID_OPCODE
            };
            return self.complete(cmd.cid(), Outcome::err(status));
        }
        if self.ctrl.as_ref().is_some_and(|c| c.is_dead()) {
            // The controller is torn down (subsystem deleted, host removed,
            // keep-alive): this queue closes on its next poll. Take no new
            // command and answer none: the host cancels what it sent when
            // the connection drops and sends it again on another path or
            // after its reconnect, where an error status here could reach
            // the application.
            return Exec::Pending;
        }
        if std::mem::take(&mut self.ns_pinned) {
            // The transport chose the data buffer for this snapshot.
        } else if let Some(ctrl) = &self.ctrl {
            let generation = ctrl.subsystem().ns_generation();
            if generation != self.ns_generation {
                self.refresh_namespaces();
            }
        }
        let op = cmd.opcode();
        if op >= IoOpcode::Compare as u8 {
            if is_reservation_command(op) {
                return self.execute_reservation(cmd, data);
            }
            if op == IoOpcode::Compare as u8 || op == IoOpcode::Verify as u8 {
                return self.execute_check(cmd, data, op == IoOpcode::Compare as u8);
            }
            if op == IoOpcode::Copy as u8 {
                return self.execute_copy(cmd, data);
            }
        }
        // Volatile write cache off: writes become FUA (one relaxed load).
        let write_cache = self.ctrl.as_ref().is_none_or(|c| c.write_cache_enabled());
        let ana = self.ctrl.as_ref().and_then(|c| c.ana_path());
        // QoS: one relaxed load while no bdev has limits.
        if crate::qos::any_active() {
            let path = ana.map(|p| &**p);
            if let Some(q) = io::qos_wait(&self.ns, path, &self.host, cmd, self.max_transfer) {
                if !self.resuming {
                    q.count_throttled();
                }
                return Exec::Throttled;
            }
        }
        match io::execute(
            &self.ns,
            ana.map(|p| &**p),
            &self.host,
            cmd,
            data,
            self.max_transfer,
            write_cache,
            &mut self.stats,
            &self.sink,
        ) {
            Submitted::Done(status) => {
                if !status.is_success() && status == io::GATE_CLOSED {
                    // A compare-and-write holds the bdev's writes.
                    return Exec::Throttled;
                }
                self.complete(cmd.cid(), Outcome::err(status))
            }
            Submitted::ZeroData => match self.complete(cmd.cid(), Outcome::err(Status::SUCCESS)) {
                Exec::Complete(c) => Exec::CompleteZeroData(c),
                other => other,
            },
            Submitted::Pending => {
                // (The opcode read again from the command: keeping `op`
                // live across the call costs every command a spill.)
                if cmd.opcode() != IoOpcode::Read as u8 {
                    // Write, Write Zeroes and Dataset Management answer
                    // Pending only once counted in the write gate.
                    self.note_gated(cmd.nsid());
                }
                Exec::Pending
            }
        }
    }

    /// Reservation Register, Report, Acquire and Release (`reservation.rs`).
    /// Not subject to the reservation's access rule; ANA applies. On a
    /// namespace with a PTPL file the state change and its file write run
    /// on the `nvmfd-ptpl` thread and the command completes when the file
    /// is on disk.
    #[cold]
    fn execute_reservation(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        let Some(ctrl) = self.ctrl.clone() else {
            return self.complete(cmd.cid(), Outcome::err(INVALID_OPCODE));
        };
        let ns = match self.ns.get(cmd.nsid()) {
            Some(ns) if ns.is_active() => ns.clone(),
            Some(_) => return self.complete(cmd.cid(), Outcome::err(Status::INTERNAL_PATH_ERROR)),
            None => {
                return self.complete(
                    cmd.cid(),
                    Outcome::err(Status::INVALID_NAMESPACE.with_dnr()),
                )
            }
        };
        if let Some(st) = ctrl
            .ana_path()
            .and_then(|p| crate::ana::io_status(p, ns.anagrpid()))
        {
            return self.complete(cmd.cid(), Outcome::err(st));
        }
        let op = cmd.opcode();
        if op == IoOpcode::ReservationReport as u8 {
            let status = ns.reservations().report(cmd.cdw11() & 1 != 0, data);
            return self.complete(cmd.cid(), Outcome::err(status));
        }
        let need = if op == IoOpcode::ReservationRelease as u8 {
            8
        } else {
            16
        };
        if data.len() < need {
            return self.complete(
                cmd.cid(),
                Outcome::err(Status::SGL_DATA_LENGTH_INVALID.with_dnr()),
            );
        }
        let key = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap_or([0; 8]));
        let (crkey, other) = (key(0), if need == 16 { key(8) } else { 0 });
        let (hostid, cdw10, nsid) = (self.host.hostid, cmd.cdw10(), cmd.nsid());
        let sub = ctrl.subsystem().clone();
        let ns2 = ns.clone();
        let work = move || {
            let r = ns2.reservations();
            let res = if op == IoOpcode::ReservationRegister as u8 {
                r.register(&hostid, cdw10, crkey, other)
            } else if op == IoOpcode::ReservationAcquire as u8 {
                r.acquire(&hostid, cdw10, crkey, other)
            } else {
                r.release(&hostid, cdw10, crkey)
            };
            match res {
                Ok(fx) => {
                    deliver_reservation_notices(&sub, nsid, &fx.notices);
                    Status::SUCCESS
                }
                Err(st) => st,
            }
        };
        // Preempt and Abort: once the new state is published, the command
        // completes only when every write counted in the namespace's write
        // gate is done (`PreemptDrain`).
        let abort = op == IoOpcode::ReservationAcquire as u8 && cdw10 & 7 == 2;
        if ns.reservations().persists() {
            let tag = IoTag {
                cid: cmd.cid(),
                bytes: 0,
                write: true,
                nsid: 0,
            };
            match crate::reservation::PTPL_POOL.run(&self.sink, tag, work) {
                Submitted::Done(st) if st.is_success() && abort => {
                    self.start_preempt_drain(cmd.cid(), &ns, true)
                }
                Submitted::Done(st) => self.complete(cmd.cid(), Outcome::err(st)),
                _ => {
                    if abort {
                        // Drained once the PTPL thread answers success.
                        self.preempt_drains.push(PreemptDrain {
                            cid: cmd.cid(),
                            hold: crate::fused::GateHold::new(ns.write_gate()),
                            started: false,
                        });
                    }
                    Exec::Pending
                }
            }
        } else {
            let st = work();
            if st.is_success() && abort {
                return self.start_preempt_drain(cmd.cid(), &ns, true);
            }
            self.complete(cmd.cid(), Outcome::err(st))
        }
    }

    /// A Preempt and Abort changed the reservation: it completes once no
    /// write counted before the change can still land (the namespace's
    /// write gate held until its count is zero; writes that come meanwhile
    /// wait, parked, and then meet the new reservation). `now`: the command
    /// is being executed (else its completion goes out through `poll`).
    #[cold]
    fn start_preempt_drain(
        &mut self,
        cid: u16,
        ns: &Arc<crate::namespace::Namespace>,
        now: bool,
    ) -> Exec {
        let mut hold = crate::fused::GateHold::new(ns.write_gate());
        if now && hold.drained() {
            hold.release();
            return self.complete(cid, Outcome::ok());
        }
        self.preempt_drains.push(PreemptDrain {
            cid,
            hold,
            started: true,
        });
        self.recount_caws();
        Exec::Pending
    }

    /// Compare or Verify (`io::start_check`): done now when the backend
    /// read at once, else kept until its read completes (`poll`).
    #[cold]
    fn execute_check(&mut self, cmd: &Command, data: &mut [u8], compare: bool) -> Exec {
        let ana = self.ctrl.as_ref().and_then(|c| c.ana_path()).cloned();
        match io::start_check(
            &self.ns,
            ana.as_deref(),
            &self.host,
            cmd,
            data,
            self.max_transfer,
            compare,
            &self.sink,
        ) {
            Err(st) => self.complete(cmd.cid(), Outcome::err(st)),
            Ok((Submitted::Pending, check)) => {
                self.checks.push(check);
                Exec::Pending
            }
            Ok((Submitted::Done(st), check)) => {
                let st = check.status(st);
                self.complete(cmd.cid(), Outcome::err(st))
            }
            Ok((Submitted::ZeroData, check)) => {
                let st = check.status(Status::SUCCESS);
                self.complete(cmd.cid(), Outcome::err(st))
            }
        }
    }

    /// Copy (`io::start_copy`): done now when the backend did it all at
    /// once, else kept until its last operation completes (`poll`).
    #[cold]
    fn execute_copy(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        let ana = self.ctrl.as_ref().and_then(|c| c.ana_path()).cloned();
        let write_cache = self.ctrl.as_ref().is_none_or(|c| c.write_cache_enabled());
        match io::start_copy(
            &self.ns,
            ana.as_deref(),
            &self.host,
            cmd,
            data,
            self.max_transfer,
            write_cache,
            &self.sink,
        ) {
            Err(st) if st == io::GATE_CLOSED => Exec::Throttled,
            Err(st) => self.complete(cmd.cid(), Outcome::err(st)),
            Ok(None) => self.complete(cmd.cid(), Outcome::ok()),
            Ok(Some(op)) => {
                self.copies.push(op);
                Exec::Pending
            }
        }
    }

    /// A counted write-group command went into an asynchronous backend.
    #[inline(never)]
    fn note_gated(&mut self, nsid: u32) {
        if let Some(ns) = self.ns.get(nsid) {
            self.gated.submitted(nsid, ns.write_gate());
        }
    }

    /// A fused Compare (`first`) and Write (`second`), paired by the
    /// request engine in arrival order, both with their data: executed as
    /// one atomic compare-and-write (`fused.rs`). Returns what to do with
    /// each; both Pending while it waits for the write gate or a backend.
    /// The engine calls it only on I/O queues.
    #[cold]
    pub(crate) fn execute_fused(
        &mut self,
        first: &Command,
        first_data: &[u8],
        second: &Command,
        second_data: &[u8],
    ) -> (Exec, Exec) {
        self.consume_sq_entry();
        self.consume_sq_entry();
        if self.auth_pending || !matches!(self.role, Role::Io) {
            let st = Status::AUTH_REQUIRED.with_dnr();
            let st = if self.auth_pending {
                st
            } else {
                INVALID_OPCODE
            };
            return (
                self.complete(first.cid(), Outcome::err(st)),
                self.complete(second.cid(), Outcome::err(st)),
            );
        }
        if self.ctrl.as_ref().is_some_and(|c| c.is_dead()) {
            // As `execute_io`: no answer, the queue closes.
            return (Exec::Pending, Exec::Pending);
        }
        self.ns_pinned = false;
        if let Some(ctrl) = &self.ctrl {
            if ctrl.subsystem().ns_generation() != self.ns_generation {
                self.refresh_namespaces();
            }
        }
        let write_cache = self.ctrl.as_ref().is_none_or(|c| c.write_cache_enabled());
        let ana = self.ctrl.as_ref().and_then(|c| c.ana_path()).cloned();
        let ana = ana.as_deref();
        let ns_cmp = io::lookup(&self.ns, ana, &self.host, first.nsid(), false);
        let ns_write = io::lookup(&self.ns, ana, &self.host, second.nsid(), true);
        let started = crate::fused::start(
            first,
            first_data,
            second,
            second_data,
            ns_cmp,
            ns_write,
            self.host.hostid,
            self.max_transfer,
            write_cache,
        );
        let (c1, c2) = match started {
            Err(pair) => pair,
            Ok(mut op) => match op.advance(&self.sink) {
                Some(pair) => pair,
                None => {
                    self.caws.push(op);
                    self.recount_caws();
                    return (Exec::Pending, Exec::Pending);
                }
            },
        };
        (
            self.complete(first.cid(), Outcome::err(c1)),
            self.complete(second.cid(), Outcome::err(c2)),
        )
    }

    /// Compare-and-writes waiting for their write gate try again (each
    /// `poll`); those that finish complete both their commands. So do
    /// Preempt and Aborts waiting for writes to drain.
    #[cold]
    fn advance_caws(&mut self, out: &mut dyn FnMut(Completion)) {
        let mut i = 0;
        while i < self.preempt_drains.len() {
            let d = &mut self.preempt_drains[i];
            if d.started && d.hold.drained() {
                d.hold.release();
                let cid = d.cid;
                self.preempt_drains.swap_remove(i);
                out(Completion::new(
                    cid,
                    self.qid,
                    self.reported_sqhd(),
                    Status::SUCCESS,
                    0,
                ));
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.caws.len() {
            if !self.caws[i].waiting() {
                i += 1;
                continue;
            }
            match self.caws[i].advance(&self.sink) {
                Some(pair) => {
                    let op = self.caws.swap_remove(i);
                    self.caw_done(&op, pair, out);
                }
                None => i += 1,
            }
        }
        self.recount_caws();
    }

    fn caw_done(
        &mut self,
        op: &crate::fused::CawOp,
        (c1, c2): crate::fused::PairStatus,
        out: &mut dyn FnMut(Completion),
    ) {
        let sqhd = self.reported_sqhd();
        for (cid, st) in [(op.cmp_cid, c1), (op.write_cid, c2)] {
            if !st.is_success() {
                self.stats.count_error(st);
            }
            out(Completion::new(cid, self.qid, sqhd, st, 0));
        }
    }

    /// Keeps `qos::park_here` counting the compare-and-writes and Preempt
    /// and Aborts that wait.
    fn recount_caws(&mut self) {
        let n = self.caws.iter().filter(|c| c.waiting()).count()
            + self.preempt_drains.iter().filter(|d| d.started).count();
        self.set_caws_parked(n);
    }

    fn set_caws_parked(&mut self, n: usize) {
        if n > self.caws_parked {
            crate::qos::park_here(n - self.caws_parked);
        } else {
            crate::qos::unpark_here(self.caws_parked - n);
        }
        self.caws_parked = n;
    }

    /// A command on an I/O queue that has not authenticated yet.
    #[cold]
    fn io_auth_pending(&mut self, cmd: &Command, data: &mut [u8]) -> Exec {
        match self.ctrl.clone() {
            Some(ctrl) if is_auth_command(cmd) => self.execute_auth(&ctrl, cmd, data),
            _ => self.complete(cmd.cid(), Outcome::err(Status::AUTH_REQUIRED.with_dnr())),
        }
    }

    #[cold]
    fn refresh_namespaces(&mut self) {
        if let Some(ctrl) = &self.ctrl {
            let (g, ns) = ctrl
                .subsystem()
                .namespaces_with_generation_for(ctrl.hostnqn());
            self.ns_generation = g;
            self.ns = ns;
        }
    }

    /// Deliver completions that became ready (Asynchronous Event Requests,
    /// asynchronous backend completions) and say whether the queue must close
    /// (keep-alive expired, controller torn down).
    pub fn poll(&mut self, now: Instant, out: &mut dyn FnMut(Completion)) -> QueueState {
        if self.auth_close.is_some() || self.auth_deadline.is_some() {
            if let Some(state) = self.poll_auth(now) {
                return state;
            }
        }
        let Some(ctrl) = self.ctrl.clone() else {
            return QueueState::Open;
        };
        if let Some(reason) = ctrl.close_reason() {
            return QueueState::Close {
                reason: reason.as_str(),
            };
        }
        // Operations in flight hold clones of the sink: reap this
        // thread's ring (and submit what was queued) before draining.
        if Arc::strong_count(&self.sink) > 1 {
            crate::backend::uring::flush();
        }
        if !self.sink.is_empty() {
            self.deliver_backend_completions(out);
        }
        if self.caws_parked > 0 {
            self.advance_caws(out);
        }
        let qid = self.qid;
        let sqhd = self.reported_sqhd();
        let Role::Admin(aq) = &mut self.role else {
            return QueueState::Open;
        };

        // Keep-alive: KATO rounded up to whole seconds, as nvmet does. Not
        // while the host authenticates (its own deadline, AUTH_TIMEOUT,
        // applies: FFDHE on a slow host takes longer than a short KATO,
        // and a host sends no Keep Alive before it is connected).
        let kato_ms = ctrl.kato_ms();
        if kato_ms != 0 && !self.auth_pending {
            let limit = Duration::from_secs(u64::from(kato_ms).div_ceil(1000));
            if now.saturating_duration_since(aq.last_activity) >= limit {
                ctrl.kill(CloseReason::KeepAliveTimeout);
                tracing::warn!(
                    cntlid = ctrl.cntlid(),
                    subnqn = %ctrl.subsystem().nqn(),
                    hostnqn = %ctrl.hostnqn(),
                    kato_ms,
                    "keep-alive timeout, tearing down controller"
                );
                return QueueState::Close {
                    reason: CloseReason::KeepAliveTimeout.as_str(),
                };
            }
        }

        // AERs the host aborted.
        for cid in aq.aborted.drain(..) {
            out(Completion::new(
                cid,
                qid,
                sqhd,
                Status::ABORTED_BY_REQUEST,
                0,
            ));
        }
        // Asynchronous events.
        while !aq.aers.is_empty() && ctrl.pending_events() != 0 {
            let Some(bit) = ctrl.take_event() else { break };
            let cid = aq.aers.remove(0);
            let c = Completion::new(cid, qid, sqhd, Status::SUCCESS, aen_result(bit));
            out(c);
        }
        QueueState::Open
    }

    /// A failed authentication closes the queue; so does one not finished
    /// within [`AUTH_TIMEOUT`] of the Connect.
    #[cold]
    fn poll_auth(&mut self, now: Instant) -> Option<QueueState> {
        if let Some(reason) = self.auth_close {
            return Some(QueueState::Close { reason });
        }
        if self.auth_deadline.is_some_and(|d| now >= d) {
            if let Some(ctrl) = &self.ctrl {
                tracing::warn!(
                    cntlid = ctrl.cntlid(),
                    qid = self.qid,
                    hostnqn = %ctrl.hostnqn(),
                    "DH-HMAC-CHAP authentication not completed in time, closing the queue"
                );
            }
            self.auth_close = Some("authentication timeout");
            return Some(QueueState::Close {
                reason: "authentication timeout",
            });
        }
        None
    }

    #[cold]
    fn deliver_backend_completions(&mut self, out: &mut dyn FnMut(Completion)) {
        let qid = self.qid;
        let sqhd = self.reported_sqhd();
        let stats = &mut self.stats;
        let checks = &mut self.checks;
        let copies = &mut self.copies;
        let caws = &mut self.caws;
        let gated = &mut self.gated;
        let drains = &mut self.preempt_drains;
        let mut drains_started = false;
        let mut abort_waits = match &mut self.role {
            Role::Admin(aq) if !aq.abort_waits.is_empty() => Some(&mut aq.abort_waits),
            _ => None,
        };
        // A clone for the Copy (and compare-and-write) writes submitted
        // from here, only while one is in flight (no atomic per drain
        // otherwise).
        let sink = (!copies.is_empty() || !caws.is_empty()).then(|| self.sink.clone());
        self.sink.drain(|tag, mut status| {
            if !drains.is_empty() {
                // A Preempt and Abort's PTPL write is done: on success it
                // now waits for the writes to drain (`advance_caws`).
                if let Some(i) = drains.iter().position(|d| !d.started && d.cid == tag.cid) {
                    if status.is_success() {
                        drains[i].started = true;
                        drains_started = true;
                        return;
                    }
                    drains.swap_remove(i);
                }
            }
            if tag.nsid != 0 {
                // A write-group command counted in its write gate.
                gated.completed(tag.nsid);
            }
            if !caws.is_empty() {
                // A compare-and-write's read or write ended.
                if let (Some(i), Some(sink)) = (
                    caws.iter().position(|c| c.write_cid == tag.cid),
                    sink.as_ref(),
                ) {
                    if let Some((c1, c2)) = caws[i].completed(status, sink) {
                        let op = caws.swap_remove(i);
                        for (cid, st) in [(op.cmp_cid, c1), (op.write_cid, c2)] {
                            if !st.is_success() {
                                stats.count_error(st);
                            }
                            out(Completion::new(cid, qid, sqhd, st, 0));
                        }
                    }
                    return;
                }
            }
            if let Some(waits) = abort_waits.as_deref_mut() {
                // An I/O queue's answer to an Abort: success, with dword 0
                // bit 0 set when it was not aborted.
                if let Some(i) = waits.iter().position(|&c| c == tag.cid) {
                    waits.swap_remove(i);
                    let dw0 = u32::from(!status.is_success());
                    out(Completion::new(tag.cid, qid, sqhd, Status::SUCCESS, dw0));
                    return;
                }
            }
            if !checks.is_empty() {
                // A Compare or Verify whose read ended: check it now.
                if let Some(i) = checks.iter().position(|c| c.cid == tag.cid) {
                    status = checks.swap_remove(i).status(status);
                }
            }
            if !copies.is_empty() {
                // A Copy's read or write ended: on to its next step, and
                // completed only when it is over.
                if let (Some(i), Some(sink)) =
                    (copies.iter().position(|c| c.cid == tag.cid), sink.as_ref())
                {
                    match copies[i].step(status, sink) {
                        Some(st) => {
                            copies.swap_remove(i);
                            status = st;
                        }
                        None => return,
                    }
                }
            }
            if status.is_success() {
                if tag.write {
                    stats.bytes_written += u64::from(tag.bytes);
                } else {
                    stats.bytes_read += u64::from(tag.bytes);
                }
            } else {
                stats.count_error(status);
            }
            out(Completion::new(tag.cid, qid, sqhd, status, 0));
        });
        if drains_started {
            self.recount_caws();
            self.advance_caws(out);
        }
    }
}

/// A Reservation Acquire with Preempt and Abort whose state change is
/// done, waiting for the writes counted before it (`started`; before that
/// its PTPL file write is still on the `nvmfd-ptpl` thread).
#[derive(Debug)]
struct PreemptDrain {
    cid: u16,
    hold: crate::fused::GateHold,
    started: bool,
}

/// Reservation Register, Report, Acquire or Release.
#[inline]
fn is_reservation_command(op: u8) -> bool {
    op == IoOpcode::ReservationRegister as u8
        || op == IoOpcode::ReservationReport as u8
        || op == IoOpcode::ReservationAcquire as u8
        || op == IoOpcode::ReservationRelease as u8
}

/// Hands reservation notices to every controller of the hosts they are
/// for (any thread; control path).
pub(crate) fn deliver_reservation_notices(
    sub: &crate::subsystem::Subsystem,
    nsid: u32,
    notices: &[crate::reservation::Notice],
) {
    if notices.is_empty() {
        return;
    }
    for ctrl in sub.controllers() {
        // A host the namespace is hidden from never hears its NSID
        // (per-host visibility, docs/VISIBILITY.md).
        if !sub.ns_visible_to(nsid, ctrl.hostnqn()) {
            continue;
        }
        for n in notices.iter().filter(|n| &n.hostid == ctrl.hostid()) {
            ctrl.reservation_notice(nsid, n.kind);
        }
    }
}

/// Authentication Send or Receive.
#[inline]
fn is_auth_command(cmd: &Command) -> bool {
    cmd.opcode() == AdminOpcode::FabricsCommand as u8
        && (cmd.fctype() == FabricsType::AuthSend as u8
            || cmd.fctype() == FabricsType::AuthRecv as u8)
}

/// Completion dword 0 of an Asynchronous Event Request for an event bit:
/// type (2:0), information (15:8), log page (23:16).
fn aen_result(bit: u32) -> u32 {
    const TYPE_NOTICE: u32 = 2;
    match bit {
        AEN_NS_ATTR => TYPE_NOTICE | (0x04 << 16), // information 00h
        AEN_DISC_CHANGE => TYPE_NOTICE | (0xF0 << 8) | (0x70 << 16),
        AEN_ANA_CHANGE => TYPE_NOTICE | (0x03 << 8) | (0x0C << 16),
        // I/O command specific status: reservation log page available.
        AEN_RESERVATION => 6 | (0x80 << 16),
        _ => TYPE_NOTICE,
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // Asynchronous operations still in flight point into the
        // transport's buffers. A transport that handed them over
        // (`hand_over`) has them freed later; one that did not frees them
        // right after this queue pair, so wait until the backend is done,
        // however long (never free under a writer; nvmf-tcp always hands
        // over, only in-process harnesses get here).
        if Arc::strong_count(&self.sink) > 1 && !self.handed_over {
            crate::backend::uring::wait_sink_idle(&self.sink);
        }
        // Compare-and-writes (dropped with the queue pair: their gates
        // open) no longer wait here.
        self.set_caws_parked(0);
        let Some(ctrl) = self.ctrl.take() else {
            return;
        };
        ctrl.fold_stats(&self.stats);
        match self.role {
            Role::Admin(_) => {
                let reason = ctrl.close_reason();
                ctrl.kill(CloseReason::ControllerDestroyed);
                ctrl.subsystem().unregister_controller(ctrl.cntlid());
                let active = self.target.controller_destroyed();
                tracing::info!(
                    cntlid = ctrl.cntlid(),
                    subnqn = %ctrl.subsystem().nqn(),
                    hostnqn = %ctrl.hostnqn(),
                    reason = reason.map_or("admin queue closed", CloseReason::as_str),
                    active_controllers = active,
                    "controller destroyed"
                );
            }
            Role::Io if self.io_claimed => ctrl.release_io_queue(self.qid),
            Role::Io | Role::Unconnected => {}
        }
    }
}
