//! multipath.rs — several paths (controllers) to one subsystem, seen from
//! the host: which transport IDs form the set (several `-r`, or every
//! record of the subsystem in a discovery log), one `Controller` per path,
//! the state each path is in (its ANA state, or lost) shared with the I/O
//! threads as atomics, and the monitor thread that keeps that state true:
//! it keeps an Asynchronous Event Request outstanding on every admin queue,
//! reads the ANA log page (0Ch) at start, on an ANA Change notice and when
//! an I/O thread saw an ANA status, and marks a path lost when its admin
//! connection or keep-alive fails. With reconnect on, it also connects a
//! lost path again in the background (backoff 100 ms doubling to 2 s),
//! opens its I/O queues and hands them to the I/O threads (a mailbox per
//! path, read only when the path's epoch moves). Also the path selection
//! policies.
//!
//! The I/O threads read a path's state with one relaxed load per decision;
//! nothing here is on the per-I/O path beyond that.

use crate::controller::{ConnectOptions, Controller};
use crate::discovery::DiscoveryLog;
use crate::error::{Error, Result};
use crate::queue::IoQueue;
use crate::trid::{AdrFam, TrType, TransportId, DISCOVERY_NQN};
use nvmf_wire::log::{AnaGroupDescriptor, AnaLogHeader};
use nvmf_wire::zerocopy::FromBytes;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use nvmf_wire::log::{
    ANA_CHANGE, ANA_INACCESSIBLE, ANA_NON_OPTIMIZED, ANA_OPTIMIZED, ANA_PERSISTENT_LOSS,
};
/// Not an ANA state: the path is lost (connection closed, keep-alive failed).
pub const PATH_FAILED: u8 = 0xff;

/// Asynchronous event: type Notice (dw0 bits 2:0) with information ANA
/// Change (bits 15:8).
const AE_TYPE_NOTICE: u32 = 0x2;
const AE_INFO_ANA_CHANGE: u32 = 0x03;

/// How often the monitor looks at the admin queues.
const MONITOR_TICK: Duration = Duration::from_millis(5);

/// Name of an ANA state (or of `PATH_FAILED`).
pub fn ana_state_name(s: u8) -> &'static str {
    match s {
        ANA_OPTIMIZED => "optimized",
        ANA_NON_OPTIMIZED => "non_optimized",
        ANA_INACCESSIBLE => "inaccessible",
        ANA_PERSISTENT_LOSS => "persistent_loss",
        ANA_CHANGE => "change",
        PATH_FAILED => "failed",
        _ => "unknown",
    }
}

/// Preference class of a state: 0 optimized, 1 non-optimized, 2 unusable.
#[inline]
pub fn state_class(s: u8) -> u8 {
    match s {
        ANA_OPTIMIZED => 0,
        ANA_NON_OPTIMIZED => 1,
        _ => 2,
    }
}

/// How I/O is spread over the usable paths of the best class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Each new command to the next usable path in turn.
    RoundRobin,
    /// Each new command to the usable path with the fewest in flight (from
    /// this thread).
    QueueDepth,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "round-robin" | "rr" => Some(Policy::RoundRobin),
            "queue-depth" | "qd" => Some(Policy::QueueDepth),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::QueueDepth => "queue-depth",
        }
    }
}

/// The state of one path, shared between the monitor and the I/O threads.
pub struct PathShared {
    /// `traddr:trsvcid`.
    pub name: String,
    state: AtomicU8,
    /// An I/O thread saw an ANA status: re-read the log.
    refresh: AtomicBool,
    changes: AtomicU64,
    log_reads: AtomicU64,
    /// Nanoseconds since the run's base instant when the path was lost.
    failed_at_ns: AtomicU64,
    failure: Mutex<Option<String>>,
    /// Moves each time the path is connected again; a queue belongs to the
    /// epoch it was opened in.
    epoch: AtomicU64,
    reconnects: AtomicU64,
    /// New I/O queues after a reconnect, indexed by qid - 1.
    mailbox: Mutex<Vec<Option<IoQueue>>>,
}

