//! The target: everything one nvmfd process exports.
//!
//! Owns [`Target`] (backends by bdev name and their QoS limits, NVM subsystems, the discovery
//! subsystem, listen addresses and their port IDs, the discovery log
//! generation counter, the active controller count, connect-time admission
//! against [`HostLimits`]: controllers in total and per host NQN, I/O queues
//! per host NQN) and the limits of each transport type (`transport.rs`). Built once from `nvmf_config::TargetConfig` and shared by
//! every reactor as `Arc<Target>`. Runtime changes (namespaces, subsystems,
//! hosts, listeners, bdev sizes) go through methods here so controllers get
//! their asynchronous events. Bdev size changes a backend notices by itself
//! (`Backend::watch_size`, called on the backend's own thread) only become a
//! [`SizeChange`] message here; the daemon's control thread takes them
//! ([`Target::take_size_changes`]) and applies them
//! ([`Target::apply_size_change`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock, Weak};

use nvmf_config::{ListenerConfig, NamespaceConfig, TargetConfig, TransportType, DISCOVERY_NQN};

use crate::backend::{self, Backend};
use crate::controller::AEN_DISC_CHANGE;
use crate::error::CoreError;
use crate::namespace::{Namespace, NamespaceTable};
use crate::qos::BdevQos;
use crate::subsystem::Subsystem;
pub use crate::transport::TransportLimits;
use crate::transport::TransportTable;

/// Caps on what hosts may hold, checked at Fabrics Connect (control path).
/// 0 means unlimited (for the two pools: no pool, the oldest is never
/// evicted and nothing is refused).
///
/// Three budgets, so that what anybody can create does not use up what a
/// real host needs (issue 23):
/// - NVM controllers of hosts that need no authentication, or that have
///   authenticated: `max_controllers` in total, `max_controllers_per_host`
///   per host NQN (and their I/O queues per host NQN);
/// - discovery controllers: their own pool of `max_discovery_controllers`;
/// - NVM controllers whose host must still authenticate (DH-HMAC-CHAP):
///   their own pool of `max_unauthenticated_controllers`, not counted
///   against the host NQN (which is not secret) until the host has
///   authenticated.
///
/// A full pool makes room by evicting its oldest member (its queues close
/// with [`crate::controller::CloseReason::Evicted`]): whoever floods a pool
/// only ever evicts its own, and a real host that needs a few round trips
/// to authenticate or read the discovery log is not locked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimits {
    /// NVM controllers alive at once, all hosts together (authenticated or
    /// needing no authentication).
    pub max_controllers: usize,
    /// The same, per host NQN.
    pub max_controllers_per_host: usize,
    /// I/O queues connected at once with the same host NQN (all its
    /// controllers together; an I/O queue that must authenticate counts
    /// once it has).
    pub max_io_queues_per_host: usize,
    /// Discovery controllers alive at once (the oldest is evicted to make
    /// room).
    pub max_discovery_controllers: usize,
    /// NVM controllers whose host has not authenticated yet (the oldest is
    /// evicted to make room).
    pub max_unauthenticated_controllers: usize,
}

/// Default of [`HostLimits::max_controllers`].
pub const DEFAULT_MAX_CONTROLLERS: usize = 1024;
/// Default of [`HostLimits::max_controllers_per_host`].
pub const DEFAULT_MAX_CONTROLLERS_PER_HOST: usize = 64;
/// Default of [`HostLimits::max_io_queues_per_host`].
pub const DEFAULT_MAX_IO_QUEUES_PER_HOST: usize = 2048;
/// Default of [`HostLimits::max_discovery_controllers`].
pub const DEFAULT_MAX_DISCOVERY_CONTROLLERS: usize = 256;
/// Default of [`HostLimits::max_unauthenticated_controllers`].
pub const DEFAULT_MAX_UNAUTHENTICATED_CONTROLLERS: usize = 128;
/// Keep-alive timeout a discovery controller gets when the host asks for
/// none (KATO 0), so a silent discovery session is always reaped (nvmet
/// uses the same 120 s).
pub const DEFAULT_DISCOVERY_KATO_MS: u32 = 120_000;

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            max_controllers: DEFAULT_MAX_CONTROLLERS,
            max_controllers_per_host: DEFAULT_MAX_CONTROLLERS_PER_HOST,
            max_io_queues_per_host: DEFAULT_MAX_IO_QUEUES_PER_HOST,
            max_discovery_controllers: DEFAULT_MAX_DISCOVERY_CONTROLLERS,
            max_unauthenticated_controllers: DEFAULT_MAX_UNAUTHENTICATED_CONTROLLERS,
        }
    }
}

/// Which budget of [`HostLimits`] a controller is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Budget {
    /// Not counted (built outside a target's admission, e.g. unit tests).
    None = 0,
    /// `max_controllers` and `max_controllers_per_host`.
    Nvm = 1,
    /// `max_discovery_controllers`.
    Discovery = 2,
    /// `max_unauthenticated_controllers`.
    Unauthenticated = 3,
}

impl Budget {
    pub(crate) fn from_u8(v: u8) -> Budget {
        match v {
            1 => Budget::Nvm,
            2 => Budget::Discovery,
            3 => Budget::Unauthenticated,
            _ => Budget::None,
        }
    }
}

