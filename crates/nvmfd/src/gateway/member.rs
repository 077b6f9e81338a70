//! This nvmfd as a member of a gateway group (docs/GATEWAY-GROUPS.md).
//!
//! Owns the member thread: it takes and renews this member's lease (a
//! `cls_lock` on `nvmfd.group.<name>.lease` named after the member),
//! fences itself when renewals stop succeeding (every ANA group it serves
//! goes inaccessible at L − δ after the last renewal that succeeded),
//! joins the shared record, probes the other members' leases, and carries
//! out what `gateway::plan` decides: a takeover (blocklist the old owner's
//! RADOS client, wait for the OSD map that carries it, then write the new
//! owner with a version guard) or a planned hand-over (inaccessible here,
//! counted writes drained, then the record changed; held back while hosts
//! connected to the group here have not connected to the receiver yet). It
//! sets this member's ANA states through the RPC service, like
//! `nvmf_subsystem_listener_set_ana_state`,
//! so hosts get the ANA Change event. Also the RPC side of `nvmf gw
//! status` / `nvmf gw move` ([`Handle`]) and the group's counters.
//!
//! Every RADOS call blocks: this thread and the RPC thread only, never a
//! reactor. A failed call is logged and retried on the next tick; only
//! renewals decide fencing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvmf_config::{AnaState, TargetConfig};
use nvmf_core::backend::rbd::group::{GroupObjects, LeaseError, Wake, Watch, WriteError};
use nvmf_core::target::Target;
use serde_json::{json, Value};
use tracing::{error, info, warn};

use super::doc::{Fenced, GroupDoc, Member};
use super::plan::{self, Action, View};
use super::{resv, shared};

/// Every member's listeners, by member ID.
type AllListeners = BTreeMap<String, shared::MemberListeners>;

/// The group configuration object's content: the shared part as a
/// `save_config` document, each member's listeners, who wrote it and when.
fn config_body(shared: &TargetConfig, listeners: &AllListeners, by: &str) -> Vec<u8> {
    let ls: serde_json::Map<String, Value> = listeners
        .iter()
        .map(|(m, l)| (m.clone(), shared::listeners_json(l)))
        .collect();
    serde_json::to_vec_pretty(&json!({
        "config": shared.to_json_value(),
        "listeners": ls,
        "by": by,
        "at": now_unix(),
    }))
    .unwrap_or_default()
}

/// Parses the group configuration object: the shared part and every
/// member's listeners.
fn parse_config_body(bytes: &[u8]) -> Result<(TargetConfig, AllListeners), String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let cfg = TargetConfig::from_json_value(&doc["config"]).map_err(|e| e.to_string())?;
    let mut all = AllListeners::new();
    if let Some(m) = doc["listeners"].as_object() {
        for (id, v) in m {
            let l = shared::listeners_from_json(v)
                .ok_or_else(|| format!("the listeners of member {id} do not parse"))?;
            all.insert(id.clone(), l);
        }
    }
    Ok((cfg, all))
}

/// How long a blocklist entry lasts: longer than any pause a frozen
/// process could come back from unnoticed.
pub const FENCE_EXPIRE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a hand-over waits for the group's writes to drain before it
/// gives up (the group is optimized here again).
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// Exit status of a member that learnt it was fenced: its supervisor
/// restarts it with a new RADOS client, which rejoins.
pub const EXIT_FENCED: i32 = 3;

/// `--gateway-group` and friends.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    pub name: String,
    pub id: String,
    /// The registered cluster (`bdev_rbd_register_cluster`) whose client
    /// the member and all its RBD namespaces use.
    pub cluster: String,
    pub pool: String,
    /// L: the lease duration.
    pub lease: Duration,
    /// ANA groups whose home this member claims when it first joins.
    pub home: BTreeSet<u32>,
    /// The longest a planned hand-over (failback, rebalancing) waits for
    /// the hosts of a group to connect to the member that receives it.
    pub failback_wait: Duration,
}

impl GroupOptions {
    /// R = L / 3.
    pub fn renew_every(&self) -> Duration {
        self.lease / 3
    }
    /// δ = L / 5.
    pub fn margin(&self) -> Duration {
        self.lease / 5
    }
    fn tick(&self) -> Duration {
        (self.lease / 12).clamp(Duration::from_millis(50), Duration::from_millis(500))
    }
    pub fn record_oid(&self) -> String {
        format!("nvmfd.group.{}", self.name)
    }
    pub fn lease_oid(&self) -> String {
        format!("nvmfd.group.{}.lease", self.name)
    }
    pub fn config_oid(&self) -> String {
        format!("nvmfd.group.{}.config", self.name)
    }
    /// Member `id`'s own status object (its last renewal, its listeners,
    /// the hosts connected to each ANA group it serves).
    pub fn member_oid(&self, id: &str) -> String {
        format!("nvmfd.group.{}.member.{id}", self.name)
    }
}

/// The group's counters, for `/metrics` and `nvmf gw status`.
#[derive(Debug, Default)]
pub struct Counters {
    pub renewals: AtomicU64,
    pub renewal_failures: AtomicU64,
    /// Sum of the successful renewals' round trips, in microseconds.
    pub renewal_us: AtomicU64,
    pub renewal_max_us: AtomicU64,
    pub self_fences: AtomicU64,
    pub fencings: AtomicU64,
    pub takeovers: AtomicU64,
    pub handovers: AtomicU64,
    pub rados_errors: AtomicU64,
    pub epoch: AtomicU64,
    pub owned: AtomicU64,
    pub fenced_now: AtomicU64,
}

