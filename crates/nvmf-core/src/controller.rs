//! Controllers: one per admin queue Connect (dynamic controller model).
//!
//! Owns [`Controller`], the state shared between a controller's admin queue
//! and its I/O queues (which may live on different reactor threads):
//! identity (cntlid, subsystem, host NQN/ID), controller registers (CC,
//! CSTS), negotiated number of I/O queues and which of them are connected,
//! keep-alive timeout, feature values, the asynchronous event masks
//! (settable from any thread, checked by the admin queue with one atomic
//! load), the changed-namespace list, a "dead" flag that makes every queue of
//! the controller close, and statistics folded in from closed queues.
//! A controller admitted against the target's host limits gives its
//! reservation back when it is dropped, and each I/O queue's reservation
//! when the queue is released.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::ana::PathAna;
use crate::stats::ErrorTable;
use crate::subsystem::Subsystem;
use crate::target::{Budget, LimitHit, Target};

/// Why an I/O queue could not be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimError {
    /// QID 0, or above the negotiated number of queues.
    InvalidQid,
    /// Another connected queue has this QID (a host's reconnect racing its
    /// old queue's teardown, or another host that knows this one's NQN).
    Taken,
    /// The host NQN holds as many I/O queues as it may.
    Limit(LimitHit),
}

/// Asynchronous Event Configuration bit / event: Namespace Attribute Notices.
pub const AEN_NS_ATTR: u32 = 1 << 8;
/// Asynchronous Event Configuration bit / event: Asymmetric Namespace
/// Access Change Notices.
pub const AEN_ANA_CHANGE: u32 = 1 << 11;
/// Asynchronous Event Configuration bit / event: Discovery Log Page Change.
pub const AEN_DISC_CHANGE: u32 = 1 << 31;

/// Event (not an Asynchronous Event Configuration bit: reservation
/// notifications are masked per namespace with feature 82h): a Reservation
/// Notification log page (80h) is available.
pub const AEN_RESERVATION: u32 = 1 << 24;
/// Reservation notifications kept per controller (the log page's Number of
/// Available Log Pages field tops out at 255); older ones are dropped, and
/// the host sees the gap in the Log Page Count.
pub const RESV_LOG_MAX: usize = 255;

/// Most entries of the Changed Namespace List log page.
pub const CHANGED_NS_MAX: usize = 1024;
/// Default over-temperature threshold of the composite temperature (feature
/// 04h): 343 K = 70 °C; the under threshold defaults to 0 K. SMART reports a
/// fixed 298 K, so neither is ever crossed unless a host moves them.
pub const TEMP_OVER_DEFAULT_K: u16 = 343;

/// Why a controller's queues must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CloseReason {
    /// The host sent no Keep Alive within KATO.
    KeepAliveTimeout = 1,
    /// The admin queue went away (the association is over).
    ControllerDestroyed = 2,
    /// The subsystem was removed.
    SubsystemRemoved = 3,
    /// The host was removed from the subsystem's allow list.
    HostRemoved = 4,
    /// The listener the controller connected through was removed.
    ListenerRemoved = 5,
    /// Its pool (discovery, or not yet authenticated) was full and it was
    /// the oldest member (`target::HostLimits`).
    Evicted = 6,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::KeepAliveTimeout => "keep-alive timeout",
            CloseReason::ControllerDestroyed => "controller destroyed",
            CloseReason::SubsystemRemoved => "subsystem removed",
            CloseReason::HostRemoved => "host removed from the subsystem",
            CloseReason::ListenerRemoved => "listener removed",
            CloseReason::Evicted => "evicted: its controller pool is full (oldest first)",
        }
    }

    fn from_u8(v: u8) -> Option<CloseReason> {
        match v {
            1 => Some(CloseReason::KeepAliveTimeout),
            2 => Some(CloseReason::ControllerDestroyed),
            3 => Some(CloseReason::SubsystemRemoved),
            4 => Some(CloseReason::HostRemoved),
            5 => Some(CloseReason::ListenerRemoved),
            6 => Some(CloseReason::Evicted),
            _ => None,
        }
    }
}