/// One evicting pool of controllers (discovery, or not yet authenticated),
/// oldest first. Members that went away are forgotten lazily; `count` is
/// exact (given back on drop), `evicting` counts those evicted and not yet
/// gone (their queues close on their next poll).
#[derive(Debug, Default)]
struct Pool {
    count: usize,
    evicting: usize,
    members: std::collections::VecDeque<Weak<crate::controller::Controller>>,
    evicted: u64,
}

impl Pool {
    /// Makes room for one more under `cap` (0: unlimited) by evicting the
    /// oldest live member that is still in this pool, then counts it.
    fn admit(&mut self, cap: usize, budget: Budget) -> Option<Arc<crate::controller::Controller>> {
        let mut victim = None;
        if cap != 0 && self.count.saturating_sub(self.evicting) >= cap {
            // Bounded: at most every member is looked at once.
            while let Some(w) = self.members.pop_front() {
                let Some(c) = w.upgrade() else { continue };
                if c.budget() != budget {
                    continue;
                }
                if c.kill_if_alive(crate::controller::CloseReason::Evicted) {
                    self.evicted += 1;
                    self.evicting += 1;
                    victim = Some(c);
                    break;
                }
            }
        }
        self.count += 1;
        victim
    }

    fn track(&mut self, c: &Arc<crate::controller::Controller>) {
        // Keep the list bounded by the live count: forget the dead first.
        if self.members.len() >= 2 * self.count.max(16) {
            self.members.retain(|w| w.strong_count() > 0);
        }
        self.members.push_back(Arc::downgrade(c));
    }

    fn release(&mut self, evicted: bool) {
        self.count = self.count.saturating_sub(1);
        if evicted {
            self.evicting = self.evicting.saturating_sub(1);
        }
    }
}

/// Which cap a Connect ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    /// [`HostLimits::max_controllers`].
    Controllers(usize),
    /// [`HostLimits::max_controllers_per_host`].
    ControllersPerHost(usize),
    /// [`HostLimits::max_io_queues_per_host`].
    IoQueuesPerHost(usize),
}

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitHit::Controllers(n) => write!(f, "{n} controllers in total (--max-controllers)"),
            LimitHit::ControllersPerHost(n) => {
                write!(
                    f,
                    "{n} controllers for this host NQN (--max-controllers-per-host)"
                )
            }
            LimitHit::IoQueuesPerHost(n) => {
                write!(
                    f,
                    "{n} I/O queues for this host NQN (--max-io-queues-per-host)"
                )
            }
        }
    }
}

/// How many Connects each cap of [`HostLimits`] refused since the start
/// ([`Target::limit_hits`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LimitHits {
    pub controllers: u64,
    pub controllers_per_host: u64,
    pub io_queues_per_host: u64,
}

impl LimitHits {
    fn count(&mut self, hit: LimitHit) {
        let n = match hit {
            LimitHit::Controllers(_) => &mut self.controllers,
            LimitHit::ControllersPerHost(_) => &mut self.controllers_per_host,
            LimitHit::IoQueuesPerHost(_) => &mut self.io_queues_per_host,
        };
        *n += 1;
    }
}

/// What the evicting controller pools hold ([`Target::pool_usage`]): their
/// members not evicted, and evictions so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolUsage {
    pub discovery: usize,
    pub unauthenticated: usize,
    pub discovery_evicted: u64,
    pub unauthenticated_evicted: u64,
}

/// Controllers and I/O queues one host NQN holds right now.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HostUsage {
    pub controllers: usize,
    pub io_queues: usize,
}

/// Default of [`Target::set_log_rate`].
pub const DEFAULT_REFUSAL_LOG_RATE: u32 = 20;

/// Rate limit of log lines a host can trigger with one command it repeats
/// as fast as it can send (refused Connects, unsupported CC values), all
/// reactors together.
#[derive(Debug)]
struct RefusalLog {
    per_sec: u32,
    window: Option<std::time::Instant>,
    used: u32,
    suppressed: u64,
}

/// Connect-time bookkeeping (one lock, taken on Connect and teardown only).
#[derive(Debug, Default)]
struct Admission {
    limits: HostLimits,
    /// Connects refused by each cap so far (`/metrics`).
    hits: LimitHits,
    controllers: usize,
    /// Only hosts holding something have an entry (bounded by the caps).
    per_host: HashMap<String, HostUsage>,
    discovery: Pool,
    unauthenticated: Pool,
}

/// A backend reported a new size by itself (its `watch_size` hook): sent to
/// the control plane, applied there with [`Target::apply_size_change`].
#[derive(Debug, Clone)]
pub struct SizeChange {
    /// The bdev's name.
    pub bdev: String,
    /// The backend that reported it (a change from a backend since replaced
    /// or removed is dropped).
    pub backend: Weak<dyn Backend>,
    /// The new size in blocks as reported (applying uses the backend's
    /// `num_blocks()` at that moment, which backends keep current).
    pub num_blocks: u64,
}

fn policy_bits(p: crate::auth::AuthPolicy) -> u32 {
    u32::from(p.digests) | (u32::from(p.dhgroups) << 8)
}