impl PathShared {
    pub fn new(name: String, state: u8) -> PathShared {
        PathShared {
            name,
            state: AtomicU8::new(state),
            refresh: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            log_reads: AtomicU64::new(0),
            failed_at_ns: AtomicU64::new(0),
            failure: Mutex::new(None),
            epoch: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            mailbox: Mutex::new(Vec::new()),
        }
    }

    /// The current connection epoch (0 for the first connection).
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Take the queue `qid` posted by the last reconnect.
    pub fn take_queue(&self, qid: u16) -> Option<IoQueue> {
        let mut m = self.mailbox.lock().unwrap_or_else(|p| p.into_inner());
        m.get_mut(qid as usize - 1).and_then(Option::take)
    }

    /// The path is connected again: post its I/O queues (index qid - 1),
    /// move the epoch, then take `state`.
    fn revive(&self, queues: Vec<IoQueue>, state: u8) {
        *self.mailbox.lock().unwrap_or_else(|p| p.into_inner()) =
            queues.into_iter().map(Some).collect();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.state.store(state, Ordering::Release);
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Relaxed)
    }

    /// Preference class now (see `state_class`).
    #[inline]
    pub fn class(&self) -> u8 {
        state_class(self.state())
    }

    #[inline]
    pub fn is_failed(&self) -> bool {
        self.state() == PATH_FAILED
    }

    /// Set an ANA state (not over a lost path); counts a change.
    pub fn set_state(&self, s: u8) {
        let mut cur = self.state();
        loop {
            if cur == PATH_FAILED || cur == s {
                return;
            }
            match self
                .state
                .compare_exchange(cur, s, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.changes.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Mark the path lost (first reason wins) unless it was connected again
    /// since `epoch` (a late failure of an old queue); `at_ns` from the run's base.
    pub fn fail(&self, epoch: u64, reason: &str, at_ns: u64) {
        if self.epoch() != epoch {
            return;
        }
        if self.state.swap(PATH_FAILED, Ordering::AcqRel) != PATH_FAILED {
            self.changes.fetch_add(1, Ordering::Relaxed);
            self.failed_at_ns.store(at_ns.max(1), Ordering::Relaxed);
            *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.to_string());
        }
    }

    /// An I/O completed with an ANA status (SCT 3, SC 1..3): take the state
    /// it implies now and have the monitor re-read the log.
    pub fn note_ana_status(&self, sc: u8) {
        let s = match sc {
            0x01 => ANA_PERSISTENT_LOSS,
            0x02 => ANA_INACCESSIBLE,
            _ => ANA_CHANGE,
        };
        self.set_state(s);
        self.refresh.store(true, Ordering::Release);
    }

    pub fn state_changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }
    pub fn ana_log_reads(&self) -> u64 {
        self.log_reads.load(Ordering::Relaxed)
    }
    pub fn failure(&self) -> Option<(String, u64)> {
        let f = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        Some((f, self.failed_at_ns.load(Ordering::Relaxed)))
    }
}

// ---------------------------------------------------------------------------
// ANA log page
// ---------------------------------------------------------------------------

const ANA_HDR: usize = size_of::<AnaLogHeader>();
const ANA_DESC: usize = size_of::<AnaGroupDescriptor>();

/// One ANA group descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroup {
    pub grpid: u32,
    pub state: u8,
    pub nsids: Vec<u32>,
}

fn header(buf: &[u8]) -> Option<AnaLogHeader> {
    AnaLogHeader::read_from_prefix(buf).ok().map(|(h, _)| h)
}

fn descriptor(buf: &[u8], at: usize) -> Option<AnaGroupDescriptor> {
    AnaGroupDescriptor::read_from_prefix(buf.get(at..)?)
        .ok()
        .map(|(d, _)| d)
}

/// Bytes the ANA log in `buf` needs to be complete (as far as `buf` shows).
pub fn ana_log_len(buf: &[u8]) -> usize {
    let Some(h) = header(buf) else {
        return ANA_HDR;
    };
    let mut at = ANA_HDR;
    for _ in 0..h.ngrps.get() {
        match descriptor(buf, at) {
            Some(d) => at += ANA_DESC + 4 * d.nnsids.get() as usize,
            // The rest lies past `buf`: ask for at least one more descriptor.
            None => return at + ANA_DESC,
        }
    }
    at
}