/// Per-queue counters (plain integers: a queue pair is owned by one thread).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    /// Commands executed (completed or handed to a backend).
    pub commands: u64,
    /// Read commands.
    pub reads: u64,
    /// Write commands.
    pub writes: u64,
    /// Bytes returned by successful reads.
    pub bytes_read: u64,
    /// Bytes stored by successful writes.
    pub bytes_written: u64,
    /// Commands that completed with an error status.
    pub errors: u64,
    /// The same errors by status (SCT, SC).
    pub errors_by_status: ErrorTable,
}

impl QueueStats {
    /// Counts one command completed with error `status`.
    #[inline]
    pub fn count_error(&mut self, status: nvmf_wire::status::Status) {
        self.errors += 1;
        self.errors_by_status.record(status.sct, status.sc);
    }

    pub fn add(&mut self, other: &QueueStats) {
        self.commands += other.commands;
        self.reads += other.reads;
        self.writes += other.writes;
        self.bytes_read += other.bytes_read;
        self.bytes_written += other.bytes_written;
        self.errors += other.errors;
        self.errors_by_status.add(&other.errors_by_status);
    }
}

#[derive(Debug, Default)]
struct AtomicStats {
    commands: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
}

fn supported_events_of(subsystem: &Subsystem) -> u32 {
    if subsystem.is_discovery() {
        AEN_DISC_CHANGE
    } else if subsystem.ana().is_some() {
        AEN_NS_ATTR | AEN_ANA_CHANGE
    } else {
        AEN_NS_ATTR
    }
}

/// Reservation notifications waiting to be read (log page 80h) and the
/// Reservation Notification Mask (feature 82h).
#[derive(Debug, Default)]
struct ResvNotices {
    /// The Log Page Count of the last notification (never 0 once one was).
    count: u64,
    /// (count, type, NSID), oldest first.
    queue: std::collections::VecDeque<(u64, u8, u32)>,
    /// Masks by NSID (bits 1..3: registration preempted, reservation
    /// released, reservation preempted); absent = nothing masked.
    masks: std::collections::HashMap<u32, u32>,
}

/// Outstanding Abort commands a controller takes for its I/O queues
/// (Identify ACL + 1).
pub const ABORT_LIMIT: usize = 4;

/// An Abort (admin 08h) of a command on one of the controller's I/O
/// queues, waiting for that queue (possibly on another reactor) to look.
#[derive(Debug)]
pub struct AbortAsk {
    /// The queue and the command to abort.
    pub sqid: u16,
    pub cid: u16,
    /// The Abort command's own CID on the admin queue.
    pub abort_cid: u16,
    /// The admin queue's sink: the I/O queue posts the answer there
    /// (success: aborted; anything else: not aborted) and wakes it.
    pub reply: Arc<crate::backend::CompletionSink>,
}

impl AbortAsk {
    /// Tells the admin queue whether the command was aborted.
    pub fn answer(self, aborted: bool) {
        let tag = crate::backend::IoTag {
            cid: self.abort_cid,
            bytes: 0,
            write: false,
            nsid: 0,
        };
        let st = if aborted {
            nvmf_wire::status::Status::SUCCESS
        } else {
            NOT_ABORTED
        };
        crate::backend::CompletionSink::post_and_wake(self.reply, tag, st);
    }
}

/// The answer an I/O queue posts for a command it did not abort (the
/// admin queue turns it into success with dword 0 bit 0 set).
pub const NOT_ABORTED: nvmf_wire::status::Status = nvmf_wire::status::Status::INTERNAL_ERROR;

/// One Reservation Notification log page entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResvLogEntry {
    pub count: u64,
    /// 0: empty page; otherwise a `reservation::NoticeKind`.
    pub kind: u8,
    /// Further entries still waiting (at most 255).
    pub available: u8,
    pub nsid: u32,
}

#[derive(Debug, Default)]
struct ChangedNs {
    list: Vec<u32>,
    overflow: bool,
}