/// The whole target. Shared by all reactors as `Arc<Target>`.
#[derive(Debug)]
pub struct Target {
    /// Limits of each transport type (from its `TransportConfig`).
    limits: TransportTable,
    backends: Mutex<BTreeMap<String, Arc<dyn Backend>>>,
    /// QoS limits by bdev name (made on first use; a namespace takes its
    /// bdev's when it is built, so all namespaces on a bdev share them).
    qos: Mutex<BTreeMap<String, Arc<BdevQos>>>,
    /// Where backends' size hooks send (a clone per hook).
    size_tx: Mutex<Sender<SizeChange>>,
    /// The other end, until the control plane takes it.
    size_rx: Mutex<Option<Receiver<SizeChange>>>,
    subsystems: RwLock<Vec<Arc<Subsystem>>>,
    discovery: Arc<Subsystem>,
    /// Every distinct listen address ever used; a listener's port ID is its
    /// index + 1 (append-only, so port IDs stay stable at run time).
    ports: RwLock<Vec<ListenerConfig>>,
    discovery_genctr: AtomicU64,
    active_controllers: AtomicUsize,
    admission: Mutex<Admission>,
    discovery_kato_ms: AtomicU32,
    refusal_log: Mutex<RefusalLog>,
    /// DH-HMAC-CHAP digests (low byte) and DH groups (high byte) allowed
    /// (`nvmf_set_config`).
    auth_policy: AtomicU32,
    /// TLS: secure listen addresses and hosts' PSKs (replaced whole on
    /// every configuration change).
    tls: RwLock<Arc<crate::tls::TlsTable>>,
}

impl Target {
    /// Build the target: backends, subsystems with their namespaces, the
    /// discovery subsystem.
    pub fn from_config(cfg: &TargetConfig) -> Result<Arc<Target>, CoreError> {
        let limits = TransportTable::from_config(&cfg.transports);

        let (size_tx, size_rx) = channel();
        let mut backends: BTreeMap<String, Arc<dyn Backend>> = BTreeMap::new();
        for b in &cfg.bdevs {
            if backends.contains_key(&b.name) {
                return Err(CoreError::DuplicateBdev(b.name.clone()));
            }
            let created = backend::create(b)?;
            watch_size(&b.name, &created, &size_tx);
            backends.insert(b.name.clone(), created);
        }

        let mut qos: BTreeMap<String, Arc<BdevQos>> = BTreeMap::new();
        for (name, l) in &cfg.bdev_qos {
            let q = qos.entry(name.clone()).or_default();
            q.set_limits(l);
        }

        let mut subsystems: Vec<Arc<Subsystem>> = Vec::new();
        for s in &cfg.subsystems {
            let serr = |reason: &str| CoreError::Subsystem {
                nqn: s.nqn.clone(),
                reason: reason.to_string(),
            };
            if s.nqn == DISCOVERY_NQN {
                return Err(serr("the discovery NQN cannot be an NVM subsystem"));
            }
            if subsystems.iter().any(|x| x.nqn() == s.nqn) {
                return Err(serr("defined twice"));
            }
            let max = s.max_namespaces.max(1);
            let mut table = NamespaceTable::new();
            for n in &s.namespaces {
                let ns = build_namespace(&s.nqn, max, n, &backends, &mut qos)?;
                if table.get(n.nsid).is_some() {
                    return Err(CoreError::Namespace {
                        nqn: s.nqn.clone(),
                        nsid: n.nsid,
                        reason: "NSID used twice".to_string(),
                    });
                }
                table = table.with(Arc::new(ns));
            }
            let sub = Arc::new(Subsystem::new_nvm(s, table));
            sub.sync_ana(s);
            subsystems.push(sub);
        }

        let discovery = Arc::new(Subsystem::new_discovery(cfg.discovery_listeners.clone()));

        let mut ports: Vec<ListenerConfig> = Vec::new();
        let all = discovery
            .listeners()
            .into_iter()
            .chain(subsystems.iter().flat_map(|s| s.listeners()));
        for l in all {
            if !ports.contains(&l) {
                ports.push(l);
            }
        }

        Ok(Arc::new(Target {
            limits,
            backends: Mutex::new(backends),
            qos: Mutex::new(qos),
            size_tx: Mutex::new(size_tx),
            size_rx: Mutex::new(Some(size_rx)),
            subsystems: RwLock::new(subsystems),
            discovery,
            ports: RwLock::new(ports),
            discovery_genctr: AtomicU64::new(1),
            active_controllers: AtomicUsize::new(0),
            admission: Mutex::new(Admission::default()),
            discovery_kato_ms: AtomicU32::new(DEFAULT_DISCOVERY_KATO_MS),
            refusal_log: Mutex::new(RefusalLog {
                per_sec: DEFAULT_REFUSAL_LOG_RATE,
                window: None,
                used: 0,
                suppressed: 0,
            }),
            auth_policy: AtomicU32::new(policy_bits(crate::auth::AuthPolicy::default())),
            tls: RwLock::new(Arc::new(crate::tls::TlsTable::default())),
        }))
    }

    /// NVMe/TCP's limits (its transport configuration, or the default).
    /// Code serving a connection asks [`Target::limits_for`] its own
    /// transport type instead.
    pub fn limits(&self) -> &TransportLimits {
        self.limits.get(TransportType::Tcp)
    }

    /// The limits of transport type `trtype` (its configuration, or that
    /// transport's defaults).
    pub fn limits_for(&self, trtype: TransportType) -> &TransportLimits {
        self.limits.get(trtype)
    }

    /// Controllers alive right now (NVM and discovery).
    pub fn active_controllers(&self) -> usize {
        self.active_controllers.load(Ordering::Acquire)
    }