/// Decode the ANA log page: the group descriptors (a truncated or
/// malformed log is an error, never a panic).
pub fn parse_ana_log(buf: &[u8]) -> Result<Vec<AnaGroup>> {
    let bad = |what: String| Error::Protocol(format!("ANA log page: {what}"));
    let h = header(buf).ok_or_else(|| bad("shorter than its header".into()))?;
    let n = h.ngrps.get();
    let mut at = ANA_HDR;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let d = descriptor(buf, at).ok_or_else(|| bad(format!("descriptor {i} cut short")))?;
        let nn = d.nnsids.get() as usize;
        let list = at + ANA_DESC;
        if list + 4 * nn > buf.len() {
            return Err(bad(format!(
                "descriptor {i} lists {nn} namespaces past the end"
            )));
        }
        let nsids = buf[list..list + 4 * nn]
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        out.push(AnaGroup {
            grpid: d.anagrpid.get(),
            state: d.state & 0x0f,
            nsids,
        });
        at = list + 4 * nn;
    }
    Ok(out)
}

/// The ANA state of namespace `nsid` (group `grpid` from Identify
/// Namespace) in a decoded log: the group that lists the namespace, else
/// the group with that ID.
pub fn state_of(groups: &[AnaGroup], nsid: u32, grpid: u32) -> Option<u8> {
    groups
        .iter()
        .find(|g| g.nsids.contains(&nsid))
        .or_else(|| groups.iter().find(|g| grpid != 0 && g.grpid == grpid))
        .map(|g| g.state)
}

// ---------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------

/// One connected path.
pub struct Path {
    pub trid: TransportId,
    pub ctrl: Controller,
    pub shared: Arc<PathShared>,
    pub ana: bool,
    pub anagrpid: u32,
}

impl Path {
    /// Connect one path. `opts` carries the host identity (the same on all
    /// paths); the transport ID is replaced by `trid`.
    pub fn connect(opts: &ConnectOptions, trid: &TransportId) -> Result<Path> {
        let mut o = opts.clone();
        o.trid = trid.clone();
        let ctrl = Controller::connect(&o)?;
        let ana = ctrl.ana_reporting();
        let name = format!("{}:{}", trid.traddr, trid.trsvcid);
        Ok(Path {
            trid: trid.clone(),
            ctrl,
            shared: Arc::new(PathShared::new(name, ANA_OPTIMIZED)),
            ana,
            anagrpid: 0,
        })
    }

    /// Read the ANA log and set this path's state for `nsid` from it (no-op
    /// without ANA reporting). A namespace missing from the log is
    /// inaccessible through this path.
    pub fn refresh_ana(&self, nsid: u32) -> Result<()> {
        if self.ana {
            let s = self.read_ana_state(nsid)?;
            self.shared.set_state(s);
        }
        Ok(())
    }

    /// The namespace's ANA state through this path, from a fresh log.
    fn read_ana_state(&self, nsid: u32) -> Result<u8> {
        let buf = self.ctrl.ana_log()?;
        self.shared.log_reads.fetch_add(1, Ordering::Relaxed);
        let groups = parse_ana_log(&buf)?;
        Ok(state_of(&groups, nsid, self.anagrpid).unwrap_or(ANA_INACCESSIBLE))
    }