/// State of one controller, shared by its queue pairs.
#[derive(Debug)]
pub struct Controller {
    cntlid: u16,
    subsystem: Arc<Subsystem>,
    hostnqn: String,
    hostid: [u8; 16],
    /// I/O queues this controller may ever have (transport limit; 0 for discovery).
    max_io_queues: u16,
    /// I/O queues negotiated with Set Features Number of Queues.
    num_io_queues: AtomicU16,
    /// `io_queues[qid]` is true while an I/O queue with that ID is connected.
    io_queues: Mutex<Vec<bool>>,
    dead: AtomicU8,
    cc: AtomicU32,
    csts: AtomicU32,
    kato_ms: AtomicU32,
    wce: AtomicBool,
    /// Composite-temperature thresholds (feature 04h), Kelvin: over in
    /// bits 15:0, under in bits 31:16.
    temp_thresholds: AtomicU32,
    aen_enabled: AtomicU32,
    aen_pending: AtomicU32,
    aen_masked: AtomicU32,
    changed_ns: Mutex<ChangedNs>,
    resv: Mutex<ResvNotices>,
    /// Aborts asked for on I/O queues, not yet looked at by their queue.
    aborts: Mutex<Vec<AbortAsk>>,
    /// `aborts` is not empty (the I/O queues' one load per poll).
    abort_asked: AtomicBool,
    /// The ANA state of the listener this controller connected through
    /// (`None` without ANA reporting).
    ana_path: Option<Arc<PathAna>>,
    stats: AtomicStats,
    /// The target whose host limits admitted this controller (dangling for
    /// controllers built outside a target, e.g. in unit tests).
    admitted_by: Weak<Target>,
    /// The budget it is counted in (`target::Budget` as u8): changes once,
    /// from unauthenticated to NVM, when its host authenticates.
    budget: AtomicU8,
}

impl Controller {
    pub(crate) fn new(
        cntlid: u16,
        subsystem: Arc<Subsystem>,
        hostnqn: &str,
        hostid: [u8; 16],
        max_io_queues: u16,
        kato_ms: u32,
    ) -> Controller {
        let supported = supported_events_of(&subsystem);
        Controller {
            cntlid,
            subsystem,
            hostnqn: hostnqn.to_string(),
            hostid,
            max_io_queues,
            num_io_queues: AtomicU16::new(max_io_queues),
            io_queues: Mutex::new(vec![false; max_io_queues as usize + 1]),
            dead: AtomicU8::new(0),
            cc: AtomicU32::new(0),
            csts: AtomicU32::new(0),
            kato_ms: AtomicU32::new(kato_ms),
            wce: AtomicBool::new(true),
            temp_thresholds: AtomicU32::new(u32::from(TEMP_OVER_DEFAULT_K)),
            aen_enabled: AtomicU32::new(supported),
            aen_pending: AtomicU32::new(0),
            aen_masked: AtomicU32::new(0),
            changed_ns: Mutex::new(ChangedNs::default()),
            resv: Mutex::new(ResvNotices::default()),
            aborts: Mutex::new(Vec::new()),
            abort_asked: AtomicBool::new(false),
            ana_path: None,
            stats: AtomicStats::default(),
            admitted_by: Weak::new(),
            budget: AtomicU8::new(Budget::None as u8),
        }
    }

    /// This controller holds a reservation of `target`'s host limits
    /// (`Target::admit_controller` succeeded for it): give it back on drop,
    /// and count its I/O queues against the host too.
    pub(crate) fn with_admission(mut self, target: &Arc<Target>, budget: Budget) -> Controller {
        self.admitted_by = Arc::downgrade(target);
        self.budget = AtomicU8::new(budget as u8);
        self
    }

    /// The budget of the target's host limits this controller is counted in.
    pub fn budget(&self) -> Budget {
        Budget::from_u8(self.budget.load(Ordering::Acquire))
    }

    /// Its host authenticated: a controller of the unauthenticated pool
    /// moves to its host NQN's budget (idempotent: re-authentication does
    /// nothing). Fails when the host is over a cap.
    pub(crate) fn promote(&self) -> Result<(), crate::target::LimitHit> {
        match self.admitted_by.upgrade() {
            Some(t) => t.promote_controller(self),
            None => Ok(()),
        }
    }

    pub(crate) fn set_budget(&self, b: Budget) {
        self.budget.store(b as u8, Ordering::Release);
    }

    /// The ANA path this controller reads its group states from.
    pub(crate) fn with_ana_path(mut self, path: Option<Arc<PathAna>>) -> Controller {
        self.ana_path = path;
        self
    }