    pub(crate) fn controller_created(&self) -> usize {
        self.active_controllers.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(crate) fn controller_destroyed(&self) -> usize {
        let prev = self
            .active_controllers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or(0);
        prev.saturating_sub(1)
    }

    /// Caps checked at Connect (existing controllers and queues are kept
    /// when lowered).
    pub fn set_host_limits(&self, limits: HostLimits) {
        self.admission().limits = limits;
    }

    pub fn host_limits(&self) -> HostLimits {
        self.admission().limits
    }

    /// Keep-alive timeout given to a discovery controller whose host asks
    /// for none (Connect KATO 0 or Set Features Keep Alive Timer 0).
    /// 0 is taken as the default (discovery controllers are always reaped).
    pub fn set_discovery_kato_ms(&self, ms: u32) {
        let ms = if ms == 0 {
            DEFAULT_DISCOVERY_KATO_MS
        } else {
            ms
        };
        self.discovery_kato_ms.store(ms, Ordering::Release);
    }

    pub fn discovery_kato_ms(&self) -> u32 {
        self.discovery_kato_ms.load(Ordering::Acquire)
    }

    /// The DH-HMAC-CHAP digests and DH groups the target accepts from now
    /// on (transactions already past negotiation keep theirs).
    pub fn set_auth_policy(&self, p: crate::auth::AuthPolicy) {
        self.auth_policy.store(policy_bits(p), Ordering::Release);
    }

    /// Installs the TLS state of a configuration (`tls::load_tls`).
    pub fn set_tls(&self, t: Arc<crate::tls::TlsTable>) {
        *self.tls.write().unwrap_or_else(|e| e.into_inner()) = t;
    }

    /// The TLS state now in force.
    pub fn tls(&self) -> Arc<crate::tls::TlsTable> {
        self.tls.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The DH-HMAC-CHAP digests and DH groups the target accepts.
    pub fn auth_policy(&self) -> crate::auth::AuthPolicy {
        let v = self.auth_policy.load(Ordering::Acquire);
        crate::auth::AuthPolicy {
            digests: v as u8,
            dhgroups: (v >> 8) as u8,
        }
    }

    /// Set (or with `None` clear) the DH-HMAC-CHAP keys of `host` on
    /// subsystem `nqn`. New Connects and re-authentications use them;
    /// queues already authenticated stay connected.
    pub fn set_host_keys(
        &self,
        nqn: &str,
        host: &str,
        keys: Option<crate::auth::HostKeys>,
    ) -> Result<(), CoreError> {
        self.nvm_subsystem(nqn)?.set_host_keys(host, keys);
        Ok(())
    }

    /// Lines about refused Connects and unsupported CC values logged per
    /// second at most (0 = no limit); the rest are counted and reported in
    /// one line when the next second opens.
    pub fn set_log_rate(&self, per_sec: u32) {
        self.refusal_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .per_sec = per_sec;
    }

    /// Runs `log` (a refused Connect, an unsupported CC value) unless this second's budget is
    /// spent (control path: one small lock).
    pub fn refusal_log(&self, log: impl FnOnce()) {
        let mut r = self.refusal_log.lock().unwrap_or_else(|e| e.into_inner());
        if r.per_sec == 0 {
            drop(r);
            return log();
        }
        let now = std::time::Instant::now();
        if r.window
            .is_none_or(|w| now.saturating_duration_since(w).as_secs() >= 1)
        {
            r.window = Some(now);
            r.used = 0;
            let k = std::mem::take(&mut r.suppressed);
            if k > 0 {
                tracing::warn!(
                    "suppressed {k} similar host error messages (refused Connects, bad CC)"
                );
            }
        }
        if r.used < r.per_sec {
            r.used += 1;
            drop(r);
            log();
        } else {
            r.suppressed += 1;
        }
    }

    /// Connects refused by each host cap so far.
    pub fn limit_hits(&self) -> LimitHits {
        self.admission().hits
    }

    /// What `hostnqn` holds right now.
    pub fn host_usage(&self, hostnqn: &str) -> HostUsage {
        self.admission()
            .per_host
            .get(hostnqn)
            .copied()
            .unwrap_or_default()
    }

    fn admission(&self) -> std::sync::MutexGuard<'_, Admission> {
        self.admission.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserve a controller for `hostnqn` (released by `release_controller`).
    pub(crate) fn admit_controller(&self, hostnqn: &str) -> Result<(), LimitHit> {
        Self::admit_locked(&mut self.admission(), hostnqn)
    }

    fn admit_locked(a: &mut Admission, hostnqn: &str) -> Result<(), LimitHit> {
        let l = a.limits;
        let hit = if l.max_controllers != 0 && a.controllers >= l.max_controllers {
            Some(LimitHit::Controllers(l.max_controllers))
        } else {
            let cur = a.per_host.get(hostnqn).map_or(0, |u| u.controllers);
            (l.max_controllers_per_host != 0 && cur >= l.max_controllers_per_host)
                .then_some(LimitHit::ControllersPerHost(l.max_controllers_per_host))
        };
        if let Some(hit) = hit {
            a.hits.count(hit);
            return Err(hit);
        }
        a.controllers += 1;
        a.per_host
            .entry(hostnqn.to_string())
            .or_default()
            .controllers += 1;
        Ok(())
    }

    /// Counts a controller of `budget` in its evicting pool (discovery, or
    /// not yet authenticated), evicting the pool's oldest member when it is
    /// full (that controller's queues close on their next poll).
    pub(crate) fn admit_pooled(&self, budget: Budget) {
        let victim = {
            let mut a = self.admission();
            let (pool, cap) = match budget {
                Budget::Discovery => {
                    let cap = a.limits.max_discovery_controllers;
                    (&mut a.discovery, cap)
                }
                Budget::Unauthenticated => {
                    let cap = a.limits.max_unauthenticated_controllers;
                    (&mut a.unauthenticated, cap)
                }
                Budget::Nvm | Budget::None => return,
            };
            pool.admit(cap, budget)
        };
        if let Some(v) = victim {
            self.refusal_log(|| {
                tracing::warn!(
                    cntlid = v.cntlid(),
                    hostnqn = %v.hostnqn(),
                    subnqn = %v.subsystem().nqn(),
                    pool = ?budget,
                    "controller pool full: its oldest controller evicted"
                )
            });
        }
    }

    /// Remembers `c` (counted by [`Target::admit_pooled`]) as the newest
    /// member of its pool.
    pub(crate) fn track_pooled(&self, c: &Arc<crate::controller::Controller>) {
        let mut a = self.admission();
        match c.budget() {
            Budget::Discovery => a.discovery.track(c),
            Budget::Unauthenticated => a.unauthenticated.track(c),
            Budget::Nvm | Budget::None => {}
        }
    }

    /// Gives back a pooled controller's place (`evicted`: it was evicted).
    pub(crate) fn release_pooled(&self, budget: Budget, evicted: bool) {
        let mut a = self.admission();
        match budget {
            Budget::Discovery => a.discovery.release(evicted),
            Budget::Unauthenticated => a.unauthenticated.release(evicted),
            Budget::Nvm | Budget::None => {}
        }
    }

    /// A controller's host authenticated: it moves from the unauthenticated
    /// pool to the NVM budget of its host NQN. Fails (the controller
    /// stays in the pool) when that is over a cap.
    pub(crate) fn promote_controller(
        &self,
        c: &crate::controller::Controller,
    ) -> Result<(), LimitHit> {
        // Under the admission lock: an eviction (which also takes it) sees
        // either a pooled controller or a promoted one, never both.
        let mut a = self.admission();
        if c.budget() != Budget::Unauthenticated || c.is_dead() {
            // Re-authentication, or already going away (evicted: its pool
            // gives its place back when it drops).
            return Ok(());
        }
        Self::admit_locked(&mut a, c.hostnqn())?;
        a.unauthenticated.release(false);
        c.set_budget(Budget::Nvm);
        Ok(())
    }

    /// Controllers in the discovery pool and in the unauthenticated pool,
    /// and how many each has evicted so far.
    pub fn pool_usage(&self) -> PoolUsage {
        let a = self.admission();
        PoolUsage {
            discovery: a.discovery.count - a.discovery.evicting,
            unauthenticated: a.unauthenticated.count - a.unauthenticated.evicting,
            discovery_evicted: a.discovery.evicted,
            unauthenticated_evicted: a.unauthenticated.evicted,
        }
    }

    pub(crate) fn release_controller(&self, hostnqn: &str) {
        let mut a = self.admission();
        a.controllers = a.controllers.saturating_sub(1);
        if let Some(u) = a.per_host.get_mut(hostnqn) {
            u.controllers = u.controllers.saturating_sub(1);
            if *u == HostUsage::default() {
                a.per_host.remove(hostnqn);
            }
        }
    }

    /// I/O queues `hostnqn` may still connect under its per-host limit
    /// (None: unlimited). Set Features Number of Queues offers no more, so
    /// a well-behaved host creates only queues it can connect.
    pub fn io_queue_budget(&self, hostnqn: &str) -> Option<usize> {
        let a = self.admission();
        let max = a.limits.max_io_queues_per_host;
        (max != 0).then(|| {
            let used = a.per_host.get(hostnqn).map_or(0, |u| u.io_queues);
            max.saturating_sub(used)
        })
    }

    /// Reserve an I/O queue for `hostnqn` (released by `release_io_queue`).
    pub(crate) fn admit_io_queue(&self, hostnqn: &str) -> Result<(), LimitHit> {
        let mut guard = self.admission();
        let a = &mut *guard;
        let max = a.limits.max_io_queues_per_host;
        let u = a.per_host.entry(hostnqn.to_string()).or_default();
        if max != 0 && u.io_queues >= max {
            a.hits.count(LimitHit::IoQueuesPerHost(max));
            return Err(LimitHit::IoQueuesPerHost(max));
        }
        u.io_queues += 1;
        Ok(())
    }

    pub(crate) fn release_io_queue(&self, hostnqn: &str) {
        let mut a = self.admission();
        if let Some(u) = a.per_host.get_mut(hostnqn) {
            u.io_queues = u.io_queues.saturating_sub(1);
            if *u == HostUsage::default() {
                a.per_host.remove(hostnqn);
            }
        }
    }

    /// The subsystem with this NQN (the discovery NQN names the discovery subsystem).
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        let subs = self.subsystems.read().unwrap_or_else(|e| e.into_inner());
        subs.iter().find(|s| s.nqn() == nqn).cloned()
    }

    /// NVM subsystems, in configuration order.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The discovery subsystem.
    pub fn discovery_subsystem(&self) -> &Arc<Subsystem> {
        &self.discovery
    }

    /// The backend of a bdev.
    pub fn backend(&self, name: &str) -> Option<Arc<dyn Backend>> {
        let b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        b.get(name).cloned()
    }

    /// Every distinct listen address (discovery and subsystems): what the
    /// daemon binds.
    pub fn listen_addresses(&self) -> Vec<ListenerConfig> {
        let mut all = self.discovery.listeners();
        for s in self.subsystems() {
            for l in s.listeners() {
                if !all.contains(&l) {
                    all.push(l);
                }
            }
        }
        all
    }

    /// Port ID of a listen address (1-based index; 0 if unknown). An address
    /// that is not configured itself matches a wildcard listener on the same
    /// service ID (a connection's local address on a `0.0.0.0` listener).
    pub fn port_id(&self, trsvcid: &str, traddr: &str) -> u16 {
        let ports = self.ports.read().unwrap_or_else(|e| e.into_inner());
        let exact = ports
            .iter()
            .position(|p| p.trsvcid == trsvcid && p.traddr == traddr);
        let wildcard = || {
            ports
                .iter()
                .position(|p| p.trsvcid == trsvcid && crate::discovery::is_wildcard(&p.traddr))
        };
        exact
            .or_else(wildcard)
            .map(|i| (i + 1).min(u16::MAX as usize) as u16)
            .unwrap_or(0)
    }

    /// Discovery log generation counter.
    pub fn discovery_generation(&self) -> u64 {
        self.discovery_genctr.load(Ordering::Acquire)
    }

    /// The discovery log changed (subsystem, host or listener added or
    /// removed): bump the generation and raise Discovery Log Page Change on
    /// every discovery controller.
    pub fn notify_discovery_change(&self) {
        self.discovery_genctr.fetch_add(1, Ordering::AcqRel);
        for c in self.discovery.controllers() {
            c.raise_event(AEN_DISC_CHANGE);
        }
    }

    /// Add a namespace to a subsystem at run time (the backend must exist).
    /// Controllers of the subsystem get Namespace Attribute Changed.
    pub fn add_namespace(&self, nqn: &str, ns: &NamespaceConfig) -> Result<(), CoreError> {
        self.add_namespace_visible(nqn, ns, crate::visibility::NsVisibility::All)
    }

    /// Add a namespace seen only by the hosts `v` names (`no_auto_visible`;
    /// all hosts with `NsVisibility::All`). Only their controllers get
    /// Namespace Attribute Changed.
    pub fn add_namespace_visible(
        &self,
        nqn: &str,
        ns: &NamespaceConfig,
        v: crate::visibility::NsVisibility,
    ) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .filter(|s| !s.is_discovery())
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        let mut qos = self.qos.lock().unwrap_or_else(|e| e.into_inner());
        let built = build_namespace(nqn, sub.max_namespaces(), ns, &backends, &mut qos)?;
        drop(qos);
        drop(backends);
        sub.add_namespace_visible(Arc::new(built), v)
    }