    /// Connect a lost path again, open its `spec.queues` I/O queues and
    /// hand them to the I/O threads; the path is usable when this returns.
    fn reconnect(&mut self, spec: &ReconnectSpec, nsid: u32) -> Result<()> {
        let mut o = spec.opts.clone();
        o.trid = self.trid.clone();
        o.timeout = o.timeout.min(Duration::from_secs(2));
        let ctrl = Controller::connect(&o)?;
        let granted = ctrl.set_num_queues(spec.queues)?;
        if granted < spec.queues {
            return Err(Error::InvalidArg(format!(
                "controller grants only {granted} I/O queues after reconnect"
            )));
        }
        let mut queues = Vec::with_capacity(spec.queues as usize);
        for i in 0..spec.queues {
            let mut q = ctrl.create_io_queue(i + 1, spec.depth, spec.io_size)?;
            if let Some(n) = spec.in_capsule {
                q.set_in_capsule_size(n.min(ctrl.in_capsule_size()));
            }
            queues.push(q);
        }
        let old = std::mem::replace(&mut self.ctrl, ctrl);
        drop(old);
        self.ana = self.ctrl.ana_reporting();
        let state = if self.ana {
            self.anagrpid = self.ctrl.identify_namespace(nsid)?.anagrpid.get();
            let s = self.read_ana_state(nsid)?;
            self.ctrl.enable_ana_change_events()?;
            self.ctrl.arm_async_event()?;
            s
        } else {
            ANA_OPTIMIZED
        };
        self.shared.revive(queues, state);
        Ok(())
    }

    /// Start-up: the namespace's group, the first ANA log, ANA Change
    /// notices enabled and the first AER armed.
    pub fn init_ana(&mut self, nsid: u32) -> Result<()> {
        if !self.ana {
            return Ok(());
        }
        self.anagrpid = self.ctrl.identify_namespace(nsid)?.anagrpid.get();
        self.refresh_ana(nsid)?;
        // A refresh at start is not a change.
        self.shared.changes.store(0, Ordering::Relaxed);
        self.ctrl.enable_ana_change_events()?;
        self.ctrl.arm_async_event()?;
        Ok(())
    }
}

/// The transport IDs a discovery service lists for `subnqn` on the fabric
/// the service was reached over (`discovery`'s trtype: TCP or RDMA; see
/// [`paths_from_log`]), in log order, with the host NQN of `opts`.
pub fn discover_paths(
    opts: &ConnectOptions,
    discovery: &TransportId,
    subnqn: &str,
) -> Result<Vec<TransportId>> {
    let mut o = opts.clone();
    o.trid = discovery.clone();
    o.trid.subnqn = DISCOVERY_NQN.to_string();
    o.kato = Duration::ZERO;
    let ctrl = Controller::connect(&o)?;
    let log = ctrl.discovery_log()?;
    paths_from_log(&log, discovery, subnqn)
}

/// The paths to `subnqn` in a discovery log read through `discovery`: the
/// records of `discovery`'s transport (NVMe/TCP records when it was reached
/// over TCP, NVMe/RDMA records over RDMA; a record of another fabric is not
/// a path this host can take the same way), one per address and port, in the
/// log's order, each with `discovery`'s host NQN and namespace.
pub fn paths_from_log(
    log: &DiscoveryLog,
    discovery: &TransportId,
    subnqn: &str,
) -> Result<Vec<TransportId>> {
    let want = match discovery.trtype {
        TrType::Tcp => nvmf_wire::log::TRTYPE_TCP,
        TrType::Rdma => nvmf_wire::log::TRTYPE_RDMA,
    };
    let mut out: Vec<TransportId> = Vec::new();
    for e in &log.entries {
        if e.subnqn != subnqn || e.trtype != want {
            continue;
        }
        let mut t = TransportId::tcp(&e.traddr, &e.trsvcid, subnqn);
        t.trtype = discovery.trtype;
        if e.adrfam == nvmf_wire::log::ADRFAM_IPV6 {
            t.adrfam = AdrFam::Ipv6;
        }
        t.hostnqn = discovery.hostnqn.clone();
        t.nsid = discovery.nsid;
        if !out
            .iter()
            .any(|x| x.traddr == t.traddr && x.trsvcid == t.trsvcid)
        {
            out.push(t);
        }
    }
    if out.is_empty() {
        let fabric = match discovery.trtype {
            TrType::Tcp => "NVMe/TCP",
            TrType::Rdma => "NVMe/RDMA",
        };
        return Err(Error::InvalidArg(format!(
            "the discovery service at {}:{} lists no {fabric} path to {subnqn}",
            discovery.traddr, discovery.trsvcid
        )));
    }
    Ok(out)
}