    /// The ANA state of the listener this controller connected through.
    #[inline]
    pub fn ana_path(&self) -> Option<&Arc<PathAna>> {
        self.ana_path.as_ref()
    }

    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.subsystem
    }

    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    /// 128-bit host identifier from the Connect data.
    pub fn hostid(&self) -> &[u8; 16] {
        &self.hostid
    }

    pub fn is_discovery(&self) -> bool {
        self.subsystem.is_discovery()
    }

    /// Events this controller can report (OAES / AEC mask).
    pub fn supported_events(&self) -> u32 {
        supported_events_of(&self.subsystem)
    }

    // ---- liveness ----

    /// Mark the controller dead; every queue pair reports Close on its next poll.
    /// The first reason wins.
    pub fn kill(&self, reason: CloseReason) {
        let _ = self
            .dead
            .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire);
    }

    /// [`Controller::kill`] that says whether it was alive (this reason won).
    pub fn kill_if_alive(&self, reason: CloseReason) -> bool {
        self.dead
            .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    #[inline]
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed) != 0
    }

    /// Why the controller died, if it did.
    #[inline]
    pub fn close_reason(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.dead.load(Ordering::Acquire))
    }

    // ---- I/O queues ----

    /// Highest I/O queue ID the host may connect (negotiated).
    pub fn num_io_queues(&self) -> u16 {
        self.num_io_queues.load(Ordering::Acquire)
    }

    /// Most I/O queues the transport allows per controller.
    pub fn max_io_queues(&self) -> u16 {
        self.max_io_queues
    }

    pub(crate) fn set_num_io_queues(&self, n: u16) {
        self.num_io_queues
            .store(n.min(self.max_io_queues), Ordering::Release);
    }

    /// Claim I/O queue `qid`: it must be in range and not connected, and
    /// the host must be below its I/O queue limit.
    pub(crate) fn claim_io_queue(&self, qid: u16) -> Result<(), ClaimError> {
        if qid == 0 || qid > self.num_io_queues() {
            return Err(ClaimError::InvalidQid);
        }
        // Lock order: this controller's queue table, then the target's
        // admission lock (release takes them one after the other).
        let mut q = self.io_queues.lock().unwrap_or_else(|e| e.into_inner());
        match q.get_mut(qid as usize) {
            Some(slot) if !*slot => {
                if let Some(t) = self.admitted_by.upgrade() {
                    t.admit_io_queue(&self.hostnqn).map_err(ClaimError::Limit)?;
                }
                *slot = true;
                Ok(())
            }
            Some(_) => Err(ClaimError::Taken),
            None => Err(ClaimError::InvalidQid),
        }
    }

    /// Release I/O queue `qid` (its connection went away).
    pub(crate) fn release_io_queue(&self, qid: u16) {
        let was = {
            let mut q = self.io_queues.lock().unwrap_or_else(|e| e.into_inner());
            let was = q
                .get_mut(qid as usize)
                .map(|slot| std::mem::replace(slot, false))
                .unwrap_or(false);
            // Aborts still waiting for this queue: nothing of it is left
            // to abort (taken under the queue table's lock, as `ask_abort`
            // queues them, so none is left behind).
            for ask in self.take_aborts(qid) {
                ask.answer(false);
            }
            was
        };
        if was {
            if let Some(t) = self.admitted_by.upgrade() {
                t.release_io_queue(&self.hostnqn);
            }
        }
    }

    /// Number of connected I/O queues.
    pub fn connected_io_queues(&self) -> usize {
        let q = self.io_queues.lock().unwrap_or_else(|e| e.into_inner());
        q.iter().filter(|&&b| b).count()
    }

    // ---- registers ----

    pub fn cc(&self) -> u32 {
        self.cc.load(Ordering::Acquire)
    }

    pub fn csts(&self) -> u32 {
        self.csts.load(Ordering::Acquire)
    }

    pub(crate) fn set_cc(&self, v: u32) {
        self.cc.store(v, Ordering::Release);
    }

    pub(crate) fn set_csts(&self, v: u32) {
        self.csts.store(v, Ordering::Release);
    }

    // ---- features ----

    /// Keep-alive timeout in milliseconds (0 = disabled), as the host set it.
    pub fn kato_ms(&self) -> u32 {
        self.kato_ms.load(Ordering::Acquire)
    }

    pub(crate) fn set_kato_ms(&self, v: u32) {
        self.kato_ms.store(v, Ordering::Release);
    }

    /// Volatile write cache enabled (feature 06h).
    pub fn write_cache_enabled(&self) -> bool {
        self.wce.load(Ordering::Relaxed)
    }

    pub(crate) fn set_write_cache_enabled(&self, v: bool) {
        self.wce.store(v, Ordering::Relaxed);
    }

    /// The composite temperature's over (`under == false`) or under
    /// threshold in Kelvin (feature 04h).
    pub fn temp_threshold(&self, under: bool) -> u16 {
        let v = self.temp_thresholds.load(Ordering::Relaxed);
        if under {
            (v >> 16) as u16
        } else {
            v as u16
        }
    }

    pub(crate) fn set_temp_threshold(&self, under: bool, kelvin: u16) {
        let (shift, keep) = if under {
            (16, 0xFFFF)
        } else {
            (0, 0xFFFF_0000)
        };
        let _ = self
            .temp_thresholds
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some((v & keep) | (u32::from(kelvin) << shift))
            });
    }

    /// Asynchronous Event Configuration (feature 0Bh).
    pub fn aen_enabled(&self) -> u32 {
        self.aen_enabled.load(Ordering::Acquire)
    }

    pub(crate) fn set_aen_enabled(&self, v: u32) {
        self.aen_enabled.store(v, Ordering::Release);
    }

    // ---- asynchronous events ----

    /// Raise an event (`AEN_*` bit). Does nothing when the host disabled the
    /// event or has not yet read the log page of the previous one (the event
    /// stays masked until then, as the spec requires). Any thread.
    pub fn raise_event(&self, bit: u32) {
        if bit != AEN_RESERVATION && self.aen_enabled.load(Ordering::Acquire) & bit == 0 {
            return;
        }
        if self.aen_masked.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return;
        }
        self.aen_pending.fetch_or(bit, Ordering::AcqRel);
    }

    /// Events waiting for an Asynchronous Event Request (cheap check).
    #[inline]
    pub fn pending_events(&self) -> u32 {
        self.aen_pending.load(Ordering::Relaxed)
    }

    /// Take the lowest pending event bit, if any.
    pub(crate) fn take_event(&self) -> Option<u32> {
        loop {
            let p = self.aen_pending.load(Ordering::Acquire);
            if p == 0 {
                return None;
            }
            let bit = p & p.wrapping_neg();
            if self
                .aen_pending
                .compare_exchange(p, p & !bit, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(bit);
            }
        }
    }

    /// The host read the log page belonging to `bit`: events of that kind
    /// may be reported again.
    pub(crate) fn unmask_event(&self, bit: u32) {
        self.aen_masked.fetch_and(!bit, Ordering::AcqRel);
    }

    /// Record a namespace change and raise Namespace Attribute Changed.
    pub fn namespace_changed(&self, nsid: u32) {
        {
            let mut c = self.changed_ns.lock().unwrap_or_else(|e| e.into_inner());
            if !c.overflow && !c.list.contains(&nsid) {
                if c.list.len() < CHANGED_NS_MAX {
                    c.list.push(nsid);
                } else {
                    c.overflow = true;
                }
            }
        }
        self.raise_event(AEN_NS_ATTR);
    }

    /// A reservation notification for namespace `nsid`: logged (log page
    /// 80h) and announced, unless the host masked that kind for the
    /// namespace (feature 82h). Any thread.
    pub fn reservation_notice(&self, nsid: u32, kind: crate::reservation::NoticeKind) {
        {
            let mut r = self.resv.lock().unwrap_or_else(|e| e.into_inner());
            if r.masks.get(&nsid).copied().unwrap_or(0) & kind.mask_bit() != 0 {
                return;
            }
            r.count = r.count.wrapping_add(1).max(1);
            let count = r.count;
            if r.queue.len() >= RESV_LOG_MAX {
                r.queue.pop_front();
            }
            r.queue.push_back((count, kind as u8, nsid));
        }
        self.raise_event(AEN_RESERVATION);
    }

    /// The next Reservation Notification log page (an empty one, count 0,
    /// when none waits); taken off the queue.
    pub(crate) fn take_reservation_notice(&self) -> ResvLogEntry {
        let mut r = self.resv.lock().unwrap_or_else(|e| e.into_inner());
        match r.queue.pop_front() {
            Some((count, kind, nsid)) => ResvLogEntry {
                count,
                kind,
                available: r.queue.len().min(255) as u8,
                nsid,
            },
            None => ResvLogEntry {
                count: 0,
                kind: 0,
                available: 0,
                nsid: 0,
            },
        }
    }

    /// Reservation Notification Mask of namespace `nsid` (feature 82h).
    pub fn reservation_mask(&self, nsid: u32) -> u32 {
        let r = self.resv.lock().unwrap_or_else(|e| e.into_inner());
        r.masks.get(&nsid).copied().unwrap_or(0)
    }

    /// Sets the mask of each namespace in `nsids`.
    pub(crate) fn set_reservation_mask(&self, nsids: &[u32], mask: u32) {
        let mut r = self.resv.lock().unwrap_or_else(|e| e.into_inner());
        for &n in nsids {
            r.masks.insert(n, mask);
        }
    }

    // ---- Abort of I/O commands ----

    /// Queues an Abort for I/O queue `ask.sqid`; gives it back when
    /// [`ABORT_LIMIT`] are already waiting.
    /// Fails (giving the ask back) when that queue is not connected: the
    /// caller answers "not aborted" at once.
    pub(crate) fn ask_abort(&self, ask: AbortAsk) -> Result<(), AbortAsk> {
        // Lock order: the queue table, then the aborts (as in release).
        let q = self.io_queues.lock().unwrap_or_else(|e| e.into_inner());
        if !q.get(usize::from(ask.sqid)).copied().unwrap_or(false) || ask.sqid == 0 {
            return Err(ask);
        }
        let mut a = self.aborts.lock().unwrap_or_else(|e| e.into_inner());
        if a.len() >= ABORT_LIMIT {
            return Err(ask);
        }
        a.push(ask);
        self.abort_asked.store(true, Ordering::Release);
        Ok(())
    }

    /// Some Abort waits for an I/O queue (one relaxed load).
    #[inline]
    pub fn abort_asked(&self) -> bool {
        self.abort_asked.load(Ordering::Relaxed)
    }

    /// Takes the Aborts waiting for I/O queue `sqid`.
    pub(crate) fn take_aborts(&self, sqid: u16) -> Vec<AbortAsk> {
        let mut a = self.aborts.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest): (Vec<_>, Vec<_>) = a.drain(..).partition(|x| x.sqid == sqid);
        *a = rest;
        self.abort_asked.store(!a.is_empty(), Ordering::Release);
        mine
    }

    /// Take the Changed Namespace List (and clear it): up to 1024 NSIDs, or
    /// a single 0xFFFFFFFF when more changed.
    pub(crate) fn take_changed_namespaces(&self) -> Vec<u32> {
        let mut c = self.changed_ns.lock().unwrap_or_else(|e| e.into_inner());
        let out = if c.overflow {
            vec![0xFFFF_FFFF]
        } else {
            std::mem::take(&mut c.list)
        };
        c.list.clear();
        c.overflow = false;
        out
    }

    // ---- statistics ----

    /// Fold a closed queue's counters into the controller totals.
    pub(crate) fn fold_stats(&self, s: &QueueStats) {
        let st = &self.stats;
        st.commands.fetch_add(s.commands, Ordering::Relaxed);
        st.reads.fetch_add(s.reads, Ordering::Relaxed);
        st.writes.fetch_add(s.writes, Ordering::Relaxed);
        st.bytes_read.fetch_add(s.bytes_read, Ordering::Relaxed);
        st.bytes_written
            .fetch_add(s.bytes_written, Ordering::Relaxed);
        st.errors.fetch_add(s.errors, Ordering::Relaxed);
    }

    /// Totals of this controller's queues that have closed (open queues
    /// report their own counters through `QueuePair::stats`).
    pub fn closed_queue_stats(&self) -> QueueStats {
        let st = &self.stats;
        QueueStats {
            commands: st.commands.load(Ordering::Relaxed),
            reads: st.reads.load(Ordering::Relaxed),
            writes: st.writes.load(Ordering::Relaxed),
            bytes_read: st.bytes_read.load(Ordering::Relaxed),
            bytes_written: st.bytes_written.load(Ordering::Relaxed),
            errors: st.errors.load(Ordering::Relaxed),
            // Not kept per controller (see `stats`): per queue and per reactor.
            errors_by_status: ErrorTable::default(),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let Some(t) = self.admitted_by.upgrade() else {
            return;
        };
        // I/O queues hold the controller, so none is normally left; give
        // back whatever is, then the controller itself.
        let q = self.io_queues.get_mut().unwrap_or_else(|e| e.into_inner());
        for slot in q.iter_mut().filter(|s| **s) {
            *slot = false;
            t.release_io_queue(&self.hostnqn);
        }
        match self.budget() {
            Budget::Nvm => t.release_controller(&self.hostnqn),
            b @ (Budget::Discovery | Budget::Unauthenticated) => {
                t.release_pooled(b, self.close_reason() == Some(CloseReason::Evicted))
            }
            Budget::None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::NamespaceTable;
    use nvmf_config::SubsystemConfig;

    fn ctrl() -> Controller {
        let sub = Arc::new(Subsystem::new_nvm(
            &SubsystemConfig::new("nqn.2024-01.io.nvmfd:t"),
            NamespaceTable::new(),
        ));
        Controller::new(1, sub, "nqn.host", [0; 16], 4, 0)
    }

    #[test]
    fn events_are_masked_until_log_read() {
        let c = ctrl();
        assert_eq!(c.pending_events(), 0);
        c.namespace_changed(3);
        c.namespace_changed(3);
        c.namespace_changed(5);
        assert_eq!(c.take_event(), Some(AEN_NS_ATTR));
        assert_eq!(c.take_event(), None);
        c.namespace_changed(6);
        assert_eq!(c.pending_events(), 0, "masked until the log is read");
        assert_eq!(c.take_changed_namespaces(), vec![3, 5, 6]);
        assert!(c.take_changed_namespaces().is_empty());
        c.unmask_event(AEN_NS_ATTR);
        c.namespace_changed(7);
        assert_eq!(c.take_event(), Some(AEN_NS_ATTR));
        // Events the host disabled are not raised; unsupported ones neither.
        c.unmask_event(AEN_NS_ATTR);
        c.set_aen_enabled(0);
        c.raise_event(AEN_NS_ATTR);
        c.raise_event(AEN_DISC_CHANGE);
        assert_eq!(c.pending_events(), 0);
    }

    #[test]
    fn changed_list_overflow() {
        let c = ctrl();
        for nsid in 1..=(CHANGED_NS_MAX as u32 + 1) {
            c.namespace_changed(nsid);
        }
        assert_eq!(c.take_changed_namespaces(), vec![0xFFFF_FFFF]);
        assert!(c.take_changed_namespaces().is_empty());
    }

    #[test]
    fn io_queue_claims() {
        let c = ctrl();
        assert!(c.claim_io_queue(0).is_err());
        assert!(c.claim_io_queue(4).is_ok());
        assert!(c.claim_io_queue(4).is_err());
        assert!(c.claim_io_queue(5).is_err());
        c.set_num_io_queues(2);
        assert!(c.claim_io_queue(3).is_err());
        assert!(c.claim_io_queue(2).is_ok());
        assert_eq!(c.connected_io_queues(), 2);
        c.release_io_queue(4);
        c.release_io_queue(999);
        assert_eq!(c.connected_io_queues(), 1);
        c.set_num_io_queues(100);
        assert_eq!(c.num_io_queues(), 4, "never above the transport limit");
    }

    #[test]
    fn first_close_reason_wins() {
        let c = ctrl();
        assert!(!c.is_dead());
        c.kill(CloseReason::KeepAliveTimeout);
        c.kill(CloseReason::ControllerDestroyed);
        assert_eq!(c.close_reason(), Some(CloseReason::KeepAliveTimeout));
    }
}