    /// Apply subsystem `cfg.nqn`'s visibility rules (`ns_visibility`) to its
    /// namespaces; controllers of hosts that gain or lose a namespace are
    /// told. Returns how many controllers were told.
    pub fn sync_visibility(&self, cfg: &nvmf_config::SubsystemConfig) -> Result<usize, CoreError> {
        let sub = self
            .subsystem(&cfg.nqn)
            .filter(|s| !s.is_discovery())
            .ok_or_else(|| CoreError::UnknownSubsystem(cfg.nqn.clone()))?;
        Ok(sub.sync_visibility(cfg))
    }

    /// Remove a namespace at run time. In-flight I/O finishes; new I/O gets
    /// Internal Path Error until the queues see the new table, then Invalid
    /// Namespace. Controllers get Namespace Attribute Changed.
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .filter(|s| !s.is_discovery())
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        sub.remove_namespace(nsid).map(|_| ())
    }
}

/// Runtime changes (control path: the RPC thread; each takes a lock or two,
/// never one a reactor holds per I/O).
impl Target {
    /// Create a backend for a new bdev. Creation may be slow (an rbd image
    /// is opened over the network): it runs without holding the backend
    /// table's lock.
    pub fn add_backend(&self, cfg: &nvmf_config::BdevConfig) -> Result<(), CoreError> {
        if self.backend(&cfg.name).is_some() {
            return Err(CoreError::DuplicateBdev(cfg.name.clone()));
        }
        let backend = backend::create(cfg)?;
        self.insert_backend(&cfg.name, backend)
    }