/// What the RPC thread and `/metrics` reach.
pub struct Handle {
    pub opts: GroupOptions,
    objs: Arc<GroupObjects>,
    status: Mutex<Value>,
    pub counters: Counters,
    /// When the last successful renewal was sent (`None`: no lease yet).
    last_ok: Mutex<Option<Instant>>,
    /// Fenced by itself: every served group inaccessible here.
    fenced: AtomicBool,
    /// Held while ANA states are computed and set, so that a self-fence
    /// (watchdog thread) and the member thread never interleave.
    ana: Mutex<()>,
    service: Arc<nvmf_rpc::RpcService>,
    target: Arc<Target>,
    /// The ANA groups served here (they change with the configuration).
    groups: Mutex<BTreeSet<u32>>,
    /// The group configuration's version this member last read or wrote,
    /// and its shared part.
    config_seen: Mutex<Option<(u64, TargetConfig, AllListeners)>>,
    /// Raised by the watches on the record and the configuration: wakes
    /// the member thread before its tick ends.
    wake: Arc<Wake>,
    /// Objects to notify the other members about (the notifier thread).
    notify_tx: Mutex<std::sync::mpsc::Sender<String>>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("opts", &self.opts)
            .field("fenced", &self.fenced)
            .finish_non_exhaustive()
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Handle {
    /// The member's latest view (`nvmf_gateway_group_status`).
    pub fn status(&self) -> Value {
        let mut v = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Live, even while the member thread waits on the cluster.
        let last_ok = self.last_ok();
        v["lease_age_ms"] = json!(last_ok.map(|t| t.elapsed().as_millis() as u64));
        v["state"] = json!(if last_ok.is_none() {
            "joining"
        } else if self.fenced() {
            "self-fenced"
        } else {
            "serving"
        });
        let c = &self.counters;
        let n = c.renewals.load(Relaxed);
        v["counters"] = json!({
            "lease_renewals": n,
            "lease_renewal_failures": c.renewal_failures.load(Relaxed),
            "lease_renewal_avg_us": c.renewal_us.load(Relaxed).checked_div(n).unwrap_or(0),
            "lease_renewal_max_us": c.renewal_max_us.load(Relaxed),
            "self_fences": c.self_fences.load(Relaxed),
            "fencings": c.fencings.load(Relaxed),
            "takeovers": c.takeovers.load(Relaxed),
            "handovers": c.handovers.load(Relaxed),
            "rados_errors": c.rados_errors.load(Relaxed),
            "notifies_received": self.wake.notifies(),
        });
        v
    }

    /// Tells the other members that `oid` changed (from the notifier
    /// thread: a notify waits for every watcher's acknowledgement, up to a
    /// second for a dead one).
    fn changed(&self, oid: String) {
        let _ = self
            .notify_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(oid);
    }

    /// Notifies this member received from the others.
    pub fn notifies(&self) -> u64 {
        self.wake.notifies()
    }

    pub fn last_ok(&self) -> Option<Instant> {
        *self.last_ok.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_last_ok(&self, t: Instant) {
        *self.last_ok.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    }

    pub fn fenced(&self) -> bool {
        self.fenced.load(Relaxed)
    }

    /// Fences this member when no renewal succeeded for L − δ: every
    /// served group inaccessible. Called by the watchdog thread every tick,
    /// so it happens on time even while the member thread waits on an
    /// unreachable cluster.
    fn fence_self_if_due(&self) {
        let Some(ok) = self.last_ok() else { return };
        let o = &self.opts;
        if ok.elapsed() < o.lease - o.margin() || self.fenced() {
            return;
        }
        let _g = self.ana.lock().unwrap_or_else(|e| e.into_inner());
        if self.fenced.swap(true, Relaxed) {
            return;
        }
        self.counters.self_fences.fetch_add(1, Relaxed);
        self.counters.fenced_now.store(1, Relaxed);
        error!(
            group = %o.name, member = %o.id,
            "no lease renewal for {} ms: fencing itself (every ANA group here inaccessible) \
             before any survivor may take over",
            ok.elapsed().as_millis()
        );
        self.set_states(&self.all(AnaState::Inaccessible));
    }

    fn all(&self, s: AnaState) -> BTreeMap<u32, AnaState> {
        let g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().map(|g| (*g, s)).collect()
    }

    /// Publishes the shared part of `new` (a configuration an RPC is about
    /// to make live here) as the group's next configuration, unless it is
    /// the one the group has: written to RADOS first, guarded by the
    /// version this member last saw. An error refuses the RPC; nothing
    /// changed anywhere.
    pub fn publish_config(&self, new: &TargetConfig) -> Result<(), String> {
        let shared = shared::shared_part(new);
        let mine = shared::listeners_of(new);
        let mut seen = self.config_seen.lock().unwrap_or_else(|e| e.into_inner());
        let (expect, mut all) = match &*seen {
            Some((_, s, all)) if *s == shared && all.get(&self.opts.id) == Some(&mine) => {
                return Ok(())
            }
            Some((v, _, all)) => (*v, all.clone()),
            None => {
                return Err(format!(
                    "gateway group {}: this member has not read the group's configuration yet; \
                     try again in a moment",
                    self.opts.name
                ))
            }
        };
        served_groups(new, &self.opts)?;
        all.insert(self.opts.id.clone(), mine);
        let body = config_body(&shared, &all, &self.opts.id);
        match self
            .objs
            .write(&self.opts.config_oid(), &body, Some(expect))
        {
            Ok(v) => {
                info!(group = %self.opts.name, version = v, "group configuration changed here and published");
                *seen = Some((v, shared, all));
                self.changed(self.opts.config_oid());
                Ok(())
            }
            Err(WriteError::Conflict) => Err(format!(
                "gateway group {}: the group's configuration was changed on another member \
                 meanwhile; nothing was changed: try again",
                self.opts.name
            )),
            Err(WriteError::Failed(e)) => Err(format!(
                "gateway group {}: the group's configuration could not be written to RADOS \
                 ({e}); nothing was changed",
                self.opts.name
            )),
        }
    }

    /// Imposes `want` on every listener (the core's group ANA table: atomic
    /// stores, no RPC lock, so a self-fence never waits for a slow RPC),
    /// then raises the ANA Change event when anything changed. Callers hold
    /// `ana`.
    fn set_states(&self, want: &BTreeMap<u32, AnaState>) {
        let owned = want.values().filter(|s| **s == AnaState::Optimized).count() as u64;
        self.counters.owned.store(owned, Relaxed);
        let table = nvmf_core::ana::group_ana();
        let mut changed = Vec::new();
        for (&g, &state) in want {
            if table.set(g, state) {
                changed.push(format!("{g}={}", state.as_str()));
            }
        }
        if !changed.is_empty() {
            self.target.notify_group_ana();
            info!(group = %self.opts.name, "ANA states here: {}", changed.join(" "));
        }
    }

    /// `nvmf_gateway_group_move`: makes `to` the home of ANA group `g`; its
    /// owner then hands it over (planned, no fencing). Returns the record's
    /// epoch after the change.
    pub fn move_group(&self, g: u32, to: &str) -> Result<Value, String> {
        let oid = self.opts.record_oid();
        for _ in 0..8 {
            let (mut doc, version) = match self.objs.read(&oid)? {
                Some((b, v)) => (GroupDoc::parse(&b)?, v),
                None => return Err(format!("group {}: no record yet", self.opts.name)),
            };
            let m = doc
                .members
                .get(to)
                .ok_or_else(|| format!("group {}: no member \"{to}\"", self.opts.name))?;
            if !m.serves.contains(&g) {
                return Err(format!(
                    "member \"{to}\" does not serve ANA group {g} (it serves {:?})",
                    m.serves
                ));
            }
            let owner = doc
                .groups
                .get(&g)
                .and_then(|a| a.owner.as_ref())
                .map(|o| o.member.clone());
            doc.groups.entry(g).or_default().home = Some(to.to_string());
            match self.objs.write(&oid, &doc.to_bytes(), Some(version)) {
                Ok(_) => {
                    info!(group = %self.opts.name, anagrpid = g, to, "ANA group move requested");
                    self.changed(oid.clone());
                    return Ok(json!({
                        "anagrpid": g,
                        "home": to,
                        "owner": owner,
                        "epoch": doc.epoch,
                    }));
                }
                Err(WriteError::Conflict) => continue,
                Err(WriteError::Failed(e)) => return Err(e),
            }
        }
        Err("the group record kept changing; try again".into())
    }
}

/// The member thread's state.
struct MemberLoop {
    h: Arc<Handle>,
    address: String,
    target: Arc<Target>,
    /// ANA group → the bdevs of its namespaces.
    serves: BTreeMap<u32, BTreeSet<String>>,
    last_try: Option<Instant>,
    /// Hand-overs in progress: group → (to, since).
    draining: BTreeMap<u32, (String, Instant)>,
    doc: GroupDoc,
    alive: BTreeSet<String>,
    last_error_log: Option<Instant>,
    /// The shared reservation store of each namespace (by NQN, NSID).
    resv_stores: BTreeMap<(String, u32), Arc<resv::GroupResvStore>>,
    /// Namespaces (NQN, NSID, ANA group) whose reservation was loaded since
    /// their group became optimized here.
    loaded: BTreeSet<(String, u32, u32)>,
    /// Watches on the record and the configuration, by object.
    watches: BTreeMap<String, Watch>,
    /// Every member's status object as last read (see [`Peer`]).
    peers: BTreeMap<String, Peer>,
    /// Since when each other member's incarnation (its address) has been
    /// seen alive: the failback wait counts from there.
    alive_since: BTreeMap<String, (String, Instant)>,
    /// The hosts per ANA group this member last wrote to its status object.
    hosts_published: Option<BTreeMap<u32, BTreeSet<String>>>,
    /// Hand-overs held back for hosts: group → (to, hosts missing there).
    waiting: BTreeMap<u32, (String, BTreeSet<String>)>,
}

/// What a member's status object says.
struct Peer {
    /// The incarnation that wrote it.
    address: String,
    renewed_at_ms: u64,
    listeners: Value,
    /// The hosts connected there, per ANA group.
    hosts: BTreeMap<u32, BTreeSet<String>>,
}

impl Peer {
    fn parse(bytes: &[u8]) -> Option<Peer> {
        let st: Value = serde_json::from_slice(bytes).ok()?;
        let hosts = st["hosts"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(g, hs)| {
                        let hs = hs
                            .as_array()?
                            .iter()
                            .filter_map(|h| h.as_str().map(str::to_string))
                            .collect();
                        Some((g.parse().ok()?, hs))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Peer {
            address: st["address"].as_str().unwrap_or_default().to_string(),
            renewed_at_ms: st["renewed_at_ms"].as_u64().unwrap_or(0),
            listeners: st["listeners"].clone(),
            hosts,
        })
    }
}

/// The ANA groups of every subsystem with ANA reporting, with the bdevs of
/// their namespaces, after checking that the configuration can be a group
/// member: every namespace on an RBD image of the group's cluster (the
/// only writes a blocklist stops) in a subsystem with ANA reporting.
pub fn served_groups(
    cfg: &TargetConfig,
    opts: &GroupOptions,
) -> Result<BTreeMap<u32, BTreeSet<String>>, String> {
    if cfg.rbd_cluster(&opts.cluster).is_none() {
        return Err(format!(
            "--group-cluster {}: no such cluster in the configuration (bdev_rbd_register_cluster)",
            opts.cluster
        ));
    }
    let mut out: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    for s in &cfg.subsystems {
        for ns in &s.namespaces {
            if !s.ana_reporting {
                return Err(format!(
                    "subsystem {} has namespaces but no ANA reporting (ana_reporting / -r): \
                     a gateway group moves ANA groups",
                    s.nqn
                ));
            }
            let rbd_ok = cfg
                .bdev(&ns.bdev_name)
                .and_then(|b| b.rbd.as_ref())
                .is_some_and(|r| r.cluster_name.as_deref() == Some(opts.cluster.as_str()));
            if !rbd_ok {
                return Err(format!(
                    "namespace {} of {} is on bdev {}, which is not an RBD image of cluster {}: \
                     a group can only fence writes that go through its own RADOS client",
                    ns.nsid, s.nqn, ns.bdev_name, opts.cluster
                ));
            }
            if ns.anagrpid > nvmf_core::ana::GROUP_ANA_MAX {
                return Err(format!(
                    "namespace {} of {} is in ANA group {}: a gateway group manages groups 1..={}",
                    ns.nsid,
                    s.nqn,
                    ns.anagrpid,
                    nvmf_core::ana::GROUP_ANA_MAX
                ));
            }
            out.entry(ns.anagrpid)
                .or_default()
                .insert(ns.bdev_name.clone());
        }
    }
    Ok(out)
}

/// Opens the group's objects on the cluster's connection and starts the
/// member thread. Returns the handle the RPC server and `/metrics` use.
pub fn start(
    opts: GroupOptions,
    serves: BTreeMap<u32, BTreeSet<String>>,
    service: Arc<nvmf_rpc::RpcService>,
    target: Arc<Target>,
    shutdown: Arc<AtomicBool>,
) -> Result<(Arc<Handle>, std::thread::JoinHandle<()>), String> {
    let conn = nvmf_core::backend::rbd::conn::cluster(&opts.cluster)
        .ok_or_else(|| format!("cluster {} is not connected", opts.cluster))?;
    let objs = Arc::new(GroupObjects::open(&conn, &opts.pool)?);
    let address = objs.client_address()?;
    // The notifier: tells the other members an object changed, off the
    // threads that changed it.
    let (notify_tx, notify_rx) = std::sync::mpsc::channel::<String>();
    let nobjs = objs.clone();
    std::thread::Builder::new()
        .name("group-notify".into())
        .spawn(move || {
            for oid in notify_rx {
                if let Err(e) = nobjs.notify(&oid, Duration::from_secs(1)) {
                    warn!("gateway group: {e} (the others see it on their next tick)");
                }
            }
        })
        .map_err(|e| format!("spawning the gateway group's notifier: {e}"))?;
    info!(
        group = %opts.name, member = %opts.id, %address, pool = %opts.pool,
        "gateway group member: lease {} ms, renewed every {} ms, self-fence after {} ms without one",
        opts.lease.as_millis(), opts.renew_every().as_millis(),
        (opts.lease - opts.margin()).as_millis()
    );
    let h = Arc::new(Handle {
        opts,
        objs,
        status: Mutex::new(json!({})),
        counters: Counters::default(),
        last_ok: Mutex::new(None),
        fenced: AtomicBool::new(false),
        ana: Mutex::new(()),
        service: service.clone(),
        target: target.clone(),
        groups: Mutex::new(serves.keys().copied().collect()),
        config_seen: Mutex::new(None),
        wake: Arc::new(Wake::default()),
        notify_tx: Mutex::new(notify_tx),
    });
    let mut m = MemberLoop {
        h: h.clone(),
        address,
        target,
        serves,
        last_try: None,
        draining: BTreeMap::new(),
        doc: GroupDoc::default(),
        alive: BTreeSet::new(),
        last_error_log: None,
        resv_stores: BTreeMap::new(),
        loaded: BTreeSet::new(),
        watches: BTreeMap::new(),
        peers: BTreeMap::new(),
        alive_since: BTreeMap::new(),
        hosts_published: None,
        waiting: BTreeMap::new(),
    };
    let (wd, stop) = (h.clone(), shutdown.clone());
    std::thread::Builder::new()
        .name("group-fence".into())
        .spawn(move || {
            let tick = wd.opts.tick();
            while !stop.load(Relaxed) {
                wd.fence_self_if_due();
                std::thread::sleep(tick);
            }
        })
        .map_err(|e| format!("spawning the gateway group's fence thread: {e}"))?;
    let t = std::thread::Builder::new()
        .name("gateway-group".into())
        .spawn(move || m.run(&shutdown))
        .map_err(|e| format!("spawning the gateway group thread: {e}"))?;
    Ok((h, t))
}

/// Whether a RADOS error says this client is blocklisted.
fn blocklisted(e: &str) -> bool {
    e.contains("-108") || e.contains("blocklist") || e.contains("ESHUTDOWN")
}

impl MemberLoop {
    fn opts(&self) -> &GroupOptions {
        &self.h.opts
    }

    fn run(&mut self, shutdown: &AtomicBool) {
        let tick = self.opts().tick();
        while !shutdown.load(Relaxed) {
            let t0 = Instant::now();
            self.read_peers();
            self.step();
            self.keep_watching();
            self.publish();
            let spent = t0.elapsed();
            if spent < tick {
                // A notify from another member ends the wait early.
                self.h.wake.wait(tick - spent);
            }
        }
        self.watches.clear();
        self.leave();
    }

    /// Watches the record and the configuration once they exist; a watch
    /// librados gave up is made again.
    fn keep_watching(&mut self) {
        let o = self.opts().clone();
        self.watches.retain(|_, w| w.healthy());
        for oid in [o.record_oid(), o.config_oid()] {
            if self.watches.contains_key(&oid) {
                continue;
            }
            match self.h.objs.watch(&oid, self.h.wake.clone()) {
                Ok(w) => {
                    self.watches.insert(oid, w);
                }
                Err(e) if e.contains("-2 ") => {} // not created yet
                Err(e) => self.rados_error("watching the group's objects", &e),
            }
        }
    }

    /// Logs a RADOS failure, at most one line per second.
    fn rados_error(&mut self, what: &str, e: &str) {
        self.h.counters.rados_errors.fetch_add(1, Relaxed);
        let now = Instant::now();
        if self
            .last_error_log
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            self.last_error_log = Some(now);
            warn!(group = %self.opts().name, "{what}: {e} (retried)");
        }
    }

    fn fenced_exit(&self, why: &str) -> ! {
        error!(
            group = %self.opts().name, member = %self.opts().id,
            "{why}: this member may have been fenced by the group; every ANA group here is \
             inaccessible; exiting with status {EXIT_FENCED} so that its supervisor restarts it \
             with a new RADOS client, which rejoins"
        );
        crate::exit_now(EXIT_FENCED);
    }

    /// Takes or renews the lease; returns whether this member may serve.
    fn renew(&mut self) -> bool {
        let o = self.opts().clone();
        let now = Instant::now();
        let due = self
            .last_try
            .is_none_or(|t| now.duration_since(t) >= o.renew_every());
        if due {
            self.last_try = Some(now);
            let first = self.h.last_ok().is_none();
            let r = self
                .h
                .objs
                .lease(&o.lease_oid(), &o.id, &o.id, o.lease, !first);
            let rtt = now.elapsed();
            match r {
                Ok(()) => {
                    let c = &self.h.counters;
                    c.renewals.fetch_add(1, Relaxed);
                    let us = rtt.as_micros() as u64;
                    c.renewal_us.fetch_add(us, Relaxed);
                    c.renewal_max_us.fetch_max(us, Relaxed);
                    if let Some(prev) = self.h.last_ok() {
                        if now.duration_since(prev) >= o.lease {
                            // Its lock may have expired on the OSD and been
                            // probed by a survivor, which then fences.
                            self.set_all_inaccessible();
                            self.fenced_exit(&format!(
                                "lease lapsed for {} ms (at least its duration)",
                                now.duration_since(prev).as_millis()
                            ));
                        }
                    } else {
                        info!(group = %o.name, member = %o.id, "lease taken");
                    }
                    self.h.set_last_ok(now);
                    self.publish_member_status();
                    if self.h.fenced() {
                        // Renewed within L of the previous renewal: the lock
                        // never expired, nobody could have taken over.
                        let _g = self.h.ana.lock().unwrap_or_else(|e| e.into_inner());
                        self.h.fenced.store(false, Relaxed);
                        self.h.counters.fenced_now.store(0, Relaxed);
                        info!(group = %o.name, "lease renewed again in time: serving again");
                    }
                }
                Err(LeaseError::Held) if first => {
                    self.rados_error(
                        "lease",
                        &format!(
                            "member ID {} is held by another process (a previous incarnation's \
                             lease ends within {} ms)",
                            o.id,
                            o.lease.as_millis()
                        ),
                    );
                }
                Err(LeaseError::Held) => {
                    self.set_all_inaccessible();
                    self.fenced_exit("the lease is held by another process");
                }
                Err(LeaseError::Failed(e)) => {
                    self.h.counters.renewal_failures.fetch_add(1, Relaxed);
                    if blocklisted(&e) && self.h.last_ok().is_some() {
                        self.set_all_inaccessible();
                        self.fenced_exit(&format!("lease renewal refused: {e}"));
                    }
                    self.rados_error("lease renewal", &e);
                }
            }
        }
        if self.h.last_ok().is_none() {
            return false;
        }
        self.h.fence_self_if_due();
        !self.h.fenced()
    }

    fn step(&mut self) {
        if !self.renew() {
            self.alive.clear();
            return;
        }
        let my_hosts = self.connected_hosts();
        if self.hosts_published.as_ref() != Some(&my_hosts) {
            // A host connected or left: the owners of this member's home
            // groups wait for that before they hand them back.
            self.publish_member_status();
        }
        self.sync_config();
        let o = self.opts().clone();
        let oid = o.record_oid();
        let (mut doc, version) = match self.h.objs.read(&oid) {
            Ok(Some((b, v))) => match GroupDoc::parse(&b) {
                Ok(d) => (d, Some(v)),
                Err(e) => return self.rados_error("group record", &e),
            },
            Ok(None) => (GroupDoc::default(), None),
            Err(e) => return self.rados_error("reading the group record", &e),
        };
        if doc.is_fenced(&self.address) {
            self.set_all_inaccessible();
            self.fenced_exit("the group record lists this member's RADOS client as fenced");
        }
        // Join (or refresh what this incarnation publishes).
        let serves: BTreeSet<u32> = self.serves.keys().copied().collect();
        let me = doc.members.get(&o.id);
        if me.is_none_or(|m| m.address != self.address || m.serves != serves)
            || o.home
                .iter()
                .any(|g| serves.contains(g) && doc.groups.get(g).is_none_or(|a| a.home.is_none()))
        {
            let joined = match me {
                Some(m) if m.address == self.address => m.joined,
                _ => now_unix(),
            };
            doc.members.insert(
                o.id.clone(),
                Member {
                    address: self.address.clone(),
                    joined,
                    serves,
                },
            );
            for g in &o.home {
                if self.serves.contains_key(g) {
                    let a = doc.groups.entry(*g).or_default();
                    a.home.get_or_insert_with(|| o.id.clone());
                }
            }
            match self.h.objs.write(&oid, &doc.to_bytes(), version) {
                Ok(_) => {
                    info!(group = %o.name, member = %o.id, address = %self.address, "joined");
                    self.h.changed(oid.clone());
                }
                Err(WriteError::Conflict) => {}
                Err(WriteError::Failed(e)) => self.rados_error("joining", &e),
            }
            return;
        }
        // Who is alive: a lease another client holds is a live member.
        let mut alive = BTreeSet::new();
        alive.insert(o.id.clone());
        let probe = format!("probe.{}", o.id);
        for m in doc
            .members
            .keys()
            .filter(|m| **m != o.id)
            .cloned()
            .collect::<Vec<_>>()
        {
            match self
                .h
                .objs
                .lease(&o.lease_oid(), &m, &probe, Duration::from_secs(1), false)
            {
                Err(LeaseError::Held) => {
                    alive.insert(m);
                }
                Ok(()) => {
                    if let Err(e) = self.h.objs.release(&o.lease_oid(), &m, &probe) {
                        self.rados_error("releasing a probe", &e);
                    }
                }
                Err(LeaseError::Failed(e)) => {
                    // Unknown: counted alive, so nothing is taken from it.
                    self.rados_error(&format!("probing member {m}"), &e);
                    alive.insert(m);
                }
            }
        }
        self.alive = alive;
        let serves: BTreeSet<u32> = self.serves.keys().copied().collect();
        let now = Instant::now();
        self.alive_since.retain(|m, (addr, _)| {
            self.alive.contains(m) && doc.members.get(m).is_some_and(|x| x.address == *addr)
        });
        for m in &self.alive {
            if let Some(x) = doc.members.get(m) {
                self.alive_since
                    .entry(m.clone())
                    .or_insert_with(|| (x.address.clone(), now));
            }
        }
        let waited: BTreeSet<String> = self
            .alive_since
            .iter()
            .filter(|(_, (_, t))| now.duration_since(*t) >= o.failback_wait)
            .map(|(m, _)| m.clone())
            .collect();
        // The hosts of each live incarnation, from its status object (one
        // written by an earlier incarnation counts for nothing).
        let mut hosts: plan::HostsByMember = self
            .peers
            .iter()
            .filter(|(m, p)| doc.members.get(*m).is_some_and(|x| x.address == p.address))
            .map(|(m, p)| (m.clone(), p.hosts.clone()))
            .collect();
        hosts.insert(o.id.clone(), my_hosts);
        let actions = plan::decide(&View {
            me: &o.id,
            address: &self.address,
            doc: &doc,
            alive: &self.alive,
            serves: &serves,
            hosts: &hosts,
            waited: &waited,
        });
        let mut waiting = BTreeMap::new();
        let mut changed = false;
        let mut took = Vec::new();
        let mut handing: BTreeSet<u32> = BTreeSet::new();
        for a in actions {
            match a {
                Action::Take { group, fence } => {
                    if let Some((member, address)) = fence {
                        if !doc.is_fenced(&address) {
                            // A fencing can take a second or more (the monitor's commit, the
                            // OSD map): renewing only once per step, a survivor fencing two
                            // dead members in one step could miss its own renewal long enough
                            // to fence itself. Renewed here when due.
                            if !self.renew() {
                                return;
                            }
                            let t = Instant::now();
                            if let Err(e) = self.h.objs.fence(&address, FENCE_EXPIRE) {
                                self.rados_error(&format!("fencing {member} ({address})"), &e);
                                continue;
                            }
                            self.h.counters.fencings.fetch_add(1, Relaxed);
                            warn!(
                                group = %o.name, fenced = %member, %address,
                                "fenced (blocklisted, OSD map has it) in {} ms before taking its ANA groups",
                                t.elapsed().as_millis()
                            );
                            doc.record_fence(Fenced {
                                member,
                                address,
                                by: o.id.clone(),
                                at: now_unix(),
                            });
                        }
                    }
                    doc.set_owner(group, &o.id, &self.address);
                    took.push(group);
                    changed = true;
                }
                Action::HandOver { group, to } => {
                    handing.insert(group);
                    let since = self
                        .draining
                        .entry(group)
                        .or_insert_with(|| (to.clone(), Instant::now()))
                        .1;
                    if since.elapsed() > DRAIN_LIMIT {
                        warn!(group = %o.name, anagrpid = group, %to, "hand-over abandoned: writes did not drain");
                        self.draining.remove(&group);
                        continue;
                    }
                    // Inaccessible here first; then wait until nothing this
                    // member counted as writing to the group's bdevs is left.
                    self.apply_ana(&doc);
                    if since.elapsed() < Duration::from_millis(20) || !self.drained(group) {
                        continue;
                    }
                    let Some(addr) = doc.members.get(&to).map(|m| m.address.clone()) else {
                        continue;
                    };
                    doc.set_owner(group, &to, &addr);
                    changed = true;
                    info!(group = %o.name, anagrpid = group, %to, "handing over (planned)");
                }
                Action::WaitForHosts { group, to, missing } => {
                    if self.waiting.get(&group) != Some(&(to.clone(), missing.clone())) {
                        let left = self.failback_wait_left(&to).unwrap_or(o.failback_wait);
                        info!(
                            group = %o.name, anagrpid = group, %to,
                            "hand-over waits until these hosts are connected to {to} too \
                             (at most {} ms more): {}",
                            left.as_millis(),
                            missing.iter().cloned().collect::<Vec<_>>().join(", ")
                        );
                    }
                    waiting.insert(group, (to, missing));
                }
            }
        }
        self.waiting = waiting;
        self.draining.retain(|g, _| handing.contains(g));
        if changed {
            match self.h.objs.write(&oid, &doc.to_bytes(), version) {
                Ok(_) => {
                    self.h.changed(oid.clone());
                    for g in &took {
                        self.h.counters.takeovers.fetch_add(1, Relaxed);
                        info!(group = %o.name, anagrpid = g, epoch = doc.epoch, "took ANA group");
                    }
                    for (g, (to, _)) in std::mem::take(&mut self.draining) {
                        if doc
                            .groups
                            .get(&g)
                            .and_then(|a| a.owner.as_ref())
                            .is_some_and(|x| x.member == to)
                        {
                            self.h.counters.handovers.fetch_add(1, Relaxed);
                        } else {
                            self.draining.insert(g, (to, Instant::now()));
                        }
                    }
                }
                Err(WriteError::Conflict) => {
                    // Someone else changed it: decide again on the next tick.
                    return;
                }
                Err(WriteError::Failed(e)) => {
                    return self.rados_error("writing the group record", &e)
                }
            }
        }
        self.doc = doc;
        let d = self.doc.clone();
        self.apply_ana(&d);
    }

    /// Writes this member's own status object: the time of the renewal that
    /// just succeeded and the listeners it serves.
    fn publish_member_status(&mut self) {
        let o = self.opts().clone();
        let cfg = self.h.service.config();
        let mut listeners: Vec<String> = cfg
            .subsystems
            .iter()
            .flat_map(|s| s.listeners.iter())
            .map(|l| format!("{}:{}", l.traddr, l.trsvcid))
            .collect();
        listeners.sort();
        listeners.dedup();
        let hosts = self.connected_hosts();
        let body = json!({
            "member": o.id,
            "address": self.address,
            "renewed_at_ms": now_unix_ms(),
            "lease_ms": o.lease.as_millis() as u64,
            "listeners": listeners,
            "hosts": hosts
                .iter()
                .map(|(g, hs)| (g.to_string(), json!(hs)))
                .collect::<serde_json::Map<String, Value>>(),
        });
        match self
            .h
            .objs
            .put(&o.member_oid(&o.id), body.to_string().as_bytes())
        {
            Ok(()) => self.hosts_published = Some(hosts),
            Err(e) => self.rados_error("writing this member's status", &e),
        }
    }

    /// The hosts (NQNs) with a live controller on a subsystem holding a
    /// namespace of each ANA group this member serves.
    fn connected_hosts(&self) -> BTreeMap<u32, BTreeSet<String>> {
        let mut out: BTreeMap<u32, BTreeSet<String>> =
            self.serves.keys().map(|g| (*g, BTreeSet::new())).collect();
        for sub in self.target.subsystems() {
            if sub.is_discovery() {
                continue;
            }
            let groups: BTreeSet<u32> = sub
                .namespaces()
                .iter()
                .map(|ns| ns.anagrpid())
                .filter(|g| out.contains_key(g))
                .collect();
            if groups.is_empty() {
                continue;
            }
            let hosts: BTreeSet<String> = sub
                .controllers()
                .iter()
                .filter(|c| !c.is_dead())
                .map(|c| c.hostnqn().to_string())
                .collect();
            for g in groups {
                out.entry(g).or_default().extend(hosts.iter().cloned());
            }
        }
        out
    }

    /// How much longer a hand-over to `to` may wait for hosts (from when
    /// its incarnation was first seen alive).
    fn failback_wait_left(&self, to: &str) -> Option<Duration> {
        let (_, since) = self.alive_since.get(to)?;
        Some(self.opts().failback_wait.saturating_sub(since.elapsed()))
    }

    /// Reads every member's status object (for the hand-over's host check
    /// and `nvmf gw status`). On the member thread: `nvmf gw status` must
    /// answer even while the cluster does not.
    fn read_peers(&mut self) {
        let o = self.opts().clone();
        let ids: Vec<String> = self.doc.members.keys().cloned().collect();
        let mut peers = BTreeMap::new();
        for id in ids {
            if let Ok(Some((bytes, _))) = self.h.objs.read(&o.member_oid(&id)) {
                if let Some(p) = Peer::parse(&bytes) {
                    peers.insert(id, p);
                }
            }
        }
        self.peers = peers;
    }

    /// Brings this member to the group's configuration: creates it from
    /// this member's when there is none yet; applies a version it has not
    /// seen (merged with what is its own, through `load_config`), then
    /// recomputes the ANA groups it serves.
    fn sync_config(&mut self) {
        let o = self.opts().clone();
        let oid = o.config_oid();
        let seen = self
            .h
            .config_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(v, _, _)| *v);
        match self.h.objs.read(&oid) {
            Err(e) => self.rados_error("reading the group configuration", &e),
            Ok(None) => {
                let local = self.h.service.config();
                let mine = shared::shared_part(&local);
                let all: AllListeners = [(o.id.clone(), shared::listeners_of(&local))].into();
                let mut guard = self.h.config_seen.lock().unwrap_or_else(|e| e.into_inner());
                match self
                    .h
                    .objs
                    .write(&oid, &config_body(&mine, &all, &o.id), None)
                {
                    Ok(v) => {
                        info!(group = %o.name, version = v, "group configuration created from this member's");
                        *guard = Some((v, mine, all));
                        self.h.changed(oid.clone());
                    }
                    Err(WriteError::Conflict) => {}
                    Err(WriteError::Failed(e)) => {
                        drop(guard);
                        self.rados_error("creating the group configuration", &e)
                    }
                }
            }
            Ok(Some((_, v))) if seen == Some(v) => {}
            Ok(Some((bytes, v))) => {
                let (group_cfg, all) = match parse_config_body(&bytes) {
                    Ok(c) => c,
                    Err(e) => {
                        return self.rados_error(
                            &format!("group configuration version {v} is not usable"),
                            &e,
                        )
                    }
                };
                let local = self.h.service.config();
                let pos = self
                    .doc
                    .members
                    .keys()
                    .position(|m| *m == o.id)
                    .unwrap_or(self.doc.members.len());
                let base = ((pos + 1) * 1000).min(60_000) as u16;
                let mut merged = shared::merge(&local, &group_cfg, base);
                // This member's listeners as the group keeps them (an RPC may
                // have changed them since its file was written).
                let known = all.get(&o.id).cloned();
                if let Some(mine) = &known {
                    merged = shared::with_listeners(merged, mine);
                }
                // Seen before it is applied: applying it publishes nothing.
                *self.h.config_seen.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((v, group_cfg, all));
                if merged != local {
                    match self
                        .h
                        .service
                        .call("load_config", Some(&merged.to_json_value()))
                    {
                        Ok(_) => {
                            info!(group = %o.name, version = v, "applied the group's configuration")
                        }
                        Err(e) => error!(
                            group = %o.name, version = v,
                            "cannot apply the group's configuration here: {}", e.message
                        ),
                    }
                }
                if known.is_none() {
                    // The group does not have this member's listeners yet.
                    if let Err(e) = self.h.publish_config(&self.h.service.config()) {
                        self.rados_error("publishing this member's listeners", &e);
                    }
                }
            }
        }
        // What is served follows the configuration, whichever way it changed
        // (the group's, or an RPC here).
        match served_groups(&self.h.service.config(), &o) {
            Ok(s) if s != self.serves => {
                info!(group = %o.name, "ANA groups served here: {:?}", s.keys().collect::<Vec<_>>());
                *self.h.groups.lock().unwrap_or_else(|e| e.into_inner()) =
                    s.keys().copied().collect();
                self.serves = s;
            }
            Ok(_) => {}
            Err(e) => self.rados_error("the configuration here cannot be a member's", &e),
        }
    }

    /// Whether every bdev of group `g` has no counted write in flight.
    fn drained(&self, g: u32) -> bool {
        self.serves.get(&g).is_none_or(|bdevs| {
            bdevs.iter().all(|b| {
                self.target
                    .backend(b)
                    .is_none_or(|be| nvmf_core::fused::gate_for(&be).in_flight() == 0)
            })
        })
    }

    /// The state each served group should have here now.
    fn desired(&self, doc: &GroupDoc) -> BTreeMap<u32, AnaState> {
        let serves: BTreeSet<u32> = self.serves.keys().copied().collect();
        // (The states depend on ownership only, not on hosts.)
        let (hosts, waited) = (plan::HostsByMember::new(), BTreeSet::new());
        let v = View {
            me: &self.h.opts.id,
            address: &self.address,
            doc,
            alive: &self.alive,
            serves: &serves,
            hosts: &hosts,
            waited: &waited,
        };
        serves
            .iter()
            .map(|&g| {
                let s = if self.draining.contains_key(&g) {
                    AnaState::Inaccessible
                } else {
                    plan::ana_state(&v, g, self.h.fenced())
                };
                (g, s)
            })
            .collect()
    }

    fn set_all_inaccessible(&mut self) {
        let _g = self.h.ana.lock().unwrap_or_else(|e| e.into_inner());
        self.h.set_states(&self.h.all(AnaState::Inaccessible));
    }

    fn apply_ana(&mut self, doc: &GroupDoc) {
        // The reservations of groups about to be served here come from RADOS
        // first (outside the lock: the fence thread must never wait on it).
        let ready = self.prepare_owned(&self.desired(doc));
        let _g = self.h.ana.lock().unwrap_or_else(|e| e.into_inner());
        // Computed under the lock: a self-fence in between is seen.
        let mut want = self.desired(doc);
        for (g, s) in want.iter_mut() {
            if *s == AnaState::Optimized && !ready.contains(g) {
                *s = AnaState::Inaccessible;
            }
        }
        self.h.set_states(&want);
    }

    /// For every group `want` makes optimized here: each of its namespaces
    /// gets the group's reservation store and state (`resv::take_over`),
    /// once per ownership. Returns the groups that are ready; a group whose
    /// state could not be loaded stays inaccessible (retried next tick).
    fn prepare_owned(&mut self, want: &BTreeMap<u32, AnaState>) -> BTreeSet<u32> {
        let o = self.opts().clone();
        let owned: BTreeSet<u32> = want
            .iter()
            .filter(|(_, s)| **s == AnaState::Optimized)
            .map(|(g, _)| *g)
            .collect();
        self.loaded.retain(|(_, _, g)| owned.contains(g));
        let mut ready = owned.clone();
        for sub in self.target.subsystems() {
            if sub.is_discovery() {
                continue;
            }
            let nqn = sub.nqn().to_string();
            for ns in sub.namespaces().iter() {
                let g = ns.anagrpid();
                if !owned.contains(&g) {
                    continue;
                }
                let key = (nqn.clone(), ns.nsid(), g);
                if self.loaded.contains(&key) && ns.reservations().store().is_some() {
                    continue;
                }
                let store = self
                    .resv_stores
                    .entry((nqn.clone(), ns.nsid()))
                    .or_insert_with(|| {
                        Arc::new(resv::GroupResvStore::new(
                            self.h.objs.clone(),
                            &o.name,
                            &nqn,
                            ns.nsid(),
                        ))
                    })
                    .clone();
                match resv::take_over(&store, ns) {
                    Ok(()) => {
                        self.loaded.insert(key);
                    }
                    Err(e) => {
                        ready.remove(&g);
                        self.rados_error(
                            &format!("loading the reservation of {nqn} namespace {}", ns.nsid()),
                            &e,
                        );
                    }
                }
            }
        }
        ready
    }

    /// Publishes the view `nvmf gw status` shows.
    fn publish(&self) {
        let o = self.opts();
        let fenced = self.h.fenced();
        let d = &self.doc;
        // Every member's own status object (read_peers): when it last
        // renewed its lease (by its clock, against ours), where it listens,
        // the hosts connected there.
        let now = now_unix_ms();
        let members: Vec<Value> = d
            .members
            .iter()
            .map(|(id, m)| {
                let p = self.peers.get(id);
                json!({
                    "renewed_ms_ago": p.map(|x| now.saturating_sub(x.renewed_at_ms)),
                    "listeners": p.map(|x| x.listeners.clone()),
                    "hosts": p.filter(|x| x.address == m.address).map(|x| {
                        x.hosts.values().flatten().collect::<BTreeSet<_>>()
                    }),
                    "id": id,
                    "address": m.address,
                    "joined": m.joined,
                    "serves": m.serves,
                    "lease": if *id == o.id {
                        if fenced { "lapsed" } else { "held" }
                    } else if self.alive.contains(id) { "held" } else { "free" },
                    "owns": d.owned_by(id),
                })
            })
            .collect();
        let groups: Vec<Value> = d
            .groups
            .iter()
            .map(|(g, a)| {
                json!({
                    "anagrpid": g,
                    "home": a.home,
                    "owner": a.owner.as_ref().map(|x| x.member.clone()),
                    "owner_address": a.owner.as_ref().map(|x| x.address.clone()),
                    "owner_epoch": a.owner.as_ref().map(|x| x.epoch),
                    "owner_alive": plan::live_owner(d, &self.alive, *g).is_some(),
                    "hand_over_waits": self.waiting.get(g).map(|(to, missing)| json!({
                        "to": to,
                        "hosts_not_there": missing,
                        "wait_left_ms": self.failback_wait_left(to).map(|d| d.as_millis() as u64),
                    })),
                    "here": if self.draining.contains_key(g) { "draining" } else {
                        match self.desired(d).get(g) {
                            Some(AnaState::Optimized) => "optimized",
                            Some(_) => "inaccessible",
                            None => "not served",
                        }
                    },
                })
            })
            .collect();
        let c = &self.h.counters;
        c.epoch.store(d.epoch, Relaxed);
        *self.h.status.lock().unwrap_or_else(|e| e.into_inner()) = json!({
            "group": o.name,
            "member": o.id,
            "address": self.address,
            "pool": o.pool,
            "lease_ms": o.lease.as_millis() as u64,
            "epoch": d.epoch,
            "members": members,
            "ana_groups": groups,
            "fenced": d.fenced,
        });
    }

    /// A clean stop: every group this member owns goes to its successor
    /// (planned: inaccessible here, drained, record changed), then the
    /// lease is released. Bounded: whatever is left is taken over by the
    /// survivors after the lease (with fencing).
    fn leave(&mut self) {
        let o = self.opts().clone();
        if self.h.last_ok().is_none() || self.h.fenced() {
            return;
        }
        let oid = o.record_oid();
        self.set_all_inaccessible();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left = false;
        while Instant::now() < deadline {
            if self.serves.keys().all(|g| self.drained(*g)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for _ in 0..8 {
            let Ok(Some((b, v))) = self.h.objs.read(&oid) else {
                break;
            };
            let Ok(mut doc) = GroupDoc::parse(&b) else {
                break;
            };
            let mut alive = self.alive.clone();
            alive.remove(&o.id);
            let mine: Vec<u32> = doc
                .owned_by(&o.id)
                .into_iter()
                .filter(|g| {
                    doc.groups[g]
                        .owner
                        .as_ref()
                        .is_some_and(|x| x.address == self.address)
                })
                .collect();
            for g in &mine {
                if let Some(to) = plan::successor(&doc, &alive, *g) {
                    let addr = doc.members[&to].address.clone();
                    doc.set_owner(*g, &to, &addr);
                }
            }
            match self.h.objs.write(&oid, &doc.to_bytes(), Some(v)) {
                Ok(_) => {
                    info!(group = %o.name, member = %o.id, "left the group: ANA groups {mine:?} handed over");
                    left = true;
                    break;
                }
                Err(WriteError::Conflict) => continue,
                Err(WriteError::Failed(e)) => {
                    warn!(group = %o.name, "leaving: {e}");
                    break;
                }
            }
        }
        if left {
            if let Err(e) = self.h.objs.release(&o.lease_oid(), &o.id, &o.id) {
                warn!(group = %o.name, "releasing the lease: {e}");
            }
            // Hosts learn of the change by an AEN and then read the ANA log page on this
            // member's connections. Closing them at once can strand that read: the Linux
            // host then waits out its keep-alive timeout before it reconnects. That was seen
            // as 6.4 s I/O waits in a rolling upgrade, once the groups came back here before
            // the host had reconnected. So the connections stay open a moment longer, with
            // every group inaccessible here.
            std::thread::sleep(LEAVE_LINGER);
        }
    }
}

/// How long a member that left its group keeps its connections open (its groups
/// inaccessible) so that hosts can read the ANA change before they close.
const LEAVE_LINGER: Duration = Duration::from_millis(1000);

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> GroupOptions {
        GroupOptions {
            name: "g".into(),
            id: "a".into(),
            cluster: "ceph0".into(),
            pool: "rbd".into(),
            lease: Duration::from_secs(15),
            home: BTreeSet::new(),
            failback_wait: Duration::from_secs(20),
        }
    }

    fn cfg(ana: bool, bdev: &str) -> TargetConfig {
        let nqn = "nqn.2016-06.io.nvmfd:g";
        TargetConfig::from_json_str(&format!(
            r#"{{"subsystems":[{{"subsystem":"bdev","config":[
  {{"method":"bdev_rbd_register_cluster","params":{{"name":"ceph0"}}}},
  {{"method":"bdev_rbd_create","params":{{"name":"Rbd0","pool_name":"rbd","rbd_name":"i","block_size":512,"cluster_name":"ceph0"}}}},
  {{"method":"bdev_rbd_create","params":{{"name":"Own0","pool_name":"rbd","rbd_name":"j","block_size":512}}}},
  {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","num_blocks":64,"block_size":512}}}}]}},
  {{"subsystem":"nvmf","config":[
  {{"method":"nvmf_create_subsystem","params":{{"nqn":"{nqn}","ana_reporting":{ana}}}}},
  {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{nqn}","namespace":{{"bdev_name":"{bdev}","nsid":1,"anagrpid":1}}}}}}]}}]}}"#
        ))
        .expect("config")
    }

    #[test]
    fn a_member_serves_only_rbd_namespaces_of_its_cluster_with_ana() {
        let g = served_groups(&cfg(true, "Rbd0"), &opts()).expect("served");
        assert_eq!(g.get(&1).map(|b| b.contains("Rbd0")), Some(true));
        let e = served_groups(&cfg(true, "Malloc0"), &opts()).unwrap_err();
        assert!(e.contains("not an RBD image of cluster ceph0"), "{e}");
        let e = served_groups(&cfg(true, "Own0"), &opts()).unwrap_err();
        assert!(e.contains("its own RADOS client"), "{e}");
        let e = served_groups(&cfg(false, "Rbd0"), &opts()).unwrap_err();
        assert!(e.contains("no ANA reporting"), "{e}");
        let mut o = opts();
        o.cluster = "other".into();
        let e = served_groups(&cfg(true, "Rbd0"), &o).unwrap_err();
        assert!(e.contains("no such cluster"), "{e}");
    }
}