/// Refuse a path set that names more than one subsystem.
pub fn check_same_subsystem(trids: &[TransportId]) -> Result<()> {
    if let Some(first) = trids.first() {
        if let Some(o) = trids.iter().find(|t| t.subnqn != first.subnqn) {
            return Err(Error::InvalidArg(format!(
                "all paths must lead to one subsystem: {}:{} names {} but {}:{} names {}",
                first.traddr, first.trsvcid, first.subnqn, o.traddr, o.trsvcid, o.subnqn
            )));
        }
    }
    Ok(())
}

/// What a reconnect needs to rebuild a path like the first connection.
#[derive(Debug, Clone)]
pub struct ReconnectSpec {
    pub opts: ConnectOptions,
    pub queues: u16,
    pub depth: u16,
    pub io_size: u32,
    pub in_capsule: Option<u32>,
}

/// First and longest wait between reconnect attempts of one path.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The thread that watches every path's admin queue during a run.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Path>>>,
    /// The paths when there is nothing to watch (no thread started).
    idle: Option<Vec<Path>>,
}

impl Monitor {
    /// Watch `paths` for namespace `nsid`: AER completions (ANA Change →
    /// re-read the log, re-arm), refresh requests from the I/O threads,
    /// keep-alive failures and lost admin connections (→ path lost), and
    /// with `reconnect` lost paths connected again. `base` is the run's
    /// time origin (for the failure time). `finish` gives the paths back.
    pub fn start(
        mut paths: Vec<Path>,
        nsid: u32,
        base: Instant,
        reconnect: Option<ReconnectSpec>,
    ) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        // One path without ANA and without reconnect: nothing could change
        // where I/O goes (a lost keep-alive is reported at the end); no
        // thread waking every tick beside the I/O threads.
        if paths.len() == 1 && !paths[0].ana && reconnect.is_none() {
            return Monitor {
                stop,
                thread: None,
                idle: Some(paths),
            };
        }
        let s2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("nvmf-multipath".into())
            .spawn(move || {
                let mut backoff: Vec<(Instant, Duration)> =
                    vec![(Instant::now(), RECONNECT_FIRST); paths.len()];
                while !s2.load(Ordering::Acquire) {
                    for (p, b) in paths.iter_mut().zip(backoff.iter_mut()) {
                        if !p.shared.is_failed() {
                            watch(p, nsid, base);
                            *b = (Instant::now() + RECONNECT_FIRST, RECONNECT_FIRST);
                            continue;
                        }
                        let Some(spec) = &reconnect else { continue };
                        if Instant::now() < b.0 {
                            continue;
                        }
                        if p.reconnect(spec, nsid).is_err() {
                            b.1 = (b.1 * 2).min(RECONNECT_MAX);
                            b.0 = Instant::now() + b.1;
                        }
                    }
                    std::thread::sleep(MONITOR_TICK);
                }
                paths
            })
            .expect("spawn multipath monitor");
        Monitor {
            stop,
            thread: Some(thread),
            idle: None,
        }
    }

    /// Stop watching; the paths (with the controllers now in use).
    pub fn finish(mut self) -> Vec<Path> {
        self.stop.store(true, Ordering::Release);
        if let Some(p) = self.idle.take() {
            return p;
        }
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// One look at one path.
fn watch(p: &Path, nsid: u32, base: Instant) {
    let sh = &p.shared;
    let epoch = sh.epoch();
    let now_ns = || base.elapsed().as_nanos() as u64;
    if let Some(e) = p.ctrl.keep_alive_error() {
        sh.fail(epoch, &format!("keep alive failed: {e}"), now_ns());
        return;
    }
    if !p.ana {
        return;
    }
    let mut reread = sh.refresh.swap(false, Ordering::AcqRel);
    match p.ctrl.poll_async_event() {
        Ok(Some(c)) => {
            let kind = c.dw0 & 0x7;
            let info = (c.dw0 >> 8) & 0xff;
            if kind == AE_TYPE_NOTICE && info == AE_INFO_ANA_CHANGE {
                reread = true;
            }
            // Any other event (or an error status) is not ours to act on;
            // re-arm unless the controller refused the request.
            if c.status.is_success() {
                if let Err(e) = p.ctrl.arm_async_event() {
                    sh.fail(epoch, &format!("admin queue: {e}"), now_ns());
                    return;
                }
            }
        }
        Ok(None) => {}
        Err(e) => {
            sh.fail(epoch, &format!("admin connection lost: {e}"), now_ns());
            return;
        }
    }
    if reread {
        if let Err(e) = p.refresh_ana(nsid) {
            if matches!(
                e,
                Error::Closed(_) | Error::Io { .. } | Error::Timeout(_) | Error::Terminated { .. }
            ) {
                sh.fail(epoch, &format!("reading the ANA log: {e}"), now_ns());
            } else {
                // Try again on the next tick.
                sh.refresh.store(true, Ordering::Release);
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoded discovery log with `records` = (trtype, adrfam, traddr, trsvcid, subnqn),
    /// each through the wire encoding.
    fn disc_log(records: &[(u8, u8, &str, &str, &str)]) -> DiscoveryLog {
        use nvmf_wire::log::{DiscoveryLogEntry, SUBTYPE_NVM};
        DiscoveryLog {
            genctr: 1,
            entries: records
                .iter()
                .enumerate()
                .map(|(i, (tt, af, addr, svc, nqn))| {
                    let w = DiscoveryLogEntry::new(
                        *tt,
                        *af,
                        SUBTYPE_NVM,
                        0,
                        i as u16,
                        32,
                        svc,
                        nqn,
                        addr,
                    );
                    crate::discovery::DiscoveryEntry::from_wire(&w)
                })
                .collect(),
        }
    }

    #[test]
    fn discovered_paths_follow_the_discovery_services_fabric() {
        use nvmf_wire::log::{ADRFAM_IPV4, ADRFAM_IPV6, TRTYPE_RDMA, TRTYPE_TCP};
        const SUB: &str = "nqn.2024-01.io.nvmfd:mp";
        let log = disc_log(&[
            (TRTYPE_TCP, ADRFAM_IPV4, "10.0.0.1", "4420", SUB),
            (TRTYPE_RDMA, ADRFAM_IPV4, "10.77.0.1", "4420", SUB),
            (
                TRTYPE_RDMA,
                ADRFAM_IPV4,
                "10.77.0.1",
                "4421",
                "nqn.2024-01.io.nvmfd:other",
            ),
            (TRTYPE_RDMA, ADRFAM_IPV6, "fd00::1", "4420", SUB),
            // the same RDMA address and port again (another port ID): one path
            (TRTYPE_RDMA, ADRFAM_IPV4, "10.77.0.1", "4420", SUB),
            (TRTYPE_TCP, ADRFAM_IPV4, "10.0.0.2", "4420", SUB),
        ]);
        let mut tcp = TransportId::tcp("10.0.0.1", "8009", DISCOVERY_NQN);
        tcp.hostnqn = Some("nqn.2014-08.org.nvmexpress:uuid:h".into());
        tcp.nsid = Some(2);
        let p = paths_from_log(&log, &tcp, SUB).unwrap();
        let got: Vec<_> = p.iter().map(|t| (t.trtype, t.traddr.as_str())).collect();
        assert_eq!(got, [(TrType::Tcp, "10.0.0.1"), (TrType::Tcp, "10.0.0.2")]);
        assert!(p
            .iter()
            .all(|t| t.hostnqn == tcp.hostnqn && t.nsid == Some(2)));
        assert!(p.iter().all(|t| t.subnqn == SUB));

        // Reached over RDMA: the RDMA records, deduplicated, IPv6 kept as such.
        let mut rdma = tcp.clone();
        rdma.trtype = TrType::Rdma;
        let p = paths_from_log(&log, &rdma, SUB).unwrap();
        let got: Vec<_> = p
            .iter()
            .map(|t| (t.trtype, t.adrfam, t.traddr.as_str(), t.trsvcid.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (TrType::Rdma, AdrFam::Ipv4, "10.77.0.1", "4420"),
                (TrType::Rdma, AdrFam::Ipv6, "fd00::1", "4420")
            ]
        );

        // No record of the fabric: a clear error naming it.
        let tcp_only = disc_log(&[(TRTYPE_TCP, ADRFAM_IPV4, "10.0.0.1", "4420", SUB)]);
        let e = paths_from_log(&tcp_only, &rdma, SUB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no NVMe/RDMA path to"), "{e}");
        let e = paths_from_log(&log, &tcp, "nqn.x:none")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no NVMe/TCP path to nqn.x:none"), "{e}");
    }

    /// An ANA log with `groups` = (grpid, state, nsids).
    fn log(groups: &[(u32, u8, &[u32])]) -> Vec<u8> {
        let mut b = vec![0u8; ANA_HDR];
        b[0..8].copy_from_slice(&7u64.to_le_bytes());
        b[8..10].copy_from_slice(&(groups.len() as u16).to_le_bytes());
        for (g, s, ns) in groups {
            let mut d = vec![0u8; ANA_DESC];
            d[0..4].copy_from_slice(&g.to_le_bytes());
            d[4..8].copy_from_slice(&(ns.len() as u32).to_le_bytes());
            d[16] = *s;
            b.extend_from_slice(&d);
            for n in *ns {
                b.extend_from_slice(&n.to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn ana_log_decodes_groups_and_finds_the_namespace() {
        let b = log(&[
            (1, ANA_OPTIMIZED, &[1, 3]),
            (2, ANA_INACCESSIBLE, &[2]),
            (3, ANA_NON_OPTIMIZED, &[]),
        ]);
        assert_eq!(ana_log_len(&b), b.len());
        let g = parse_ana_log(&b).unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].nsids, vec![1, 3]);
        assert_eq!(state_of(&g, 3, 0), Some(ANA_OPTIMIZED));
        assert_eq!(state_of(&g, 2, 0), Some(ANA_INACCESSIBLE));
        // Groups-only log (RGO): found by the group ID.
        assert_eq!(state_of(&g, 9, 3), Some(ANA_NON_OPTIMIZED));
        assert_eq!(state_of(&g, 9, 0), None);
    }

    #[test]
    fn ana_log_truncated_is_an_error_not_a_panic() {
        let b = log(&[(1, ANA_OPTIMIZED, &[1, 2, 3, 4])]);
        for cut in 0..b.len() {
            let r = parse_ana_log(&b[..cut]);
            assert!(r.is_err(), "cut at {cut} parsed: {r:?}");
            let _ = ana_log_len(&b[..cut]);
        }
        // A descriptor count beyond the data asks for more bytes.
        let mut h = vec![0u8; ANA_HDR];
        h[8] = 2;
        assert_eq!(ana_log_len(&h), ANA_HDR + ANA_DESC);
    }

    #[test]
    fn path_state_changes_and_failure() {
        let p = PathShared::new("a".into(), ANA_OPTIMIZED);
        assert_eq!(p.class(), 0);
        p.note_ana_status(0x02);
        assert_eq!(p.state(), ANA_INACCESSIBLE);
        assert_eq!(p.class(), 2);
        assert!(p.refresh.load(Ordering::Relaxed));
        p.set_state(ANA_NON_OPTIMIZED);
        assert_eq!(p.class(), 1);
        assert_eq!(p.state_changes(), 2);
        p.fail(0, "gone", 5);
        p.fail(0, "again", 9);
        assert!(p.is_failed());
        assert_eq!(p.failure(), Some(("gone".into(), 5)));
        // A lost path stays lost.
        p.set_state(ANA_OPTIMIZED);
        assert!(p.is_failed());
        assert_eq!(p.state_changes(), 3);
    }

    #[test]
    fn mixed_subsystems_are_refused() {
        let a = TransportId::tcp("127.0.0.1", "4420", "nqn.a");
        let b = TransportId::tcp("127.0.0.1", "4421", "nqn.b");
        assert!(check_same_subsystem(&[a.clone(), a.clone()]).is_ok());
        let e = check_same_subsystem(&[a, b]).unwrap_err().to_string();
        assert!(e.contains("nqn.a") && e.contains("nqn.b"), "{e}");
    }

    #[test]
    fn policy_names() {
        for p in ["round-robin", "queue-depth"] {
            assert_eq!(Policy::parse(p).unwrap().name(), p);
        }
        assert!(Policy::parse("random").is_none());
    }
}