    /// Serve an already-made backend as bdev `name` (what `add_backend`
    /// does after creating one; also for embedders and tests with their own
    /// `Backend`). Its size changes are watched (see [`SizeChange`]).
    pub fn insert_backend(&self, name: &str, backend: Arc<dyn Backend>) -> Result<(), CoreError> {
        let mut b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        if b.contains_key(name) {
            return Err(CoreError::DuplicateBdev(name.to_string()));
        }
        let tx = self
            .size_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        watch_size(name, &backend, &tx);
        b.insert(name.to_string(), backend);
        Ok(())
    }

    /// The size changes backends report by themselves, for the control
    /// thread that applies them (`apply_size_change`); `Some` only once.
    pub fn take_size_changes(&self) -> Option<Receiver<SizeChange>> {
        self.size_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Apply a size change a backend reported: every namespace on that bdev
    /// takes the new size and its controllers are told (Changed Namespace
    /// List, Namespace Attribute Changed). Returns (NQN, NSID) of each
    /// namespace whose size changed; nothing when the bdev has since been
    /// replaced or removed.
    pub fn apply_size_change(&self, change: &SizeChange) -> Vec<(String, u32)> {
        let Some(reporter) = change.backend.upgrade() else {
            return Vec::new();
        };
        match self.backend(&change.bdev) {
            // The backend's size now, not the reported one: a report that
            // arrives after a later resize must not take the size back.
            Some(cur) if std::ptr::addr_eq(Arc::as_ptr(&cur), Arc::as_ptr(&reporter)) => {
                self.announce_size(&cur, cur.num_blocks())
            }
            _ => Vec::new(),
        }
    }

    /// Resize bdev `name` to `num_blocks` blocks (`Backend::resize`: may
    /// block for a cluster round trip; control plane only), then announce
    /// the new size as [`Target::apply_size_change`] does.
    pub fn resize_bdev(
        &self,
        name: &str,
        num_blocks: u64,
    ) -> Result<Vec<(String, u32)>, CoreError> {
        let b = self.backend(name).ok_or_else(|| CoreError::Bdev {
            name: name.to_string(),
            reason: "no such bdev".to_string(),
        })?;
        b.resize(num_blocks)?;
        Ok(self.announce_size(&b, num_blocks))
    }

    /// The current size in blocks of bdev `name` (its backend's).
    pub fn bdev_num_blocks(&self, name: &str) -> Option<u64> {
        self.backend(name).map(|b| b.num_blocks())
    }

    fn announce_size(&self, backend: &Arc<dyn Backend>, num_blocks: u64) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for s in self.subsystems() {
            for nsid in s.resize_backend(backend, num_blocks) {
                out.push((s.nqn().to_string(), nsid));
            }
        }
        out
    }

    /// Forget a bdev's backend. Namespaces still holding it (none, when the
    /// caller checked) keep it alive until they go.
    pub fn remove_backend(&self, name: &str) -> bool {
        let mut b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        b.remove(name).is_some()
    }

    /// The QoS state of bdev `name` (made without limits if it had none):
    /// what its namespaces share.
    pub fn bdev_qos(&self, name: &str) -> Arc<BdevQos> {
        let mut q = self.qos.lock().unwrap_or_else(|e| e.into_inner());
        q.entry(name.to_string()).or_default().clone()
    }

    /// Forgets bdev `name`'s QoS state (the bdev was deleted; namespaces
    /// still holding it keep theirs until they go).
    pub fn remove_bdev_qos(&self, name: &str) {
        let mut q = self.qos.lock().unwrap_or_else(|e| e.into_inner());
        q.remove(name);
    }

    /// Sets bdev `name`'s QoS limits, live: every queue serving a namespace
    /// on it applies them to its next command, and commands waiting for
    /// tokens are tried again on the next time slice. Kept by name, so a
    /// bdev that is redefined keeps them; all zero turns QoS off.
    pub fn set_bdev_qos(&self, name: &str, limits: &nvmf_config::QosLimits) {
        self.bdev_qos(name).set_limits(limits);
    }

    /// Names of the bdevs with a backend.
    pub fn backend_names(&self) -> Vec<String> {
        let b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        b.keys().cloned().collect()
    }

    /// Add an NVM subsystem with its namespaces, hosts and listeners.
    pub fn add_subsystem(&self, cfg: &nvmf_config::SubsystemConfig) -> Result<(), CoreError> {
        let serr = |reason: &str| CoreError::Subsystem {
            nqn: cfg.nqn.clone(),
            reason: reason.to_string(),
        };
        if cfg.nqn == DISCOVERY_NQN {
            return Err(serr("the discovery NQN cannot be an NVM subsystem"));
        }
        let max = cfg.max_namespaces.max(1);
        let mut table = NamespaceTable::new();
        {
            let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
            let mut qos = self.qos.lock().unwrap_or_else(|e| e.into_inner());
            for n in &cfg.namespaces {
                if table.get(n.nsid).is_some() {
                    return Err(CoreError::Namespace {
                        nqn: cfg.nqn.clone(),
                        nsid: n.nsid,
                        reason: "NSID used twice".to_string(),
                    });
                }
                table = table.with(Arc::new(build_namespace(
                    &cfg.nqn, max, n, &backends, &mut qos,
                )?));
            }
        }
        {
            let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
            if subs.iter().any(|s| s.nqn() == cfg.nqn) {
                return Err(serr("already exists"));
            }
            let sub = Arc::new(Subsystem::new_nvm(cfg, table));
            sub.sync_ana(cfg);
            subs.push(sub);
        }
        for l in &cfg.listeners {
            self.note_port(l);
        }
        self.notify_discovery_change();
        Ok(())
    }

    /// Remove an NVM subsystem: its controllers are torn down (their queues
    /// close on the next reactor tick). Returns the removed subsystem.
    pub fn remove_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, CoreError> {
        let sub = {
            let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
            let pos = subs
                .iter()
                .position(|s| s.nqn() == nqn)
                .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
            subs.remove(pos)
        };
        // Controllers first: their queues take no new command from now on
        // and close on their next poll (the daemon polls them at once), so
        // the host resends what was unanswered elsewhere. A command that
        // raced past that check meets a namespace being removed: Internal
        // Path Error (io.rs), which a multipath host fails over.
        sub.disconnect_all(crate::controller::CloseReason::SubsystemRemoved);
        for ns in sub.namespaces().iter() {
            ns.set_state(crate::namespace::NamespaceState::Removing);
        }
        self.notify_discovery_change();
        Ok(sub)
    }

    /// Report `l` for subsystem `nqn` (the discovery NQN included).
    pub fn add_listener(&self, nqn: &str, l: &ListenerConfig) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        self.note_port(l);
        if sub.add_listener(l) {
            self.notify_discovery_change();
        }
        Ok(())
    }

    /// Stop reporting `l` for subsystem `nqn`.
    pub fn remove_listener(&self, nqn: &str, l: &ListenerConfig) -> Result<(), CoreError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))?;
        if sub.remove_listener(l) {
            self.notify_discovery_change();
        }
        Ok(())
    }

    /// Bring subsystem `cfg.nqn`'s ANA states and namespace groups to what
    /// `cfg` says; controllers that see a change get the ANA Change event.
    /// Returns whether anything changed.
    pub fn sync_ana(&self, cfg: &nvmf_config::SubsystemConfig) -> Result<bool, CoreError> {
        Ok(self.nvm_subsystem(&cfg.nqn)?.sync_ana(cfg))
    }

    /// Tells the hosts of every subsystem with ANA reporting that the
    /// gateway group's ANA states changed (ANA Change event).
    pub fn notify_group_ana(&self) {
        for s in self.subsystems() {
            if !s.is_discovery() {
                s.notify_group_ana();
            }
        }
    }

    /// Allow `host` on subsystem `nqn`.
    pub fn add_host(&self, nqn: &str, host: &str) -> Result<(), CoreError> {
        let sub = self.nvm_subsystem(nqn)?;
        sub.add_host(host);
        self.notify_discovery_change();
        Ok(())
    }

    /// Disallow `host` on subsystem `nqn` and disconnect its controllers there.
    pub fn remove_host(&self, nqn: &str, host: &str) -> Result<usize, CoreError> {
        let sub = self.nvm_subsystem(nqn)?;
        let n = sub.remove_host(host);
        self.notify_discovery_change();
        Ok(n)
    }

    /// Set allow_any_host of subsystem `nqn`.
    pub fn set_allow_any_host(&self, nqn: &str, allow: bool) -> Result<usize, CoreError> {
        let sub = self.nvm_subsystem(nqn)?;
        let n = sub.set_allow_any_host(allow);
        self.notify_discovery_change();
        Ok(n)
    }

    fn nvm_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, CoreError> {
        self.subsystem(nqn)
            .filter(|s| !s.is_discovery())
            .ok_or_else(|| CoreError::UnknownSubsystem(nqn.to_string()))
    }

    fn note_port(&self, l: &ListenerConfig) {
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        if !ports.contains(l) {
            ports.push(l.clone());
        }
    }
}

/// Ask `backend` to report size changes as [`SizeChange`] messages on `tx`
/// (the hook runs on the backend's thread: it only sends).
fn watch_size(name: &str, backend: &Arc<dyn Backend>, tx: &Sender<SizeChange>) {
    let tx = Mutex::new(tx.clone());
    let bdev = name.to_string();
    let weak = Arc::downgrade(backend);
    backend.watch_size(Arc::new(move |num_blocks| {
        let change = SizeChange {
            bdev: bdev.clone(),
            backend: weak.clone(),
            num_blocks,
        };
        // The receiver is gone only when the target is: nothing to tell.
        let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(change);
    }));
}

fn build_namespace(
    nqn: &str,
    max_namespaces: u32,
    n: &NamespaceConfig,
    backends: &BTreeMap<String, Arc<dyn Backend>>,
    qos: &mut BTreeMap<String, Arc<BdevQos>>,
) -> Result<Namespace, CoreError> {
    let err = |reason: String| CoreError::Namespace {
        nqn: nqn.to_string(),
        nsid: n.nsid,
        reason,
    };
    if n.nsid == 0 || n.nsid > max_namespaces {
        return Err(err(format!(
            "NSID must be 1..={max_namespaces} (max_namespaces)"
        )));
    }
    let backend = backends
        .get(&n.bdev_name)
        .cloned()
        .ok_or_else(|| err(format!("bdev {} not found", n.bdev_name)))?;
    let q = qos.entry(n.bdev_name.clone()).or_default().clone();
    let mut ns = Namespace::new(n.nsid, backend, n.nguid, n.eui64, n.uuid)
        .with_qos(q)
        .with_name(&n.bdev_name);
    if let Some(f) = &n.ptpl_file {
        ns = ns
            .with_ptpl_file(std::path::Path::new(f))
            .map_err(|e| err(format!("ptpl_file {e}")))?;
    }
    ns.set_anagrpid(n.anagrpid);
    Ok(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mdts_from_max_io_size() {
        let mut l = TransportLimits::default();
        for (size, mdts) in [
            (131_072, 5),
            (1 << 20, 8),
            (4096, 1),
            (8192, 1),
            (12288, 1),
            (65536, 4),
        ] {
            l.max_io_size = size;
            assert_eq!(l.mdts(), mdts, "max_io_size {size}");
        }
    }
}
